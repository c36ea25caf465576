"""Targets: their up/down bookkeeping, per-source transitions, and host facts."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import cast

from sqlalchemy import Table, func, select
from sqlalchemy.orm import Session

from collector.analysis.health import HOST_KIND, TRITON_KIND, scrape_decides, target_up
from collector.records import HostFacts
from collector.store.engine import Database
from collector.store.mapping import RowValues, columns, orm_values, record_from, record_values
from collector.store.rows import TargetState, TargetTransition
from collector.store.schema import HostFactsRow, TargetRow, TransitionRow

__all__ = ["TargetsMixin"]

# The columns that come from ``HostFacts``' fields (see ``schema.record_columns``).
_HOST_FACTS = cast(Table, HostFactsRow.__table__).c


class TargetsMixin(Database):
    """``Store`` methods about targets (see ``collector.store.Store``)."""

    def record_scrape(
        self,
        target: str,
        source: str,
        *,
        kind: str,
        started_at: float,
        duration_s: float,
        error_kind: str | None,
        error: str | None,
        interval_s: float | None = None,
        first_in_run: bool = False,
    ) -> TargetState:
        """Record that ``source`` scraped ``target``; it succeeded when ``error_kind``
        is ``None``. Returns the target's state after this scrape.

        ``interval_s`` is how often the scraping collector scrapes (kept when given,
        so readers can tell a target not scraped lately). ``first_in_run`` marks the
        first scrape of this source by a collector that just started: the failures
        in a row are counted from zero again, not on from an earlier run.

        Each (target, source) is tracked on its own: a ``TargetTransition`` is written
        for its first scrape and whenever it goes up→down or down→up (not while it
        stays down with another error). Which sources decide the *target's* state is
        ``collector.analysis.health``'s rule (for a Triton target, the Triton source;
        for a host, every source).

        On a deciding scrape, ``consecutive_failures`` grows by one when it failed and
        returns to 0 (with the last error cleared) once the target is up again.
        ``kind`` overwrites the stored kind.
        """
        ok = error_kind is None
        with self._write() as session:
            target_id = self._ensure_target(session, target, kind)
            row = session.get_one(TargetRow, target_id)
            states = self._source_states(session, [target_id]).get(target_id, {})
            previous = states.get(source)
            if previous is None or previous.up != ok:
                transition = TargetTransition(target, source, started_at, ok, error_kind, error)
                values = record_values(transition, skip=("target",))
                session.add(TransitionRow(target_id=target_id, **values))
            up_by_source = {name: t.up for name, t in states.items()}
            up_by_source[source] = ok
            row.kind = kind
            if interval_s is not None and interval_s > 0:
                row.interval_s = interval_s
            if scrape_decides(kind, source):
                if first_in_run:
                    row.consecutive_failures = 0
                row.last_scrape_at = started_at
                row.last_duration_s = duration_s
                up = target_up(kind, up_by_source)
                if not ok:
                    row.consecutive_failures += 1
                    row.last_error_kind = error_kind
                    row.last_error = error
                else:
                    row.last_seen_at = started_at
                    if up:
                        row.consecutive_failures = 0
                        row.last_error_kind = None
                        row.last_error = None
                row.up = up
            session.flush()
            return _target_state(orm_values(row), up_by_source)

    def record_endpoints(self, target: str, *, url: str, metrics_url: str) -> None:
        """Keep where the Triton ``target`` is scraped, for commands that are given only
        its HTTP URL (``batchscope apply`` finds the metrics URL here)."""
        with self._write() as session:
            row = session.get_one(TargetRow, self._ensure_target(session, target, TRITON_KIND))
            row.url = url
            row.metrics_url = metrics_url

    def targets(self) -> list[TargetState]:
        """Every known target, by name."""
        with self._read() as session:
            stmt = select(*columns(TargetRow)).order_by(TargetRow.name)
            rows = session.execute(stmt).mappings().all()
            states = self._source_states(session, [r["id"] for r in rows])
            return [
                _target_state(r, {s: t.up for s, t in states.get(r["id"], {}).items()})
                for r in rows
            ]

    def transitions(
        self, target: str, *, source: str | None = None, since: float | None = None
    ) -> list[TargetTransition]:
        """The up/down history of ``target`` (optionally one source, from ``since``
        inclusive), oldest first."""
        stmt = (
            select(*columns(TransitionRow))
            .join(TargetRow, TargetRow.id == TransitionRow.target_id)
            .where(TargetRow.name == target)
            .order_by(TransitionRow.id)
        )
        if source is not None:
            stmt = stmt.where(TransitionRow.source == source)
        if since is not None:
            stmt = stmt.where(TransitionRow.at >= since)
        with self._read() as session:
            return [
                record_from(TargetTransition, r, extra={"target": target})
                for r in session.execute(stmt).mappings()
            ]

    # ------------------------------------------------------------------ host facts

    def write_host_facts(self, target: str, facts: HostFacts) -> None:
        """Keep ``facts`` as the latest about the machine ``target`` runs on (an older
        reading than the one stored is ignored); a new target gets kind ``"host"``."""
        with self._write() as session:
            target_id = self._ensure_target(session, target, HOST_KIND)
            stored_at = session.scalar(
                select(_HOST_FACTS.collected_at).where(_HOST_FACTS.target_id == target_id)
            )
            if stored_at is not None and stored_at > facts.collected_at:
                return
            values = {"target_id": target_id, **record_values(facts, skip=("target",))}
            self._upsert(session, HostFactsRow, values, ["target_id"])

    def host_facts(self, target: str) -> HostFacts | None:
        """The latest facts about the machine ``target`` runs on; ``None`` when no host
        source has reported them."""
        stmt = (
            select(*columns(HostFactsRow))
            .join(TargetRow, TargetRow.id == HostFactsRow.target_id)
            .where(TargetRow.name == target)
        )
        with self._read() as session:
            row = session.execute(stmt).mappings().first()
        return None if row is None else record_from(HostFacts, row, extra={"target": target})

    # ------------------------------------------------------------------ internals

    def _ensure_target(self, session: Session, name: str, kind: str) -> int:
        """The id of target ``name``, created with ``kind`` if new, locked for the
        rest of the transaction on PostgreSQL so writers of one target serialise."""
        stmt = select(TargetRow.id).where(TargetRow.name == name).with_for_update()
        target_id = session.scalar(stmt)
        if target_id is None:
            self._insert_ignoring_duplicates(
                session,
                TargetRow,
                [{"name": name, "kind": kind, "consecutive_failures": 0}],
                ["name"],
            )
            target_id = session.scalar(stmt)
        assert target_id is not None  # inserted just above, or by a concurrent writer
        return target_id

    def _source_states(
        self, session: Session, target_ids: Sequence[int]
    ) -> dict[int, dict[str, TransitionRow]]:
        """The latest transition of every (target, source), i.e. its current state."""
        if not target_ids:
            return {}
        latest = (
            select(func.max(TransitionRow.id))
            .where(TransitionRow.target_id.in_(target_ids))
            .group_by(TransitionRow.target_id, TransitionRow.source)
        )
        states: dict[int, dict[str, TransitionRow]] = defaultdict(dict)
        for t in session.scalars(select(TransitionRow).where(TransitionRow.id.in_(latest))):
            states[t.target_id][t.source] = t
        return states


def _target_state(row: RowValues, sources: dict[str, bool]) -> TargetState:
    return record_from(TargetState, row, extra={"sources": dict(sorted(sources.items()))})
