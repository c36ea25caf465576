"""The Triton server process and its Python-backend stubs on this host, with CPU use.

The Python backend runs one ``triton_python_backend_stub`` process per model
instance, and its command line ends with the instance name and the host-policy name
(``... batched_0_0 DEFAULT``); the model's path (``<repo>/<model>/<version>/model.py``)
is among its arguments. That gives per-instance CPU use on any machine, and on a GPU
host the same pid map keys NVML's per-process SM utilisation (the join is done by pid
at query time).

Each tick also yields the ``HostFacts`` of the machine Triton runs on (its CPU
count), which the analysis uses instead of the facts of whatever machine runs it.

Only a target whose URL names this host is looked up: for a remote Triton there is
nothing to read here (run batchscope next to it instead).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import psutil

from collector.config import DEFAULT_HTTP_PORT, TargetSettings
from collector.errors import TargetDown
from collector.records import HostFacts, ProcessSample
from collector.sources.base import SourceSpec, register_source

__all__ = [
    "HostSource",
    "StubIdentity",
    "http_port_of",
    "is_server_process",
    "path_parts",
    "program_name",
    "server_cpu_count",
    "stub_identity",
]

SERVER_NAME = "tritonserver"
STUB_NAME = "triton_python_backend_stub"
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}


@dataclass(frozen=True)
class StubIdentity:
    model: str | None
    instance_name: str | None


def path_parts(arg: str) -> list[str]:
    """The components of the POSIX path ``arg`` below its root, as
    ``PurePosixPath(arg).parts`` names them (empty and ``.`` components dropped).

    String work, not pathlib: the host is read every tick, every process's command line
    with it, and pathlib interns each component it parses. Strings interned and freed
    again each second churn the interpreter's table of interned strings, which then
    grows by a 1.8 MiB step after about ten minutes of ``serve``."""
    return [part for part in arg.split("/") if part and part != "."]


def program_name(arg: str) -> str:
    """The last component of the path ``arg`` (``PurePosixPath(arg).name``)."""
    parts = path_parts(arg)
    return parts[-1] if parts else ""


def is_server_process(proc: psutil.Process, cmdline: Sequence[str]) -> bool:
    """Whether ``proc`` (whose command line is ``cmdline``) is a Triton server: by its
    process name, or by the program its command line runs."""
    return proc.name() == SERVER_NAME or (bool(cmdline) and program_name(cmdline[0]) == SERVER_NAME)


def stub_identity(cmdline: Sequence[str]) -> StubIdentity:
    """Model and instance name from a stub's command line (see the module docstring)."""
    model = None
    for arg in cmdline[1:]:
        # <repo>/<model>/<version>/model.py: a ".py" name (more than the suffix) in a
        # numbered folder, three components at least counting the root.
        parts = path_parts(arg)
        if (
            len(parts) + arg.startswith("/") >= 3
            and len(parts[-1]) > 3
            and parts[-1].endswith(".py")
            and parts[-2].isdigit()
        ):
            model = parts[-3] if len(parts) >= 3 else ""
            break
    instance = cmdline[-2] if len(cmdline) >= 3 else None
    if instance is not None and model is None and "_" in instance:
        # Default instance names are <model>_<group>_<index>.
        model = instance.rsplit("_", 2)[0]
    return StubIdentity(model=model, instance_name=instance)


def http_port_of(cmdline: Sequence[str]) -> int:
    """The HTTP port a ``tritonserver`` command line asks for (8000 when not given)."""
    for i, arg in enumerate(cmdline):
        if arg.startswith("--http-port="):
            return int(arg.split("=", 1)[1])
        if arg == "--http-port" and i + 1 < len(cmdline):
            return int(cmdline[i + 1])
    return DEFAULT_HTTP_PORT


def server_cpu_count(server: psutil.Process) -> int | None:
    """How many logical CPUs the Triton server may run on.

    Its own CPU affinity where the platform has one (Linux, Windows): a server started
    under ``taskset`` or in a container with ``--cpuset-cpus`` runs its threads and
    its Python-backend stubs (which inherit the affinity) on those CPUs only, and
    batchscope's own affinity says nothing about Triton's when the two are pinned
    apart. Elsewhere, or when the affinity cannot be read, the machine's logical CPU
    count. A CPU *quota* (``docker --cpus``) is not seen: it is a share of time on
    these CPUs, not fewer of them. ``None`` only when even the machine's count is
    unknown.
    """
    try:
        return len(server.cpu_affinity())
    except (AttributeError, psutil.Error, OSError):
        # AttributeError: psutil has no cpu_affinity on this platform (macOS).
        return psutil.cpu_count(logical=True) or os.cpu_count()


def _is_local(host: str | None) -> bool:
    if host is None:
        return False
    if host in _LOCAL_HOSTS or host.startswith("127.") or host == socket.gethostname():
        return True
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


class HostSource:
    """CPU and memory of one target's Triton process tree on this host, and the facts
    of this host (``HostFacts``).

    ``clock`` times CPU use (monotonic seconds); ``wall_clock`` (Unix seconds) stamps
    the facts.
    """

    name = "host"

    def __init__(
        self,
        target: TargetSettings,
        *,
        processes: Callable[[], Iterable[psutil.Process]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target.name
        parts = urlsplit(target.url)
        self._local = _is_local(parts.hostname)
        self._port = parts.port or DEFAULT_HTTP_PORT
        self._processes = processes or (lambda: psutil.process_iter(["name", "cmdline"]))
        self._clock = clock
        self._wall_clock = wall_clock
        # (pid, create_time) -> (clock reading, cumulative CPU seconds): the previous tick.
        self._cpu_before: dict[tuple[int, float], tuple[float, float]] = {}

    def _server(self) -> psutil.Process | None:
        for proc in self._processes():
            try:
                cmdline = proc.cmdline()
                if not is_server_process(proc, cmdline):
                    continue
                if http_port_of(cmdline) == self._port:
                    return proc
            except (psutil.Error, ValueError):
                continue
        return None

    def _cpu_pct(self, proc: psutil.Process, now: float) -> float | None:
        key = (proc.pid, proc.create_time())
        times = proc.cpu_times()
        used = times.user + times.system
        before = self._cpu_before.get(key)
        self._cpu_before[key] = (now, used)
        if before is None or now <= before[0]:
            return None
        return max(used - before[1], 0.0) / (now - before[0]) * 100.0

    def collect(self) -> list[ProcessSample | HostFacts]:
        if not self._local:
            return []
        collected_at = self._wall_clock()
        server = self._server()
        if server is None:
            raise TargetDown(
                f"{self.target}: no {SERVER_NAME} process serving HTTP port "
                f"{self._port} on this host"
            )
        records: list[ProcessSample | HostFacts] = []
        records.extend(self._process_samples(server))
        cpu_count = server_cpu_count(server)
        if cpu_count is not None:
            records.append(
                HostFacts(target=self.target, collected_at=collected_at, cpu_count=cpu_count)
            )
        return records

    def _process_samples(self, server: psutil.Process) -> list[ProcessSample]:
        """The server and its Python-backend stubs, with CPU use since the last tick."""
        now = self._clock()
        samples: list[ProcessSample] = []
        seen: set[tuple[int, float]] = set()
        try:
            children = server.children(recursive=True)
        except psutil.Error:
            children = []
        for proc in [server, *children]:
            try:
                with proc.oneshot():
                    is_server = proc is server
                    if not is_server and STUB_NAME not in proc.name():
                        continue
                    identity = (
                        StubIdentity(None, None) if is_server else stub_identity(proc.cmdline())
                    )
                    seen.add((proc.pid, proc.create_time()))
                    samples.append(
                        ProcessSample(
                            source="host",
                            pid=proc.pid,
                            role="server" if is_server else "stub",
                            model=identity.model,
                            instance_name=identity.instance_name,
                            cpu_pct=self._cpu_pct(proc, now),
                            rss_bytes=proc.memory_info().rss,
                        )
                    )
            except psutil.Error:
                continue  # the process exited while we looked; the next tick will not see it
        # Forget exited processes so the map stays bounded.
        self._cpu_before = {k: v for k, v in self._cpu_before.items() if k in seen}
        return samples

    def close(self) -> None:
        self._cpu_before.clear()


register_source(SourceSpec("host", lambda settings, target: HostSource(target), per_target=True))
