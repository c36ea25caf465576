"""The detectors' thresholds and hysteresis (``DetectorSettings``), validated at
construction, and read from the ``analysis:`` section of the settings file."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from collector.errors import ConfigError


@dataclass(frozen=True)
class DetectorSettings:
    """Thresholds of the detectors and their hysteresis. Every field is validated at
    construction; a bad value raises ``ConfigError("analysis.<field>", ...)``.

    Window and hysteresis:

    * ``window_s`` (60) — seconds of samples one evaluation reads. A minute holds 12
      scrapes at the default 5 s interval, enough to smooth single-request noise, and
      with ``sustain`` = 3 a finding opens within about three minutes.
    * ``min_samples`` (3) — samples a model series or device needs in the window to be
      evaluated at all: three samples are two counter increases (one odd scrape cannot
      decide alone) and the fewest points a pending-count slope means anything over.
    * ``sustain`` (3) — consecutive evaluations a condition must hold before a finding
      opens, so a one-window burst opens nothing.
    * ``clear_after`` (3) — consecutive clear evaluations before an open finding
      resolves; symmetric with ``sustain``, so a condition that comes and goes every
      other window neither opens nor, once open, resolves: no flapping.
    * ``stale_after_s`` (900) — an open finding whose subject has had no evaluable
      window for this long (model unloaded, target gone) is resolved. Shorter gaps (a
      target down for a few scrapes) neither hold nor clear a condition.

    Evaluations closer together than half a window read mostly the same samples, so
    such a repeat refreshes open findings but does not advance a streak.

    Idle capacity:

    * ``idle_util_pct`` (30) — a GPU or MIG instance whose mean utilisation over the
      window (NVML ``sm_active_pct`` when GPM has it, else ``utilization_gpu_pct``,
      Triton's ``nv_gpu_utilization`` as the last resort) is below this percentage is
      idle. The production case behind batchscope ran at 15–30 % before batching was
      tuned and 91 % after.
    * ``idle_busy_share`` (0.3) — the same for a model's instances where no GPU
      reading exists (the CPU testbed): ``ModelRates.busy_share`` below it is idle.
    * ``traffic_rps`` (0.1) — requests per second above which a subject "has traffic";
      idle capacity with traffic is held back, without it could be consolidated.

    Queue-delay saturation:

    * ``queue_share`` (0.5) — Δqueue time / Δrequest time above which the queue
      dominates: requests wait longer than they compute.
    * ``queue_share_critical`` (0.8) — queue share above which it is critical.
    * ``pending_growth_per_s`` (0.1) — least-squares slope of the pending-request
      gauge over the window, in requests per second, above which the queue is not
      draining (0.1/s is six more waiting requests a minute).
    * ``reject_per_s`` (0.0) — ``REJECTED`` failures per second above which the queue
      policy counts as rejecting; 0 means any rejection in the window, since a queue
      timeout or full queue always turns clients away.
    * ``delay_limit_queue_ratio`` (0.5) — queue time per request at or above this
      share of ``max_queue_delay_microseconds`` means batches are closed by the delay
      timer: with arrivals spread over the wait, a batch sent when the oldest request
      hits the delay has a mean queue time of about half the delay, while one sent at
      a preferred size waits far less.
    * ``delay_limit_below_share`` (0.5) — share of executions below the smallest
      preferred batch size above which batches form "mostly" below it.

    Batching left on the table:

    * ``concurrency_min`` (1.5) — mean requests in the server (Little's law: L =
      Δrequest duration / window) at or above which traffic counts as concurrent: more
      than one request is usually in flight, so there is something to batch with.
    * ``below_preferred_ratio`` (0.5) — average batch below this × the smallest
      preferred batch size is far below preferred.
    * ``below_max_ratio`` (0.25) — without preferred sizes (the batcher then aims at
      ``max_batch_size``), average batch below this × ``max_batch_size`` is far below.
    """

    window_s: float = 60.0
    min_samples: int = 3
    sustain: int = 3
    clear_after: int = 3
    stale_after_s: float = 900.0
    idle_util_pct: float = 30.0
    idle_busy_share: float = 0.3
    traffic_rps: float = 0.1
    queue_share: float = 0.5
    queue_share_critical: float = 0.8
    pending_growth_per_s: float = 0.1
    reject_per_s: float = 0.0
    delay_limit_queue_ratio: float = 0.5
    delay_limit_below_share: float = 0.5
    concurrency_min: float = 1.5
    below_preferred_ratio: float = 0.5
    below_max_ratio: float = 0.25

    def __post_init__(self) -> None:
        _check_number(self, "window_s", low=0.0)
        _check_int(self, "min_samples", low=2)
        _check_int(self, "sustain", low=1)
        _check_int(self, "clear_after", low=1)
        _check_number(self, "stale_after_s", low=0.0)
        _check_number(self, "idle_util_pct", low=0.0, high=100.0)
        _check_number(self, "idle_busy_share", low=0.0, high=1.0)
        _check_number(self, "traffic_rps", low=0.0, low_inclusive=True)
        _check_number(self, "queue_share", low=0.0, high=1.0)
        _check_number(self, "queue_share_critical", low=0.0, high=1.0)
        if self.queue_share_critical < self.queue_share:
            raise ConfigError(
                "analysis.queue_share_critical",
                f"must be >= queue_share ({self.queue_share:g}), got {self.queue_share_critical!r}",
            )
        _check_number(self, "pending_growth_per_s", low=0.0)
        _check_number(self, "reject_per_s", low=0.0, low_inclusive=True)
        _check_number(self, "delay_limit_queue_ratio", low=0.0)
        _check_number(self, "delay_limit_below_share", low=0.0, high=1.0)
        _check_number(self, "concurrency_min", low=0.0)
        _check_number(self, "below_preferred_ratio", low=0.0, high=1.0)
        _check_number(self, "below_max_ratio", low=0.0, high=1.0)

    @property
    def min_gap_s(self) -> float:
        """Evaluations closer than this to the previous one do not advance a streak."""
        return self.window_s / 2


def _check_number(
    settings: DetectorSettings,
    name: str,
    *,
    low: float,
    high: float | None = None,
    low_inclusive: bool = False,
) -> None:
    value = getattr(settings, name)
    where = f"analysis.{name}"
    bounds = f"{'>=' if low_inclusive else '>'} {low:g}" + (
        f" and <= {high:g}" if high is not None else ""
    )
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(where, f"must be a number {bounds}, got {value!r}")
    if (
        not math.isfinite(value)
        or (value < low if low_inclusive else value <= low)
        or (high is not None and value > high)
    ):
        raise ConfigError(where, f"must be {bounds}, got {value!r}")


def _check_int(settings: DetectorSettings, name: str, *, low: int) -> None:
    value = getattr(settings, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"analysis.{name}", f"must be an integer >= {low}, got {value!r}")


def detector_settings(raw: Mapping[str, object]) -> DetectorSettings:
    """``DetectorSettings`` from the ``analysis:`` section of the settings file."""
    known = {f.name for f in fields(DetectorSettings)}
    for key in raw:
        if key not in known:
            raise ConfigError(
                f"analysis.{key}", f"unknown setting; known: {', '.join(sorted(known))}"
            )
    # The values' types are checked by DetectorSettings.__post_init__, which names the
    # field of a bad one.
    return DetectorSettings(**raw)  # type: ignore[arg-type]
