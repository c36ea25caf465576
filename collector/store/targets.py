"""Targets: their up/down bookkeeping, per-source transitions, and host facts."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from typing import Any, cast

from sqlalchemy import Connection, Table, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from collector.analysis.health import HOST_KIND, TRITON_KIND, scrape_decides, target_up
from collector.records import HostFacts
from collector.store.bulk import INCREMENT, KeyedUpdate
from collector.store.engine import Database, Executor
from collector.store.mapping import RowValues, columns, record_from, record_values
from collector.store.rows import ScrapeRecord, TargetState, TargetTransition
from collector.store.schema import HostFactsRow, TargetRow, TransitionRow

__all__ = ["TargetsMixin"]

# The columns that come from ``HostFacts``' fields (see ``schema.record_columns``).
_HOST_FACTS = cast(Table, HostFactsRow.__table__).c
_TARGETS = cast(Table, TargetRow.__table__)
_INSERT_TRANSITION = insert(cast(Table, TransitionRow.__table__))
# A scrape's record on its hot path (``Store.write_scrape``): compiled once.
_UPDATE_TARGET = KeyedUpdate(_TARGETS, "id")


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
        ``kind`` overwrites the stored kind. (``Store.write_scrape`` records a scrape
        the same way, in the transaction that stores its samples.)
        """
        scrape = ScrapeRecord(
            target, source, kind, started_at, duration_s, error_kind, error,
            interval_s=interval_s, first_in_run=first_in_run,
        )  # fmt: skip
        # Writes of one target in this process take turns, so the cached source
        # states are the ones the previous write committed.
        with self._target_lock(target):
            try:
                try:
                    return self._record_scrape(scrape)
                except (_TargetGone, IntegrityError):
                    # Deleted by someone else while its id was cached (the row, or the
                    # reference of a transition to it): found again, or made anew.
                    self._drop_cached(target)
                    return self._record_scrape(scrape)
            except BaseException:
                self._drop_cached(target)
                raise

    def forget_target(self, name: str) -> None:
        """Drop what this store keeps in memory about target ``name`` (for a target the
        collector no longer scrapes); its rows stay. A later write finds it again.

        Its lock stays: a writer that took the lock before this call would otherwise
        write under the old one while a later writer made a new one."""
        with self._target_lock(name):
            self._drop_cached(name)

    def _record_scrape(self, scrape: ScrapeRecord) -> TargetState:
        with self._write_connection() as connection:
            target_id = self._target_ids.get(scrape.target)
            if target_id is None:
                target_id = self._ensure_target(connection, scrape.target, scrape.kind)
            up_by_source, changes = self._scrape_record(connection, target_id, scrape)
            values = {
                name: _TARGETS.c[name] + 1 if value is INCREMENT else value
                for name, value in changes.items()
            }
            stmt = update(_TARGETS).where(_TARGETS.c.id == target_id).values(values)
            row = connection.execute(stmt.returning(*_TARGETS.c)).mappings().one_or_none()
            if row is None:
                raise _TargetGone(scrape.target)
        self._target_ids[scrape.target] = target_id
        self._source_up[target_id] = up_by_source
        return _target_state(row, up_by_source)

    def _write_scrape_record(
        self, connection: Connection, target_id: int, scrape: ScrapeRecord
    ) -> dict[str, bool]:
        """``record_scrape``'s write in the transaction of ``connection``, by a statement
        compiled once; the target's source states after it, for the write cache once
        the transaction commits."""
        up_by_source, changes = self._scrape_record(connection, target_id, scrape)
        if _UPDATE_TARGET.execute(connection, target_id, changes) == 0:
            raise _TargetGone(scrape.target)
        return up_by_source

    def _scrape_record(
        self, session: Executor, target_id: int, scrape: ScrapeRecord
    ) -> tuple[dict[str, bool], dict[str, Any]]:
        """Write the transition of ``scrape``'s source when its state changes; the
        target's source states after the scrape, and its row's changes."""
        ok = scrape.error_kind is None
        up_by_source = self._source_up.get(target_id)
        # Another deciding source (a fleet-mode and a direct collector of one
        # target) may be written by another process: its cached state may be old.
        if up_by_source is None or any(
            other != scrape.source and scrape_decides(scrape.kind, other) for other in up_by_source
        ):
            up_by_source = self._source_states(session, target_id).get(target_id, {})
        if up_by_source.get(scrape.source) != ok:
            transition = TargetTransition(
                scrape.target, scrape.source, scrape.started_at, ok, scrape.error_kind,
                scrape.error,
            )  # fmt: skip
            values = record_values(transition, skip=("target",))
            session.execute(_INSERT_TRANSITION, [{"target_id": target_id, **values}])
        up_by_source = {**up_by_source, scrape.source: ok}
        return up_by_source, _scrape_changes(scrape, up_by_source)

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
            states = self._source_states(session) if rows else {}
            return [_target_state(r, states.get(r["id"], {})) for r in rows]

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

    def _target_id(
        self, session: Executor, name: str, kind: str, known: list[Callable[[], None]]
    ) -> int:
        """The id of target ``name`` from the write cache, or ``_ensure_target``'s
        (cached through ``known`` once the write commits)."""
        target_id = self._target_ids.get(name)
        if target_id is None:
            target_id = self._ensure_target(session, name, kind)
            known.append(functools.partial(self._target_ids.__setitem__, name, target_id))
        return target_id

    def _write_server_version(
        self,
        session: Executor,
        target_id: int,
        version: str,
        known: list[Callable[[], None]],
        *,
        stale: bool = False,
    ) -> None:
        """Store the target's server version unless the write cache says it is stored
        already (and it is not ``stale``)."""
        if not stale and self._server_versions.get(target_id) == version:
            return
        stmt = update(_TARGETS).where(_TARGETS.c.id == target_id).values(server_version=version)
        session.execute(stmt)
        known.append(functools.partial(self._server_versions.__setitem__, target_id, version))

    def _ensure_target(self, session: Executor, name: str, kind: str) -> int:
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
        self, session: Executor, target_id: int | None = None
    ) -> dict[int, dict[str, bool]]:
        """Whether the latest scrape of every (target, source) succeeded (the latest
        transition's ``up``): its current state; of ``target_id``'s sources only when
        given. No ``IN (list of ids)`` here: SQLAlchemy leaves each such statement as a
        reference cycle, freed only by a full garbage collection, which a service runs
        once a minute (``tune_gc_for_service``), and this runs every detector pass."""
        latest = select(func.max(TransitionRow.id)).group_by(
            TransitionRow.target_id, TransitionRow.source
        )
        if target_id is not None:
            latest = latest.where(TransitionRow.target_id == target_id)
        stmt = select(TransitionRow.target_id, TransitionRow.source, TransitionRow.up).where(
            TransitionRow.id.in_(latest)
        )
        states: dict[int, dict[str, bool]] = defaultdict(dict)
        for target_id, source, up in session.execute(stmt):
            states[target_id][source] = up
        return states


class _TargetGone(LookupError):
    """The target's row is gone (deleted by someone else) while its id was cached."""

    def __init__(self, name: str) -> None:
        super().__init__(f"target {name!r} is no longer in the store; written again next time")


def _scrape_changes(scrape: ScrapeRecord, up_by_source: dict[str, bool]) -> dict[str, Any]:
    """The column changes of a target's row for one scrape (see ``record_scrape``);
    ``INCREMENT`` adds one to the stored count."""
    kind, source = scrape.kind, scrape.source
    changes: dict[str, Any] = {"kind": kind}
    if scrape.interval_s is not None and scrape.interval_s > 0:
        changes["interval_s"] = scrape.interval_s
    if not scrape_decides(kind, source):
        return changes
    up = target_up(kind, up_by_source)
    changes.update(last_scrape_at=scrape.started_at, last_duration_s=scrape.duration_s, up=up)
    if scrape.error_kind is not None:
        changes.update(
            consecutive_failures=1 if scrape.first_in_run else INCREMENT,
            last_error_kind=scrape.error_kind,
            last_error=scrape.error,
        )
    else:
        changes["last_seen_at"] = scrape.started_at
        if up:
            changes.update(consecutive_failures=0, last_error_kind=None, last_error=None)
        elif scrape.first_in_run:
            changes["consecutive_failures"] = 0
    return changes


def _target_state(row: RowValues, sources: dict[str, bool]) -> TargetState:
    return record_from(TargetState, row, extra={"sources": dict(sorted(sources.items()))})
