"""Alert test helpers: a real webhook receiver on 127.0.0.1 that verifies signatures
with the ``standardwebhooks`` package, the signing secret the tests share, and the
open findings that make an alert fire."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from collector.store import Store

__all__ = ["SECRET", "Received", "Receiver", "add_saturation_findings"]

SECRET = "whsec_" + base64.b64encode(b"batchscope-test-signing-key-32b!").decode()


@dataclass(frozen=True)
class Received:
    at: float
    path: str
    headers: dict[str, str]
    body: str
    status: int  # what the receiver answered
    verified: bool | None  # the signature, by standardwebhooks (None: not checked)


class Receiver:
    """A real HTTP server on 127.0.0.1 (a free port) answering each POST with the next
    scripted (status, headers), then 200; it records every request and, given a
    secret, verifies each signature with ``standardwebhooks`` and answers 401 to a bad
    one. ``port`` 0 (the default) takes a free one. With ``hold_first``, the first
    request is recorded at once but answered only once that event is set. Use as a
    context manager: the server stops on exit, also on failure."""

    def __init__(
        self,
        *,
        secret: str | None = None,
        script: Sequence[tuple[int, dict[str, str]]] = (),
        port: int = 0,
        hold_first: threading.Event | None = None,
    ) -> None:
        self.received: list[Received] = []
        self._script = list(script)
        self._lock = threading.Lock()
        self._verifier = Webhook(secret) if secret else None
        self._hold_first = hold_first
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, extra = receiver._answer(headers, body, self.path)
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def _answer(self, headers: dict[str, str], body: str, path: str) -> tuple[int, dict[str, str]]:
        verified = None
        if self._verifier is not None:
            try:
                self._verifier.verify(body, headers)
                verified = True
            except WebhookVerificationError:
                verified = False
        with self._lock:
            status, extra = self._script.pop(0) if self._script else (200, {})
            if verified is False:
                status, extra = 401, {}
            self.received.append(Received(time.time(), path, headers, body, status, verified))
            hold, self._hold_first = self._hold_first, None
        if hold is not None:
            hold.wait(30)
        return status, extra

    def delivered(self) -> dict[str, str]:
        """Bodies answered 2xx, deduped by webhook-id, as a receiver would keep them."""
        return {r.headers["webhook-id"]: r.body for r in self.received if 200 <= r.status < 300}

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def add_saturation_findings(store: Store, models: Sequence[str], at: float) -> None:
    """An open queue_saturation finding per model, as the detectors open them."""
    for model in models:
        store.add_finding(
            kind="queue_saturation",
            severity="warning",
            target="triton-a",
            subject=model,
            summary=f"{model} queues",
            window_start=at - 30,
            window_end=at,
            evidence={"queue_share": 0.7},
            created_at=at,
        )
