"""The CPU of one detector pass on a simulated fleet's store.

A fleet of N simulated Tritons with M models each (``collector.testbed.fleet``) is
scraped every second by ``batchscope collect --sources triton`` with the analyses put
off, for ``--seconds`` (a minute's window and a little more); then, in this process and
with the garbage-collector thresholds a ``collect`` runs with, the detectors' job
(``detector_job`` with the default settings, as ``collect`` builds it) is timed at the
newest sample, ``--passes`` times, by ``time.process_time``. Printed beside it: the
window read alone (``read_window``) and, for scale, reading the same window as full
``ModelSample`` records (``Store.model_samples``), what the detectors read before
``Store.counter_series``; and ``build_status`` over the same window, what the alert
rules read each pass (and ``status``, the UI's overview and the exporter).

Usage: ``python -m bench.detect_pass [--targets 20] [--models 20] [--seconds 75]
[--passes 3] [--store FILE]`` (``--store``: time a copy of an existing SQLite store
instead).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.fleet_run import CollectorProcess
from collector.analysis.detect import DetectorSettings, detector_job, read_window
from collector.analysis.status import build_status
from collector.process_control import tune_gc_for_service
from collector.store import Store
from collector.testbed.fleet import Fleet


def build_store(workdir: Path, targets: int, models: int, seconds: float) -> Path:
    """A SQLite store of ``seconds`` of 1 s scrapes of a simulated fleet."""
    path = workdir / "batchscope.db"
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(Fleet(targets, models))
        collector = CollectorProcess(workdir, fleet.urls, f"sqlite:///{path}", 1.0, analyses=False)
        stack.callback(collector.stop)
        collector.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            collector.check_alive()
            time.sleep(1.0)
    return path


def cpu_seconds(work: Callable[[], object], repeats: int) -> list[float]:
    """The CPU seconds of ``work``, once per repeat."""
    out = []
    for _ in range(repeats):
        started = time.process_time()
        work()
        out.append(time.process_time() - started)
    return out


def measure(path: Path, passes: int) -> None:
    settings = DetectorSettings()
    tune_gc_for_service()
    with Store(f"sqlite:///{path}") as store:
        newest = store.latest_collected_at()
        if newest is None:
            raise SystemExit(f"{path}: no samples")
        samples = len(store.model_samples(since=newest - settings.window_s, until=newest))
        job = detector_job(settings)
        figures = {
            "detector pass": cpu_seconds(lambda: job(store, newest), passes),
            "read_window": cpu_seconds(lambda: read_window(store, settings, now=newest), passes),
            # What the alert rules read each pass (and `status`, the UI, the exporter).
            "build_status": cpu_seconds(
                lambda: build_status(store, window_s=settings.window_s, now=newest), passes
            ),
            "model_samples (full records)": cpu_seconds(
                lambda: store.model_samples(since=newest - settings.window_s, until=newest),
                passes,
            ),
        }
    print(f"store {path}: {samples} model samples in the {settings.window_s:g} s window")
    for name, values in figures.items():
        runs = " ".join(f"{v:.3f}" for v in values)
        print(f"{name:30s} median {statistics.median(values):.3f} s CPU  ({runs})")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=20)
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=75.0)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--store", type=Path, help="an existing SQLite store to time")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bs-detect-") as workdir:
        if args.store is not None:
            # A pass writes its streaks and findings: the given store stays as it was.
            path = Path(shutil.copy(args.store, Path(workdir) / "batchscope.db"))
        else:
            path = build_store(Path(workdir), args.targets, args.models, args.seconds)
        measure(path, args.passes)


if __name__ == "__main__":
    main()
