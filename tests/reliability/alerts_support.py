"""Alert fault helpers: a webhook receiver on 127.0.0.1 whose every answer (a status,
and how long it waits before answering) is decided per request by a plan, recording
what it received; and the outbox counts a fault test compares with what arrived."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from collector.store import Store

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


class PlannedReceiver:
    """A real HTTP server on 127.0.0.1 (``port`` 0: a free one) answering each POST as
    ``plan`` says. ``delivered()`` is what a receiver that dedupes by webhook-id keeps:
    the ids answered 2xx. Use as a context manager; it stops on exit, also on failure."""

    def __init__(self, plan: Plan, *, port: int = 0) -> None:
        self.hits: list[Hit] = []
        self._plan = plan
        self._lock = threading.Lock()
        self._tries: dict[str, int] = {}
        self._release = threading.Event()  # set on exit: held answers end at once
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = receiver._answer(self.headers.get("webhook-id", ""))
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:  # the sender gave up waiting and closed the connection
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def _answer(self, webhook_id: str) -> int:
        at = time.time()
        with self._lock:
            tries = self._tries.get(webhook_id, 0) + 1
            self._tries[webhook_id] = tries
            status, delay_s = self._plan(webhook_id, tries)
            self.hits.append(Hit(at, webhook_id, tries, status, delay_s))
        if delay_s > 0:
            self._release.wait(delay_s)
        return status

    def delivered(self) -> set[str]:
        with self._lock:
            return {h.webhook_id for h in self.hits if 200 <= h.status < 300}

    def requests(self) -> int:
        with self._lock:
            return len(self.hits)

    def __enter__(self) -> PlannedReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def outbox_counts(store: Store, receiver: str | None = None) -> dict[str, int]:
    """Notifications per state (pending, delivered, dead, gone), of one receiver or all."""
    counts = {"pending": 0, "delivered": 0, "dead": 0, "gone": 0}
    for (name, state), n in store.notification_counts().items():
        if receiver is None or name == receiver:
            counts[state] = counts.get(state, 0) + n
    return counts
