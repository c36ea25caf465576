"""Long-running commands collect cyclic garbage rarely (see ``tune_gc_for_service``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from collector.process_control import SERVICE_GC_THRESHOLDS, SERVICE_MALLOC_ARENAS


def _child_output(code: str) -> str:
    """What ``code`` prints, run by a child Python: the settings it checks are
    process-wide."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout


def test_a_batchscope_command_runs_with_the_service_gc_thresholds() -> None:
    # In a child process: the thresholds are process-wide.
    code = (
        "import gc, sys\n"
        "from collector import cli\n"
        "cli._run = lambda args: print(gc.get_threshold()) or 0\n"
        "sys.exit(cli.main(['status']))\n"
    )
    out = _child_output(code)
    assert out.strip() == str(SERVICE_GC_THRESHOLDS)
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
    out = _child_output(code)
    assert int(out) >= 2


_ARENA_COUNT = """
import ctypes, sys, threading
from collector import process_control
if sys.argv[1] == "tuned":
    process_control.tune_gc_for_service()
started = threading.Barrier(9)
done = threading.Event()
def work():
    kept = [bytearray(50_000) for _ in range(20)]  # from the thread's malloc arena
    started.wait()
    done.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
started.wait()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
stream = libc.fopen(sys.argv[2].encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(stream))
libc.fclose(ctypes.c_void_p(stream))
done.set()
for t in threads:
    t.join()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc arenas")
def test_a_service_keeps_two_malloc_arenas_however_many_threads_allocate(
    tmp_path: Path,
) -> None:
    # In child processes (the cap is process-wide and set before threads allocate):
    # 8 threads allocating get arenas of their own untuned, and share 2 when tuned.
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    heaps = {}
    for mode in ("untuned", "tuned"):
        info = tmp_path / f"{mode}.xml"
        subprocess.run(
            [sys.executable, "-c", _ARENA_COUNT, mode, str(info)],
            env=env,
            timeout=60,
            check=True,
        )
        heaps[mode] = info.read_text().count("<heap nr=")
    assert heaps["tuned"] <= SERVICE_MALLOC_ARENAS < heaps["untuned"], heaps


def test_the_tuning_can_be_undone_in_a_process_that_goes_on() -> None:
    # In a child process: the thresholds and the sweeper are process-wide.
    code = (
        "import gc, threading\n"
        "from collector import process_control\n"
        "default = gc.get_threshold()\n"
        "process_control.tune_gc_for_service()\n"
        "tuned = gc.get_threshold()\n"
        "sweeping = any(t.name == 'gc-sweep' for t in threading.enumerate())\n"
        "process_control.untune_gc()\n"
        "left = any(t.name == 'gc-sweep' for t in threading.enumerate())\n"
        "print(tuned != default, sweeping, gc.get_threshold() == default, left)\n"
    )
    out = _child_output(code)
    assert out.split() == ["True", "True", "True", "False"]
