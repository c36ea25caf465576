"""A process that exits while load runs are in flight (the demo's driver threads are
daemons) exits at once and quietly: the runs stop sending, return what they measured,
and gRPC's asyncio state is released after its event loop has stopped."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time


def test_exiting_during_load_runs_is_quick_and_quiet() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        target = f"127.0.0.1:{s.getsockname()[1]}"  # closed: every request fails fast
    script = textwrap.dedent(
        f"""
        import threading, time
        from collector.testbed.load import run_load

        results = []
        def drive():
            results.append(run_load({target!r}, "m", concurrency=4, duration_s=30.0))

        for _ in range(4):
            threading.Thread(target=drive, daemon=True).start()
        time.sleep(0.5)
        # Two short runs finish on their own meanwhile, from two threads at once.
        done = [threading.Thread(target=run_load, args=({target!r}, "m"),
                                 kwargs={{"concurrency": 2, "duration_s": 0.3}})
                for _ in range(2)]
        for t in done: t.start()
        for t in done: t.join()
        print("exiting", flush=True)
        """
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exiting"
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
    assert time.monotonic() - started < 20.0


def test_a_started_load_loop_lets_a_first_run_stop_at_once() -> None:
    """What the demo relies on to stop within seconds of a SIGTERM that comes as its
    first load runs start: once ``start_load_loop`` has run, a run told to stop imports
    nothing (gRPC's import cannot be interrupted) and returns at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        target = f"127.0.0.1:{s.getsockname()[1]}"
    script = textwrap.dedent(
        f"""
        import sys, threading, time
        from collector.testbed.load import run_load, start_load_loop

        start_load_loop()
        before = set(sys.modules)
        stop = threading.Event()
        stop.set()
        began = time.monotonic()
        result = run_load({target!r}, "m", concurrency=4, duration_s=30.0, stop=stop)
        print(round(time.monotonic() - began, 3))
        print(sorted(set(sys.modules) - before))
        print(result.requests + result.errors)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    seconds, imported, requests = done.stdout.split("\n")[:3]
    assert float(seconds) < 1.0, done.stdout
    assert imported == "[]", done.stdout
    assert requests == "0", done.stdout
