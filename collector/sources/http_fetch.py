"""One bounded HTTP GET, the *fetch* step of an HTTP source.

``HttpFetcher.get`` reads one URL with connect and read timeouts, a total deadline and
a cap on the body, and turns every failure into the ``collector.errors.CollectError``
that says why: ``TargetDown``, ``TargetTimeout``, ``TargetHTTPError``,
``ResponseTooLarge`` or ``ParseError`` (an undecodable body). Nothing in it is specific
to Triton, so any source that scrapes an HTTP endpoint can use it.

Without a ``requests`` session of the caller's, a GET goes through libcurl (``pycurl``),
one handle per fetcher, its connections kept alive across scrapes: libcurl reads the
response, headers included, in C, without holding the GIL, and enforces the connect
timeout and the deadline itself. A scrape's GET costs about a quarter of the CPU that
urllib3's pools spent on it, which matters at hundreds of targets.

With a session (``batchscope apply``), requests go through it and urllib3. The deadline
holds there too from the request's start to the body's last byte, the status line and
headers included: the connections read the response through ``_DeadlineReader``, which
clips every receive to what is left of the deadline, so a server that sends its headers
a byte at a time cannot hold a request (a per-read timeout alone never fires while bytes
keep coming).
"""

from __future__ import annotations

import contextlib
import http.client
import io
import socket
import ssl
import threading
import time
from collections.abc import Generator
from typing import Any

import pycurl
import requests
import urllib3
import urllib3.connection
import urllib3.connectionpool
import urllib3.exceptions
from requests.adapters import HTTPAdapter

from collector.errors import (
    CollectError,
    ParseError,
    ResponseTooLarge,
    TargetDown,
    TargetHTTPError,
    TargetTimeout,
)

__all__ = ["HttpFetcher", "MIB"]

MIB = 1024 * 1024
_READ_CHUNK = 64 * 1024
_ERROR_EXCERPT_BYTES = 512
_ERROR_EXCERPT_CHARS = 200


# ---------------------------------------------------------------- the deadline's reader

# The deadline (time.monotonic()) of the GET this thread is making, read by the
# response of the connection that GET uses (the pools give no other way to pass it).
_request = threading.local()


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes (through its own ``makefile``, which keeps the socket open
    while a response reads it, as ``http.client`` expects), each receive bounded by
    what is left of the deadline of the request that opened the response
    (``TimeoutError`` once it is past) and by the socket's own timeout."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no complete response within the deadline")
        timeout = self._sock.gettimeout()
        if timeout is not None and timeout <= remaining:
            return self._raw.readinto(buffer)
        self._sock.settimeout(remaining)
        try:
            return self._raw.readinto(buffer)
        finally:
            with contextlib.suppress(OSError):  # closed meanwhile
                self._sock.settimeout(timeout)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineSocket:
    """What ``http.client.HTTPResponse`` asks of its socket: a file to read from."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))


class _DeadlineResponse(http.client.HTTPResponse):
    """``http.client``'s response, reading through ``_DeadlineReader`` when the thread's
    GET has a deadline (a response on a connection of ours read outside a GET of
    ``HttpFetcher``, if any, reads as usual)."""

    def __init__(
        self,
        sock: socket.socket,
        debuglevel: int = 0,
        method: str | None = None,
        url: str | None = None,
    ) -> None:
        deadline: float | None = getattr(_request, "deadline", None)
        reader: Any = sock if deadline is None else _DeadlineSocket(sock, deadline)
        super().__init__(reader, debuglevel, method, url)


class _HTTPConnection(urllib3.connection.HTTPConnection):
    response_class = _DeadlineResponse


class _HTTPSConnection(urllib3.connection.HTTPSConnection):
    response_class = _DeadlineResponse


class _HTTPConnectionPool(urllib3.connectionpool.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSConnectionPool(urllib3.connectionpool.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOL_CLASSES = {"http": _HTTPConnectionPool, "https": _HTTPSConnectionPool}


def _deadline_pools(pools: urllib3.PoolManager) -> urllib3.PoolManager:
    """``pools``, making connections that read responses within the GET's deadline."""
    pools.pool_classes_by_scheme = dict(_POOL_CLASSES)
    return pools


@contextlib.contextmanager
def _deadline_of_request(deadline: float) -> Generator[None, None, None]:
    _request.deadline = deadline
    try:
        yield
    finally:
        _request.deadline = None


# Why a transfer was cut short by us (``_Transfer.cut``).
_CUT_DECLARED = "declared"  # a 2xx whose Content-Length is over the cap
_CUT_BODY = "body"  # a 2xx whose body grew over the cap
_CUT_EXCERPT = "excerpt"  # an error page: its start is all a message needs


def _ignore(data: bytes) -> None:
    """A callback that takes what libcurl hands it and keeps nothing."""


class _Transfer:
    """One GET through libcurl: the last response's status line, declared length and
    encoding as its headers arrive (after a redirect, those of the next response), and
    its body within the cap -- or the start of an error page -- cut short otherwise."""

    __slots__ = (
        "cap",
        "chunks",
        "cut",
        "encoded",
        "headers_done",
        "length",
        "reason",
        "size",
        "status",
    )

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.chunks: list[bytes] = []
        self.size = 0
        self.status: int | None = None
        self.reason = ""
        self.length: int | None = None
        self.encoded = False
        self.headers_done = False
        self.cut: str | None = None

    def header(self, line: bytes) -> int | None:
        """libcurl's header callback; 0 (not the line's length) aborts the transfer."""
        if line.startswith(b"HTTP/"):
            parts = line.split(None, 2)
            try:
                self.status = int(parts[1])
            except (IndexError, ValueError):
                self.status = None
            self.reason = parts[2].decode("latin-1").strip() if len(parts) > 2 else ""
            self.length, self.encoded, self.headers_done = None, False, False
        elif not line.strip():
            self.headers_done = True
            status, length = self.status, self.length
            if (
                status is not None
                and 200 <= status < 300
                and length is not None
                and length > self.cap
                and not self.encoded  # an encoded length says nothing of the decoded size
            ):
                self.cut = _CUT_DECLARED
                return 0
        else:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    self.length = int(value.strip())
                except ValueError:
                    self.length = None
            elif name == b"content-encoding":
                self.encoded = value.strip().lower() not in (b"", b"identity")
        return None

    def write(self, data: bytes) -> int | None:
        """libcurl's body callback; 0 (not the data's length) aborts the transfer."""
        self.chunks.append(data)
        self.size += len(data)
        status = self.status
        if status is not None and 200 <= status < 300:
            if self.size > self.cap:
                self.chunks.clear()  # let go of what was read at once
                self.cut = _CUT_BODY
                return 0
        elif self.size > _ERROR_EXCERPT_BYTES:
            self.cut = _CUT_EXCERPT
            return 0
        return None


class _CurlHandles:
    """A fetcher's libcurl handle, which keeps its connections alive between GETs; a
    GET made while another holds it (one fetcher shared by threads) gets a handle of its
    own for that GET."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._curl: pycurl.Curl | None = _new_curl()

    @contextlib.contextmanager
    def handle(self) -> Generator[pycurl.Curl, None, None]:
        if self._lock.acquire(blocking=False):
            try:
                if self._curl is None:
                    self._curl = _new_curl()  # closed, then used again
                yield self._curl
            finally:
                self._lock.release()
            return
        extra = _new_curl()
        try:
            yield extra
        finally:
            extra.close()

    def close(self) -> None:
        with self._lock:
            if self._curl is not None:
                self._curl.close()
                self._curl = None


_WEB = pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS


def _new_curl() -> pycurl.Curl:
    """A handle for scrapes: no signals (libcurl runs in threads), no proxy from the
    environment, HTTP and HTTPS only, redirects followed as requests would."""
    curl = pycurl.Curl()
    curl.setopt(pycurl.NOSIGNAL, 1)
    curl.setopt(pycurl.PROXY, "")
    curl.setopt(pycurl.PROTOCOLS, _WEB)
    curl.setopt(pycurl.REDIR_PROTOCOLS, _WEB)
    curl.setopt(pycurl.FOLLOWLOCATION, 1)
    curl.setopt(pycurl.MAXREDIRS, 30)
    curl.setopt(pycurl.USERAGENT, "batchscope")
    # HTTPS trusts what Python's ssl trusts here (SSL_CERT_FILE/SSL_CERT_DIR, else the
    # system's store), not a path compiled into libcurl.
    trusted = ssl.get_default_verify_paths()
    if trusted.cafile:
        curl.setopt(pycurl.CAINFO, trusted.cafile)
    if trusted.capath:
        curl.setopt(pycurl.CAPATH, trusted.capath)
    return curl


class HttpFetcher:
    """Bounded GETs over kept-alive connections.

    ``session`` is owned by the fetcher from then on: ``close()`` closes it. Without
    one, GETs go through libcurl, ignoring the environment: a scrape goes exactly where
    the settings say, with no proxies or netrc, over HTTP or HTTPS only (redirects
    too). Pass a ``requests`` session of your own to get proxies and netrc.
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        max_response_bytes: int,
        session: requests.Session | None = None,
    ) -> None:
        self._session = session
        self._curl = _CurlHandles() if session is None else None
        if session is not None:
            # The session's own adapters (not its proxies') read within the deadline too.
            for adapter in session.adapters.values():
                if isinstance(adapter, HTTPAdapter):
                    _deadline_pools(adapter.poolmanager)
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
        if self._curl is not None:
            self._curl.close()

    def get(self, url: str, who: str) -> bytes:
        """GET ``url`` and return its body, or raise the ``CollectError`` that says why not.

        ``who`` names the endpoint's owner in messages (``target 'a'``). The connect
        timeout and the read timeout (the longest wait for any one read) are both
        ``timeout_s``; on top of them the whole response must be complete within
        ``timeout_s`` of the request's start, status line and headers included, so a
        server that drips bytes cannot hold a collection for long.
        """
        where = f"GET {url} ({who})"
        if self._curl is not None:
            return self._get_curl(self._curl, url, where)
        deadline = time.monotonic() + self.timeout_s
        with _deadline_of_request(deadline):
            return self._get_session(url, deadline, where)

    def _get_session(self, url: str, deadline: float, where: str) -> bytes:
        """``get`` through the caller's ``requests`` session."""
        assert self._session is not None
        try:
            response = self._session.get(
                url,
                timeout=(self.timeout_s, self.timeout_s),
                stream=True,
                # Uncompressed, so the byte cap is a cap on what we hold in memory.
                headers={"Accept-Encoding": "identity"},
            )
        except requests.exceptions.Timeout as exc:  # ConnectTimeout and ReadTimeout
            raise TargetTimeout(f"timed out after {self.timeout_s:g} s: {where}") from exc
        except requests.exceptions.ConnectionError as exc:
            raise TargetDown(f"connection failed: {where}: {_reason(exc)}") from exc
        except requests.exceptions.RequestException as exc:
            raise CollectError(f"request failed: {where}: {_reason(exc)}") from exc
        with response:
            body = self._body(response, deadline, where)
            # The whole body was read: hand the connection back to the pool for reuse
            # (closing the response would otherwise close it).
            release = getattr(response.raw, "release_conn", None)
            if release is not None:
                release()
            return body

    def _get_curl(self, handles: _CurlHandles, url: str, where: str) -> bytes:
        """``get`` through libcurl."""
        if not url.lower().startswith(("http://", "https://")):
            raise CollectError(f"request failed: {where}: not an http:// or https:// URL")
        transfer = _Transfer(self.max_response_bytes)
        timeout_ms = max(int(self.timeout_s * 1000), 1)
        with handles.handle() as curl:
            # Set per GET: a timeout_s or cap changed since construction holds at once.
            curl.setopt(pycurl.URL, url)
            curl.setopt(pycurl.CONNECTTIMEOUT_MS, timeout_ms)
            curl.setopt(pycurl.TIMEOUT_MS, timeout_ms)  # the whole GET, headers included
            curl.setopt(pycurl.HEADERFUNCTION, transfer.header)
            curl.setopt(pycurl.WRITEFUNCTION, transfer.write)
            try:
                curl.perform()
            except pycurl.error as exc:
                failure = self._curl_failure(transfer, exc, where)
                if failure is not None:
                    raise failure from None
            finally:
                # Drop the callbacks' hold on this transfer (and its body) at once.
                curl.setopt(pycurl.HEADERFUNCTION, _ignore)
                curl.setopt(pycurl.WRITEFUNCTION, _ignore)
        status = transfer.status
        if status is None or not 200 <= status < 300:
            excerpt = _excerpt(b"".join(transfer.chunks)[:_ERROR_EXCERPT_BYTES])
            raise TargetHTTPError(
                f"HTTP {status} {transfer.reason}".rstrip()
                + f": {where}"
                + (f": {excerpt}" if excerpt else ""),
                status=status or 0,
            )
        body = b"".join(transfer.chunks)
        transfer.chunks.clear()
        return body

    def _curl_failure(
        self, transfer: _Transfer, exc: pycurl.error, where: str
    ) -> CollectError | None:
        """The ``CollectError`` for a libcurl transfer that ended in ``exc``; ``None``
        when it was an error page cut short on purpose (its status is the error)."""
        code, message = exc.args[0], " ".join(str(exc.args[-1]).split())
        reason = message[:_ERROR_EXCERPT_CHARS] or f"libcurl error {code}"
        if transfer.cut == _CUT_EXCERPT:
            return None
        if transfer.cut == _CUT_DECLARED:
            return ResponseTooLarge(
                f"response of {transfer.length} bytes exceeds the cap of "
                f"{self.max_response_bytes} bytes: {where}"
            )
        if transfer.cut == _CUT_BODY:
            return ResponseTooLarge(
                f"response exceeds the cap of {self.max_response_bytes} bytes: {where}"
            )
        if code == pycurl.E_OPERATION_TIMEDOUT:
            if transfer.size > 0:  # the body had begun: it did not end in time
                return self._incomplete(where)
            return TargetTimeout(f"timed out after {self.timeout_s:g} s: {where}")
        redirected = transfer.status is not None and 300 <= transfer.status < 400
        if code in (pycurl.E_TOO_MANY_REDIRECTS, pycurl.E_URL_MALFORMAT) or (
            code == pycurl.E_UNSUPPORTED_PROTOCOL and redirected  # to file://, ftp://...
        ):
            return CollectError(f"request failed: {where}: {reason}")
        if code == pycurl.E_BAD_CONTENT_ENCODING:
            return ParseError(f"undecodable response body: {where}: {reason}")
        if transfer.status is not None and transfer.headers_done:
            # A reset, or a close before the declared length: the server went away.
            return TargetDown(f"connection broken while reading: {where}: {reason}")
        return TargetDown(f"connection failed: {where}: {reason}")

    def _body(self, response: _Response, deadline: float, where: str) -> bytes:
        """The body of a 2xx response within the cap; every failure as a ``CollectError``."""
        try:
            if not 200 <= response.status_code < 300:
                excerpt = self._error_excerpt(response, deadline, where)
                raise TargetHTTPError(
                    f"HTTP {response.status_code} {response.reason or ''}".rstrip()
                    + f": {where}"
                    + (f": {excerpt}" if excerpt else ""),
                    status=response.status_code,
                )
            declared = _content_length(response)
            if declared is not None and declared > self.max_response_bytes:
                raise ResponseTooLarge(
                    f"response of {declared} bytes exceeds the cap of "
                    f"{self.max_response_bytes} bytes: {where}"
                )
            return self._read(response, deadline, self.max_response_bytes, where, excerpt=False)
        except (urllib3.exceptions.ReadTimeoutError, requests.exceptions.Timeout) as exc:
            raise TargetTimeout(f"timed out after {self.timeout_s:g} s: {where}") from exc
        except (
            urllib3.exceptions.DecodeError,
            requests.exceptions.ContentDecodingError,
        ) as exc:
            raise ParseError(f"undecodable response body: {where}: {_reason(exc)}") from exc
        except (
            urllib3.exceptions.HTTPError,
            requests.exceptions.RequestException,
            OSError,
        ) as exc:
            # A reset, or a close before the declared length: the server went away.
            raise TargetDown(f"connection broken while reading: {where}: {_reason(exc)}") from exc

    def _error_excerpt(self, response: _Response, deadline: float, where: str) -> str:
        """The start of an error body, best effort: a status is reason enough to fail,
        and an unreadable error page must not turn it into a different error."""
        try:
            return _excerpt(
                self._read(response, deadline, _ERROR_EXCERPT_BYTES, where, excerpt=True)
            )
        except (
            CollectError,
            urllib3.exceptions.HTTPError,
            requests.exceptions.RequestException,
            OSError,
        ):
            return ""

    def _read(
        self, response: _Response, deadline: float, limit: int, where: str, *, excerpt: bool
    ) -> bytes:
        """Read the body until its end or until more than ``limit`` bytes are in hand:
        then an ``excerpt`` is what was read (at most one chunk more than ``limit``),
        and a body is ``ResponseTooLarge`` (what was read is let go at once, not joined
        into one more copy). Raises ``TargetTimeout`` past ``deadline``."""
        chunks: list[bytes] = []
        total = 0
        # closing(): leaving early must still run _chunks' cleanup (socket timeout) now.
        with contextlib.closing(self._chunks(response, deadline, where)) as stream:
            for chunk in stream:
                chunks.append(chunk)
                total += len(chunk)
                if total > limit:
                    if excerpt:
                        break
                    chunks.clear()
                    raise ResponseTooLarge(
                        f"response exceeds the cap of {self.max_response_bytes} bytes: {where}"
                    )
                if time.monotonic() >= deadline:
                    raise self._incomplete(where)
        return b"".join(chunks)

    def _chunks(
        self, response: _Response, deadline: float, where: str
    ) -> Generator[bytes, None, None]:
        raw = response.raw
        read1 = getattr(raw, "read1", None)
        if read1 is None:
            # Not a urllib3 >= 2 response (an older urllib3, a test adapter): chunk by
            # chunk, with the deadline checked between chunks only.
            yield from response.iter_content(_READ_CHUNK)
            return
        sock = _socket_of(raw)
        saved = sock.gettimeout() if sock is not None else None
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._incomplete(where)
                if sock is not None:
                    # read1 makes at most one recv, so clipping the socket timeout to
                    # what is left of the deadline bounds the whole read by it.
                    sock.settimeout(min(self.timeout_s, remaining))
                chunk = read1(_READ_CHUNK, decode_content=True)
                if not chunk:
                    return
                yield chunk
        finally:
            if sock is not None:
                with contextlib.suppress(OSError):  # closed already: nothing to restore
                    sock.settimeout(saved)

    def _incomplete(self, where: str) -> TargetTimeout:
        return TargetTimeout(f"response not complete within {self.timeout_s:g} s: {where}")


_Response = requests.Response


def _excerpt(body: bytes) -> str:
    """The start of an error body on one line, for a message."""
    text = " ".join(body.decode("utf-8", errors="replace").split())
    return text[:_ERROR_EXCERPT_CHARS]


def _content_length(response: _Response) -> int | None:
    value = response.headers.get("Content-Length")
    if value is None or response.headers.get("Content-Encoding", "identity") != "identity":
        return None  # an encoded length says nothing about the decoded size
    try:
        return int(value)
    except ValueError:
        return None


def _socket_of(raw: object) -> socket.socket | None:
    # urllib3 2.x keeps the connection on the response while it is being read.
    connection = getattr(raw, "connection", None)
    sock = getattr(connection, "sock", None)
    return sock if isinstance(sock, socket.socket) else None


def _reason(exc: BaseException) -> str:
    """The innermost cause of a requests/urllib3 error, in one short line: their own
    messages repeat the pool and the URL, which the caller already names."""
    inner: BaseException = exc
    for _ in range(8):  # bounded: a cause chain could, in principle, loop
        # urllib3 keeps the cause in .reason (MaxRetryError) or among the args
        # (requests' ConnectionError(MaxRetryError), ProtocolError(text, cause)).
        causes = [getattr(inner, "reason", None), *reversed(inner.args)]
        nxt = next((c for c in causes if isinstance(c, BaseException) and c is not inner), None)
        if nxt is None:
            break
        inner = nxt
    text = " ".join(str(inner).split()) or type(inner).__name__
    return text[:_ERROR_EXCERPT_CHARS]
