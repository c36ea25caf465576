"""Small helpers the tests share: a free port, waiting for a condition, stopping a
process a test started, a ``batchscope collect`` process run for a test."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from collector import process_control

__all__ = [
    "RunningCollector",
    "free_port",
    "running_collector",
    "start_process",
    "stop_process",
    "wait_until",
]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_until(
    predicate: Callable[[], bool], timeout_s: float, what: str, *, every_s: float = 0.05
) -> None:
    """Return once ``predicate()`` is true; fail naming ``what`` after ``timeout_s``. A
    refused connection counts as "not yet" (a server still starting)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except requests.ConnectionError:
            pass
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def start_process(args: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(args, **popen)`` of a process that is SIGKILLed when the test
    run dies, even by SIGKILL (``process_control.die_with_parent``): a run stopped
    hard leaves no server behind."""
    return subprocess.Popen(args, preexec_fn=process_control.die_with_parent(), **popen)


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """Stop a process a test started, as an operator would (SIGTERM), killing it when it
    does not exit within ``timeout_s``; nothing when it has already exited."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class RunningCollector:
    """A ``batchscope collect`` process started by :func:`running_collector`."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self, tail: int = 3000) -> str:
        """The last ``tail`` characters of what the process wrote."""
        return self.log_path.read_text(errors="replace")[-tail:]

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """Stop it with SIGTERM (killed after ``timeout_s``); its exit status."""
        stop_process(self.proc, timeout_s=timeout_s)
        return self.proc.returncode


@contextmanager
def running_collector(
    workdir: Path,
    *,
    settings: Mapping[str, object] | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 60.0,
) -> Iterator[RunningCollector]:
    """``batchscope collect`` run from ``workdir``: with ``settings`` written to
    ``workdir/batchscope.yaml`` (``--config``) and/or command-line ``args``, its output
    in ``workdir/collect.log``, in an environment without ``BATCHSCOPE_*`` or
    ``FAKE_NVML_*`` variables but those of ``env``. Yielded once its store is open (the
    collector logs "collecting from"), failing with its log when it exits before that;
    stopped with SIGTERM on leaving."""
    command = [sys.executable, "-m", "collector.cli", "collect"]
    if settings is not None:
        config_path = workdir / "batchscope.yaml"
        config_path.write_text(json.dumps(settings))  # JSON is YAML
        command += ["--config", str(config_path)]
    command += list(args)
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("BATCHSCOPE_", "FAKE_NVML_"))
    }
    environ.update(env or {})
    log_path = workdir / "collect.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environ)
    collector = RunningCollector(proc, log_path)
    try:
        wait_until(
            lambda: b"collecting from" in log_path.read_bytes() or proc.poll() is not None,
            ready_timeout_s,
            "the collector's store",
        )
        assert proc.poll() is None, collector.log(tail=10_000)
        yield collector
    finally:
        stop_process(proc)
