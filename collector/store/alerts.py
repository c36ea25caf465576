"""Alert states, silences and the notification outbox (``alerts``): their tables, the
typed records the store hands out, and the ``Store`` methods that read and write them.

* ``alert_states``: one row per alert, keyed by its fingerprint (rule + target +
  subject), so a restarted process continues every alert where it was;
* ``alert_silences``: who muted which alerts until when;
* ``alert_notifications``: the durable outbox. A notification is written here, in the
  same transaction as the state change that caused it, before anyone tries to send it;
  its ``webhook_id`` is the idempotency key receivers dedupe on;
* ``alert_receivers_gone``: receivers that answered 410 Gone; nothing is sent to them
  until the mark is cleared;
* ``alert_evaluator``: the one process that evaluates the rules, and until when.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import Index, Integer, UniqueConstraint, delete, func, insert, select, update
from sqlalchemy.orm import Mapped, mapped_column

from collector.store.engine import Database
from collector.store.mapping import columns, record_from
from collector.store.schema import ID, Base

__all__ = [
    "ALERT_STATES",
    "NOTIFICATION_STATES",
    "AlertState",
    "AlertsMixin",
    "NewNotification",
    "Notification",
    "Silence",
]

#: An alert is ``pending`` while its condition holds for less than its rule's ``for``,
#: then ``firing``, and ``resolved`` once the condition clears.
ALERT_STATES = ("pending", "firing", "resolved")
#: A notification is ``pending`` until it is ``delivered``, ``dead`` (every try
#: failed) or ``gone`` (its receiver answered 410 Gone).
NOTIFICATION_STATES = ("pending", "delivered", "dead", "gone")


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class AlertState:
    """One alert: a rule holding (or having held) for one subject of one target.

    ``subject`` is the model name or device uuid ("" for the target itself);
    ``active_since`` is when the condition started holding in this episode,
    ``fired_at`` when it turned firing (``None`` while pending), ``resolved_at`` when it
    cleared; ``held_at`` the latest evaluation at which the condition held and
    ``evaluated_at`` the latest evaluation of any outcome. ``labels`` and
    ``annotations`` are as notifications carry them."""

    fingerprint: str
    rule: str
    target: str
    subject: str
    state: str
    severity: str
    active_since: float
    evaluated_at: float
    held_at: float
    fired_at: float | None = None
    resolved_at: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Silence:
    """Notifications of alerts matching ``rule``, ``target`` and ``subject`` (``None``
    matches any) are held back from ``starts_at`` until ``ends_at``."""

    id: int
    starts_at: float
    ends_at: float
    rule: str | None = None
    target: str | None = None
    subject: str | None = None
    created_by: str = ""
    comment: str = ""

    def matches(self, state: AlertState, at: float) -> bool:
        return (
            self.starts_at <= at < self.ends_at
            and self.rule in (None, state.rule)
            and self.target in (None, state.target)
            and self.subject in (None, state.subject)
        )


@dataclass(frozen=True)
class NewNotification:
    """A notification to be sent: ``body`` exactly as it will be posted to
    ``receiver``; ``alert_status`` is ``firing``, ``resolved`` or ``test``."""

    webhook_id: str
    receiver: str
    fingerprint: str
    alert_status: str
    body: str
    created_at: float


@dataclass(frozen=True, kw_only=True)
class Notification(NewNotification):
    """A notification in the outbox and how its delivery stands: ``attempts`` made so
    far, the next at ``next_attempt_at`` (while ``pending``), the last answer's HTTP
    ``last_status`` (``None``: no answer) and ``last_error``, and when it reached its
    final state (``finished_at``)."""

    id: int
    state: str = "pending"
    attempts: int = 0
    next_attempt_at: float = 0.0
    last_status: int | None = None
    last_error: str | None = None
    finished_at: float | None = None


# --------------------------------------------------------------------------- tables


class AlertStateRow(Base):
    __tablename__ = "alert_states"

    fingerprint: Mapped[str] = mapped_column(primary_key=True)
    rule: Mapped[str]
    target: Mapped[str]
    subject: Mapped[str]
    state: Mapped[str]
    severity: Mapped[str]
    active_since: Mapped[float]
    evaluated_at: Mapped[float]
    held_at: Mapped[float]
    fired_at: Mapped[float | None]
    resolved_at: Mapped[float | None]
    labels: Mapped[dict[str, Any]]
    annotations: Mapped[dict[str, Any]]


class SilenceRow(Base):
    __tablename__ = "alert_silences"
    __table_args__ = (Index(None, "ends_at"),)

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    starts_at: Mapped[float]
    ends_at: Mapped[float]
    rule: Mapped[str | None]
    target: Mapped[str | None]
    subject: Mapped[str | None]
    created_by: Mapped[str]
    comment: Mapped[str]


class NotificationRow(Base):
    __tablename__ = "alert_notifications"
    __table_args__ = (
        UniqueConstraint("webhook_id"),
        Index(None, "state", "next_attempt_at"),
        Index(None, "fingerprint", "receiver", "created_at"),
    )

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    webhook_id: Mapped[str]
    receiver: Mapped[str]
    fingerprint: Mapped[str]
    alert_status: Mapped[str]
    body: Mapped[str]
    created_at: Mapped[float]
    state: Mapped[str]
    attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[float]
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None]
    finished_at: Mapped[float | None]


class AlertEvaluatorRow(Base):
    """Which process evaluates the alert rules on this store, until when (one row)."""

    __tablename__ = "alert_evaluator"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    holder: Mapped[str]
    until: Mapped[float]


class ReceiverGoneRow(Base):
    __tablename__ = "alert_receivers_gone"

    receiver: Mapped[str] = mapped_column(primary_key=True)
    gone_at: Mapped[float]
    reason: Mapped[str]


# --------------------------------------------------------------------------- methods


class AlertsMixin(Database):
    """``Store`` methods about alert states, silences and the notification outbox."""

    def alert_states(self, *, state: str | None = None) -> list[AlertState]:
        """Every alert (or those in ``state``), by rule, target and subject."""
        table = AlertStateRow
        stmt = select(*columns(table)).order_by(table.rule, table.target, table.subject)
        if state is not None:
            stmt = stmt.where(table.state == state)
        with self._read() as session:
            return [record_from(AlertState, r) for r in session.execute(stmt).mappings()]

    def save_alert_evaluation(
        self,
        changed: Iterable[AlertState],
        *,
        forget: Iterable[str] = (),
        notifications: Iterable[NewNotification] = (),
    ) -> None:
        """One evaluation's outcome in one transaction: the ``changed`` alerts written
        (by fingerprint), those in ``forget`` deleted, and the ``notifications`` it
        caused put in the outbox (``pending``, due at once). A crash leaves either all
        of it or none, so no state change is without its notification."""
        states = [asdict(s) for s in changed]
        gone = list(forget)
        rows = [_outbox_row(n) for n in notifications]
        with self._write() as session:
            for row in states:
                self._upsert(session, AlertStateRow, row, ("fingerprint",))
            if gone:
                session.execute(
                    delete(AlertStateRow)
                    .where(AlertStateRow.fingerprint.in_(gone))
                    .execution_options(synchronize_session=False)
                )
            if rows:
                session.execute(insert(NotificationRow), rows)

    def hold_alert_evaluation(self, holder: str, now: float, lease_s: float) -> bool:
        """Whether ``holder`` may evaluate the alert rules now: it holds the store's one
        evaluator lease (extended to ``now + lease_s``), or takes it because nobody
        holds it or the holder's lease ran out. Two processes evaluating one store
        would each decide to notify, and every receiver would hear twice."""
        with self._write() as session:
            row = session.get(AlertEvaluatorRow, 1)
            if row is not None and row.holder != holder and row.until > now:
                return False
            self._upsert(
                session,
                AlertEvaluatorRow,
                {"id": 1, "holder": holder, "until": float(now) + lease_s},
                ("id",),
            )
            return True

    def release_alert_evaluation(self, holder: str) -> bool:
        """End ``holder``'s evaluator lease (a process stopping cleanly), so that the
        next evaluator — this process restarted, or one standing by — takes over at
        its next pass instead of when the lease runs out. Returns whether it held it."""
        with self._write() as session:
            row = session.get(AlertEvaluatorRow, 1)
            if row is None or row.holder != holder:
                return False
            session.delete(row)
            return True

    # ------------------------------------------------------------------ silences

    def add_silence(
        self,
        *,
        starts_at: float,
        ends_at: float,
        rule: str | None = None,
        target: str | None = None,
        subject: str | None = None,
        created_by: str = "",
        comment: str = "",
    ) -> Silence:
        """Store a silence and return it. ``ValueError`` when it ends before it starts."""
        if ends_at <= starts_at:
            raise ValueError(f"a silence must end after it starts ({ends_at} <= {starts_at})")
        values = {
            "starts_at": float(starts_at),
            "ends_at": float(ends_at),
            "rule": rule,
            "target": target,
            "subject": subject,
            "created_by": created_by,
            "comment": comment,
        }
        with self._write() as session:
            new_id = session.scalars(insert(SilenceRow).returning(SilenceRow.id), [values]).one()
        return Silence(id=int(new_id), **values)  # type: ignore[arg-type]

    def silences(self, *, active_at: float | None = None) -> list[Silence]:
        """Every silence (or those in force at ``active_at``), oldest first."""
        stmt = select(*columns(SilenceRow)).order_by(SilenceRow.id)
        if active_at is not None:
            stmt = stmt.where(SilenceRow.starts_at <= active_at, SilenceRow.ends_at > active_at)
        with self._read() as session:
            return [record_from(Silence, r) for r in session.execute(stmt).mappings()]

    def end_silence(self, silence_id: int, at: float) -> None:
        """End a silence at ``at`` (if it would end later). ``KeyError`` when unknown."""
        with self._write() as session:
            row = session.get(SilenceRow, silence_id)
            if row is None:
                raise KeyError(f"no silence with id {silence_id}")
            row.ends_at = min(row.ends_at, max(float(at), row.starts_at))

    # ------------------------------------------------------------------ outbox

    def enqueue_notifications(self, notifications: Iterable[NewNotification]) -> None:
        """Put notifications in the outbox outside an evaluation (a test send)."""
        self.save_alert_evaluation((), notifications=notifications)

    def last_notified(self, fingerprints: Sequence[str]) -> dict[tuple[str, str], float]:
        """When each (fingerprint, receiver) pair of ``fingerprints`` was last given a
        notification (of any status), by ``created_at``."""
        if not fingerprints:
            return {}
        table = NotificationRow
        stmt = (
            select(table.fingerprint, table.receiver, func.max(table.created_at))
            .where(table.fingerprint.in_(list(fingerprints)))
            .group_by(table.fingerprint, table.receiver)
        )
        with self._read() as session:
            return {(fp, rc): float(at) for fp, rc, at in session.execute(stmt).all()}

    def due_notifications(self, now: float, *, limit: int = 100) -> list[Notification]:
        """Pending notifications whose next attempt is due at ``now``, oldest first."""
        table = NotificationRow
        stmt = (
            select(*columns(table))
            .where(table.state == "pending", table.next_attempt_at <= now)
            .order_by(table.next_attempt_at, table.id)
            .limit(limit)
        )
        with self._read() as session:
            return [record_from(Notification, r) for r in session.execute(stmt).mappings()]

    def claim_due_notification(
        self,
        now: float,
        *,
        lease_s: float,
        webhook_ids: Sequence[str] | None = None,
        skip_ids: Sequence[int] = (),
    ) -> Notification | None:
        """The oldest pending notification due at ``now`` (of ``webhook_ids``, when
        given; not one of ``skip_ids``), claimed for ``lease_s``: its next attempt
        moves to ``now + lease_s`` in the same transaction, so another delivery on the
        same store does not take it meanwhile, and one that dies while trying it
        leaves it to be tried again once the lease ends. ``None`` when nothing is
        due. The notification is returned as it was before the claim."""
        table = NotificationRow
        stmt = (
            select(*columns(table))
            .where(table.state == "pending", table.next_attempt_at <= now)
            .order_by(table.next_attempt_at, table.id)
            .limit(1)
        )
        if webhook_ids is not None:
            stmt = stmt.where(table.webhook_id.in_(list(webhook_ids)))
        if skip_ids:
            stmt = stmt.where(table.id.not_in(list(skip_ids)))
        if self._dialect == "postgresql":
            # SQLite's write transaction (BEGIN IMMEDIATE) already excludes others.
            stmt = stmt.with_for_update(skip_locked=True)
        with self._write() as session:
            row = session.execute(stmt).mappings().first()
            if row is None:
                return None
            claimed = record_from(Notification, row)
            session.execute(
                update(table)
                .where(table.id == claimed.id)
                .values(next_attempt_at=float(now) + lease_s)
            )
            return claimed

    def notifications(
        self, *, state: str | None = None, receiver: str | None = None, limit: int | None = None
    ) -> list[Notification]:
        """Notifications in the outbox, newest first."""
        table = NotificationRow
        stmt = select(*columns(table)).order_by(table.id.desc())
        if state is not None:
            stmt = stmt.where(table.state == state)
        if receiver is not None:
            stmt = stmt.where(table.receiver == receiver)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._read() as session:
            return [record_from(Notification, r) for r in session.execute(stmt).mappings()]

    def notification_counts(self) -> dict[tuple[str, str], int]:
        """How many notifications each (receiver, state) has in the outbox."""
        table = NotificationRow
        stmt = select(table.receiver, table.state, func.count()).group_by(
            table.receiver, table.state
        )
        with self._read() as session:
            return {(r, s): int(n) for r, s, n in session.execute(stmt).all()}

    def record_delivery_attempt(
        self,
        notification_id: int,
        *,
        state: str,
        attempts: int,
        next_attempt_at: float,
        last_status: int | None,
        last_error: str | None,
        finished_at: float | None,
    ) -> None:
        """What one delivery attempt came to. ``ValueError`` for an unknown state."""
        if state not in NOTIFICATION_STATES:
            raise ValueError(f"state must be one of {', '.join(NOTIFICATION_STATES)}")
        with self._write() as session:
            session.execute(
                update(NotificationRow)
                .where(NotificationRow.id == notification_id)
                .values(
                    state=state,
                    attempts=attempts,
                    next_attempt_at=next_attempt_at,
                    last_status=last_status,
                    last_error=last_error,
                    finished_at=finished_at,
                )
            )

    def prune_alerts(self, before: float) -> int:
        """Forget what is over and older than ``before``: notifications that reached a
        final state, resolved alerts, ended silences. Pending notifications and active
        alerts are never touched. Returns how many rows went."""
        with self._write() as session:
            deleted = 0
            for stmt in (
                delete(NotificationRow).where(
                    NotificationRow.state != "pending", NotificationRow.finished_at < before
                ),
                delete(AlertStateRow).where(
                    AlertStateRow.state == "resolved", AlertStateRow.resolved_at < before
                ),
                delete(SilenceRow).where(SilenceRow.ends_at < before),
            ):
                result = session.execute(stmt.execution_options(synchronize_session=False))
                deleted += int(getattr(result, "rowcount", 0) or 0)
            return deleted

    # ------------------------------------------------------------------ receivers gone

    def mark_receiver_gone(self, receiver: str, at: float, reason: str) -> None:
        """Stop sending to ``receiver`` (it answered 410): its pending notifications
        become ``gone`` now, and so will later ones until ``clear_receiver_gone``."""
        with self._write() as session:
            self._upsert(
                session,
                ReceiverGoneRow,
                {"receiver": receiver, "gone_at": float(at), "reason": reason},
                ("receiver",),
            )
            session.execute(
                update(NotificationRow)
                .where(NotificationRow.receiver == receiver, NotificationRow.state == "pending")
                .values(state="gone", finished_at=float(at), last_error=reason)
            )

    def receivers_gone(self) -> dict[str, str]:
        """The receivers marked gone, with the reason."""
        with self._read() as session:
            rows = session.execute(select(ReceiverGoneRow.receiver, ReceiverGoneRow.reason))
            return {name: reason for name, reason in rows.all()}

    def clear_receiver_gone(self, receiver: str) -> bool:
        """Send to ``receiver`` again; whether it was marked gone."""
        with self._write() as session:
            result = session.execute(
                delete(ReceiverGoneRow).where(ReceiverGoneRow.receiver == receiver)
            )
            return bool(getattr(result, "rowcount", 0))


def _outbox_row(n: NewNotification) -> Mapping[str, Any]:
    return {
        **asdict(n),
        "state": "pending",
        "attempts": 0,
        "next_attempt_at": n.created_at,
        "last_status": None,
        "last_error": None,
        "finished_at": None,
    }
