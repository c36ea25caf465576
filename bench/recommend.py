"""Recommended batching config against an exhaustive sweep, on the real CPU testbed.

For each case and each closed-loop concurrency c, all on one ``tritonserver`` per case:

1. baseline: dynamic batching off, one instance, max_batch_size 32; QPS and p95 as the
   load generator measures them (client side) over ``--seconds``;
2. observe -> recommend: a ``CollectorService`` (triton + host sources, 0.5 s scrapes,
   a fresh SQLite store) watches while the load runs for the observation window, then
   ``recommend_model`` answers from the store alone; a ``probe`` recommendation is
   applied and observed again under the same load (at most ``--probe-rounds`` times).
   The wall time from the first observation to the final recommendation is the *time
   to recommendation*;
   Then ``batchscope recommend`` (the CLI, a fresh process each time) is called
   ``--cli-calls`` times (3 by default), ``--cli-gap`` seconds apart (15; 3 with
   ``--quick``), on the same store under the same unbroken load: each call's wall
   time and whether every call gave the same advice are reported (``cli s``,
   ``held``) and checked (at most 3 s a call; the same advice);
3. the final recommendation is applied and measured like the baseline; the
   recommender's prediction (QPS and p95 at the observed load) is compared with it;
4. sweep: every grid config (max_queue_delay 0/500/1000/2000/5000 us x preferred sizes
   none/[4,8]/[8,16]/[16,32] x instances 1/2, plus the baseline) is loaded through the
   load API, warmed up and measured with the same load generator (``--sweep-seconds``
   each); the sweep-best is the highest QPS whose p95 meets the objective
   (``slo_p95_ms`` when the case has one, else p95 <= 1.1 x baseline p95).  Each config
   is loaded once and measured at every concurrency in turn; the sweep wall time shown
   per concurrency is what a sweep at that concurrency alone costs (per config: reload
   + warm-up + measurement);
5. confirm (``--confirm N``, 2 by default, 0 with ``--quick``): the recommended and the
   sweep-best config are re-measured N times each, alternating, for a "paired" ratio
   that neither a single noisy run nor the sweep's pick of the luckiest of 41 runs can
   bias. On 2 cores one config measured twice differs by up to ~12 % (closed loops
   lock into different batching patterns), and the sweep-best is the maximum of 41
   such draws, so the single-run ratio reads low by about that much.

Cases (each starts from the baseline config):

(a) ``fixed_cost``: 8 ms fixed + 0.3 ms per sample per execution; batching pays a lot.
(b) ``linear``: 0.5 ms fixed + 2.0 ms per sample; batching pays little, so the right
    answer is a small change or none.
(c) ``strict_slo``: the model of (a) under a strict p95 objective, ``STRICT_SLO_P95_MS``
    per concurrency (see there for the values and why), tight enough that the longest
    delay (5000 us) does not meet it.  Its model is (a)'s, so when (a) runs in the same
    invocation its sweep measurements are reused and only the objective differs.

Usage: ``python -m bench.recommend [--quick] [--cases a,b,c] [--concurrency 8,16,32]
[--seconds S] [--sweep-seconds S] [--confirm N] [--sweep-only] [--json FILE]``.

``--quick`` (concurrency 16; delay 0/2000 x preferred none/[8,16] x 1 instance; 3 s
measurements, 8 s observations) is what CI runs (tests/integration/
test_recommend_bench.py, case (a) alone, about 75 s); all three cases take about 2.5
minutes on 2 cores.  The full bench takes about 21 minutes on 2 cores: 2 sweeps of 41
configs x 3 concurrencies at 3 s, the recommendation flows at 4 s per measurement and
12 s per observation.  ``--sweep-only`` skips the recommender (steps 2-3 and 5) and
prints the baseline and sweep columns alone.  Progress goes to stderr, the table to
stdout.

Measurements on a shared machine: the footer reports the CPU that other processes
used and the hypervisor's steal during the run, since both move the figures (steal
alone reached 48 % over 2 s on the 2-core VM this was written on).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from collector.analysis.configs import config_with
from collector.config import Settings, target_from_url
from collector.records import BatcherConfig, Recommendation
from collector.scheduler import CollectorService, build_sources
from collector.store import Store
from collector.testbed.load import LoadResult, load_in_background, run_load
from collector.testbed.models import ModelSpec
from collector.testbed.server import TritonServer

__all__ = ["CASES", "BenchReport", "main"]

MAX_BATCH_SIZE = 32

# Case (c)'s p95 objective (client side, ms) per concurrency.  Why these values: on
# the 2-core testbed the configs of (a)'s grid that batch well (2 instances, a
# preferred size the load reaches or a delay of at most 2000 us) measured a p95 of
# about 20-25 ms at c=8, 25-30 ms at c=16 and 35-40 ms at c=32 in quiet runs, while
# the longest delay with no preferred size the load can reach (5000 us, where every
# batch waits the delay out) measured 25-41, 30-47 and 43-61 ms.  Each value sits
# just above the first group and below the second, so the objective is strict: the
# longest delay is not allowed, only the few configs that batch without waiting are.
# One value for all concurrencies cannot do that: in a closed loop the mean latency
# is c / QPS (Little's law), so the floor rises with c.  Other concurrencies are
# interpolated linearly (and extrapolated from the nearest two).  On a much faster or
# slower machine these figures move; the table then shows "none meets" or a loose
# objective, which is the sign to recalibrate.
STRICT_SLO_P95_MS: dict[int, float] = {8: 24.0, 16: 30.0, 32: 40.0}

# The objective without an SLO: never worse than the baseline p95 by more than 10 %.
P95_TOLERANCE = 1.10
# A `batchscope recommend` call may take this long at most (the whole command).
_CLI_LIMIT_S = 3.0
# "Not worse than baseline" allows this much QPS noise between two measurements.
QPS_NOISE = 0.95
# A measurement during which other processes used this many cores, or the hypervisor
# stole this share of the CPU, is marked "~" in the table: on 2 cores either moves QPS
# by tens of percent.
DISTURBED_FOREIGN_CORES = 0.25
DISTURBED_STEAL = 0.10


@dataclass(frozen=True)
class Case:
    key: str
    spec: ModelSpec
    description: str
    strict_slo: bool = False
    sweep_like: str | None = None  # reuse that case's sweep: same model, same costs

    @property
    def model(self) -> str:
        return self.spec.name

    def slo_p95_ms(self, concurrency: int) -> float | None:
        if not self.strict_slo:
            return None
        return strict_slo_p95_ms(concurrency)


def strict_slo_p95_ms(concurrency: int) -> float:
    """``STRICT_SLO_P95_MS`` at ``concurrency``, linear between (and beyond) its points."""
    points = sorted(STRICT_SLO_P95_MS.items())
    if concurrency in STRICT_SLO_P95_MS or len(points) == 1:
        return STRICT_SLO_P95_MS.get(concurrency, points[0][1])
    lo, hi = points[0], points[1]
    for a, b in zip(points, points[1:], strict=False):
        lo, hi = a, b
        if concurrency <= b[0]:
            break
    slope = (hi[1] - lo[1]) / (hi[0] - lo[0])
    return max(lo[1] + slope * (concurrency - lo[0]), 1.0)


def _spec(name: str, fixed_ms: float, per_sample_ms: float) -> ModelSpec:
    return ModelSpec(
        name,
        fixed_ms=fixed_ms,
        per_sample_ms=per_sample_ms,
        max_batch_size=MAX_BATCH_SIZE,
        dynamic_batching=False,
        instance_count=1,
    )


CASES: dict[str, Case] = {
    "a": Case("a", _spec("fixed_cost", 8.0, 0.3), "large fixed cost per execution"),
    "b": Case("b", _spec("linear", 0.5, 2.0), "cost nearly linear in batch size"),
    "c": Case(
        "c",
        _spec("strict_slo", 8.0, 0.3),
        "(a) under a strict p95 objective",
        strict_slo=True,
        sweep_like="a",
    ),
}

BASELINE = BatcherConfig(max_batch_size=MAX_BATCH_SIZE, dynamic_batching=False, instance_count=1)

FULL_GRID = dict(
    delays=(0, 500, 1000, 2000, 5000), preferred=((), (4, 8), (8, 16), (16, 32)), instances=(1, 2)
)
QUICK_GRID = dict(delays=(0, 2000), preferred=((), (8, 16)), instances=(1,))


def grid_configs(
    delays: Iterable[int], preferred: Iterable[tuple[int, ...]], instances: Iterable[int]
) -> list[BatcherConfig]:
    """The baseline followed by every grid point (delay-major order)."""
    configs = [BASELINE]
    for delay in delays:
        for sizes in preferred:
            for count in instances:
                configs.append(
                    BatcherConfig(
                        max_batch_size=MAX_BATCH_SIZE,
                        dynamic_batching=True,
                        preferred_batch_sizes=tuple(sizes),
                        max_queue_delay_us=delay,
                        instance_count=count,
                    )
                )
    return configs


def short(config: BatcherConfig | None) -> str:
    """``off x1`` or ``d2000 [8,16] x2`` (delay us, preferred sizes, instance count)."""
    if config is None:
        return "-"
    if not config.dynamic_batching:
        text = f"off x{config.instance_count}"
    else:
        sizes = ",".join(str(s) for s in config.preferred_batch_sizes) or "-"
        text = f"d{config.max_queue_delay_us} [{sizes}] x{config.instance_count}"
    if config.max_batch_size != MAX_BATCH_SIZE:
        text += f" mb{config.max_batch_size}"
    if config.max_queue_size:
        text += f" q{config.max_queue_size}"
    if config.default_timeout_us:
        text += f" t{config.default_timeout_us}"
    return text


# --------------------------------------------------------------------------- results


@dataclass
class Measure:
    """One load-generator run (client side)."""

    qps: float
    p95_ms: float | None
    p50_ms: float | None
    errors: int
    duration_s: float
    t_start: float = 0.0  # time.monotonic() around the run, to match CpuWatch samples
    t_end: float = 0.0
    # Filled from CpuWatch once the bench is done: cores other processes used, and the
    # share of CPU time the hypervisor stole, while this run went on.
    foreign_cores: float | None = None
    steal_share: float | None = None

    @classmethod
    def of(cls, result: LoadResult, t_start: float = 0.0, t_end: float = 0.0) -> Measure:
        return cls(
            qps=result.qps,
            p95_ms=result.p95_ms,
            p50_ms=result.p50_ms,
            errors=result.errors,
            duration_s=result.duration_s,
            t_start=t_start,
            t_end=t_end,
        )

    @property
    def disturbed(self) -> bool:
        return (self.foreign_cores or 0.0) >= DISTURBED_FOREIGN_CORES or (
            self.steal_share or 0.0
        ) >= DISTURBED_STEAL

    def short(self) -> str:
        p95 = f"{self.p95_ms:.1f}" if self.p95_ms is not None else "-"
        return f"{self.qps:.0f}/{p95}" + ("~" if self.disturbed else "")


def meets(measure: Measure, objective_p95_ms: float) -> bool:
    return measure.errors == 0 and measure.p95_ms is not None and measure.p95_ms <= objective_p95_ms


@dataclass
class Round:
    """One observation window and the recommendation made from it (``None``: too little
    data to make one)."""

    loaded: str  # config under observation (short form)
    observed: Measure  # the load generator's own figures over the window
    window_s: float
    recommend_s: float  # time recommend_model took
    recommendation: Recommendation | None
    target: str = ""  # the store's target name, and when the window ended (epoch s):
    ended_at: float = 0.0  # with --keep-stores, enough to observe the window again


@dataclass
class SweepPoint:
    config: str
    concurrency: int
    measure: Measure
    reload_s: float
    warmup_s: float


@dataclass
class Sweep:
    case: str  # the case that ran it
    points: list[SweepPoint]
    wall_s: float  # the whole sweep, every concurrency
    grid: list[BatcherConfig]

    def config(self, name: str) -> BatcherConfig:
        return next(c for c in self.grid if short(c) == name)

    def at(self, concurrency: int) -> list[SweepPoint]:
        return [p for p in self.points if p.concurrency == concurrency]

    def wall_at(self, concurrency: int) -> float:
        """What a sweep at this concurrency alone costs: reload + warm-up + run, per config."""
        return sum(p.reload_s + p.warmup_s + p.measure.duration_s for p in self.at(concurrency))


@dataclass
class Row:
    """Everything about one case at one concurrency."""

    case: str
    model: str
    concurrency: int
    slo_p95_ms: float | None
    objective_p95_ms: float  # the p95 a config must meet
    baseline: Measure
    rounds: list[Round] = field(default_factory=list)
    recommended_config: str | None = None
    recommended_kind: str | None = None
    recommended: Measure | None = None
    predicted_qps: float | None = None
    predicted_p95_ms: float | None = None
    time_to_recommendation_s: float | None = None
    sweep_case: str | None = None
    sweep_best_config: str | None = None
    sweep_best: Measure | None = None
    sweep_wall_s: float | None = None
    sweep_of_recommended: Measure | None = None  # the recommended config's sweep point
    recommended_batcher: BatcherConfig | None = None
    confirm_recommended: list[Measure] = field(default_factory=list)
    confirm_best: list[Measure] = field(default_factory=list)
    # `batchscope recommend` called repeatedly after the final recommendation: the
    # seconds each call took (the whole command) and the advice each gave.
    cli_call_s: list[float] = field(default_factory=list)
    cli_advice: list[str] = field(default_factory=list)

    @property
    def cli_advice_held(self) -> bool | None:
        """Whether every repeated call gave the same advice (None: not called)."""
        return len(set(self.cli_advice)) == 1 if self.cli_advice else None

    @property
    def ratio(self) -> float | None:
        if self.recommended is None or self.sweep_best is None or not self.sweep_best.qps:
            return None
        return self.recommended.qps / self.sweep_best.qps

    @property
    def paired_ratio(self) -> float | None:
        """Mean QPS of the recommended config over the sweep-best's, from ``--confirm``'s
        alternating re-measurements (1.0 when they are the same config)."""
        if self.recommended is None or self.sweep_best is None:
            return None
        if self.recommended_config == self.sweep_best_config:
            return 1.0
        if not self.confirm_recommended or not self.confirm_best:
            return None
        rec = sum(m.qps for m in self.confirm_recommended) / len(self.confirm_recommended)
        best = sum(m.qps for m in self.confirm_best) / len(self.confirm_best)
        return rec / best if best else None

    @property
    def qps_error(self) -> float | None:
        if self.recommended is None or self.predicted_qps is None or not self.recommended.qps:
            return None
        return abs(self.predicted_qps - self.recommended.qps) / self.recommended.qps

    @property
    def p95_error(self) -> float | None:
        if self.recommended is None or self.predicted_p95_ms is None or not self.recommended.p95_ms:
            return None
        return abs(self.predicted_p95_ms - self.recommended.p95_ms) / self.recommended.p95_ms

    @property
    def gain(self) -> float | None:
        if self.recommended is None or not self.baseline.qps:
            return None
        return self.recommended.qps / self.baseline.qps

    @property
    def recommended_meets_objective(self) -> bool | None:
        return None if self.recommended is None else meets(self.recommended, self.objective_p95_ms)

    @property
    def not_worse_than_baseline(self) -> bool | None:
        """QPS within noise of the baseline or above, p95 within the objective or the
        baseline's tolerance (a baseline that breaks an SLO is not a bar to keep)."""
        rec = self.recommended
        if rec is None:
            return None
        if rec.errors or rec.p95_ms is None or rec.qps < QPS_NOISE * self.baseline.qps:
            return False
        base_p95 = self.baseline.p95_ms or 0.0
        return rec.p95_ms <= max(P95_TOLERANCE * base_p95, self.objective_p95_ms)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for name in (
            "ratio",
            "paired_ratio",
            "qps_error",
            "p95_error",
            "gain",
            "recommended_meets_objective",
            "not_worse_than_baseline",
            "cli_advice_held",
        ):
            data[name] = getattr(self, name)
        return data


@dataclass
class Target:
    name: str
    met: bool | None  # None: not evaluated
    detail: str


@dataclass
class BenchReport:
    options: dict[str, Any]
    rows: list[Row]
    sweeps: dict[str, Sweep]
    targets: list[Target]
    wall_s: float

    def row(self, case: str, concurrency: int) -> Row:
        for r in self.rows:
            if r.case == case and r.concurrency == concurrency:
                return r
        raise KeyError((case, concurrency))

    def to_json(self) -> str:
        return json.dumps(
            {
                "options": self.options,
                "rows": [r.to_dict() for r in self.rows],
                "sweeps": {k: dataclasses.asdict(s) for k, s in self.sweeps.items()},
                "targets": [dataclasses.asdict(t) for t in self.targets],
                "wall_s": self.wall_s,
            },
            indent=2,
            default=str,
        )


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Options:
    cases: tuple[str, ...]
    concurrency: tuple[int, ...]
    seconds: float  # each baseline / recommended / confirmation measurement
    sweep_seconds: float  # each sweep measurement
    observe_s: float  # each observation window
    ramp_s: float  # start of each window left out of what the recommender sees
    warmup_s: float  # load after every reload before measuring
    probe_rounds: int
    confirm: int  # paired re-measurements of recommended vs sweep-best
    interval_s: float
    grid: dict[str, Any]
    quick: bool
    sweep_only: bool
    json_path: str | None
    keep_stores: str | None = None
    cli_calls: int = 0  # `batchscope recommend` calls after the final recommendation
    cli_gap_s: float = 3.0  # between those calls, under the same load


def _add_cli_call_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cli-calls",
        type=int,
        default=3,
        metavar="N",
        help="after the final recommendation, call `batchscope recommend` N times on "
        "the same store under the same load, for its per-call latency and whether the "
        "advice holds (default 3; 0 skips)",
    )
    parser.add_argument(
        "--cli-gap",
        type=float,
        default=None,
        metavar="S",
        help="seconds between those calls (default 15; 3 with --quick)",
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench/recommend.py",
        description="Recommended batching config vs an exhaustive sweep on the CPU testbed.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CI mode: concurrency 16, a 2x2x1 grid, shorter windows",
    )
    parser.add_argument("--cases", default="a,b,c", help="comma-separated, of a,b,c")
    parser.add_argument(
        "--concurrency",
        default=None,
        help="comma-separated closed-loop concurrencies (default 8,16,32; 16 with --quick)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="seconds per baseline/recommended measurement (default 4; 3 with --quick)",
    )
    parser.add_argument(
        "--sweep-seconds",
        type=float,
        default=None,
        help="seconds per sweep measurement (default 3, which keeps the "
        "full bench near 20 minutes on 2 cores)",
    )
    parser.add_argument(
        "--observe-seconds",
        type=float,
        default=None,
        help="seconds per observation window (default 12; 8 with --quick)",
    )
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=1.0,
        help="load after each reload before measuring (default 1)",
    )
    parser.add_argument(
        "--probe-rounds",
        type=int,
        default=2,
        help="probe recommendations applied at most (default 2)",
    )
    parser.add_argument(
        "--confirm",
        type=int,
        default=None,
        metavar="N",
        help="after the sweep, re-measure the recommended and the "
        "sweep-best config N times each, alternating, for a paired "
        "ratio that single noisy runs and picking the best of many "
        "cannot bias (default 2; 0 with --quick)",
    )
    _add_cli_call_options(parser)
    parser.add_argument(
        "--sweep-only", action="store_true", help="baseline and sweep only, without the recommender"
    )
    parser.add_argument(
        "--json", dest="json_path", metavar="FILE", help="write the raw results as JSON to FILE"
    )
    parser.add_argument(
        "--keep-stores",
        metavar="DIR",
        help="keep each observation's SQLite store in DIR (as "
        "CASE_cN.db), so bench/model_accuracy.py can replay it",
    )
    return parser


def parse_options(argv: Sequence[str] | None) -> Options:
    parser = _build_parser()
    args = parser.parse_args(argv)

    cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        parser.error(f"--cases: unknown {unknown}; choose from {','.join(CASES)}")
    if args.concurrency is None:
        concurrency = (16,) if args.quick else (8, 16, 32)
    else:
        try:
            concurrency = tuple(int(c) for c in args.concurrency.split(",") if c.strip())
        except ValueError:
            parser.error(f"--concurrency: not a list of integers: {args.concurrency!r}")
        if not concurrency or min(concurrency) < 1:
            parser.error("--concurrency: give one or more integers >= 1")
    seconds = args.seconds if args.seconds is not None else (3.0 if args.quick else 4.0)
    sweep_seconds = args.sweep_seconds if args.sweep_seconds is not None else 3.0
    observe = (
        args.observe_seconds if args.observe_seconds is not None else (8.0 if args.quick else 12.0)
    )
    confirm = args.confirm if args.confirm is not None else (0 if args.quick else 2)
    if (
        seconds <= 0
        or sweep_seconds <= 0
        or observe <= 2
        or args.warmup_seconds < 0
        or args.probe_rounds < 0
        or confirm < 0
        or args.cli_calls < 0
        or (args.cli_gap is not None and args.cli_gap < 0)
    ):
        parser.error(
            "--seconds and --sweep-seconds must be > 0, --observe-seconds > 2, the others >= 0"
        )
    return Options(
        cases=cases,
        concurrency=concurrency,
        seconds=seconds,
        sweep_seconds=sweep_seconds,
        observe_s=observe,
        ramp_s=1.0,
        warmup_s=args.warmup_seconds,
        probe_rounds=args.probe_rounds,
        confirm=confirm,
        interval_s=0.5,
        grid=QUICK_GRID if args.quick else FULL_GRID,
        quick=args.quick,
        sweep_only=args.sweep_only,
        json_path=args.json_path,
        keep_stores=args.keep_stores,
        cli_calls=args.cli_calls,
        cli_gap_s=args.cli_gap if args.cli_gap is not None else (3.0 if args.quick else 15.0),
    )


# --------------------------------------------------------------------------- steps

ServerFactory = Callable[..., TritonServer]
Recommender = Callable[..., Recommendation]


def _start_server(specs: list[ModelSpec], **kwargs: Any) -> TritonServer:
    server = TritonServer(specs, **kwargs)
    server.start()
    return server


class CpuWatch:
    """Samples, in the background, the CPU that processes outside this bench (and its
    servers) use, and the share the hypervisor steals: what makes two runs of one
    config disagree on a shared machine.  ``summary()`` is printed with the table."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self.foreign_cores: list[float] = []
        self.steal_share: list[float] = []
        self.spans: list[tuple[float, float]] = []  # (start, end) of each sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-watch", daemon=True)
        self._own: dict[int, float] = {}

    def __enter__(self) -> CpuWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _own_delta(self) -> float:
        """CPU seconds this process and its descendants used since the last call."""
        me = psutil.Process()
        total, seen = 0.0, {}
        for proc in [me, *me.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                seen[proc.pid] = t.user + t.system
                total += seen[proc.pid] - self._own.get(proc.pid, 0.0)
        self._own = seen
        return total

    @staticmethod
    def _busy_steal() -> tuple[float, float]:
        t = psutil.cpu_times()
        busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        return busy, getattr(t, "steal", 0.0)

    def _run(self) -> None:
        cpus = psutil.cpu_count() or 1
        self._own_delta()
        busy0, steal0 = self._busy_steal()
        t0 = time.monotonic()
        while not self._stop.wait(self.every_s):
            own = self._own_delta()
            busy, steal = self._busy_steal()
            now = time.monotonic()
            wall = max(now - t0, 1e-6)
            self.foreign_cores.append(max(busy - busy0 - own, 0.0) / wall)
            self.steal_share.append(max(steal - steal0, 0.0) / (wall * cpus))
            self.spans.append((t0, now))
            busy0, steal0, t0 = busy, steal, now

    def during(self, start: float, end: float) -> tuple[float, float] | None:
        """(foreign cores, steal share) over [start, end], weighted by overlap."""
        total = foreign = steal = 0.0
        for (a, b), f, st in zip(self.spans, self.foreign_cores, self.steal_share, strict=True):
            overlap = min(b, end) - max(a, start)
            if overlap > 0:
                total += overlap
                foreign += f * overlap
                steal += st * overlap
        return (foreign / total, steal / total) if total else None

    def annotate(self, measures: Iterable[Measure]) -> None:
        for m in measures:
            seen = self.during(m.t_start, m.t_end) if m.t_end > m.t_start else None
            if seen is not None:
                m.foreign_cores, m.steal_share = seen

    def summary(self) -> dict[str, float | None]:
        def mean(xs: list[float]) -> float | None:
            return sum(xs) / len(xs) if xs else None

        return {
            "foreign_cores_mean": mean(self.foreign_cores),
            "foreign_cores_max": max(self.foreign_cores, default=None),
            "steal_share_mean": mean(self.steal_share),
            "steal_share_max": max(self.steal_share, default=None),
        }


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Bench:
    """One case's server, with the config currently loaded on it tracked."""

    def __init__(self, server: TritonServer, case: Case, options: Options) -> None:
        self.server = server
        self.case = case
        self.options = options
        self.base_config: dict[str, Any] = server.get_json(f"/v2/models/{case.model}/config")
        self.base_raw = json.dumps(self.base_config)
        self.loaded = BASELINE

    def load(self, config: BatcherConfig, doc: dict[str, Any] | None = None) -> float:
        """Load ``config`` (as ``doc`` when given); returns the seconds it took."""
        if doc is None:
            doc = self.base_config if config == BASELINE else config_with(self.base_raw, config)
        t0 = time.monotonic()
        self.server.load_model(self.case.model, doc)
        self.loaded = config
        return time.monotonic() - t0

    def run(self, concurrency: int, seconds: float) -> Measure:
        t0 = time.monotonic()
        result = run_load(
            self.server.grpc_url, self.case.model, concurrency=concurrency, duration_s=seconds
        )
        return Measure.of(result, t0, time.monotonic())

    def warm_up(self, concurrency: int) -> float:
        if self.options.warmup_s <= 0:
            return 0.0
        t0 = time.monotonic()
        self.run(concurrency, self.options.warmup_s)
        return time.monotonic() - t0

    # ---------------------------------------------------------------- step 2-3

    def recommend(self, row: Row, recommend_model: Recommender) -> Recommendation | None:
        """Observe under load and recommend, applying probes; fills ``row.rounds``.
        None when the recommender found too little in the store to answer."""
        opts = self.options
        target = target_from_url(self.server.http_url, self.server.metrics_url)
        with tempfile.TemporaryDirectory(prefix="batchscope-bench-") as tmp:
            db = Path(tmp) / "bench.db"
            if opts.keep_stores:
                db = Path(opts.keep_stores) / f"{row.case}_c{row.concurrency}.db"
                db.parent.mkdir(parents=True, exist_ok=True)
                db.unlink(missing_ok=True)
            settings = Settings(
                targets=(target,),
                db_url=f"sqlite:///{db}",
                interval_s=opts.interval_s,
                jitter_s=0.0,
                sources=("triton", "host"),
            )
            store = Store(settings.db_url)
            service = CollectorService(settings, store, build_sources(settings))
            service.start()
            try:
                t0 = time.monotonic()
                probes = 0
                while True:
                    started = time.time()
                    observed = self.run(row.concurrency, opts.observe_s)
                    ended = time.time()
                    # The ramp at the start of the window (and the reload just before
                    # it) is left out of what the recommender sees.
                    window = max(ended - started - opts.ramp_s, 1.0)
                    t_rec = time.monotonic()
                    rec = recommend_model(
                        store,
                        target.name,
                        self.case.model,
                        slo_p95_ms=row.slo_p95_ms,
                        window_s=window,
                        now=ended,
                    )
                    row.rounds.append(
                        Round(
                            loaded=short(self.loaded),
                            observed=observed,
                            window_s=window,
                            recommend_s=time.monotonic() - t_rec,
                            recommendation=rec,
                            target=target.name,
                            ended_at=ended,
                        )
                    )
                    if rec is None:
                        _log(
                            f"    round {len(row.rounds)} on {short(self.loaded)}: observed "
                            f"{observed.short()} -> no recommendation (too little data)"
                        )
                        break
                    _log(
                        f"    round {len(row.rounds)} on {short(self.loaded)}: "
                        f"observed {observed.short()} -> {rec.kind} {short(rec.proposed_config)}"
                        f" (predicted {rec.predicted.qps:.0f}/"
                        f"{_num(rec.predicted.p95_ms, '.1f')}, "
                        f"confidence {rec.confidence:.2f})"
                    )
                    if rec.kind != "probe" or probes >= opts.probe_rounds:
                        break
                    probes += 1
                    self.apply(rec)
                row.time_to_recommendation_s = time.monotonic() - t0
                if rec is not None and opts.cli_calls:
                    self.cli_calls(row, settings.db_url, window)
            finally:
                service.shutdown()
                store.close()
        return rec

    def cli_calls(self, row: Row, db_url: str, window_s: float) -> None:
        """``batchscope recommend`` run ``cli_calls`` times, ``cli_gap_s`` apart, on the
        store the collector still fills, under the same load: each call's wall time
        (a fresh process, as a user runs it) and its advice, into ``row``."""
        opts = self.options
        # One unbroken run of the load (a restart would show in the window as a dip),
        # long enough for every call at the slowest the calls are allowed to be.
        settle = window_s + 1.0  # the first call's window holds this load alone
        span = settle + opts.cli_calls * (opts.cli_gap_s + _CLI_LIMIT_S)
        command = [sys.executable, "-m", "collector.cli", "recommend", "--db", db_url]
        command += ["--model", self.case.model, "--window", f"{window_s:g}", "--json"]
        if row.slo_p95_ms is not None:
            command += ["--slo-p95-ms", f"{row.slo_p95_ms:g}"]
        # The load ends with the last call when the calls took less than the span.
        with load_in_background(
            self.server.grpc_url,
            self.case.model,
            concurrency=row.concurrency,
            duration_s=span,
        ):
            time.sleep(settle)  # the gap since the observation must leave the window
            for i in range(opts.cli_calls):
                if i:
                    time.sleep(opts.cli_gap_s)  # the spacing itself is what is measured
                t0 = time.monotonic()
                out = subprocess.run(command, capture_output=True, text=True, timeout=120)
                row.cli_call_s.append(time.monotonic() - t0)
                row.cli_advice.append(_cli_advice(out))
                _log(
                    f"    cli call {i + 1}: {row.cli_call_s[-1]:.2f} s -> {row.cli_advice[-1]}"
                    f"{_cli_basis(out)}"
                )

    def apply(self, rec: Recommendation) -> bool:
        """Load ``rec``'s config when it differs from the loaded one; True if it did."""
        if rec.proposed_config == self.loaded:
            return False
        doc = json.loads(rec.config_json) if rec.config_json.strip() not in ("", "{}") else None
        self.load(rec.proposed_config, doc)
        return True

    # ---------------------------------------------------------------- step 5

    def sweep(self, configs: list[BatcherConfig]) -> Sweep:
        points: list[SweepPoint] = []
        t0 = time.monotonic()
        for i, config in enumerate(configs, 1):
            reload_s = self.load(config)
            warm_s = self.warm_up(self.options.concurrency[0])
            line = []
            for c in self.options.concurrency:
                m = self.run(c, self.options.sweep_seconds)
                points.append(SweepPoint(short(config), c, m, reload_s, warm_s))
                line.append(f"c{c} {m.short()}" + (f" ({m.errors} errors)" if m.errors else ""))
            _log(f"    sweep {i}/{len(configs)} {short(config):<16} " + "  ".join(line))
        return Sweep(
            case=self.case.key, points=points, wall_s=time.monotonic() - t0, grid=list(configs)
        )

    # ---------------------------------------------------------------- --confirm

    def confirm(self, row: Row, recommended: BatcherConfig, best: BatcherConfig) -> None:
        """Re-measure the two configs alternately, ``--confirm`` times each."""
        for _ in range(self.options.confirm):
            for config, into in ((recommended, row.confirm_recommended), (best, row.confirm_best)):
                self.load(config)
                self.warm_up(row.concurrency)
                into.append(self.run(row.concurrency, self.options.seconds))
        _log(
            f"  c={row.concurrency}: confirm {short(recommended)} "
            f"{[m.short() for m in row.confirm_recommended]} vs {short(best)} "
            f"{[m.short() for m in row.confirm_best]}"
        )


def fill_sweep(row: Row, sweep: Sweep) -> None:
    """Sweep-best at ``row``'s concurrency under ``row``'s objective."""
    points = sweep.at(row.concurrency)
    row.sweep_case = sweep.case
    row.sweep_wall_s = sweep.wall_at(row.concurrency)
    ok = [p for p in points if meets(p.measure, row.objective_p95_ms)]
    if ok:
        best = max(ok, key=lambda p: p.measure.qps)
        row.sweep_best_config, row.sweep_best = best.config, best.measure
    for p in points:
        if p.config == row.recommended_config:
            row.sweep_of_recommended = p.measure


def _cli_advice(out: subprocess.CompletedProcess[str]) -> str:
    """The advice of one ``recommend --json`` run: its kind and changes, or why none."""
    if out.returncode != 0:
        return f"exit {out.returncode}"
    recs = json.loads(out.stdout).get("recommendations") or []
    if not recs:
        return "none"
    rec = recs[0]
    changes = ", ".join(f"{c['field']}={c['to']}" for c in rec["changes"]) or "keep"
    return f"{rec['kind']}: {changes}"


def _cli_basis(out: subprocess.CompletedProcess[str]) -> str:
    """What one ``recommend --json`` answer rests on: its predicted gain and that gain's
    uncertainty, the standing config it was held against, and whether it was reused."""
    try:
        evidence = (json.loads(out.stdout).get("recommendations") or [{}])[0].get("evidence")
    except ValueError:
        return ""
    if not evidence:
        return ""
    gain, spread = evidence.get("predicted_gain"), evidence.get("gain_uncertainty")
    return (
        f" (gain {_num(gain, '.2f')}x ±{_pct(spread)}, standing {evidence.get('standing')}, "
        f"{'reused' if 'computed_at' in evidence else 'computed'})"
    )


def run_case(
    case: Case,
    options: Options,
    factory: ServerFactory,
    recommend_model: Recommender | None,
    sweeps: dict[str, Sweep],
) -> list[Row]:
    _log(f"case ({case.key}) {case.model}: {case.description}")
    # The testbed runs its stubs with single-threaded BLAS (see TritonServer).
    server = factory([case.spec], extra_args=["--metrics-config", "summary_latencies=true"])
    rows: list[Row] = []
    try:
        bench = Bench(server, case, options)
        for c in options.concurrency:
            if bench.loaded != BASELINE:
                bench.load(BASELINE)
                bench.warm_up(c)
            else:
                bench.warm_up(c)  # a fresh server, or the previous run left it warm
            baseline = bench.run(c, options.seconds)
            slo = case.slo_p95_ms(c)
            objective = slo if slo is not None else P95_TOLERANCE * (baseline.p95_ms or 0.0)
            row = Row(
                case=case.key,
                model=case.model,
                concurrency=c,
                slo_p95_ms=slo,
                objective_p95_ms=objective,
                baseline=baseline,
            )
            _log(
                f"  c={c}: baseline {baseline.short()}; objective p95 <= {objective:.1f} ms"
                + (" (SLO)" if slo is not None else " (1.1 x baseline)")
            )
            if recommend_model is not None:
                rec = bench.recommend(row, recommend_model)
                if rec is not None:
                    bench.apply(rec)
                    row.recommended_kind = rec.kind
                    row.predicted_qps = rec.predicted.qps
                    row.predicted_p95_ms = rec.predicted.p95_ms
                else:
                    # Nothing to apply: what is loaded is what an operator is left with.
                    row.recommended_kind = "none"
                row.recommended_config = short(bench.loaded)
                row.recommended_batcher = bench.loaded
                bench.warm_up(c)
                row.recommended = bench.run(c, options.seconds)
                _log(
                    f"  c={c}: recommended {row.recommended_config} measured "
                    f"{row.recommended.short()} after {row.time_to_recommendation_s:.1f} s"
                )
            rows.append(row)
        reuse = sweeps.get(case.sweep_like) if case.sweep_like else None
        if reuse is None:
            _log(
                f"  sweep: {len(grid_configs(**options.grid))} configs x "
                f"{len(options.concurrency)} concurrencies"
            )
            sweeps[case.key] = bench.sweep(grid_configs(**options.grid))
            reuse = sweeps[case.key]
        else:
            _log(f"  sweep: reusing case ({reuse.case})'s measurements (same model and costs)")
        for row in rows:
            fill_sweep(row, reuse)
            if (
                options.confirm
                and row.recommended_batcher is not None
                and row.sweep_best_config is not None
                and row.sweep_best_config != row.recommended_config
            ):
                bench.confirm(row, row.recommended_batcher, reuse.config(row.sweep_best_config))
    finally:
        server.close()
    return rows


# --------------------------------------------------------------------------- report


def _cli_targets(
    rows: list[Row],
    where: Callable[[Callable[[Row], bool]], list[str]],
    verdict: Callable[[str, list[str], str], Target],
) -> list[Target]:
    """The repeated `batchscope recommend` calls: fast enough, and the same advice."""
    out: list[Target] = []
    called = [r for r in rows if r.cli_call_s]
    if called:
        slowest = max(t for r in called for t in r.cli_call_s)
        out.append(
            verdict(
                f"`recommend` CLI <= {_CLI_LIMIT_S:g} s per call",
                where(lambda r: bool(r.cli_call_s) and max(r.cli_call_s) > _CLI_LIMIT_S),
                f"slowest {slowest:.2f} s",
            )
        )
        out.append(
            verdict(
                "`recommend` gives the same advice on repeated calls",
                where(lambda r: r.cli_advice_held is False),
                f"{sum(len(r.cli_advice) for r in called)} calls over {len(called)} rows",
            )
        )
    return out


def evaluate(rows: list[Row], options: Options) -> list[Target]:
    if options.sweep_only:
        return [Target("recommender targets", None, "not evaluated: --sweep-only")]

    def where(predicate: Callable[[Row], bool]) -> list[str]:
        return [f"{r.case}@{r.concurrency}" for r in rows if predicate(r)]

    def verdict(name: str, failing: list[str], detail: str) -> Target:
        return Target(
            name, not failing, detail + (f"; fails at {', '.join(failing)}" if failing else "")
        )

    # Where no grid config meets the objective there is no sweep-best to compare with.
    no_best = where(lambda r: r.sweep_best is None)
    na = f"; n/a at {', '.join(no_best)} (no grid config meets the objective)" if no_best else ""
    ratios = [r.ratio for r in rows if r.ratio is not None]
    qerr = [r.qps_error for r in rows if r.qps_error is not None]
    perr = [r.p95_error for r in rows if r.p95_error is not None]
    targets = [
        verdict(
            "recommended/sweep-best >= 0.90 in every case",
            where(lambda r: r.sweep_best is not None and (r.ratio is None or r.ratio < 0.90)),
            (f"min {min(ratios):.2f}" if ratios else "no ratio") + na,
        ),
    ]
    if options.confirm:
        paired = [r.paired_ratio for r in rows if r.paired_ratio is not None]
        targets.append(
            verdict(
                f"  the same, paired ({options.confirm} alternating re-measurements)",
                where(
                    lambda r: (
                        r.sweep_best is not None
                        and (r.paired_ratio is None or r.paired_ratio < 0.90)
                    )
                ),
                (f"min {min(paired):.2f}" if paired else "no ratio") + na,
            )
        )
    targets += [
        verdict(
            "predicted QPS within 15 % of measured",
            where(lambda r: r.qps_error is None or r.qps_error > 0.15),
            f"max error {max(qerr):.0%}" if qerr else "no prediction",
        ),
        verdict(
            "predicted p95 within 25 % of measured",
            where(lambda r: r.p95_error is None or r.p95_error > 0.25),
            f"max error {max(perr):.0%}" if perr else "no prediction",
        ),
        verdict(
            "never worse than baseline",
            where(lambda r: not r.not_worse_than_baseline),
            f"QPS >= {QPS_NOISE:.2f} x baseline and p95 within the objective "
            f"or {P95_TOLERANCE:.1f} x baseline",
        ),
        verdict(
            "recommended config meets the p95 objective (implied)",
            where(lambda r: not r.recommended_meets_objective),
            "every row",
        ),
    ]
    targets += _cli_targets(rows, where, verdict)
    a32 = [r for r in rows if r.case == "a" and r.concurrency == 32]
    if a32 and a32[0].gain is not None:
        gain = a32[0].gain
        targets.append(Target("case (a) at c=32: >= 3x baseline QPS", gain >= 3.0, f"{gain:.1f}x"))
    else:
        targets.append(
            Target(
                "case (a) at c=32: >= 3x baseline QPS",
                None,
                "not run (needs case a and concurrency 32)",
            )
        )
    return targets


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _cli_times(row: Row) -> str:
    """``mean/max`` seconds of the repeated CLI calls, or ``-``."""
    if not row.cli_call_s:
        return "-"
    mean = sum(row.cli_call_s) / len(row.cli_call_s)
    return f"{mean:.1f}/{max(row.cli_call_s):.1f}"


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def _case_table(report: BenchReport, key: str, paired: bool) -> list[str]:
    """One case's heading and its row per concurrency (nothing when it has no rows)."""
    case = CASES[key]
    rows = [r for r in report.rows if r.case == key]
    if not rows:
        return []
    header = (
        f"{'c':>3}  {'baseline':>11}  {'recommended':<17} {'rec QPS/p95':>11}  "
        f"{'sweep-best':<17} {'best QPS/p95':>12}  {'ratio':>5}  "
        + (f"{'paired':>6}  " if paired else "")
        + f"{'QPS err':>7}  {'p95 err':>7}  {'t_rec s':>7}  {'sweep s':>7}  "
        f"{'cli s':>11}  {'held':>4}"
    )
    lines: list[str] = []
    slos = ", ".join(
        f"c{r.concurrency} {r.slo_p95_ms:g} ms" for r in rows if r.slo_p95_ms is not None
    )
    objective = f"p95 SLO {slos}" if slos else "p95 <= 1.1 x baseline p95"
    lines.append(
        f"({key}) {case.model} (fixed {case.spec.fixed_ms:g} ms + "
        f"{case.spec.per_sample_ms:g} ms/sample): {case.description}; "
        f"objective {objective}"
    )
    if rows[0].sweep_case and rows[0].sweep_case != key:
        lines.append(f"    sweep measurements shared with case ({rows[0].sweep_case})")
    lines.append(header)
    lines.append("-" * len(header))
    for r in rows:
        rec_cfg = r.recommended_config or "-"
        if r.recommended_kind and r.recommended_kind != "tune":
            rec_cfg += f" ({r.recommended_kind})"
        mark = "" if r.recommended_meets_objective in (None, True) else "!"
        lines.append(
            f"{r.concurrency:>3}  {r.baseline.short():>11}  {rec_cfg:<17} "
            f"{(r.recommended.short() + mark) if r.recommended else '-':>11}  "
            f"{r.sweep_best_config or 'none meets':<17} "
            f"{r.sweep_best.short() if r.sweep_best else '-':>12}  "
            f"{_num(r.ratio, '.2f'):>5}  "
            + (f"{_num(r.paired_ratio, '.2f'):>6}  " if paired else "")
            + f"{_pct(r.qps_error):>7}  {_pct(r.p95_error):>7}  "
            f"{_num(r.time_to_recommendation_s, '.1f'):>7}  "
            f"{_num(r.sweep_wall_s, '.0f'):>7}  "
            f"{_cli_times(r):>11}  {_yes_no(r.cli_advice_held):>4}"
        )
    lines.append("")
    return lines


def _report_footer(report: BenchReport, paired: bool) -> list[str]:
    """The legend, the targets, the wall time and the interference seen."""
    lines: list[str] = []
    lines.append(
        "QPS/p95: closed-loop QPS and client-side p95 (ms); '!' marks a recommended "
        "config whose p95 breaks the objective; (probe)/(no_change)/(none): the final "
        "recommendation's kind."
    )
    lines.append(
        "ratio: recommended QPS / sweep-best QPS"
        + ("; paired: the same from alternating re-measurements" if paired else "")
        + ". QPS/p95 err: |predicted - measured| / measured."
    )
    lines.append(
        "t_rec: first observation to final recommendation; sweep s: reload + "
        "warm-up + run over every grid config at that concurrency."
    )
    lines.append(
        "cli s: mean/max wall time of each repeated `batchscope recommend` call (a fresh "
        "process) after the final recommendation; held: every call gave the same advice."
    )
    lines.append("")
    lines.append("Targets:")
    for t in report.targets:
        status = "not evaluated" if t.met is None else ("met" if t.met else "NOT met")
        lines.append(f"  [{status}] {t.name}: {t.detail}")
    load = report.options.get("loadavg")
    lines.append(
        f"bench wall time {report.wall_s:.0f} s"
        + (
            f"; 1-min load average at start {load[0]:.1f}, at end {load[1]:.1f} "
            f"on {report.options['cpus']} CPUs"
            if load
            else ""
        )
    )
    seen = report.options.get("interference") or {}
    if seen.get("foreign_cores_mean") is not None:
        lines.append(
            f"interference: other processes used {seen['foreign_cores_mean']:.2f} "
            f"cores on average (max {seen['foreign_cores_max']:.2f} over 2 s), "
            f"hypervisor steal {seen['steal_share_mean']:.0%} "
            f"(max {seen['steal_share_max']:.0%}); {seen['disturbed']} of "
            f"{seen['measurements']} measurements ran under interference "
            f"(>= {DISTURBED_FOREIGN_CORES} cores or >= {DISTURBED_STEAL:.0%} "
            f"steal), marked '~'"
        )
    return lines


def format_report(report: BenchReport) -> str:
    paired = bool(report.options["confirm"])
    lines: list[str] = []
    for key in report.options["cases"]:
        lines.extend(_case_table(report, key, paired))
    lines.extend(_report_footer(report, paired))
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def all_measures(rows: list[Row], sweeps: dict[str, Sweep]) -> list[Measure]:
    """Every load-generator run the report holds, each once."""
    found: dict[int, Measure] = {}
    for row in rows:
        for m in (
            row.baseline,
            row.recommended,
            *(r.observed for r in row.rounds),
            *row.confirm_recommended,
            *row.confirm_best,
        ):
            if m is not None:
                found[id(m)] = m
    for sweep in sweeps.values():
        for p in sweep.points:
            found[id(p.measure)] = p.measure
    return list(found.values())


def _recommender() -> Recommender:
    # Imported here so that --sweep-only runs without the recommender.
    from collector.analysis.recommend import recommend_model

    return recommend_model


def main(
    argv: Sequence[str] | None = None, *, server_factory: ServerFactory | None = None
) -> BenchReport:
    """Run the bench, print its table and return the report.

    ``server_factory(specs, extra_args=...)`` returns a started :class:`TritonServer`
    (default: a plain one in a temporary directory); the bench closes each server it
    got once its case is done.
    """
    options = parse_options(argv)
    recommend_model = None if options.sweep_only else _recommender()
    factory = server_factory or _start_server
    t0 = time.monotonic()
    load_start = os.getloadavg()[0]
    rows: list[Row] = []
    sweeps: dict[str, Sweep] = {}
    # Cases that reuse another's sweep go after it.
    order = sorted(options.cases, key=lambda k: CASES[k].sweep_like in options.cases)
    with CpuWatch() as watch:
        for key in order:
            rows.extend(run_case(CASES[key], options, factory, recommend_model, sweeps))
    rows.sort(key=lambda r: (options.cases.index(r.case), r.concurrency))
    measures = all_measures(rows, sweeps)
    watch.annotate(measures)
    report = BenchReport(
        options={
            "cases": list(options.cases),
            "concurrency": list(options.concurrency),
            "seconds": options.seconds,
            "sweep_seconds": options.sweep_seconds,
            "observe_s": options.observe_s,
            "confirm": options.confirm,
            "warmup_s": options.warmup_s,
            "probe_rounds": options.probe_rounds,
            "quick": options.quick,
            "sweep_only": options.sweep_only,
            "grid": {
                k: [list(v) if isinstance(v, tuple) else v for v in vals]
                for k, vals in options.grid.items()
            },
            "strict_slo_p95_ms": STRICT_SLO_P95_MS,
            "loadavg": [load_start, os.getloadavg()[0]],
            "cpus": os.cpu_count(),
            "interference": {
                **watch.summary(),
                "measurements": len(measures),
                "disturbed": sum(m.disturbed for m in measures),
            },
        },
        rows=rows,
        sweeps=sweeps,
        targets=evaluate(rows, options),
        wall_s=time.monotonic() - t0,
    )
    print(format_report(report), flush=True)
    if options.json_path:
        Path(options.json_path).write_text(report.to_json() + "\n")
    return report


if __name__ == "__main__":
    main()
