"""What the analysis concludes: findings, the detectors' streaks, recommendations and
their outcomes."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any

from sqlalchemy import ColumnElement, case, delete, func, insert, or_, select
from sqlalchemy.orm import Session

from collector.records import SEVERITY_ORDER, Finding, Recommendation
from collector.store.engine import Database
from collector.store.mapping import (
    RowValues,
    columns,
    orm_values,
    recommendation_from,
    recommendation_values,
    record_from,
    record_values,
)
from collector.store.rows import (
    RECOMMENDATION_OUTCOMES,
    DetectorStreak,
    StoredFinding,
    StoredRecommendation,
)
from collector.store.schema import DetectorStreakRow, FindingRow, RecommendationRow

__all__ = ["FindingsMixin"]


class FindingsMixin(Database):
    """``Store`` methods about findings, detector streaks and recommendations."""

    def add_finding(
        self,
        finding: Finding | None = None,
        /,
        *,
        created_at: float | None = None,
        **fields: Any,
    ) -> int:
        """Store ``finding`` and return its id; ``created_at`` defaults to now. Its
        ``evidence`` must be JSON-serialisable. The fields of a ``Finding`` may also be
        given as keywords instead (``kind=..., severity=...``)."""
        if finding is None:
            finding = Finding(**{**fields, "evidence": dict(fields.get("evidence") or {})})
        elif fields:
            raise TypeError(f"add_finding takes a Finding or its fields, not both: {fields}")
        row = FindingRow(
            **record_values(finding),
            created_at=time.time() if created_at is None else created_at,
            resolved_at=None,
        )
        with self._write() as session:
            session.add(row)
            session.flush()
            return row.id

    def findings(
        self,
        *,
        target: str | None = None,
        kind: str | None = None,
        since: float | None = None,
    ) -> list[StoredFinding]:
        """Findings created at or after ``since``, oldest first."""
        stmt = select(*columns(FindingRow)).order_by(FindingRow.created_at, FindingRow.id)
        if target is not None:
            stmt = stmt.where(FindingRow.target == target)
        if kind is not None:
            stmt = stmt.where(FindingRow.kind == kind)
        if since is not None:
            stmt = stmt.where(FindingRow.created_at >= since)
        with self._read() as session:
            return [record_from(StoredFinding, r) for r in session.execute(stmt).mappings()]

    def active_findings(
        self, *, target: str | None = None, kind: str | None = None
    ) -> list[StoredFinding]:
        """Findings not resolved yet, oldest first."""
        stmt = (
            select(*columns(FindingRow))
            .where(FindingRow.resolved_at.is_(None))
            .order_by(FindingRow.created_at, FindingRow.id)
        )
        if target is not None:
            stmt = stmt.where(FindingRow.target == target)
        if kind is not None:
            stmt = stmt.where(FindingRow.kind == kind)
        with self._read() as session:
            return [record_from(StoredFinding, r) for r in session.execute(stmt).mappings()]

    def finding_events(
        self,
        *,
        since: float,
        target: str | None = None,
        subject: str | None = None,
        kind: str | None = None,
        severity: str | None = None,
        state: str = "all",
        limit: int | None = None,
    ) -> list[StoredFinding]:
        """Findings open now or created at or after ``since`` that match the filters
        (``state``: ``"active"``, ``"past"`` or ``"all"``), the open ones first, then the
        most severe (``SEVERITY_ORDER``, unknown ones last), then the newest; at most
        ``limit``. The findings page's read: however many findings a week holds, it
        reads the rows it shows."""
        if state not in _FINDING_STATES:
            raise ValueError(f"state must be one of {sorted(_FINDING_STATES)}, got {state!r}")
        stmt = (
            select(*columns(FindingRow))
            .where(_open_or_since(since))
            .order_by(
                FindingRow.resolved_at.is_not(None),
                case(SEVERITY_ORDER, value=FindingRow.severity, else_=len(SEVERITY_ORDER)),
                FindingRow.created_at.desc(),
                FindingRow.id.desc(),
            )
            .limit(limit)
        )
        for column, value in (
            (FindingRow.target, target),
            (FindingRow.subject, subject),
            (FindingRow.kind, kind),
            (FindingRow.severity, severity),
        ):
            if value is not None:
                stmt = stmt.where(column == value)
        if state != "all":
            resolved = FindingRow.resolved_at
            stmt = stmt.where(resolved.is_(None) if state == "active" else resolved.is_not(None))
        with self._read() as session:
            return [record_from(StoredFinding, r) for r in session.execute(stmt).mappings()]

    def finding_facets(self, *, since: float) -> list[tuple[str, str, str, str]]:
        """The distinct (target, subject, kind, severity) of the findings open now or
        created at or after ``since``: what the findings page's filters offer."""
        stmt = (
            select(FindingRow.target, FindingRow.subject, FindingRow.kind, FindingRow.severity)
            .where(_open_or_since(since))
            .distinct()
        )
        with self._read() as session:
            return [(t, s, k, v) for t, s, k, v in session.execute(stmt)]

    def update_finding(
        self,
        finding_id: int,
        *,
        severity: str,
        summary: str,
        window_end: float,
        evidence: Mapping[str, Any],
    ) -> StoredFinding:
        """Refresh an open finding with a newer evaluation of the same condition and
        return it. ``window_start`` and ``created_at`` stay: the finding reads as "held
        from window_start to window_end". Raises ``KeyError`` when there is no finding
        ``finding_id`` and ``ValueError`` when it is resolved (resolved findings are
        history; a condition that returns opens a new one)."""
        with self._write() as session:
            row = _get(session, FindingRow, finding_id, "finding")
            if row.resolved_at is not None:
                raise ValueError(f"finding {finding_id} was resolved at {row.resolved_at}")
            row.severity = severity
            row.summary = summary
            row.window_end = float(window_end)
            row.evidence = dict(evidence)
            session.flush()
            return record_from(StoredFinding, orm_values(row))

    def resolve_finding(self, finding_id: int, at: float) -> StoredFinding:
        """Mark a finding resolved at ``at`` and return it. Resolving a resolved finding
        keeps its first ``resolved_at``. Raises ``KeyError`` when there is none."""
        with self._write() as session:
            row = _get(session, FindingRow, finding_id, "finding")
            if row.resolved_at is None:
                row.resolved_at = float(at)
            session.flush()
            return record_from(StoredFinding, orm_values(row))

    # ------------------------------------------------------------------ detector streaks

    def detector_streaks(self) -> list[DetectorStreak]:
        """The detectors' hysteresis state, ordered by (kind, target, subject)."""
        stmt = select(*columns(DetectorStreakRow)).order_by(
            DetectorStreakRow.kind, DetectorStreakRow.target, DetectorStreakRow.subject
        )
        with self._read() as session:
            return [record_from(DetectorStreak, r) for r in session.execute(stmt).mappings()]

    def replace_detector_streaks(self, streaks: Iterable[DetectorStreak]) -> None:
        """Replace the whole hysteresis state with ``streaks`` in one transaction (one
        evaluation's outcome; the set is small: only subjects with a streak going or an
        open finding). Two streaks with the same (kind, target, subject) are an error."""
        rows = [asdict(s) for s in streaks]
        with self._write() as session:
            session.execute(delete(DetectorStreakRow).execution_options(synchronize_session=False))
            if rows:
                session.execute(insert(DetectorStreakRow), rows)

    # ------------------------------------------------------------------ recommendations

    def add_recommendation(self, rec: Recommendation) -> int:
        """Store ``rec`` (status ``"open"``) and return its id."""
        with self._write() as session:
            values = {"status": "open", **recommendation_values(rec)}
            return int(
                session.scalars(
                    insert(RecommendationRow).returning(RecommendationRow.id), [values]
                ).one()
            )

    def record_recommendation_outcome(
        self,
        recommendation_id: int,
        *,
        outcome: str,
        at: float,
        verification: Mapping[str, Any] | None = None,
    ) -> StoredRecommendation:
        """Record what became of a recommendation: ``outcome`` is ``"applied"``,
        ``"kept"`` (applied, verified and kept), ``"rolled_back"`` or ``"failed"``, at
        ``at``, with the before/after figures in ``verification``. Raises ``KeyError``
        when there is no recommendation ``recommendation_id`` and ``ValueError`` for
        another outcome."""
        if outcome not in RECOMMENDATION_OUTCOMES:
            raise ValueError(
                f"outcome must be one of {', '.join(RECOMMENDATION_OUTCOMES)}, got {outcome!r}"
            )
        with self._write() as session:
            row = _get(session, RecommendationRow, recommendation_id, "recommendation")
            row.status = outcome
            row.applied_at = float(at)
            row.verification = dict(verification) if verification is not None else None
            session.flush()
            return _stored_recommendation(orm_values(row))

    def recommendations(
        self,
        *,
        target: str | None = None,
        model: str | None = None,
        status: str | None = None,
        kind: str | None = None,
    ) -> list[StoredRecommendation]:
        """Recommendations, oldest first."""
        table = RecommendationRow.__table__.c
        stmt = select(*columns(RecommendationRow)).order_by(*_oldest_first())
        for column, wanted in (
            ("target", target),
            ("model", model),
            ("status", status),
            ("kind", kind),
        ):
            if wanted is not None:
                stmt = stmt.where(table[column] == wanted)
        with self._read() as session:
            return [_stored_recommendation(r) for r in session.execute(stmt).mappings()]

    def latest_recommendation(self, target: str, model: str) -> StoredRecommendation | None:
        """The latest recommendation for ``model`` on ``target`` (the last one
        ``recommendations`` lists for it), or None: one row through the (target, model,
        created_at) index, where reading them all to keep the last grew with the store's
        history (a page view, a recommender pass)."""
        table = RecommendationRow.__table__.c
        stmt = (
            select(*columns(RecommendationRow))
            .where(table.target == target, table.model == model)
            .order_by(*_newest_first())
            .limit(1)
        )
        with self._read() as session:
            row = session.execute(stmt).mappings().first()
        return None if row is None else _stored_recommendation(row)

    def latest_recommendations(self) -> list[StoredRecommendation]:
        """The latest recommendation of each (target, model) — the last one
        ``recommendations`` lists for it — ordered by target and model: one row per
        model however many are stored (the recommender stores one a minute)."""
        table = RecommendationRow.__table__.c
        newest_first = (
            func.row_number()
            .over(
                partition_by=(table.target, table.model),
                order_by=_newest_first(),
            )
            .label("newest_first")
        )
        ranked = select(table.id, newest_first).subquery()
        stmt = (
            select(*columns(RecommendationRow))
            .join(ranked, ranked.c.id == table.id)
            .where(ranked.c.newest_first == 1)
            .order_by(table.target, table.model)
        )
        with self._read() as session:
            return [_stored_recommendation(r) for r in session.execute(stmt).mappings()]


def _get(session: Session, table: type[Any], row_id: int, what: str) -> Any:
    row = session.get(table, row_id)
    if row is None:
        raise KeyError(f"no {what} with id {row_id}")
    return row


_FINDING_STATES = frozenset({"active", "past", "all"})


def _open_or_since(since: float) -> ColumnElement[bool]:
    return or_(FindingRow.resolved_at.is_(None), FindingRow.created_at >= since)


def _oldest_first() -> tuple[ColumnElement[Any], ...]:
    """The order of recommendations: by creation time, a tie going to the later
    insert. "The latest" everywhere is the last one in this order."""
    table = RecommendationRow.__table__.c
    return table.created_at, table.id


def _newest_first() -> tuple[ColumnElement[Any], ...]:
    return tuple(column.desc() for column in _oldest_first())


def _stored_recommendation(row: RowValues) -> StoredRecommendation:
    return StoredRecommendation(
        id=row["id"],
        recommendation=recommendation_from(row),
        status=row["status"],
        applied_at=row["applied_at"],
        verification=row["verification"],
    )
