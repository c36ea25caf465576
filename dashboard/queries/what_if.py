"""What-if curves: the batcher model calibrated to a model's observed load, asked for
QPS and p95 at every max queue delay of ``WHAT_IF_DELAYS_US`` for the preferred sizes
and instance count a user picks.

Calibrating takes seconds and a curve a fraction of one, while a slider moves many
times a minute: ``WhatIfCurves`` is the one cache, keeping each (target, model)'s
model for ``WHAT_IF_MODEL_TTL_S`` and the curves drawn from it, so moving only the
delay slider is instant.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from collector.analysis.recommend import (
    BatcherModel,
    RecommendSettings,
    batcher_model,
    observe_model,
)
from collector.records import BatcherConfig
from collector.store import Store
from dashboard.queries.views import WHAT_IF_DELAYS_US, WhatIfView

__all__ = ["WHAT_IF_MODEL_TTL_S", "WhatIfCurves", "draw_curve"]

#: A what-if reuses a calibrated batcher model this long.
WHAT_IF_MODEL_TTL_S: Final = 60.0
_SETTINGS: Final = RecommendSettings(window_s=30.0)
# Curves kept per calibrated model (each a choice of preferred sizes and instances).
_CURVES_PER_MODEL: Final = 64

_CurveKey = tuple[tuple[int, ...], int]  # (preferred sizes, instances)


@dataclass
class _Calibrated:
    built_at: float
    batcher: BatcherModel | None  # None: not enough traffic observed yet
    curves: dict[_CurveKey, WhatIfView] = field(default_factory=dict)


class WhatIfCurves:
    """What-if curves over ``store``, each model calibrated at most once per
    ``ttl_s``; safe to share between threads."""

    def __init__(
        self,
        store: Store,
        *,
        slo_p95_ms: Mapping[str, float] | None = None,
        ttl_s: float = WHAT_IF_MODEL_TTL_S,
    ) -> None:
        self._store = store
        self._slo = dict(slo_p95_ms or {})
        self._ttl_s = ttl_s
        self._models: dict[tuple[str, str], _Calibrated] = {}
        self._lock = threading.Lock()

    def curve(
        self, target: str, model: str, *, preferred: Sequence[int], instances: int, now: float
    ) -> WhatIfView:
        view = WhatIfView(
            target=target, model=model, preferred=sorted(set(preferred)), instances=instances
        )
        calibrated = self._calibrated(target, model, now)
        if calibrated.batcher is None:
            return replace(view, error="not enough traffic observed for a prediction yet")
        key = (tuple(view.preferred), instances)
        with self._lock:
            drawn = calibrated.curves.get(key)
        if drawn is None:
            drawn = draw_curve(calibrated.batcher, view, self._slo.get(model))
            with self._lock:
                if len(calibrated.curves) >= _CURVES_PER_MODEL:
                    calibrated.curves.clear()
                calibrated.curves[key] = drawn
        return drawn

    def _calibrated(self, target: str, model: str, now: float) -> _Calibrated:
        with self._lock:
            held = self._models.get((target, model))
        if held is not None and now - held.built_at < self._ttl_s:
            return held
        built = _Calibrated(built_at=now, batcher=_calibrate(self._store, target, model, now))
        with self._lock:
            self._models[(target, model)] = built
        return built


def _calibrate(store: Store, target: str, model: str, now: float) -> BatcherModel | None:
    observation = observe_model(store, target, model, settings=_SETTINGS, now=now)
    return batcher_model(observation, _SETTINGS) if observation is not None else None


def draw_curve(batcher: BatcherModel, view: WhatIfView, slo_p95_ms: float | None) -> WhatIfView:
    """``view`` filled with the predictions of ``batcher`` over ``WHAT_IF_DELAYS_US``
    (preferred sizes above the max batch size and instance counts beyond the model's
    limit are dropped) and the objective they are judged against."""
    current = batcher.observation.batcher
    settings = batcher.settings
    sizes = [p for p in view.preferred if 1 <= p <= current.max_batch_size]
    instances = min(max(view.instances, 1), settings.max_instances)
    predicted = [
        batcher.predict(
            BatcherConfig(
                max_batch_size=current.max_batch_size,
                dynamic_batching=True,
                preferred_batch_sizes=tuple(sizes),
                max_queue_delay_us=delay,
                instance_count=instances,
            ),
            requests=settings.screen_requests,
        )
        for delay in WHAT_IF_DELAYS_US
    ]
    today = batcher.predict(current, requests=settings.screen_requests)
    objective: float | None
    if slo_p95_ms is not None:
        objective, text = slo_p95_ms, f"SLO p95 ≤ {slo_p95_ms:g} ms"
    else:
        objective = today.p95_ms * settings.latency_margin if today.p95_ms else None
        text = f"current p95 + {settings.latency_margin - 1:.0%}"
    return replace(
        view,
        preferred=sizes,
        instances=instances,
        delays_us=list(WHAT_IF_DELAYS_US),
        predicted=predicted,
        current=today,
        objective_p95_ms=objective,
        objective=text,
        current_delay_us=current.max_queue_delay_us if current.dynamic_batching else None,
        max_batch_size=current.max_batch_size,
        max_instances=settings.max_instances,
    )
