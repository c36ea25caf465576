"""Apply a recommendation to a live Triton, verify it, and roll back when it hurts.

The change goes through the model-repository load API (explicit model control), with
the whole effective config: Triton replaces the config it has, it does not merge.
Verification compares a window before with a window after: when throughput fell by more
than 5 % or the p95 objective is broken, the previous config is loaded again. Either
way the before/after figures are recorded as a ``config_applied`` finding.

p95 comes from Triton's request-latency summary (``--metrics-config
summary_latencies=true``); without it the mean request time stands in, and the
finding says so.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from urllib.parse import quote

import requests

from collector.analysis.rates import rates_between
from collector.config import TargetSettings
from collector.errors import BatchscopeError, CollectError
from collector.records import Finding, ModelSample, Recommendation
from collector.sources.triton import REQUEST_SUMMARY, TritonSource
from collector.store import Store

__all__ = ["ApplyRefused", "ApplyResult", "WindowFigures", "apply_recommendation",
           "measure_window"]


class ApplyRefused(BatchscopeError):
    """The server cannot take a live config change; nothing was changed."""


@dataclass(frozen=True)
class WindowFigures:
    window_s: float
    qps: float
    p95_ms: float | None  # server-side, from the summary
    mean_ms: float | None
    avg_batch_size: float | None

    @property
    def latency_ms(self) -> float | None:
        """p95 when Triton exports it, else the mean request time."""
        return self.p95_ms if self.p95_ms is not None else self.mean_ms


@dataclass(frozen=True)
class ApplyResult:
    applied: bool
    rolled_back: bool
    before: WindowFigures
    after: WindowFigures | None
    verdict: str
    finding_id: int | None = None


def _sample(source: TritonSource, model: str) -> ModelSample | None:
    (snapshot,) = source.collect()
    stats = {s.model: s for s in snapshot.model_stats}
    for m in snapshot.model_metrics:
        if m.model == model:
            return ModelSample(target=snapshot.target, collected_at=snapshot.collected_at,
                               metrics=m, stats=stats.get(model))
    return None


def measure_window(source: TritonSource, model: str, seconds: float, *,
                   stop: threading.Event | None = None) -> WindowFigures:
    """Throughput and latency of ``model`` over the next ``seconds``."""
    first = _sample(source, model)
    (stop or threading.Event()).wait(seconds)
    last = _sample(source, model)
    if first is None or last is None:
        raise CollectError(f"model {model!r} is not served by {source.target}")
    rates = rates_between(first, last)
    summary = last.metrics.summary_quantiles_us.get(REQUEST_SUMMARY, {})
    return WindowFigures(
        window_s=rates.window_s, qps=rates.requests_per_s,
        p95_ms=summary[0.95] / 1000.0 if 0.95 in summary else None,
        mean_ms=(rates.request_us_per_request / 1000.0
                 if rates.request_us_per_request is not None else None),
        avg_batch_size=rates.avg_batch_size)


def _load(session: requests.Session, url: str, model: str, config_json: str,
          timeout_s: float) -> None:
    try:
        # Model names are path segments: quoted, a name with "/" or "?" stays one name.
        response = session.post(f"{url}/v2/repository/models/{quote(model, safe='')}/load",
                                json={"parameters": {"config": config_json}}, timeout=timeout_s)
    except requests.RequestException as exc:
        raise ApplyRefused(f"could not reach {url} to load {model!r}: {exc}") from None
    if response.ok:
        return
    try:
        message = response.json().get("error", response.text)
    except ValueError:
        message = response.text
    if "not allowed" in message or "polling is enabled" in message:
        raise ApplyRefused(
            f"{url} does not allow live config changes ({message}): start tritonserver with "
            f"--model-control-mode=explicit. Nothing was changed.")
    raise ApplyRefused(f"Triton refused the config for {model!r} (HTTP "
                       f"{response.status_code}: {message[:300]}). Nothing was changed.")


def apply_recommendation(target: TargetSettings, recommendation: Recommendation, *,
                         verify_s: float = 30.0, store: Store | None = None,
                         timeout_s: float = 120.0,
                         say: Callable[[str], None] = lambda _m: None) -> ApplyResult:
    """Apply, verify over ``verify_s`` seconds, roll back on a regression; record it."""
    model = recommendation.model
    source = TritonSource(target, timeout_s=10.0)
    session = requests.Session()
    session.trust_env = False
    try:
        previous = session.get(f"{target.url}/v2/models/{quote(model, safe='')}/config",
                               timeout=10.0)
        if not previous.ok:
            raise ApplyRefused(f"cannot read the current config of {model!r} from "
                               f"{target.url} (HTTP {previous.status_code})")
        previous_json = json.dumps(previous.json())
        say(f"measuring {model} for {verify_s:g} s before the change ...")
        before = measure_window(source, model, verify_s)
        say(f"loading the new config of {model} ...")
        _load(session, target.url, model, recommendation.config_json, timeout_s)
        time.sleep(1.0)  # the reload is done (the call returned); let traffic resume
        say(f"verifying for {verify_s:g} s ...")
        after = measure_window(source, model, verify_s)

        limit = recommendation.slo_p95_ms
        reasons = []
        if after.qps < before.qps * 0.95:
            reasons.append(f"throughput fell from {before.qps:.0f} to {after.qps:.0f} QPS")
        b_lat, a_lat = before.latency_ms, after.latency_ms
        measure = "p95" if after.p95_ms is not None else "mean request time"
        if a_lat is not None:
            if limit is not None and after.p95_ms is not None and after.p95_ms > limit:
                reasons.append(f"p95 {after.p95_ms:.1f} ms is above the objective {limit:g} ms")
            elif limit is None and b_lat is not None and a_lat > b_lat * 1.10:
                reasons.append(f"{measure} rose from {b_lat:.1f} to {a_lat:.1f} ms (> 10 %)")
        rolled_back = bool(reasons)
        if rolled_back:
            say("regression: " + "; ".join(reasons) + " — rolling back")
            _load(session, target.url, model, previous_json, timeout_s)
            verdict = "rolled back: " + "; ".join(reasons)
        else:
            verdict = (f"kept: {before.qps:.0f} → {after.qps:.0f} QPS, {measure} "
                       f"{_ms(b_lat)} → {_ms(a_lat)}")
        finding_id = None
        if store is not None:
            finding_id = store.add_finding(**asdict(_finding(recommendation, before, after,
                                                             verdict, rolled_back)))
        return ApplyResult(applied=True, rolled_back=rolled_back, before=before, after=after,
                           verdict=verdict, finding_id=finding_id)
    finally:
        source.close()
        session.close()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _finding(rec: Recommendation, before: WindowFigures, after: WindowFigures, verdict: str,
             rolled_back: bool) -> Finding:
    now = time.time()
    return Finding(
        kind="config_applied", severity="warning" if rolled_back else "info",
        target=rec.target, subject=rec.model,
        summary=f"{rec.model}: {', '.join(str(c) for c in rec.changes) or 'no change'} — "
                f"{verdict}",
        window_start=now - before.window_s - after.window_s, window_end=now,
        evidence={"before_qps": before.qps, "after_qps": after.qps,
                  "before_p95_ms": before.p95_ms, "after_p95_ms": after.p95_ms,
                  "before_mean_ms": before.mean_ms, "after_mean_ms": after.mean_ms,
                  "predicted_qps": rec.predicted.qps, "predicted_p95_ms": rec.predicted.p95_ms,
                  "rolled_back": rolled_back, "changes": "; ".join(str(c) for c in rec.changes)})
