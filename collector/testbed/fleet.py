"""A simulated fleet of Triton servers: N HTTP servers on 127.0.0.1 in one process.

Each target answers what a Triton's HTTP endpoint answers to a monitor --
``GET /v2`` (server metadata), ``GET /metrics`` (Prometheus text),
``GET /v2/models/stats`` (statistics JSON), ``GET /v2/models/NAME/config`` and the
health endpoints -- with HTTP/1.1 keep-alive, on its own port (the metrics share the
port: point a target's ``metrics_url`` at ``http://127.0.0.1:PORT/metrics``).

What they serve is made by :mod:`collector.testbed.fleet_documents`: the CPU
testbed's recorded exposition scaled to M models, statistics in step with it,
counters advancing per tick.

Cheap by construction, so that the simulator does not compete with what it feeds: one
asyncio loop serves every port; a document is rendered at most once per tick per
target (by one ``%`` format of a template compiled at start), on the first request
that needs it, and the metadata and config answers are bytes made once.

Started by :class:`Fleet` (a separate process, so its CPU is not the caller's, which
dies with its parent even on SIGKILL) or from a shell::

    python -m collector.testbed.fleet --targets 500 --models 20

It prints one JSON line when every port listens (``{"ports": [...], ...}``), also
written to ``--port-file`` when given, and runs until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from collector.process_control import die_with_parent
from collector.testbed.fleet_documents import (
    RECORDED_METRICS,
    RECORDED_MODEL,
    SERVER_METADATA,
    FleetTemplates,
    TargetDocuments,
    compact_json,
    model_names,
)

__all__ = [
    "DEFAULT_TICK_S",
    "HOST",
    "RECORDED_METRICS",
    "RECORDED_MODEL",
    "Fleet",
    "FleetError",
    "main",
    "model_names",
    "serve",
]

HOST = "127.0.0.1"
DEFAULT_TICK_S = 1.0


class FleetError(RuntimeError):
    """The simulator did not start (or exited before it was ready)."""


# --------------------------------------------------------------------------- HTTP

_TEXT = b"text/plain; charset=utf-8"
_JSON = b"application/json"
_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed"}
_MAX_HEAD = 64 * 1024


def _response(status: int, content_type: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        status, _REASONS[status], content_type, len(body), body,
    )  # fmt: skip


def _frame(kind: str, body: bytes) -> bytes:
    return _response(200, _TEXT if kind == "metrics" else _JSON, body)


def _error(status: int, message: str) -> bytes:
    return _response(status, _JSON, compact_json({"error": message}))


_CLOSING_400 = _error(400, "malformed request line").replace(
    b"\r\n", b"\r\nConnection: close\r\n", 1
)


class _Routes:
    """Answers to one request head, shared by every connection of the fleet."""

    def __init__(self, templates: FleetTemplates):
        self.metadata = _response(200, _JSON, compact_json(SERVER_METADATA))
        self.health = _response(200, _TEXT, b"")
        self.configs = {
            f"/v2/models/{name}/config".encode(): _response(200, _JSON, body)
            for name, body in templates.configs.items()
        }

    def answer(self, target: TargetDocuments, method: bytes, path: bytes) -> bytes:
        path = path.split(b"?", 1)[0].rstrip(b"/") or b"/"
        if method not in (b"GET", b"HEAD"):
            return _error(405, f"{method.decode(errors='replace')} is not served here")
        if path == b"/metrics":
            return target.metrics()
        if path == b"/v2/models/stats":
            return target.stats()
        if path == b"/v2":
            return self.metadata
        if path in (b"/v2/health/live", b"/v2/health/ready"):
            return self.health
        config = self.configs.get(path)
        if config is not None:
            return config
        return _error(404, f"not found: {path.decode(errors='replace')}")


class _Connection(asyncio.Protocol):
    """One client connection: requests answered in order, kept alive unless asked."""

    def __init__(self, target: TargetDocuments, routes: _Routes):
        self._target = target
        self._routes = routes
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        buffer = self._buffer + data if self._buffer else data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buffer[:end]
            lowered = head.lower()
            skip = end + 4 + _content_length(lowered)
            if len(buffer) < skip:
                break
            buffer = buffer[skip:]
            answer, close = self._answer(head, lowered)
            transport.write(answer)
            if close:
                transport.close()
                return
        if len(buffer) > _MAX_HEAD:
            transport.write(_CLOSING_400)
            transport.close()
            return
        self._buffer = buffer

    def _answer(self, head: bytes, lowered: bytes) -> tuple[bytes, bool]:
        request_line = head.split(b"\r\n", 1)[0].split()
        if len(request_line) != 3:
            return _CLOSING_400, True
        method, path, version = request_line
        answer = self._routes.answer(self._target, method, path)
        if method == b"HEAD":
            answer = answer[: answer.index(b"\r\n\r\n") + 4]
        close = b"connection: close" in lowered or (
            version == b"HTTP/1.0" and b"connection: keep-alive" not in lowered
        )
        if close:
            answer = answer.replace(b"\r\n", b"\r\nConnection: close\r\n", 1)
        return answer, close


def _content_length(lowered_head: bytes) -> int:
    at = lowered_head.find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    value = lowered_head[at + 17 :].split(b"\r\n", 1)[0].strip()
    return int(value) if value.isdigit() else 0


# --------------------------------------------------------------------------- serving


def _raise_file_limit(needed: int) -> None:
    """Each target takes a listening socket and its clients' connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


async def serve(
    targets: int,
    models: int,
    *,
    tick_s: float = DEFAULT_TICK_S,
    ready: Callable[[list[int]], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve ``targets`` simulated servers of ``models`` models each until ``stop`` is
    set; ``ready`` gets their ports once every one listens."""
    if targets < 1 or models < 1:
        raise ValueError(f"need at least one target and one model, got {targets} x {models}")
    if not tick_s > 0:
        raise ValueError(f"tick_s must be positive, got {tick_s!r}")
    _raise_file_limit(targets * 8 + 64)
    loop = asyncio.get_running_loop()
    templates = FleetTemplates.build(models)
    routes = _Routes(templates)
    started = time.time()
    servers: list[asyncio.Server] = []
    try:
        for index in range(targets):
            target = TargetDocuments(index, templates, tick_s, started, frame=_frame)
            server = await loop.create_server(
                functools.partial(_Connection, target, routes), HOST, 0, backlog=512
            )
            servers.append(server)
        ports = [int(s.sockets[0].getsockname()[1]) for s in servers]
        if ready is not None:
            ready(ports)
        await (stop or asyncio.Event()).wait()
    finally:
        for server in servers:
            server.close()


def _announce(ports: list[int], models: int, port_file: Path | None) -> None:
    line = json.dumps(
        {"pid": os.getpid(), "host": HOST, "ports": ports, "models": model_names(models)}
    )
    if port_file is not None:
        partial = port_file.with_name(port_file.name + ".partial")
        partial.write_text(line + "\n")
        partial.replace(port_file)  # whole or absent: a reader never sees half of it
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collector.testbed.fleet",
        description="Serve a simulated fleet of Triton servers on 127.0.0.1 until stopped.",
    )
    parser.add_argument("--targets", type=int, default=20, help="servers, one port each")
    parser.add_argument("--models", type=int, default=20, help="models per server")
    parser.add_argument("--tick", type=float, default=DEFAULT_TICK_S, help="seconds per step")
    parser.add_argument("--port-file", type=Path, help="also write the ready line here")
    args = parser.parse_args(argv)
    if args.targets < 1 or args.models < 1 or not args.tick > 0:
        parser.error("--targets and --models must be at least 1, --tick positive")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await serve(
            args.targets,
            args.models,
            tick_s=args.tick,
            ready=lambda ports: _announce(ports, args.models, args.port_file),
            stop=stop,
        )

    asyncio.run(run())
    return 0


# --------------------------------------------------------------------------- launcher


class Fleet:
    """The simulator in a process of its own, for benchmarks and tests.

    ``start()`` returns once every port listens (the process's ready line, no
    polling); the process is SIGKILLed by Linux should the caller die without
    ``stop()``.  ``urls[i]`` is target i's HTTP endpoint, ``metrics_urls[i]`` its
    metrics page (same port).
    """

    def __init__(self, targets: int, models: int = 20, *, tick_s: float = DEFAULT_TICK_S) -> None:
        self.targets = targets
        self.models = models
        self.tick_s = tick_s
        self.ports: list[int] = []
        self.model_names = model_names(models)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise FleetError("the fleet is not running")
        return self._proc.pid

    @property
    def urls(self) -> list[str]:
        return [f"http://{HOST}:{p}" for p in self.ports]

    @property
    def metrics_urls(self) -> list[str]:
        return [f"{url}/metrics" for url in self.urls]

    def start(self, timeout_s: float = 60.0) -> Fleet:
        command = [
            sys.executable, "-m", "collector.testbed.fleet", "--targets", str(self.targets),
            "--models", str(self.models), "--tick", repr(self.tick_s),
        ]  # fmt: skip
        self._proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent(),
        )  # fmt: skip
        try:
            self.ports = self._read_ready(self._proc, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _read_ready(proc: subprocess.Popen[bytes], timeout_s: float) -> list[int]:
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline() if readable else b""
        if not line:
            code = proc.poll()
            why = f"exited with {code}" if code is not None else f"not ready in {timeout_s:g} s"
            raise FleetError(f"fleet simulator {why}")
        ports = json.loads(line)["ports"]
        return [int(p) for p in ports]

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> Fleet:
        return self.start() if self._proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
