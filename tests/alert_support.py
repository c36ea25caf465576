"""Alert test helpers: a real webhook receiver on 127.0.0.1 that verifies signatures
with the ``standardwebhooks`` package, the signing secret the tests share, the open
findings that make an alert fire, and a real Alertmanager to send alerts to."""

from __future__ import annotations

import base64
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from collector.store import Store
from tests.support import free_port, start_process, stop_process, wait_until

__all__ = [
    "ALERTMANAGER",
    "SECRET",
    "Alertmanager",
    "Received",
    "Receiver",
    "add_saturation_findings",
]

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"

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
    context manager: the server stops on exit, also on failure, ending answers still
    held back. Subclasses decide answers otherwise by overriding ``_next_answer``."""

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
        self._release = threading.Event()  # set on exit: held answers end at once
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, extra = receiver._answer(headers, body, self.path)
                try:
                    self.send_response(status)
                    for name, value in extra.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:  # the sender gave up waiting and closed the connection
                    pass

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
            at = time.time()
            status, extra, delay_s = self._next_answer(headers)
            if verified is False:
                status, extra = 401, {}
            self.received.append(Received(at, path, headers, body, status, verified))
            hold, self._hold_first = self._hold_first, None
        if hold is not None:
            hold.wait(30)
        if delay_s > 0:
            self._release.wait(delay_s)
        return status, extra

    def _next_answer(self, headers: dict[str, str]) -> tuple[int, dict[str, str], float]:
        """The answer to a request with ``headers`` (called under the lock, in arrival
        order): its status, extra headers, and seconds to hold it back. Here the next
        scripted one, then 200 at once."""
        status, extra = self._script.pop(0) if self._script else (200, {})
        return status, extra, 0.0

    def delivered(self) -> dict[str, str]:
        """Bodies answered 2xx, deduped by webhook-id, as a receiver would keep them."""
        return {r.headers["webhook-id"]: r.body for r in self.received if 200 <= r.status < 300}

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
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


class Alertmanager:
    """A real Alertmanager (Debian's ``prometheus-alertmanager``) on a free port, its
    config and data in ``workdir``, routing every alert at once (no group wait, grouped
    by ``group_by``) to the webhook ``{forward_to}/from-alertmanager``, resolved alerts
    too with ``send_resolved``. ``start()`` and ``stop()`` at will: a restart keeps port
    and data. As a context manager it is started on entry and stopped on exit, also on
    failure."""

    def __init__(
        self,
        workdir: Path,
        forward_to: str,
        *,
        group_by: Sequence[str] = ("alertname",),
        send_resolved: bool = False,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = workdir
        self._config = workdir / "alertmanager.yml"
        self._config.write_text(
            "route:\n"
            "  receiver: test\n"
            f"  group_by: [{', '.join(group_by)}]\n"
            "  group_wait: 0s\n"
            "  group_interval: 1s\n"
            "  repeat_interval: 1h\n"
            "receivers:\n"
            "  - name: test\n"
            "    webhook_configs:\n"
            f"      - url: {forward_to}/from-alertmanager\n"
            + ("        send_resolved: true\n" if send_resolved else "")
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        """Start it and wait for its ``/-/ready``; fail with its log if it exits."""
        if shutil.which(ALERTMANAGER) is None:
            pytest.fail(f"{ALERTMANAGER} is missing: apt-get install prometheus-alertmanager")
        log_path = self._dir / f"alertmanager{self.starts}.log"
        with log_path.open("wb") as log:
            self.process = start_process(
                [
                    ALERTMANAGER,
                    f"--config.file={self._config}",
                    f"--storage.path={self._dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1
        process = self.process

        def ready() -> bool:
            assert process.poll() is None, f"Alertmanager exited: {log_path.read_text()}"
            try:
                return requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200
            except requests.ConnectionError:
                return False

        try:
            wait_until(ready, 20, "Alertmanager's /-/ready")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM, killed after 10 s; nothing when it is not running."""
        if self.process is not None:
            stop_process(self.process, timeout_s=10)
        self.process = None

    def __enter__(self) -> Alertmanager:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
