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
