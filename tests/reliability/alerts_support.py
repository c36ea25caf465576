"""Alert fault helpers: the test webhook receiver with its every answer (a status, and
how long it waits before answering) decided per request by a plan; and the outbox
counts a fault test compares with what arrived."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from collector.store import Store
from tests.alert_support import Receiver

__all__ = ["Hit", "PlannedReceiver", "outbox_counts"]


@dataclass(frozen=True)
class Hit:
    at: float  # when the request arrived
    webhook_id: str
    tries: int  # this webhook-id's number of requests so far, this one included
    status: int  # what was answered
    delay_s: float  # how long the answer was held back


# (webhook-id, its number of tries so far) -> (status, seconds to wait before answering)
Plan = Callable[[str, int], tuple[int, float]]


class PlannedReceiver(Receiver):
    """The test webhook receiver (``tests.alert_support.Receiver``: a real HTTP server
    on 127.0.0.1, ``port`` 0: a free one) answering each POST as ``plan`` says, each
    request recorded as a ``Hit`` too. ``delivered()`` is what a receiver that dedupes
    by webhook-id keeps: the bodies answered 2xx, by id. Use as a context manager; it
    stops on exit, also on failure, ending answers still held back."""

    def __init__(self, plan: Plan, *, port: int = 0) -> None:
        super().__init__(port=port)
        self.hits: list[Hit] = []
        self._plan = plan
        self._tries: dict[str, int] = {}

    def _next_answer(self, headers: dict[str, str]) -> tuple[int, dict[str, str], float]:
        webhook_id = headers.get("webhook-id", "")
        tries = self._tries.get(webhook_id, 0) + 1
        self._tries[webhook_id] = tries
        status, delay_s = self._plan(webhook_id, tries)
        self.hits.append(Hit(time.time(), webhook_id, tries, status, delay_s))
        return status, {}, delay_s

    def requests(self) -> int:
        with self._lock:
            return len(self.hits)


def outbox_counts(store: Store, receiver: str | None = None) -> dict[str, int]:
    """Notifications per state (pending, delivered, dead, gone), of one receiver or all."""
    counts = {"pending": 0, "delivered": 0, "dead": 0, "gone": 0}
    for (name, state), n in store.notification_counts().items():
        if receiver is None or name == receiver:
            counts[state] = counts.get(state, 0) + n
    return counts
