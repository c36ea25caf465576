"""batchscope's collector against Prometheus on one simulated Triton fleet: a table of
CPU ratios, scrapes done, targets per core and store size, from one run.

For each point a fleet of N simulated Tritons with M models each
(``collector.testbed.fleet``, a process of its own) is scraped side by side by
``batchscope collect --sources triton`` (a subprocess, with a settings file listing
the targets) and by Debian's ``prometheus`` (a generated ``prometheus.yml`` scraping
the same targets' ``/metrics`` at the same interval, its TSDB in a temporary folder).
Once both have scraped every target and one more interval has passed, the CPU of each
process (user + system, from ``/proc/<pid>/stat``) is read at the start and the end of
the same window; the scrapes each completed in the window come from batchscope's store
(its samples) and from Prometheus itself (the sum of ``up``).

Printed per point: CPU ms per target-scrape of each, scrapes done / due, the ratio
batchscope / Prometheus, the targets one core keeps at a 5 s interval
(5 s / CPU s per target-scrape), the store's bytes per target-scrape and the
simulator's own CPU. On PostgreSQL the server's CPU for batchscope's connections is
shown apart (it is not batchscope's process). The ``store`` points add bytes per
target per day and the bounded size under the default retention (``bench/store_size.py``),
and ``parser`` the fast parser's speed-up (``bench/parser_speed.py``). Every point
measures the scrape cycle alone (fetch, parse, rates, store write: the analyses are put
off), but ``analyses``: the headline fleet with the detectors and alert rules running
every 15 s as ``collect`` runs them by default.

Usage: ``make bench-collector`` or ``python -m bench.collector [--seconds 60]
[--points headline,analyses,postgres,targets,models,store,parser] [--quick] [--json FILE]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: this file's folder would shadow the ``collector`` package.
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH]
    sys.path.insert(0, str(_BENCH.parent))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator, Sequence  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from types import FrameType  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402

from bench.fleet_run import (  # noqa: E402
    DEFAULT_PG_URL,
    BenchStore,
    CollectorProcess,
    PrometheusProcess,
    cpu_seconds,
    pg_reachable,
    pg_store,
    sqlite_store,
    wait_for_first_scrapes,
)
from bench.store_size import StoreSize, human, store_size  # noqa: E402
from collector.testbed.fleet import Fleet  # noqa: E402

GROUPS = ("headline", "analyses", "postgres", "targets", "models", "store", "parser")
PER_CORE_INTERVAL_S = 5.0


@dataclass(frozen=True)
class Point:
    group: str
    targets: int
    models: int
    interval_s: float
    backend: str = "sqlite"
    prometheus: bool = True
    store: bool = False
    # The detectors and alert rules too (every analysis_every_s); the other points
    # measure the scrape cycle alone: fetch, parse, rates, store write.
    analyses: bool = False

    @property
    def fleet(self) -> str:
        return f"{self.targets} x {self.models} @ {self.interval_s:g} s"


def plan(groups: Sequence[str], quick: bool) -> list[Point]:
    """The points of the selected groups, in the order they run."""
    n, m = (3, 3) if quick else (20, 20)
    out: list[Point] = []
    if "headline" in groups:
        out.append(Point("headline", n, m, 1.0))
    if "analyses" in groups:
        out.append(Point("analyses", n, m, 1.0, analyses=True))
    if "postgres" in groups:
        out.append(Point("postgres", n, m, 1.0, backend="postgresql"))
    if "targets" in groups:
        interval = 1.0 if quick else 5.0
        for targets in (4, 8) if quick else (50, 100, 200, 500):
            out.append(Point("targets", targets, m, interval))
    if "models" in groups:
        for models in (1, 6) if quick else (1, 20, 100):
            if models == m and "headline" in groups:
                continue  # the headline point is this one
            out.append(Point("models", n, models, 1.0))
    if "store" in groups:
        interval = 1.0 if quick else 5.0
        for backend in ("sqlite", "postgresql"):
            out.append(Point("store", n, m, interval, backend, prometheus=False, store=True))
    return out


@dataclass
class Row:
    point: Point
    window_s: float = 0.0
    b_scrapes: int = 0
    b_cpu_s: float = 0.0
    pg_cpu_s: float | None = None  # PostgreSQL's backends serving batchscope
    p_scrapes: int | None = None
    p_cpu_s: float | None = None
    sim_cpu_s: float = 0.0
    growth_bytes: int = 0
    size: StoreSize | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def due(self) -> float:
        return self.point.targets * self.window_s / self.point.interval_s

    @property
    def b_ms(self) -> float | None:
        return 1e3 * self.b_cpu_s / self.b_scrapes if self.b_scrapes else None

    @property
    def p_ms(self) -> float | None:
        if self.p_cpu_s is None or not self.p_scrapes:
            return None
        return 1e3 * self.p_cpu_s / self.p_scrapes

    @property
    def pg_ms(self) -> float | None:
        return (
            1e3 * self.pg_cpu_s / self.b_scrapes
            if self.pg_cpu_s is not None and self.b_scrapes
            else None
        )

    @property
    def ratio(self) -> float | None:
        b, p = self.b_ms, self.p_ms
        return b / p if b is not None and p else None


# --------------------------------------------------------------------------- one point


def _pg_backends(collector_pid: int, store: BenchStore) -> dict[int, float]:
    """CPU seconds of the PostgreSQL backends serving the collector's connections."""
    if store.kind != "postgresql":
        return {}
    try:
        ports = {
            c.laddr.port
            for c in psutil.Process(collector_pid).net_connections(kind="tcp")
            if c.raddr and c.raddr.port == 5432
        }
        with store.engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT pid, client_port FROM pg_stat_activity").all()
    except Exception:  # noqa: BLE001 - a figure shown apart, not the measurement
        return {}
    return {int(pid): cpu_seconds(int(pid)) for pid, port in rows if port in ports}


def _cpu(pid: int | None) -> float:
    return cpu_seconds(pid) if pid is not None else 0.0


def measure(point: Point, seconds: float, pg_url: str, source_root: Path | None = None) -> Row:
    row = Row(point)
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(Fleet(point.targets, point.models))
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bs-bench-")))
        store = stack.enter_context(
            sqlite_store(workdir) if point.backend == "sqlite" else pg_store(pg_url)
        )
        collector = CollectorProcess(
            workdir,
            fleet.urls,
            store.url,
            point.interval_s,
            source_root=source_root,
            analyses=point.analyses,
        )
        stack.callback(collector.stop)
        collector.start()
        prometheus: PrometheusProcess | None = None
        if point.prometheus:
            hosts = [u.split("://", 1)[1] for u in fleet.urls]
            prometheus = PrometheusProcess(workdir, hosts, point.interval_s)
            stack.callback(prometheus.stop)
            prometheus.start()
        warm_s = 30.0 + 0.1 * point.targets + 3 * point.interval_s
        note = wait_for_first_scrapes(store, prometheus, collector, point.targets, warm_s)
        if note:
            row.notes.append(note)
        time.sleep(point.interval_s + 1.0)  # one more interval: past the first scrapes

        p_pid = prometheus.pid if prometheus else None
        t0, b0, p0, s0 = time.time(), _cpu(collector.pid), _cpu(p_pid), _cpu(fleet.pid)
        pg0, size0 = _pg_backends(collector.pid, store), store.size_bytes()
        time.sleep(seconds)
        t1, b1, p1, s1 = time.time(), _cpu(collector.pid), _cpu(p_pid), _cpu(fleet.pid)
        pg1, size1 = _pg_backends(collector.pid, store), store.size_bytes()

        collector.check_alive()
        collector.stop()  # the store settles: every scrape of the window is written
        row.window_s, row.b_cpu_s, row.sim_cpu_s = t1 - t0, b1 - b0, s1 - s0
        row.b_scrapes = store.scrapes_between(t0, t1)
        row.growth_bytes = size1 - size0
        if store.kind == "postgresql":
            row.pg_cpu_s = sum(c - pg0.get(pid, 0.0) for pid, c in pg1.items())
        if prometheus is not None:
            row.p_cpu_s = p1 - p0
            row.p_scrapes = prometheus.scrapes_between(t0, t1)
            prometheus.stop()
        if point.store:
            row.size = store_size(store, point.models, row.b_scrapes, row.growth_bytes, source_root)
    return row


# --------------------------------------------------------------------------- printing


def _f(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _done(done: int | None, due: float) -> str:
    if done is None:
        return "-"
    return f"{done}/{due:.0f} ({100 * done / due:.0f}%)" if due else str(done)


def _per_core(ms: float | None) -> str:
    return "n/a" if not ms else f"{PER_CORE_INTERVAL_S / (ms / 1e3):.0f}"


def print_table(rows: Sequence[Row]) -> None:
    head = (
        f"{'point':<9} {'fleet':<18} {'store':<10} {'bs ms/scr':>9} {'bs done/due':>18} "
        f"{'prom ms/scr':>11} {'prom done/due':>18} {'ratio':>6} {'bs tgt/core':>11} "
        f"{'prom tgt/core':>13} {'B/scr':>7} {'sim %cpu':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        pt = r.point
        sim = 100 * r.sim_cpu_s / r.window_s if r.window_s else 0.0
        b_per = r.growth_bytes / r.b_scrapes if r.b_scrapes else None
        print(
            f"{pt.group:<9} {pt.fleet:<18} {pt.backend:<10} {_f(r.b_ms):>9} "
            f"{_done(r.b_scrapes, r.due):>18} {_f(r.p_ms):>11} {_done(r.p_scrapes, r.due):>18} "
            f"{_f(r.ratio):>6} {_per_core(r.b_ms):>11} {_per_core(r.p_ms):>13} "
            f"{_f(b_per, 0):>7} {sim:>8.1f}"
        )
        if r.pg_ms is not None:
            print(
                f"{'':<9} + PostgreSQL server for batchscope's connections: {r.pg_ms:.2f} ms/scrape"
            )
        for note in r.notes:
            print(f"{'':<9} note: {note}")


def print_summary(rows: Sequence[Row]) -> None:
    for r in rows:
        pt = r.point
        if pt.group == "headline" and r.ratio is not None:
            verdict = "meets" if r.ratio <= 1.0 else "misses"
            print(f"headline ratio ({pt.fleet}, {pt.backend}): {r.ratio:.2f} ({verdict} <= 1.0)")
    targets_rows = [r for r in rows if r.point.group == "targets" and r.b_scrapes]
    if targets_rows:
        big = max(targets_rows, key=lambda r: r.point.targets)
        share = big.b_scrapes / big.due if big.due else 0.0
        verdict = "meets" if share >= 0.99 else "misses"
        print(
            f"max targets per core at a {PER_CORE_INTERVAL_S:g} s interval "
            f"(from {big.point.fleet}): "
            f"batchscope {_per_core(big.b_ms)}, Prometheus {_per_core(big.p_ms)}; "
            f"batchscope completed {100 * share:.1f}% of due scrapes ({verdict} >= 99%)"
        )


def print_store(rows: Sequence[Row]) -> None:
    sized = [r for r in rows if r.size is not None]
    if not sized:
        return
    print()
    print(
        f"store size ({sized[0].point.models} models per target; per day at the default "
        "5 s interval; bounded = 7 d raw + 90 d of 300 s rollups)"
    )
    head = (
        f"{'store':<10} {'B/target-scrape':>15} {'raw/target/day':>14} {'B/rollup row':>12} "
        f"{'bounded/target':>14} {'file+wal':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in sized:
        s = r.size
        assert s is not None
        print(
            f"{s.kind:<10} {_f(s.bytes_per_target_scrape, 0):>15} "
            f"{human(s.raw_per_target_day):>14} "
            f"{_f(s.bytes_per_rollup_row, 0):>12} {human(s.steady_per_target):>14} "
            f"{human(s.file_bytes) if s.kind == 'sqlite' else '-':>9}"
        )


def parser_line() -> str:
    try:
        from bench.parser_speed import parser_speed
    except ImportError as exc:
        return f"fast parser: bench/parser_speed.py is missing ({exc})"
    result = parser_speed()
    if isinstance(result, dict) and {"ratio", "fast_s", "prometheus_client_s"} <= set(result):
        return (
            f"fast parser ({result.get('models', 0):.0f} models, "
            f"{result.get('lines', 0):.0f} lines, same results): "
            f"{result['fast_s'] * 1e3:.2f} ms vs prometheus_client's "
            f"{result['prometheus_client_s'] * 1e3:.2f} ms per page, "
            f"{result['ratio']:.1f}x faster (>= 10x wanted)"
        )
    return f"fast parser: {result}"


# --------------------------------------------------------------------------- main


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops the bench like Ctrl-C: everything started is stopped."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, help="measured window per point (default 60)")
    parser.add_argument("--points", default=",".join(GROUPS), help="groups: " + ",".join(GROUPS))
    parser.add_argument("--quick", action="store_true", help="small fleets (a smoke test)")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="PostgreSQL for the pg points")
    parser.add_argument("--json", type=Path, help="also write every row here")
    parser.add_argument(
        "--collector-root",
        type=Path,
        help="run batchscope from this source tree (another checkout) instead of this one",
    )
    args = parser.parse_args(argv)
    groups = [g.strip() for g in args.points.split(",") if g.strip()]
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        parser.error(f"unknown --points {unknown}; choose from {', '.join(GROUPS)}")
    seconds = args.seconds or (4.0 if args.quick else 60.0)

    points = plan(groups, args.quick)
    pg_problem = pg_reachable(args.pg_url) if any(p.backend != "sqlite" for p in points) else None
    rows: list[Row] = []
    with _sigterm_interrupts():
        for point in points:
            if point.backend != "sqlite" and pg_problem:
                print(f"skipped {point.group} {point.fleet} on PostgreSQL: {pg_problem}")
                continue
            print(f"measuring {point.group}: {point.fleet} on {point.backend} ...", flush=True)
            rows.append(measure(point, seconds, args.pg_url, args.collector_root))
        parser_text = parser_line() if "parser" in groups else None

    print()
    print(f"batchscope collect vs Prometheus, {seconds:g} s windows")
    print_table(rows)
    print_summary(rows)
    print_store(rows)
    if parser_text:
        print(parser_text)
    if args.json:
        args.json.write_text(json.dumps([_row_json(r) for r in rows], indent=1))
    return rows


def _row_json(row: Row) -> dict[str, Any]:
    out = asdict(row)
    out.update(b_ms=row.b_ms, p_ms=row.p_ms, pg_ms=row.pg_ms, ratio=row.ratio, due=row.due)
    return out


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted: everything started was stopped", file=sys.stderr)
        raise SystemExit(130) from None
