"""HttpFetcher against a tiny real HTTP server: which CollectError each failure is,
the same through libcurl as through a requests session, and the timeout in force."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from collector.errors import (
    CollectError,
    ResponseTooLarge,
    TargetDown,
    TargetHTTPError,
    TargetTimeout,
)
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
            self.server.slow_arrived.set()  # type: ignore[attr-defined]
            self.server.release.wait(5.0)  # type: ignore[attr-defined]
        if self.path == "/file":
            self.send_response(302)
            self.send_header("Location", "file:///etc/hostname")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/declared-huge":
            # Declares more than any cap, then holds the body back.
            self.send_response(200)
            self.send_header("Content-Length", str(10 * MIB))
            self.end_headers()
            self.wfile.flush()
            self.server.release.wait(5.0)  # type: ignore[attr-defined]
            return
        if self.path == "/error":
            page = b"<html><body>" + b"the receiver broke " * 5000 + b"</body></html>"
            self.send_response(503, "Busy Now")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.release = threading.Event()  # type: ignore[attr-defined]
    server.slow_arrived = threading.Event()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


@pytest.fixture
def base_url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def _failure(url: str, *, with_session: bool = False) -> CollectError:
    """The ``CollectError`` a GET of ``url`` raises (through libcurl, or a requests
    session)."""
    fetcher = HttpFetcher(
        timeout_s=5.0,
        max_response_bytes=MIB,
        session=requests.Session() if with_session else None,
    )
    try:
        with pytest.raises(CollectError) as caught:
            fetcher.get(url, "target 't'")
    finally:
        fetcher.close()
    return caught.value


@pytest.mark.parametrize("with_session", [False, True])
def test_too_many_redirects_is_a_request_failure(base_url: str, with_session: bool) -> None:
    failure = _failure(f"{base_url}/loop", with_session=with_session)
    assert type(failure) is CollectError
    assert failure.error_kind == "error"
    assert str(failure).startswith(f"request failed: GET {base_url}/loop (target 't')")


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


@pytest.mark.parametrize("with_session", [False, True])
def test_a_declared_length_over_the_cap_fails_before_the_body(
    base_url: str, with_session: bool
) -> None:
    started = time.monotonic()
    failure = _failure(f"{base_url}/declared-huge", with_session=with_session)
    assert time.monotonic() - started < 2.0  # not the 5 s the server holds the body back
    assert isinstance(failure, ResponseTooLarge)
    assert str(failure).startswith(f"response of {10 * MIB} bytes exceeds the cap")


@pytest.mark.parametrize("with_session", [False, True])
def test_an_error_page_is_named_by_its_status_and_start(base_url: str, with_session: bool) -> None:
    failure = _failure(f"{base_url}/error", with_session=with_session)
    message = str(failure)
    assert isinstance(failure, TargetHTTPError) and failure.status == 503
    assert message.startswith(f"HTTP 503 Busy Now: GET {base_url}/error (target 't'): <html>")
    assert "the receiver broke" in message and len(message) < 400


def test_a_redirect_off_http_is_refused(base_url: str) -> None:
    failure = _failure(f"{base_url}/file")
    assert type(failure) is CollectError
    assert str(failure).startswith(f"request failed: GET {base_url}/file (target 't')")


def test_scrapes_ignore_a_proxy_in_the_environment(
    base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy that refuses every connection: a GET sent to it would fail.
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{dead.getsockname()[1]}"
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    fetcher = HttpFetcher(timeout_s=5.0, max_response_bytes=MIB)
    try:
        assert fetcher.get(f"{base_url}/fast", "target 't'") == b"ok"
    finally:
        fetcher.close()


def test_one_fetcher_serves_threads_at_once(server: ThreadingHTTPServer, base_url: str) -> None:
    """A GET made while another holds the fetcher's handle gets a handle of its own."""
    fetcher = HttpFetcher(timeout_s=5.0, max_response_bytes=MIB)
    bodies: list[bytes] = []
    thread = threading.Thread(
        target=lambda: bodies.append(fetcher.get(f"{base_url}/slow", "target 't'"))
    )
    try:
        thread.start()
        assert server.slow_arrived.wait(5.0)  # type: ignore[attr-defined]
        # The slow GET holds the handle, its answer held back: another completes at once.
        assert fetcher.get(f"{base_url}/fast", "target 't'") == b"ok"
        assert bodies == []
        server.release.set()  # type: ignore[attr-defined]
        thread.join(5.0)
        assert bodies == [b"ok"]
        # And the handle is free again for the next GET.
        assert fetcher.get(f"{base_url}/fast", "target 't'") == b"ok"
    finally:
        server.release.set()  # type: ignore[attr-defined]
        thread.join(5.0)
        fetcher.close()


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on 127.0.0.1 with a self-signed certificate: its URL and the
    certificate's file."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.release = threading.Event()  # type: ignore[attr-defined]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}", cert
    server.shutdown()
    server.server_close()


def test_https_checks_the_certificate_against_what_python_trusts(
    tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, cert = tls_server
    failure = _failure(f"{url}/fast")
    assert isinstance(failure, TargetDown) and "certificate" in str(failure).lower()
    # Trusted through SSL_CERT_FILE, as Python's ssl would trust it: the GET succeeds.
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    fetcher = HttpFetcher(timeout_s=5.0, max_response_bytes=MIB)
    try:
        assert fetcher.get(f"{url}/fast", "target 't'") == b"ok"
    finally:
        fetcher.close()
