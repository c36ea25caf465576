"""Delivery from the outbox: each pending notification whose time has come is posted
to its receiver; the answer decides what becomes of it.

* 2xx: ``delivered``;
* 410 Gone: the receiver is marked gone (``Store.mark_receiver_gone``): this and every
  other notification for it is ``gone``, and nothing more is sent to it until the mark
  is cleared;
* another 4xx but 408, 425 and 429 (the receiver refuses this request: a bad body, a
  wrong signature or secret, no such path): ``dead`` at once with the answer as its
  reason, since the same request would be refused again;
* anything else (5xx, 408, 425, 429, a refused connection, a timeout): tried again
  after ``backoff_s × 2^(tries-1)`` (at most ``backoff_max_s``), drawn between half and
  all of that (jitter, so receivers coming back are not hit by every sender at once),
  or exactly when the receiver's ``Retry-After`` says; after ``max_attempts`` tries it
  is ``dead``.

A receiver that did not answer a try (refused, or no answer within ``timeout_s``) is
not tried again in the same pass: its other notifications stay due for the next one,
so a receiver that hangs holds up the others for one timeout, not one per alert.

Everything is in the store: a process that stops (or is killed) between two tries
leaves the notification ``pending``, and the next delivery — in this process or a new
one on the same store — takes it up. A notification posted but not yet recorded as
delivered is posted again: delivery is at least once, and the ``webhook-id`` it
carries (the same on every try) is how a receiver dedupes.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

import requests

from alerts.signing import signed_headers
from collector.config import AlertSettings, ReceiverSettings
from collector.store import Store
from collector.store.alerts import Notification

__all__ = [
    "Answer",
    "DeliveryReport",
    "DeliveryWorker",
    "backoff_s",
    "deliver_due",
    "post_notification",
    "refused_for_good",
    "retry_after_s",
]

log = logging.getLogger("batchscope.alerts")

_USER_AGENT = "batchscope-alerts"
# The longest answer body kept as the error of a failed try.
_ERROR_CHARS = 200
# 4xx answers that say "not now" rather than "never": tried again.
_RETRYABLE_4XX = frozenset({408, 425, 429})


def refused_for_good(status: int | None) -> bool:
    """Whether an answer refuses the request itself (another try gets the same): a 4xx
    other than 408 Request Timeout, 425 Too Early and 429 Too Many Requests."""
    return status is not None and 400 <= status < 500 and status not in _RETRYABLE_4XX


@dataclass(frozen=True)
class Answer:
    """What one try got: the HTTP ``status`` (``None``: no answer), the receiver's
    ``Retry-After`` in seconds, and an ``error`` to show when it failed."""

    status: int | None
    retry_after_s: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@dataclass
class DeliveryReport:
    """What one ``deliver_due`` call did, by outcome."""

    delivered: int = 0
    retried: int = 0
    dead: int = 0
    gone: int = 0
    # Slack receivers sent to in this call (one message each).
    slack_sent: set[str] = field(default_factory=set)

    @property
    def tried(self) -> int:
        return self.delivered + self.retried + self.dead + self.gone


def retry_after_s(value: str | None, now: float) -> float | None:
    """A ``Retry-After`` header in seconds from ``now``: delta-seconds or an HTTP date;
    ``None`` when absent or not understood."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        return max(parsedate_to_datetime(text).timestamp() - now, 0.0)
    except (TypeError, ValueError, IndexError):
        return None


def backoff_s(attempts: int, settings: AlertSettings, rng: random.Random) -> float:
    """How long to wait after the ``attempts``-th failed try: exponential, capped,
    with the upper half of it drawn at random."""
    full = min(settings.backoff_s * 2.0 ** max(attempts - 1, 0), settings.backoff_max_s)
    return full * rng.uniform(0.5, 1.0)


def post_notification(
    notification: Notification,
    receiver: ReceiverSettings,
    *,
    session: requests.Session,
    timeout_s: float,
    now: float,
) -> Answer:
    """One try: post the stored body with the Standard Webhooks headers (signed when
    the webhook has a secret)."""
    key = receiver.webhook.key if receiver.webhook is not None else None
    headers = {
        "Content-Type": "application/json",
        "User-Agent": _USER_AGENT,
        **signed_headers(key, notification.webhook_id, int(now), notification.body),
    }
    try:
        response = session.post(
            _url(receiver), data=notification.body.encode(), headers=headers, timeout=timeout_s
        )
    except requests.RequestException as exc:
        # The exception's text may hold the URL, and a Slack URL holds its token.
        return Answer(None, error=f"no answer: {type(exc).__name__}")
    with response:
        if 200 <= response.status_code < 300:
            return Answer(response.status_code)
        return Answer(
            response.status_code,
            retry_after_s(response.headers.get("Retry-After"), now),
            f"HTTP {response.status_code}: {response.text[:_ERROR_CHARS]}",
        )


def _url(receiver: ReceiverSettings) -> str:
    if receiver.webhook is not None:
        return receiver.webhook.url
    if receiver.slack is not None:
        return receiver.slack.url.get_secret_value()
    assert receiver.alertmanager is not None
    return receiver.alertmanager.url.rstrip("/") + "/api/v2/alerts"


def deliver_due(
    store: Store,
    settings: AlertSettings,
    *,
    now: float | None = None,
    session: requests.Session | None = None,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.time,
    only: Collection[str] | None = None,
    limit: int = 100,
) -> DeliveryReport:
    """Try the notifications due at ``now`` once each (those whose webhook-id is in
    ``only``, when given; at most ``limit``), oldest first: each is claimed in the
    store first (``Store.claim_due_notification``), so two deliveries on one store do
    not send it twice, and its outcome is recorded before the next. A Slack receiver
    gets at most one message per call (Slack takes about one a second; the worker
    calls every second). Returns what became of them."""
    now = clock() if now is None else now
    rng = rng or random.Random()
    report = DeliveryReport()
    # A read first: claiming is a write transaction, which on SQLite would take the
    # write lock from the collector every second while the outbox has nothing due.
    if not store.due_notifications(now, limit=1):
        return report
    gone = store.receivers_gone()
    # Claimed for longer than one try can take (connect and read, each up to the
    # timeout), so a live delivery never loses its claim to another.
    lease_s = settings.timeout_s * 2 + 5.0
    held_back: list[Notification] = []
    tried: list[int] = []  # each is tried once per call, even if due again already
    unanswered: set[str] = set()  # receivers that did not answer a try in this call
    own_session = session is None
    http = session or requests.Session()
    try:
        for _ in range(limit):
            n = store.claim_due_notification(
                now,
                lease_s=lease_s,
                webhook_ids=None if only is None else list(only),
                skip_ids=tried,
            )
            if n is None:
                break
            tried.append(n.id)
            outcome = _deliver_one(store, n, settings, gone, unanswered, http, rng, clock, report)
            if outcome == "held_back":
                held_back.append(n)
            elif outcome == "gone":
                gone = store.receivers_gone()
    finally:
        for n in held_back:  # due again at once, for the next call
            store.record_delivery_attempt(
                n.id,
                state="pending",
                attempts=n.attempts,
                next_attempt_at=n.next_attempt_at,
                last_status=n.last_status,
                last_error=n.last_error,
                finished_at=None,
            )
        if own_session:
            http.close()
    return report


def _deliver_one(
    store: Store,
    n: Notification,
    settings: AlertSettings,
    gone: dict[str, str],
    unanswered: set[str],
    http: requests.Session,
    rng: random.Random,
    clock: Callable[[], float],
    report: DeliveryReport,
) -> str:
    """Deliver one claimed notification and count it in ``report``; returns its
    outcome (``"held_back"``, not tried: a second Slack message in this call, or a
    receiver that did not answer an earlier try of this call, named in ``unanswered``)."""
    if n.receiver in gone:
        _finish(store, n, "gone", f"receiver gone: {gone[n.receiver]}", clock())
        report.gone += 1
        return "gone"
    try:
        receiver = settings.receiver(n.receiver)
    except KeyError:
        _finish(store, n, "dead", f"no receiver named {n.receiver!r} in the settings", clock())
        report.dead += 1
        return "dead"
    if receiver.name in unanswered:
        return "held_back"
    if receiver.slack is not None:
        if receiver.name in report.slack_sent:
            return "held_back"
        report.slack_sent.add(receiver.name)
    answer = post_notification(n, receiver, session=http, timeout_s=settings.timeout_s, now=clock())
    if answer.status is None:
        unanswered.add(receiver.name)
    outcome = _record(store, n, answer, settings, rng, clock())
    setattr(report, outcome, getattr(report, outcome) + 1)
    return outcome


def _finish(store: Store, n: Notification, state: str, error: str, at: float) -> None:
    """End a notification without trying it."""
    store.record_delivery_attempt(
        n.id,
        state=state,
        attempts=n.attempts,
        next_attempt_at=n.next_attempt_at,
        last_status=n.last_status,
        last_error=error,
        finished_at=at,
    )


def _record(
    store: Store,
    n: Notification,
    answer: Answer,
    settings: AlertSettings,
    rng: random.Random,
    at: float,
) -> str:
    """Store what the try came to; returns the ``DeliveryReport`` field it counts in."""
    attempts = n.attempts + 1
    if answer.ok:
        store.record_delivery_attempt(
            n.id,
            state="delivered",
            attempts=attempts,
            next_attempt_at=n.next_attempt_at,
            last_status=answer.status,
            last_error=None,
            finished_at=at,
        )
        return "delivered"
    if answer.status == 410:
        store.record_delivery_attempt(
            n.id,
            state="gone",
            attempts=attempts,
            next_attempt_at=n.next_attempt_at,
            last_status=410,
            last_error=answer.error,
            finished_at=at,
        )
        store.mark_receiver_gone(n.receiver, at, "answered 410 Gone")
        log.warning("alert receiver %s answered 410 Gone: nothing more is sent to it", n.receiver)
        return "gone"
    refused = refused_for_good(answer.status)
    dead = refused or attempts >= settings.max_attempts
    wait = answer.retry_after_s
    if wait is None:
        wait = backoff_s(attempts, settings, rng)
    store.record_delivery_attempt(
        n.id,
        state="dead" if dead else "pending",
        attempts=attempts,
        next_attempt_at=n.next_attempt_at if dead else at + wait,
        last_status=answer.status,
        last_error=answer.error,
        finished_at=at if dead else None,
    )
    if dead:
        log.warning(
            "alert notification %s to %s is dead after %d tries%s: %s",
            n.webhook_id,
            n.receiver,
            attempts,
            " (refused: not tried again)" if refused else "",
            answer.error,
        )
        return "dead"
    return "retried"


class DeliveryWorker:
    """Delivers from the outbox in a thread, every ``poll_s`` (default: the settings'
    ``deliver_every_s``), until ``stop()``."""

    def __init__(
        self, store: Store, settings: AlertSettings, *, poll_s: float | None = None
    ) -> None:
        self._store = store
        self._settings = settings
        self._poll_s = settings.deliver_every_s if poll_s is None else poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="alert-delivery", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with requests.Session() as session:
            while not self._stop.is_set():
                try:
                    deliver_due(self._store, self._settings, session=session)
                except Exception:  # a store error must not end delivery for good
                    log.exception("alert delivery failed; trying again")
                self._stop.wait(self._poll_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def __enter__(self) -> DeliveryWorker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
