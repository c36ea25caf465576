"""Apply a recommendation to a live Triton, verify it, and roll back when it hurts.

The change goes through the model-repository load API (explicit model control), with
the whole effective config: Triton replaces the config it has, it does not merge.
Verification compares a window before with a window after (``verdict``, with the
thresholds of ``ApplySettings``): when throughput fell too far or latency broke the
objective, the previous config is loaded again. The outcome is recorded in the store
inside this flow (``applied`` once loaded, then ``kept``, ``rolled_back`` or
``failed``), with the before/after figures as a ``config_applied`` finding, so every
caller (``batchscope apply``, the UI) leaves the same record.

The caller passes the HTTP session (it owns it), and may pass the clock and the wait
between samples: ``wait(seconds)`` returns True when the apply should stop (Ctrl-C), in
which case a change already loaded is rolled back.

p95 comes from Triton's request-latency summary (``--metrics-config
summary_latencies=true``); without it the mean request time stands in, and the
finding says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import quote

import requests

from collector.analysis.rates import rates_between
from collector.config import ApplySettings, TargetSettings
from collector.errors import BatchscopeError, CollectError
from collector.records import Finding, ModelRates, ModelSample, Recommendation
from collector.sources.triton import REQUEST_SUMMARY, TritonSource
from collector.store import Store

__all__ = [
    "ApplyInterrupted",
    "ApplyRefused",
    "ApplyResult",
    "LiveChangesRefused",
    "TargetUnreachable",
    "Verdict",
    "WindowFigures",
    "apply_recommendation",
    "check_live_changes",
    "measure_window",
    "stored_figures",
    "stored_recommendation",
    "verdict",
]

log = logging.getLogger("batchscope.apply")

_READ_TIMEOUT_S = 10.0
# What Triton answers a load/unload with when it is not in explicit model control mode.
_NOT_EXPLICIT = ("not allowed", "polling is enabled")


class ApplyRefused(BatchscopeError):
    """Triton refused the change; nothing was changed."""


class LiveChangesRefused(ApplyRefused):
    """The server does not take live config changes (no explicit model control)."""


class TargetUnreachable(BatchscopeError):
    """The server could not be reached; the message says whether anything changed."""


class ApplyInterrupted(BatchscopeError):
    """Stopped before the change was loaded; nothing was changed."""


@dataclass(frozen=True)
class WindowFigures:
    """One model's rates over a measured window, and its p95 from Triton's summary."""

    rates: ModelRates
    p95_ms: float | None  # server-side, from the summary

    @property
    def mean_ms(self) -> float | None:
        us = self.rates.request_us_per_request
        return None if us is None else us / 1000.0

    @property
    def latency_ms(self) -> float | None:
        """p95 when Triton exports it, else the mean request time."""
        return self.p95_ms if self.p95_ms is not None else self.mean_ms


@dataclass(frozen=True)
class Verdict:
    keep: bool
    reasons: tuple[str, ...]  # why the change is rolled back; empty when kept
    summary: str  # one line: "kept: ..." or "rolled back: ..."


_STOPPED = Verdict(
    False,
    ("stopped before the change was verified",),
    "rolled back: stopped before the change was verified",
)


@dataclass(frozen=True)
class ApplyResult:
    recommendation_id: int
    before: WindowFigures
    after: WindowFigures | None  # None when stopped before the after window
    verdict: Verdict
    finding_id: int

    @property
    def rolled_back(self) -> bool:
        return not self.verdict.keep


def stored_figures(before: WindowFigures, after: WindowFigures | None) -> dict[str, Any]:
    """The before/after figures as the store keeps them (verification, finding evidence)."""
    return {
        "before_qps": before.rates.requests_per_s,
        "after_qps": after.rates.requests_per_s if after else None,
        "before_p95_ms": before.p95_ms,
        "after_p95_ms": after.p95_ms if after else None,
        "before_mean_ms": before.mean_ms,
        "after_mean_ms": after.mean_ms if after else None,
    }


def verdict(
    before: WindowFigures,
    after: WindowFigures,
    objective_p95_ms: float | None,
    settings: ApplySettings,
) -> Verdict:
    """Keep or roll back: throughput may not fall below ``min_qps_ratio`` of before;
    p95 may not exceed the objective, or without one grow past ``max_p95_ratio``
    (the mean request time stands in for p95 when Triton has no summary)."""
    reasons = []
    b_qps, a_qps = before.rates.requests_per_s, after.rates.requests_per_s
    if a_qps < b_qps * settings.min_qps_ratio:
        reasons.append(f"throughput fell from {b_qps:.0f} to {a_qps:.0f} QPS")
    b_lat, a_lat = before.latency_ms, after.latency_ms
    measure = "p95" if after.p95_ms is not None else "mean request time"
    if objective_p95_ms is not None:
        if after.p95_ms is not None and after.p95_ms > objective_p95_ms:
            reasons.append(
                f"p95 {after.p95_ms:.1f} ms is above the objective {objective_p95_ms:g} ms"
            )
    elif b_lat is not None and a_lat is not None and a_lat > b_lat * settings.max_p95_ratio:
        reasons.append(
            f"{measure} rose from {b_lat:.1f} to {a_lat:.1f} ms "
            f"(> {(settings.max_p95_ratio - 1) * 100:.0f} %)"
        )
    if reasons:
        return Verdict(False, tuple(reasons), "rolled back: " + "; ".join(reasons))
    return Verdict(
        True, (), f"kept: {b_qps:.0f} → {a_qps:.0f} QPS, {measure} {_ms(b_lat)} → {_ms(a_lat)}"
    )


def _sample(source: TritonSource, model: str) -> ModelSample | None:
    (snapshot,) = source.collect()
    stats = {s.model: s for s in snapshot.model_stats}
    for m in snapshot.model_metrics:
        if m.model == model:
            return ModelSample(
                target=snapshot.target,
                collected_at=snapshot.collected_at,
                metrics=m,
                stats=stats.get(model),
            )
    return None


def measure_window(
    source: TritonSource, model: str, seconds: float, wait: Callable[[float], bool]
) -> WindowFigures:
    """Throughput and latency of ``model`` over the next ``seconds``; raises
    ``ApplyInterrupted`` when ``wait`` says stop."""
    first = _sample(source, model)
    if wait(seconds):
        raise ApplyInterrupted(f"stopped while measuring {model!r}")
    last = _sample(source, model)
    if first is None or last is None:
        raise CollectError(f"model {model!r} is not served by {source.target}")
    summary = last.metrics.summary_quantiles_us.get(REQUEST_SUMMARY, {})
    return WindowFigures(
        rates=rates_between(first, last), p95_ms=summary[0.95] / 1000.0 if 0.95 in summary else None
    )


def _model_path(model: str) -> str:
    # Model names are path segments: quoted, a name with "/" or "?" stays one name.
    return f"/v2/repository/models/{quote(model, safe='')}"


def _refusal(response: requests.Response) -> str:
    try:
        return str(response.json().get("error", response.text))
    except ValueError:
        return response.text


def _unreachable(
    base_url: str, exc: requests.RequestException, *, changed: bool
) -> TargetUnreachable:
    log.debug("request to %s failed", base_url, exc_info=exc)
    reason = (
        "timed out"
        if isinstance(exc, requests.Timeout)
        else "connection failed"
        if isinstance(exc, requests.ConnectionError)
        else type(exc).__name__
    )
    state = "the new config may be loaded" if changed else "nothing was changed"
    return TargetUnreachable(f"could not reach Triton at {base_url} ({reason}); {state}")


def _post(
    http: requests.Session,
    base_url: str,
    path: str,
    *,
    timeout_s: float,
    changed: bool,
    **kwargs: Any,
) -> requests.Response:
    try:
        return http.post(base_url + path, timeout=timeout_s, **kwargs)
    except requests.RequestException as exc:
        raise _unreachable(base_url, exc, changed=changed) from None


def check_live_changes(http: requests.Session, url: str) -> None:
    """Raise ``LiveChangesRefused`` unless the server at ``url`` takes config changes
    through the load API (explicit model control), ``TargetUnreachable`` when it cannot
    be asked. Probed with an unload of a model name that cannot exist: a server in
    another mode refuses any load or unload."""
    probe = f"/v2/repository/models/batchscope-probe-{time.monotonic_ns():x}/unload"
    response = _post(http, url, probe, timeout_s=5.0, changed=False)
    if not response.ok and any(word in response.text.lower() for word in _NOT_EXPLICIT):
        raise LiveChangesRefused(
            f"{url} does not allow live config changes: start "
            f"tritonserver with --model-control-mode=explicit. Nothing was changed."
        )


def _load(
    http: requests.Session,
    url: str,
    model: str,
    config_json: str,
    timeout_s: float,
    *,
    rollback: bool = False,
) -> None:
    response = _post(
        http,
        url,
        f"{_model_path(model)}/load",
        timeout_s=timeout_s,
        changed=rollback,
        json={"parameters": {"config": config_json}},
    )
    if response.ok:
        return
    message = _refusal(response)
    if rollback:
        raise BatchscopeError(
            f"the rollback of {model!r} failed (HTTP {response.status_code}: "
            f"{message[:300]}); the new config may still be loaded"
        )
    if any(word in message for word in _NOT_EXPLICIT):
        raise LiveChangesRefused(
            f"{url} does not allow live config changes ({message}): start tritonserver with "
            f"--model-control-mode=explicit. Nothing was changed."
        )
    raise ApplyRefused(
        f"Triton refused the config for {model!r} (HTTP "
        f"{response.status_code}: {message[:300]}). Nothing was changed."
    )


def _current_config(http: requests.Session, url: str, model: str) -> str:
    try:
        response = http.get(
            f"{url}/v2/models/{quote(model, safe='')}/config", timeout=_READ_TIMEOUT_S
        )
    except requests.RequestException as exc:
        raise _unreachable(url, exc, changed=False) from None
    if not response.ok:
        raise ApplyRefused(
            f"cannot read the current config of {model!r} from {url} "
            f"(HTTP {response.status_code}). Nothing was changed."
        )
    return json.dumps(response.json())


def stored_recommendation(
    store: Store,
    target: str,
    model: str,
    recommendation_id: int | None = None,
) -> tuple[int, Recommendation] | None:
    """The stored recommendation ``recommendation_id`` for ``model`` on ``target``
    (default: the latest) with its id, or None when there is none."""
    if recommendation_id is None:
        found = store.latest_recommendation(target, model)
    else:
        stored = store.recommendations(target=target, model=model)
        found = next((r for r in stored if r.id == recommendation_id), None)
    return None if found is None else (found.id, found.recommendation)


def apply_recommendation(
    target: TargetSettings,
    recommendation: Recommendation,
    *,
    store: Store,
    http: requests.Session,
    settings: ApplySettings | None = None,
    recommendation_id: int | None = None,
    clock: Callable[[], float] = time.time,
    wait: Callable[[float], bool] | None = None,
    say: Callable[[str], None] = lambda _m: None,
) -> ApplyResult:
    """Apply, verify, roll back on a regression, and record the outcome in ``store``
    (under ``recommendation_id``; an unstored recommendation is stored first).

    Raises ``LiveChangesRefused``, ``ApplyRefused``, ``TargetUnreachable`` or
    ``ApplyInterrupted`` when nothing was changed; a failure after the change was loaded
    is recorded as ``failed`` after a best-effort rollback, and raised."""
    settings = settings or ApplySettings()
    wait = wait or threading.Event().wait
    rec_id = (
        store.add_recommendation(recommendation) if recommendation_id is None else recommendation_id
    )
    model, url = recommendation.model, target.url
    # The caller owns ``http``: the source borrows it and is not closed.
    source = TritonSource(target, timeout_s=_READ_TIMEOUT_S, session=http, clock=clock)
    previous_json = _current_config(http, url, model)
    say(f"measuring {model} for {settings.before_s:g} s before the change ...")
    before = measure_window(source, model, settings.before_s, wait)
    say(f"loading the new config of {model} ...")
    _load(http, url, model, recommendation.config_json, settings.load_timeout_s)
    store.record_recommendation_outcome(rec_id, outcome="applied", at=clock(), verification=None)
    try:
        after, judged = _verify(source, recommendation, before, settings, wait, say)
        if not judged.keep:
            say(f"{judged.summary} — rolling back")
            _load(http, url, model, previous_json, settings.load_timeout_s, rollback=True)
    except Exception as exc:  # the change is loaded: undo it if we can, and say so
        _fail(store, rec_id, exc, clock())
        if not isinstance(exc, TargetUnreachable):
            _try_rollback(http, url, model, previous_json, settings)
        raise
    finding_id = store.add_finding(
        **asdict(_finding(recommendation, before, after, judged, clock()))
    )
    store.record_recommendation_outcome(
        rec_id,
        outcome="kept" if judged.keep else "rolled_back",
        at=clock(),
        verification={"verdict": judged.summary, **stored_figures(before, after)},
    )
    return ApplyResult(
        recommendation_id=rec_id, before=before, after=after, verdict=judged, finding_id=finding_id
    )


def _verify(
    source: TritonSource,
    rec: Recommendation,
    before: WindowFigures,
    settings: ApplySettings,
    wait: Callable[[float], bool],
    say: Callable[[str], None],
) -> tuple[WindowFigures | None, Verdict]:
    """The after window and its verdict; stopped early, the change is not kept."""
    if wait(settings.settle_s):  # the reload is done (the call returned); traffic resumes
        return None, _STOPPED
    say(f"verifying for {settings.after_s:g} s ...")
    try:
        after = measure_window(source, rec.model, settings.after_s, wait)
    except ApplyInterrupted:
        return None, _STOPPED
    return after, verdict(before, after, rec.slo_p95_ms, settings)


def _fail(store: Store, rec_id: int, exc: Exception, at: float) -> None:
    try:
        store.record_recommendation_outcome(
            rec_id, outcome="failed", at=at, verification={"verdict": f"failed: {exc}"}
        )
    except Exception:  # the original error is the one to raise
        log.exception("could not record the failure of recommendation %d", rec_id)


def _try_rollback(
    http: requests.Session, url: str, model: str, previous_json: str, settings: ApplySettings
) -> None:
    # The original error is raised; its message says the new config may be loaded.
    with contextlib.suppress(BatchscopeError):
        _load(http, url, model, previous_json, settings.load_timeout_s, rollback=True)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _finding(
    rec: Recommendation,
    before: WindowFigures,
    after: WindowFigures | None,
    judged: Verdict,
    now: float,
) -> Finding:
    changes = [str(c) for c in rec.changes]
    after_s = after.rates.window_s if after else 0.0
    return Finding(
        kind="config_applied",
        severity="info" if judged.keep else "warning",
        target=rec.target,
        subject=rec.model,
        summary=f"{rec.model}: {', '.join(changes) or 'no change'} — {judged.summary}",
        window_start=now - before.rates.window_s - after_s,
        window_end=now,
        evidence={
            **stored_figures(before, after),
            "predicted_qps": rec.predicted.qps,
            "predicted_p95_ms": rec.predicted.p95_ms,
            "rolled_back": not judged.keep,
            "changes": "; ".join(changes),
        },
    )
