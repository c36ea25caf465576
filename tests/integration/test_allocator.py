"""Long-running commands run on jemalloc when it is installed (the ``allocator``
setting): the command replaces its own process with one that preloads it, keeping its
pid and command line; ``allocator: system`` keeps the C library's malloc."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from collector.process_control import jemalloc_library
from tests.support import free_port, stop_process, wait_until

pytestmark = pytest.mark.skipif(
    jemalloc_library() is None, reason="jemalloc is not installed (make system-deps)"
)


def _mapped_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@contextmanager
def _exporter(tmp_path: Path, **env_extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """The exporter, started as the program, scraping a port nothing listens on, ready
    once its /healthz answers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSCOPE_")}
    env.pop("LD_PRELOAD", None)
    env.update(env_extra)
    command = [sys.executable, "-m", "collector.cli", "exporter", "--listen", f"127.0.0.1:{port}"]
    command += ["--triton", f"http://127.0.0.1:{free_port()}"]
    with (tmp_path / "exporter.log").open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(
            lambda: (
                proc.poll() is not None
                or requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).ok
            ),
            60,
            "the exporter's /healthz",
        )
        assert proc.poll() is None, (tmp_path / "exporter.log").read_text()
        yield proc
    finally:
        stop_process(proc)


def test_a_long_running_command_runs_on_jemalloc_in_its_own_process(tmp_path: Path) -> None:
    with _exporter(tmp_path) as proc:
        # The process started is the one serving: replaced in place, not forked.
        assert "libjemalloc" in _mapped_libraries(proc.pid)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert b"exporter" in cmdline and b"--listen" in cmdline
    assert proc.returncode == 0, (tmp_path / "exporter.log").read_text()


def test_allocator_system_keeps_the_c_librarys_malloc(tmp_path: Path) -> None:
    with _exporter(tmp_path, BATCHSCOPE_ALLOCATOR="system") as proc:
        assert "libjemalloc" not in _mapped_libraries(proc.pid)


def test_a_jemalloc_the_loader_cannot_preload_is_not_tried_again(tmp_path: Path) -> None:
    # LD_PRELOAD names a jemalloc that is not there: the loader says so and goes on,
    # and the command runs on the C library's malloc instead of replacing itself again.
    missing = str(tmp_path / "libjemalloc.so.2")
    with _exporter(tmp_path, LD_PRELOAD=missing) as proc:
        assert "libjemalloc" not in _mapped_libraries(proc.pid)
    assert proc.returncode == 0


def test_an_unknown_allocator_is_refused_naming_the_setting(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSCOPE_")}
    env["BATCHSCOPE_ALLOCATOR"] = "tcmalloc"
    done = subprocess.run(
        [sys.executable, "-m", "collector.cli", "exporter", "--triton", "http://127.0.0.1:1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode != 0
    assert "invalid setting allocator" in done.stderr, done.stderr
    assert "jemalloc" in done.stderr and "system" in done.stderr
