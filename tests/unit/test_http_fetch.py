"""HttpFetcher against a tiny real HTTP server: which CollectError each failure is,
the same with urllib3's pools as with a requests session, and the timeout in force."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from collector.errors import CollectError, TargetTimeout
from collector.sources.http_fetch import MIB, HttpFetcher


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/loop"):
            # Redirects to itself for ever.
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/slow":
            self.server.release.wait(5.0)  # type: ignore[attr-defined]
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def base_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.release = threading.Event()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.release.set()  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("with_session", [False, True])
def test_too_many_redirects_is_a_request_failure(base_url: str, with_session: bool) -> None:
    fetcher = HttpFetcher(
        timeout_s=5.0,
        max_response_bytes=MIB,
        session=requests.Session() if with_session else None,
    )
    try:
        with pytest.raises(CollectError) as caught:
            fetcher.get(f"{base_url}/loop", "target 't'")
    finally:
        fetcher.close()
    assert type(caught.value) is CollectError
    assert caught.value.error_kind == "error"
    assert str(caught.value).startswith(f"request failed: GET {base_url}/loop (target 't')")


def test_a_timeout_changed_after_construction_is_the_one_used(base_url: str) -> None:
    fetcher = HttpFetcher(timeout_s=30.0, max_response_bytes=MIB)
    try:
        assert fetcher.get(f"{base_url}/fast", "target 't'") == b"ok"
        fetcher.timeout_s = 0.2
        started = time.monotonic()
        with pytest.raises(TargetTimeout, match="timed out after 0.2 s"):
            fetcher.get(f"{base_url}/slow", "target 't'")
        assert time.monotonic() - started < 3.0
    finally:
        fetcher.close()
