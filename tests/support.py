"""Small helpers the tests share: a free port, waiting for a condition, stopping a
process a test started."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Callable

import requests

__all__ = ["free_port", "stop_process", "wait_until"]


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
