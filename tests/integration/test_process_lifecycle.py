"""What batchscope starts dies with it: SIGKILL, SIGTERM and a background demo.

Each test runs a real command in a subprocess against a real tritonserver, notes every
process started under it (tritonserver and its Python-backend stubs) while it serves,
stops it, and then waits, bounded, for those processes to be gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest

from collector.testbed.server import (
    STUB_NAME,
    WORKDIR_PREFIX,
    processes_of_workdir,
    remove_stale_workdirs,
)
from tests.support import free_port, wait_until

pytestmark = pytest.mark.integration

STARTUP_TIMEOUT_S = 90.0


def _spawn(argv: Sequence[str], cwd: Path, *, ignore_sigint: bool = False) -> subprocess.Popen[str]:
    """``python -m collector.cli ARGV``, run from ``cwd`` (not the checkout, so the
    package is the one on the import path) with its output piped."""

    def ignore_interrupts() -> None:
        # What a non-interactive shell does to a job it starts with `&`.
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    return subprocess.Popen(
        [sys.executable, "-m", "collector.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=ignore_interrupts if ignore_sigint else None,
    )


def _read_until(proc: subprocess.Popen[str], marker: str) -> list[str]:
    """The output lines up to and including the first that starts with ``marker``.

    Reading blocks; should the command never print it, a watchdog kills the command,
    which ends the read, so the test fails instead of hanging.
    """
    watchdog = threading.Timer(STARTUP_TIMEOUT_S, proc.kill)
    watchdog.start()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith(marker):
                return lines
    finally:
        watchdog.cancel()
    pytest.fail(f"the command ended before printing {marker!r}:\n" + "\n".join(lines))


def _drain(proc: subprocess.Popen[str]) -> tuple[threading.Thread, list[str]]:
    """Keep reading the command's output, so that a full pipe never blocks its stop:
    the reading thread (it ends with the output) and the lines it has read."""
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, lines


def _wait_or_show(
    proc: subprocess.Popen[str], timeout_s: float, reader: threading.Thread, output: list[str]
) -> int:
    """The command's exit status once it ends within ``timeout_s``, its output read to
    the end; else the test fails with what it printed and, asked by SIGUSR1, every
    thread's stack: where it hangs."""
    try:
        status = proc.wait(timeout=timeout_s)
        reader.join(timeout=5)
        return status
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: _printed_stacks(output), 3, "the stacks")
        pytest.fail(
            f"still running {timeout_s:.0f} s after SIGTERM; it printed:\n" + "\n".join(output)
        )


def _printed_stacks(output: list[str]) -> bool:
    """Whether the output holds a thread's stack, as faulthandler prints it."""
    return any(line.startswith("Thread 0x") for line in output)


def _descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _survivors(processes: Sequence[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of ``processes`` still running (zombies count as gone) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in processes if _running(p)]
    while alive and time.monotonic() < deadline:
        psutil.wait_procs(alive, timeout=0.2)
        alive = [p for p in alive if _running(p)]
    return alive


def _describe(processes: Sequence[psutil.Process]) -> list[str]:
    described = []
    for p in processes:
        try:
            described.append(f"{p.pid} {p.name()} (parent {p.ppid()})")
        except psutil.Error:
            described.append(str(p.pid))
    return described


def _kill_all(processes: Sequence[psutil.Process]) -> None:
    for p in processes:
        if _running(p):
            with contextlib.suppress(psutil.Error):
                p.kill()


@pytest.fixture
def testbed_config(tmp_path: Path, triton_available: None) -> Path:
    config = tmp_path / "testbed.yaml"
    config.write_text("models:\n  - name: only\n    fixed_ms: 1.0\n    instance_count: 2\n")
    return config


@pytest.fixture
def started() -> Iterator[list[tuple[subprocess.Popen[str], list[psutil.Process]]]]:
    """Commands a test started and the processes under them: all killed at teardown,
    whatever the test's outcome, so a failure here leaves nothing running."""
    runs: list[tuple[subprocess.Popen[str], list[psutil.Process]]] = []
    yield runs
    for proc, children in runs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        _kill_all(children)


def _serving_testbed(
    config: Path,
    cwd: Path,
    runs: list[tuple[subprocess.Popen[str], list[psutil.Process]]],
) -> tuple[subprocess.Popen[str], list[psutil.Process], Path]:
    """``batchscope testbed up`` once it serves: the command, its processes, its folder."""
    proc = _spawn(["testbed", "up", "--config", str(config)], cwd)
    children: list[psutil.Process] = []
    runs.append((proc, children))
    lines = _read_until(proc, "Ctrl-C")
    _drain(proc)
    log_line = next(line for line in lines if line.startswith("log "))
    workdir = Path(log_line.partition(" ")[2].strip()).parent
    children.extend(_descendants(proc.pid))
    names = sorted(p.name() for p in children)
    assert "tritonserver" in names, names
    # One stub per model instance; the kernel cuts a process name to 15 characters.
    assert sum(STUB_NAME.startswith(n) for n in names) == 2, names
    return proc, children, workdir


def test_sigkill_takes_triton_along_and_the_next_start_removes_the_folder(
    testbed_config: Path,
    tmp_path: Path,
    started: list[tuple[subprocess.Popen[str], list[psutil.Process]]],
) -> None:
    proc, children, workdir = _serving_testbed(testbed_config, tmp_path, started)
    # A stub's third argument names its shared-memory region (in /dev/shm).
    regions = [p.cmdline()[2] for p in children if STUB_NAME.startswith(p.name())]

    proc.kill()  # SIGKILL: no handler of batchscope runs
    proc.wait(timeout=10)
    survivors = _survivors(children, timeout_s=10)
    assert survivors == [], f"left running after SIGKILL: {_describe(survivors)}"
    assert processes_of_workdir(workdir) == []

    # Where the folder lies and how it is named is what lets a later start find it.
    assert workdir.parent == Path(tempfile.gettempdir())
    assert workdir.name.startswith(f"{WORKDIR_PREFIX}{proc.pid}-"), workdir
    # No process can remove a folder when SIGKILLed; the next start removes it, as it
    # removes every testbed folder whose owner is gone.
    assert workdir.exists()
    assert workdir in remove_stale_workdirs()
    assert not workdir.exists()
    assert not any((Path("/dev/shm") / r).exists() for r in regions), regions


def test_sigterm_stops_testbed_up_within_seconds_leaving_nothing(
    testbed_config: Path,
    tmp_path: Path,
    started: list[tuple[subprocess.Popen[str], list[psutil.Process]]],
) -> None:
    proc, children, workdir = _serving_testbed(testbed_config, tmp_path, started)

    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    print(f"\ntestbed up stopped {time.monotonic() - began:.1f} s after SIGTERM")
    survivors = _survivors(children, timeout_s=5)
    assert survivors == [], f"left running after SIGTERM: {_describe(survivors)}"
    assert not workdir.exists()


def test_background_demo_stops_on_sigterm_leaving_nothing(
    tmp_path: Path,
    triton_available: None,
    started: list[tuple[subprocess.Popen[str], list[psutil.Process]]],
) -> None:
    # As `batchscope demo &` from a script: SIGINT ignored, so SIGTERM is the way.
    argv = ["demo", "--port", str(free_port()), "--db", f"sqlite:///{tmp_path}/demo.db"]
    proc = _spawn(argv, tmp_path, ignore_sigint=True)
    children: list[psutil.Process] = []
    started.append((proc, children))
    lines = _read_until(proc, "batchscope UI:")
    # gRPC's library is loaded before the UI's line, so a SIGTERM that comes as the
    # first load runs start waits on no import (one took over 20 s on a busy machine).
    maps = Path(f"/proc/{proc.pid}/maps").read_text()
    assert "cygrpc" in maps, "the load's gRPC library was not loaded before the UI's line"
    reader, output = _drain(proc)
    children.extend(_descendants(proc.pid))
    names = sorted(p.name() for p in children)
    assert "tritonserver" in names, (names, lines)
    workdirs = [
        Path(arg.partition("=")[2]).parent
        for p in children
        if p.name() == "tritonserver"
        for arg in p.cmdline()
        if arg.startswith("--model-repository=")
    ]
    assert len(workdirs) == 1, workdirs

    # SIGUSR1 asks for every thread's stack (on stderr) and the demo goes on serving.
    proc.send_signal(signal.SIGUSR1)
    wait_until(lambda: _printed_stacks(output), 10, "the stacks SIGUSR1 asks for")
    assert proc.poll() is None

    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert _wait_or_show(proc, 20, reader, output) == 0
    print(f"\ndemo stopped {time.monotonic() - began:.1f} s after SIGTERM")
    # Its last line says how long each part took to stop.
    assert any(line.startswith("stopped in ") for line in output), output
    survivors = _survivors(children, timeout_s=5)
    assert survivors == [], f"left running after SIGTERM: {_describe(survivors)}"
    assert not workdirs[0].exists()
