"""Triton look-alikes that misbehave on demand: one HTTP port per target, in this process.

Each target answers what a Triton's HTTP endpoint answers to a monitor (``GET /v2``,
``/metrics``, ``/v2/models/stats``, ``/v2/models/NAME/config``) with the simulated
fleet's documents (``collector.testbed.fleet_documents``: the CPU testbed's recorded
exposition, counters advancing with time), until a test switches it to a fault with
``set_fault(name, fault)``; ``set_fault(name, OK)`` makes it behave again. A fault
applies to every request the target gets from then on; a connection already held by
``HANG`` or ``DRIP`` stays so until the client gives up.

Faults (``FAULTS``):

- ``hang``: accepts the connection, reads the request and never answers;
- ``drip``: answers one byte a second (status line and headers included);
- ``huge``: a 200 of 50 MB of exposition-looking text, without a ``Content-Length``;
- ``html``: a 200 HTML page (a login page or a proxy's error page) on every path;
- ``truncated``: the metrics page cut mid-line (its ``Content-Length`` says so);
- ``cut``: the metrics page's ``Content-Length`` promised, half of it sent, then closed;
- ``garbage``: random bytes, ``text/plain``;
- ``duplicated``: every model series of the metrics page twice, one line after the other;
- ``backwards``: counters start again near zero, as after a restart, with no outage a
  collector could see (the documents of a server started just now).

Outside ``FAULTS`` (a behaviour of its own, not one of the faults tried together):

- ``flip``: the address reaches two long-running servers in turn, ``FLIP_S`` seconds
  each (a load balancer, a DNS name that moves): the target's own documents and those
  of a server up ``FLIP_AHEAD_S`` seconds longer, under the same load, so the counters
  jump up and fall part-way back, and the true rates never change.

Every connection runs on a thread of its own; ``close()`` ends them all (a hung or
dripping connection within a tenth of a second).
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from collector.testbed.fleet_documents import (
    SERVER_METADATA,
    FleetTemplates,
    TargetDocuments,
    compact_json,
)

__all__ = [
    "BACKWARDS",
    "CUT",
    "DRIP",
    "DUPLICATED",
    "FAULTS",
    "FLIP",
    "FLIP_AHEAD_S",
    "FLIP_S",
    "GARBAGE",
    "HANG",
    "HTML",
    "HUGE",
    "HUGE_BYTES",
    "OK",
    "TRUNCATED",
    "FaultServer",
]

OK = "ok"
HANG = "hang"
DRIP = "drip"
HUGE = "huge"
HTML = "html"
TRUNCATED = "truncated"
CUT = "cut"
GARBAGE = "garbage"
DUPLICATED = "duplicated"
BACKWARDS = "backwards"
FAULTS = (HANG, DRIP, HUGE, HTML, TRUNCATED, CUT, GARBAGE, DUPLICATED, BACKWARDS)
FLIP = "flip"
FLIP_S = 2.5  # how long the address stays on each of the two servers
FLIP_AHEAD_S = 1800.0  # how much longer the other server has been up

HUGE_BYTES = 50 * 1000 * 1000
_TICK_S = 0.1  # counters advance ten times a second: rates between 1 s scrapes are smooth
_POLL_S = 0.1  # how often a held connection looks whether it should end
_MAX_HEAD = 64 * 1024
_HTML_PAGE = (
    b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head>\n"
    b"<body><form method=post action=/login><input name=user><input name=password "
    b"type=password></form></body></html>\n"
)
# 1 MB of lines that look like exposition, repeated for the huge answer.
_HUGE_BLOCK = b"".join(
    b'nv_inference_count{model="m%06d",version="1"} %d\n' % (i, i) for i in range(24000)
)[: 1000 * 1000]


def _response(status: str, content_type: bytes, body: bytes, *, close: bool = False) -> bytes:
    head = b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
        status.encode(),
        content_type,
        len(body),
    )
    if close:
        head += b"Connection: close\r\n"
    return head + b"\r\n" + body


def _duplicated(page: bytes) -> bytes:
    out: list[bytes] = []
    for line in page.split(b"\n"):
        out.append(line)
        if b"model=" in line and not line.startswith(b"#"):
            out.append(line)
    return b"\n".join(out)


@dataclass
class _Target:
    name: str
    index: int
    listener: socket.socket
    documents: TargetDocuments
    other: TargetDocuments  # the second server of ``FLIP``
    fault: str = OK
    requests: int = 0
    connections: list[socket.socket] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])


class FaultServer:
    """Targets named ``names``, each serving ``models`` simulated models on a port of
    its own on 127.0.0.1 (a free one, picked by the kernel)."""

    def __init__(self, names: Sequence[str], *, models: int = 2) -> None:
        self._templates = FleetTemplates.build(models)
        self.models = self._templates.models
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._targets: dict[str, _Target] = {}
        started = time.time()
        for index, name in enumerate(names):
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", 0))
            listener.listen(64)
            listener.settimeout(_POLL_S)
            docs = TargetDocuments(index, self._templates, _TICK_S, started)
            other = TargetDocuments(index, self._templates, _TICK_S, started - FLIP_AHEAD_S)
            self._targets[name] = _Target(name, index, listener, docs, other)

    # ------------------------------------------------------------------ control

    def start(self) -> FaultServer:
        for target in self._targets.values():
            self._spawn(self._accept, target, name=f"fault-accept-{target.name}")
        return self

    def close(self) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(timeout=5)
        for target in self._targets.values():
            target.listener.close()
            with self._lock:
                held = list(target.connections)
            for conn in held:
                conn.close()

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self._targets[name].port}"

    def metrics_url(self, name: str) -> str:
        return f"{self.url(name)}/metrics"

    def set_fault(self, name: str, fault: str) -> None:
        """What ``name`` does from its next request on (``OK`` or one of ``FAULTS``)."""
        if fault not in (OK, FLIP) and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        target = self._targets[name]
        if fault == BACKWARDS:
            # The documents of a server that started just now: every counter near zero.
            # TargetDocuments counts from an hour (and a bit) before ``started``.
            offset = 3600.0 + (target.index * 37) % 600
            target.documents = TargetDocuments(
                target.index, self._templates, _TICK_S, time.time() + offset
            )
        target.fault = fault

    def requests(self, name: str) -> int:
        """Requests ``name`` has read so far."""
        return self._targets[name].requests

    # ------------------------------------------------------------------ serving

    def _spawn(self, fn: object, *args: object, name: str) -> None:
        thread = threading.Thread(target=fn, args=args, name=name, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept(self, target: _Target) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = target.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(_POLL_S)
            with self._lock:
                target.connections.append(conn)
            self._spawn(self._serve, target, conn, name=f"fault-conn-{target.name}")

    def _serve(self, target: _Target, conn: socket.socket) -> None:
        try:
            for path in self._requests(conn):
                target.requests += 1
                if not self._answer(target, conn, path):
                    return
        except OSError:
            return  # the client went away
        finally:
            with self._lock:
                if conn in target.connections:
                    target.connections.remove(conn)
            conn.close()

    def _requests(self, conn: socket.socket) -> Iterator[str]:
        """The path of each request on ``conn`` (keep-alive), until it closes."""
        buffer = b""
        while not self._stop.is_set():
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                head, buffer = buffer[:end], buffer[end + 4 :]
                parts = head.split(b"\r\n", 1)[0].split(b" ")
                yield parts[1].decode("latin-1") if len(parts) > 1 else "/"
                continue
            if len(buffer) > _MAX_HEAD:
                return
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                return
            buffer += chunk

    def _answer(self, target: _Target, conn: socket.socket, path: str) -> bool:
        """Answer one request; False when the connection is done with."""
        fault = target.fault
        if fault == HANG:
            self._hold(conn)
            return False
        if fault == DRIP:
            self._drip(conn, self._document(target, path, OK))
            return False
        if fault == HUGE:
            self._huge(conn)
            return False
        if fault == CUT and path.startswith("/metrics"):
            whole = self._document(target, path, OK)
            head, _, body = whole.partition(b"\r\n\r\n")
            conn.sendall(head + b"\r\n\r\n" + body[: len(body) // 2])
            return False
        conn.sendall(self._document(target, path, fault))
        return True

    def _document(self, target: _Target, path: str, fault: str) -> bytes:
        """The whole HTTP response to ``path`` for a target doing ``fault``."""
        path = path.split("?", 1)[0].rstrip("/") or "/"
        if fault == HTML:
            return _response("200 OK", b"text/html; charset=utf-8", _HTML_PAGE)
        if fault == GARBAGE:
            return _response("200 OK", b"text/plain; charset=utf-8", os.urandom(4096))
        docs = target.documents
        if fault == FLIP and int(time.time() // FLIP_S) % 2 == 1:
            docs = target.other
        if path == "/metrics":
            page = docs.metrics()
            if fault == TRUNCATED:
                cut = page.rfind(b'model="', 0, len(page) // 2) + 4
                page = page[:cut]
            elif fault == DUPLICATED:
                page = _duplicated(page)
            return _response("200 OK", b"text/plain; version=0.0.4", page)
        if path == "/v2/models/stats":
            return _response("200 OK", b"application/json", docs.stats())
        if path == "/v2":
            return _response("200 OK", b"application/json", compact_json(SERVER_METADATA))
        config = self._templates.configs.get(path.removeprefix("/v2/models/").split("/")[0])
        if config is not None and path.endswith("/config"):
            return _response("200 OK", b"application/json", config)
        return _response("404 Not Found", b"application/json", compact_json({"error": path}))

    def _hold(self, conn: socket.socket) -> None:
        """Say nothing until the client closes (or the server stops)."""
        while not self._stop.is_set():
            readable, _, _ = select.select([conn], [], [], _POLL_S)
            if readable:
                try:
                    if not conn.recv(65536):
                        return
                except OSError:
                    return

    def _drip(self, conn: socket.socket, response: bytes) -> None:
        """``response`` one byte a second, until it is all sent or the client closes."""
        for i in range(len(response)):
            conn.sendall(response[i : i + 1])
            if self._stop.wait(1.0):
                return
            readable, _, _ = select.select([conn], [], [], 0)
            if readable and not conn.recv(65536):
                return

    def _huge(self, conn: socket.socket) -> None:
        """50 MB, with no length given: the body ends when the connection closes."""
        conn.settimeout(5.0)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
        sent = 0
        while sent < HUGE_BYTES and not self._stop.is_set():
            block = _HUGE_BLOCK[: HUGE_BYTES - sent]
            conn.sendall(block)
            sent += len(block)
