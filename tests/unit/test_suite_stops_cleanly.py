"""A test run stopped with SIGTERM runs its fixtures' teardowns (``tests/conftest.py``):
the processes the tests started do not outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

from tests.support import wait_until

REPO = Path(__file__).resolve().parents[2]

TEST_FILE = textwrap.dedent(
    """
    import subprocess
    import sys
    import time

    import pytest


    @pytest.fixture
    def child():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("CHILD", proc.pid, flush=True)
        yield proc
        proc.kill()
        proc.wait()


    def test_waits(child):
        print("READY", flush=True)
        time.sleep(600)
    """
)


def test_a_run_stopped_with_sigterm_stops_what_its_fixtures_started(tmp_path: Path) -> None:
    (tmp_path / "test_waits.py").write_text(TEST_FILE)
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "tests.conftest",
         "-p", "no:cacheprovider", str(tmp_path / "test_waits.py")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    child_pid = 0
    try:
        assert run.stdout is not None
        for line in run.stdout:
            if line.startswith("CHILD "):
                child_pid = int(line.split()[1])
            if "READY" in line:
                break
        assert child_pid, "the inner test did not start its child"
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
        # Its teardown killed and reaped the child before the run exited.
        wait_until(lambda: not psutil.pid_exists(child_pid), 5, "the child to be gone")
    finally:
        run.kill()
        run.wait()
        if child_pid and psutil.pid_exists(child_pid):
            os.kill(child_pid, signal.SIGKILL)
