"""A real ``tritonserver`` on the CPU, started from the binary that nvidia-pytriton ships.

The server runs the synthetic models of :mod:`collector.testbed.models` through the
Python backend, with explicit model control so the load API can reconfigure a model
while it serves.  It is started in its own session, so that stopping it can reach the
``triton_python_backend_stub`` processes (one per model instance) even after the
server itself is gone.  The server also gets a parent-death signal: should the
process that started it die without stopping it (a SIGKILL, a crash), Linux kills the
server, and its stubs, which watch their parent, exit on their own.

A working directory made by the server itself lies under the system's temporary
directory as ``batchscope-triton-<owner pid>-*``.  A SIGKILLed owner cannot remove it;
the next server started on the machine removes every such folder whose owner is gone,
with any process still running from it (:func:`remove_stale_workdirs`).

Ports are chosen once, at the first start, and kept: a server stopped or killed and
started again comes back at the same URLs, which is what a collector watching it needs
to see a target go down and return.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

from collector.errors import BatchscopeError
from collector.process_control import die_with_parent
from collector.testbed.models import ModelSpec, write_model_repository

__all__ = [
    "STUB_NAME",
    "StartCancelled",
    "TestbedError",
    "TritonInstall",
    "TritonServer",
    "find_triton",
    "pick_ports",
    "processes_of_workdir",
    "remove_stale_workdirs",
    "stub_processes_under",
]

STUB_NAME = "triton_python_backend_stub"
# Temporary working directories are named <prefix><owner pid>-<random>; the owner file
# inside holds the owner's start time, so a reused pid does not pass for the owner.
WORKDIR_PREFIX = "batchscope-triton-"
_OWNER_FILE = "owner"
# The stubs' shared-memory regions, written once the server is ready: stubs whose
# server was SIGKILLed exit without unlinking them, so the cleanup reads them here.
_SHM_FILE = "shm-regions"
_SHM_PREFIX = "triton_python_backend_shm_region"


class TestbedError(BatchscopeError):
    """The testbed server could not be started, stopped or driven."""

    # Keeps pytest from trying to collect this class because of its name.
    __test__ = False


class StartCancelled(TestbedError):
    """``start(cancel=...)`` gave up waiting for readiness because ``cancel`` was set."""


class TritonInstall:
    """Where the pieces of the pytriton-shipped server live on this machine."""

    def __init__(self, package_dir: Path) -> None:
        self.package_dir = package_dir
        self.binary = package_dir / "tritonserver" / "bin" / "tritonserver"
        self.backends = package_dir / "tritonserver" / "backends"
        self.lib_dir = package_dir.parent / "nvidia_pytriton.libs"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        self.stub = package_dir / "tritonserver" / "python_backend_stubs" / version / STUB_NAME

    def check(self) -> None:
        for path in (self.binary, self.backends / "python", self.stub):
            if not path.exists():
                raise TestbedError(f"nvidia-pytriton install is incomplete: {path} is missing")


def find_triton() -> TritonInstall:
    """Locate nvidia-pytriton's server without importing pytriton (slow, and not needed)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TestbedError(
            "nvidia-pytriton is not installed; install the testbed extra: "
            "pip install 'batchscope[testbed]'"
        )
    install = TritonInstall(Path(next(iter(spec.submodule_search_locations))))
    install.check()
    return install


def stub_processes_under(workdirs: Iterable[Path]) -> list[psutil.Process]:
    """Live stub processes whose executable lies under one of ``workdirs``.

    Every :class:`TritonServer` runs its stubs from its own working directory, so this
    finds the stubs of given servers (even re-parented ones) and no one else's.
    """
    roots = [str(Path(w)) + os.sep for w in workdirs]
    return [
        p
        for p, cmdline in _live_command_lines()
        if cmdline[0].endswith(STUB_NAME) and any(cmdline[0].startswith(r) for r in roots)
    ]


def processes_of_workdir(workdir: Path) -> list[psutil.Process]:
    """Live processes of the server whose working directory is ``workdir``: its stubs
    (run from the backend copy there) and the server (named by its repository there)."""
    stub = str(workdir / "backends" / "python" / STUB_NAME)
    repo_arg = f"--model-repository={workdir / 'models'}"
    return [p for p, cmdline in _live_command_lines() if cmdline[0] == stub or repo_arg in cmdline]


def _owner_alive(workdir: Path) -> bool:
    """Whether the process that made this temporary working directory still runs."""
    try:
        pid = int(workdir.name[len(WORKDIR_PREFIX) :].split("-", 1)[0])
    except ValueError:
        return True  # not named by us after all: leave it alone
    try:
        started = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True
    try:
        recorded = float((workdir / _OWNER_FILE).read_text())
    except (OSError, ValueError):
        return True  # just made, owner file not yet written: the pid is alive
    return abs(started - recorded) < 1.0


def remove_stale_workdirs(temp_root: Path | None = None) -> list[Path]:
    """Remove the temporary working directories whose owner process is gone.

    A server whose owner was SIGKILLed died with it (parent-death signal), but its
    folder stayed.  Anything still running from such a folder is killed first and the
    shared memory its stubs held is unlinked.  Only this user's folders are touched.
    Returns the folders removed.
    """
    root = Path(temp_root or tempfile.gettempdir())
    removed = []
    for workdir in root.glob(f"{WORKDIR_PREFIX}*"):
        try:
            if not workdir.is_dir() or workdir.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if _owner_alive(workdir):
            continue
        leftovers = processes_of_workdir(workdir)
        regions = _shm_regions_of(leftovers)
        with contextlib.suppress(OSError):
            regions += (workdir / _SHM_FILE).read_text().split()
        for p in leftovers:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(leftovers, timeout=10)
        _unlink_shm(regions)
        shutil.rmtree(workdir, ignore_errors=True)
        removed.append(workdir)
    return removed


def _shm_regions_of(processes: Iterable[psutil.Process]) -> list[str]:
    """Names of the shared-memory regions stubs among ``processes`` use (3rd argument)."""
    regions = []
    for p in processes:
        with contextlib.suppress(psutil.Error, IndexError):
            cmdline = p.cmdline()
            name = cmdline[2]
            if cmdline[0].endswith(STUB_NAME) and _is_shm_region(name):
                regions.append(name)
    return regions


def _is_shm_region(name: str) -> bool:
    return name.startswith(_SHM_PREFIX) and "/" not in name


def _unlink_shm(regions: Iterable[str]) -> None:
    # A killed server cannot unlink the shared-memory regions of its stubs (1 MiB or
    # more each, in /dev/shm); a clean stop has already removed them.
    for region in regions:
        if _is_shm_region(region):
            with contextlib.suppress(OSError):
                (Path("/dev/shm") / region).unlink(missing_ok=True)


def _live_command_lines() -> list[tuple[psutil.Process, list[str]]]:
    """Every process of this host that is not a zombie, with its (non-empty) command
    line; processes that exit or deny access while we look are left out."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = p.info["cmdline"] or []
            if p.info["status"] != psutil.STATUS_ZOMBIE and cmdline:
                found.append((p, list(cmdline)))
        except psutil.Error:
            continue
    return found


def _port_free(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR as servers set it: connections of a previous run lingering in
        # TIME_WAIT do not keep a restarted server from binding its old port.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_ports(host: str = "127.0.0.1", attempts: int = 50) -> tuple[int, int, int]:
    """Three free ports for HTTP, gRPC and metrics.

    Consecutive ports are preferred, mirroring Triton's 8000/8001/8002 defaults, so that
    "gRPC = HTTP port + 1" holds for the testbed too; if no such triple turns up, three
    unrelated free ports are returned.  Another process may take a port between this
    check and the server's bind; the server then fails to start with a clear log line.
    """
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            base = s.getsockname()[1]
        if base + 2 < 65536 and all(_port_free(base + i, host) for i in range(3)):
            return base, base + 1, base + 2
    ports: list[int] = []
    socks = []
    try:
        for _ in range(3):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports[0], ports[1], ports[2]


class TritonServer:
    """A ``tritonserver`` process serving synthetic models; a context manager.

    ``with TritonServer([ModelSpec("m")]) as server: ...`` starts it, waits until it is
    ready and stops it on exit.  ``stop()`` and ``kill()`` may be followed by ``start()``
    again: the ports, the model repository (as first written) and the log file stay.

    ``workdir`` holds the backend copy, the model repository and ``tritonserver.log``;
    by default a temporary directory, removed by ``close()`` (a given one is kept).
    Ports left ``None`` are picked free at the first start.  ``extra_args`` are
    appended to the server's command line (e.g. ``["--metrics-interval-ms=1000"]``).
    ``exit_timeout_s`` is Triton's ``--exit-timeout-secs``: how long a SIGTERM'd server
    waits for in-flight requests.
    """

    def __init__(
        self,
        specs: Iterable[ModelSpec],
        *,
        workdir: Path | None = None,
        host: str = "127.0.0.1",
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        extra_args: Sequence[str] = (),
        explicit_model_control: bool = True,
        startup_timeout_s: float = 60.0,
        exit_timeout_s: int = 10,
    ) -> None:
        self.specs: tuple[ModelSpec, ...] = tuple(specs)
        if not self.specs:
            raise ValueError("a TritonServer needs at least one ModelSpec")
        self.host = host
        self.extra_args = tuple(extra_args)
        # Without explicit control Triton refuses live config changes (mode "none").
        self.explicit_model_control = explicit_model_control
        self.startup_timeout_s = startup_timeout_s
        self.exit_timeout_s = exit_timeout_s
        self._requested_ports = (http_port, grpc_port, metrics_port)
        self._ports: tuple[int, int, int] | None = None
        self._given_workdir = Path(workdir) if workdir is not None else None
        self._workdir: Path | None = None
        self._owns_workdir = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._install: TritonInstall | None = None

    # ------------------------------------------------------------------ addresses

    @property
    def ports(self) -> tuple[int, int, int]:
        """(http, grpc, metrics); fixed at the first ``start()``."""
        if self._ports is None:
            raise TestbedError("the server has not been started yet, so it has no ports")
        return self._ports

    @property
    def _client_host(self) -> str:
        # A server bound to every interface is still reached through loopback here.
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host

    @property
    def http_url(self) -> str:
        return f"http://{self._client_host}:{self.ports[0]}"

    @property
    def grpc_url(self) -> str:
        """``host:port``, the form tritonclient's gRPC clients take."""
        return f"{self._client_host}:{self.ports[1]}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._client_host}:{self.ports[2]}/metrics"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise TestbedError("the server is not running")
        return self._proc.pid

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise TestbedError("the server has not been started yet")
        return self._workdir

    @property
    def log_path(self) -> Path:
        return self.workdir / "tritonserver.log"

    @property
    def model_repository(self) -> Path:
        return self.workdir / "models"

    @property
    def backend_directory(self) -> Path:
        return self.workdir / "backends"

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _prepare(self) -> None:
        """Once per object: the backend copy, the model repository and the ports."""
        if self._workdir is not None:
            return
        self._install = find_triton()
        if self._given_workdir is not None:
            self._workdir = self._given_workdir
            self._workdir.mkdir(parents=True, exist_ok=True)
        else:
            remove_stale_workdirs()
            self._workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))
            self._owns_workdir = True
            started = psutil.Process().create_time()
            (self._workdir / _OWNER_FILE).write_text(repr(started))
        # The stub for the running interpreter goes next to libtriton_python.so in a
        # copy, so the installed package is never modified.
        shutil.copytree(self._install.backends, self.backend_directory, dirs_exist_ok=True)
        shutil.copy2(self._install.stub, self.backend_directory / "python" / STUB_NAME)
        write_model_repository(self.model_repository, self.specs)
        http, grpc, metrics = self._requested_ports
        if None in (http, grpc, metrics):
            picked = pick_ports(self._client_host)
            http = http or picked[0]
            grpc = grpc or picked[1]
            metrics = metrics or picked[2]
        assert http is not None and grpc is not None and metrics is not None
        self._ports = (http, grpc, metrics)

    def command(self) -> list[str]:
        """The server's command line (valid once the server has been prepared)."""
        assert self._install is not None
        http, grpc, metrics = self.ports
        return [
            str(self._install.binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={self.backend_directory}",
            *(
                ("--model-control-mode=explicit", "--load-model=*")
                if self.explicit_model_control
                else ("--model-control-mode=none",)
            ),
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.host}",
            f"--http-port={http}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            *self.extra_args,
        ]

    def _environment(self) -> dict[str, str]:
        assert self._install is not None
        env = dict(os.environ)
        # The stub finds numpy through the first `python` on PATH, so the interpreter
        # running batchscope (normally a virtualenv) must come first.
        bin_dir = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join(p for p in (bin_dir, env.get("PATH", "")) if p)
        libs = str(self._install.lib_dir)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libs, env.get("LD_LIBRARY_PATH", "")) if p
        )
        # The synthetic models' numpy products are small: left alone, OpenBLAS spins a
        # thread pool per stub that takes the cores from the server and the load
        # generator (on 2 cores about a quarter of the QPS, and runs differ as much).
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(name, "1")
        return env

    def start(self, *, cancel: threading.Event | None = None) -> None:
        """Start the server and block until ``/v2/health/ready`` answers 200.

        Setting ``cancel`` (e.g. from a signal handler) while it waits kills the server
        and raises :class:`StartCancelled`, so a stop asked for during a start is quick.
        """
        if self.is_running():
            raise TestbedError(f"the server is already running (pid {self.pid})")
        self._prepare()
        for port in self.ports:
            if not _port_free(port, self._client_host):
                raise TestbedError(f"port {port} is in use; cannot start tritonserver")
        with self.log_path.open("ab") as log:
            log.write(f"=== batchscope: starting {' '.join(self.command())}\n".encode())
            log.flush()
            # Own session: the server and its stubs form a process group that stop()
            # and kill() can signal as a whole, and Ctrl-C in a terminal reaches only
            # us, so the shutdown stays orderly.  The parent-death signal covers our
            # own death, which leaves no one to signal the group.
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._environment(),
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        try:
            self._wait_ready(cancel)
        except BaseException:
            self.kill()
            raise
        if self._owns_workdir:
            (self.workdir / _SHM_FILE).write_text("\n".join(self._shm_regions()))

    def _wait_ready(self, cancel: threading.Event | None) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        delay = 0.05
        while True:
            assert self._proc is not None
            if cancel is not None and cancel.is_set():
                raise StartCancelled("tritonserver start cancelled")
            code = self._proc.poll()
            if code is not None:
                raise TestbedError(
                    f"tritonserver exited with status {code} while starting; "
                    f"log tail:\n{self.log_tail()}"
                )
            # Ready means every URL handed out answers: Triton opens its metrics port
            # after the HTTP endpoint can already report ready.
            if all(
                self._answers(url) for url in (f"{self.http_url}/v2/health/ready", self.metrics_url)
            ):
                return
            if time.monotonic() > deadline:
                raise TestbedError(
                    f"tritonserver was not ready after {self.startup_timeout_s:.0f} s; "
                    f"log tail:\n{self.log_tail()}"
                )
            if cancel is not None:
                cancel.wait(delay)
            else:
                time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False  # not listening yet, or listening but not ready (400)

    def stop(self, timeout_s: float | None = None) -> None:
        """Shut down cleanly: SIGTERM, wait, then SIGKILL; no stub may survive."""
        if self._proc is None:
            return
        proc = self._proc
        shm = self._shm_regions()
        if timeout_s is None:
            # Triton waits up to --exit-timeout-secs for in-flight work, then unloads.
            timeout_s = self.exit_timeout_s + 15.0
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._kill_group(proc)
        self._finish(shm)

    def kill(self) -> None:
        """SIGKILL the server and its stubs at once, as a crash would leave them."""
        if self._proc is None:
            return
        proc = self._proc
        shm = self._shm_regions()
        if proc.poll() is None:
            self._kill_group(proc)
        self._finish(shm)

    def close(self) -> None:
        """Stop the server and remove the working directory if this object made it."""
        try:
            self.stop()
        finally:
            if self._owns_workdir and self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None
                self._owns_workdir = False

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        # Safe while proc is not yet reaped: its pid, and so the group id, cannot have
        # been reused by an unrelated process.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def _finish(self, shm_regions: Iterable[str]) -> None:
        """After the server is reaped: kill whatever of ours is left, and check."""
        leftovers = self.leftover_processes()
        for p in leftovers:
            with contextlib.suppress(psutil.Error):
                p.kill()
        _, alive = psutil.wait_procs(leftovers, timeout=10)
        self._proc = None
        _unlink_shm(shm_regions)
        if alive:
            pids = ", ".join(str(p.pid) for p in alive)
            raise TestbedError(f"processes of the stopped tritonserver survived: {pids}")

    def _shm_regions(self) -> list[str]:
        """Names of the shared-memory regions the live stubs use (their 3rd argument)."""
        return _shm_regions_of(self.stub_processes().values())

    def leftover_processes(self) -> list[psutil.Process]:
        """Live processes started from this server's backend copy or for its repository.

        The match is on the command line, which names this object's own working
        directory, so it finds stubs even after they were re-parented to init and never
        touches another server's processes.
        """
        if self._workdir is None:
            return []
        return processes_of_workdir(self._workdir)

    def stub_processes(self) -> dict[str, psutil.Process]:
        """Live stub processes by model instance name (e.g. ``batched_0_0``).

        A stub's command line ends with ``<instance name> <kind>``; the instance name is
        ``<instance group name>_<index>`` and the group name defaults to
        ``<model>_<group index>``.
        """
        stub = str(self.backend_directory / "python" / STUB_NAME)
        result: dict[str, psutil.Process] = {}
        for p in self.leftover_processes():
            with contextlib.suppress(psutil.Error):
                cmdline = p.cmdline()
                if cmdline and cmdline[0] == stub and len(cmdline) >= 3:
                    result[cmdline[-2]] = p
        return result

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    # ------------------------------------------------------------------ HTTP helpers

    def _request(self, method: str, path: str, body: Any = None, timeout_s: float = 30.0) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.http_url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data is not None else {},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                raw = r.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise TestbedError(f"{method} {path}: HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise TestbedError(f"{method} {path}: {exc}") from exc
        return json.loads(raw) if raw.strip() else None

    def get_json(self, path: str) -> Any:
        """``GET`` a server path, e.g. ``/v2/models/stats``, and decode the JSON."""
        return self._request("GET", path)

    def load_model(self, name: str, config: dict[str, Any], timeout_s: float = 120.0) -> None:
        """(Re)load ``name`` with ``config`` (a model config as a dict) via the load API.

        Triton answers only when the load has finished, so on return the new config is
        live; the repository's config.pbtxt on disk is left as it was.
        """
        body = {"parameters": {"config": json.dumps(config)}}
        self._request("POST", f"/v2/repository/models/{name}/load", body, timeout_s)

    def unload_model(self, name: str, timeout_s: float = 60.0) -> None:
        self._request("POST", f"/v2/repository/models/{name}/unload", {}, timeout_s)
