"""Long-running commands collect cyclic garbage rarely (see ``tune_gc_for_service``)."""

from __future__ import annotations

import subprocess
import sys

from collector.process_control import SERVICE_GC_THRESHOLDS


def test_a_batchscope_command_runs_with_the_service_gc_thresholds() -> None:
    # In a child process: the thresholds are process-wide.
    code = (
        "import gc, sys\n"
        "from collector import cli\n"
        "cli._run = lambda args: print(gc.get_threshold()) or 0\n"
        "sys.exit(cli.main(['status']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == str(SERVICE_GC_THRESHOLDS)
    assert SERVICE_GC_THRESHOLDS[0] > 700  # above Python's default young threshold


def test_the_oldest_generation_is_collected_fully_once_in_a_while() -> None:
    # In a child process (the sweeper is process-wide), with the sweep every 50 ms.
    code = (
        "import gc, sys, time\n"
        "from collector import process_control\n"
        "process_control.FULL_COLLECTION_EVERY_S = 0.05\n"
        "before = gc.get_stats()[2]['collections']\n"
        "process_control.tune_gc_for_service()\n"
        "deadline = time.monotonic() + 10\n"
        "while gc.get_stats()[2]['collections'] < before + 2 and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print(gc.get_stats()[2]['collections'] - before)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert int(out.stdout) >= 2
