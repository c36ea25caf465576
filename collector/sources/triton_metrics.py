"""Triton's metrics page -> records: the *map* step of the ``triton`` source.

``map_metrics`` is pure: it takes the neutral families of
``collector.sources.exposition.parse_exposition`` and returns ``ModelMetrics`` per
(model, version), ``DeviceSample`` per GPU and ``ServerMetrics``. Families it does not
know are ignored. ``parse_metrics`` is prometheus_client's parser followed by it: the
reference.

``TritonMetricsParser`` is the fast path for one target's pages, scrape after scrape:
``collector.sources.fast_exposition.ExpositionScanner`` reads only the families
``map_metrics`` uses, and each series is turned once into a *fold* (which model and
field, which GPU, which server gauge it adds to), cached with the series; a page is then
one cache lookup and one ``float()`` per line, folded straight into the accumulators,
without ``MetricFamily`` objects. ``map_metrics`` applies the same folds to parsed
families, so there is one mapping; the fast path gives the same ``TritonMetrics`` as
``parse_metrics`` (the tests compare both on recorded, scaled and generated pages).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from collector.errors import ParseError
from collector.records import DeviceSample, ModelMetrics, ServerMetrics
from collector.sources.exposition import MetricFamily, parse_exposition
from collector.sources.fast_exposition import (
    DEFAULT_MAX_SERIES,
    ExpositionScanner,
    IrregularPage,
    decode,
)

__all__ = [
    "REQUEST_SUMMARY",
    "TritonMetrics",
    "TritonMetricsParser",
    "map_metrics",
    "parse_metrics",
]

# Per-model counters summed over every series of a (model, version): Triton keeps one
# series per reporter -- one per GPU for KIND_GPU instances (label gpu_uuid) plus a
# model-level one without gpu_uuid -- and the model's total is their sum.
_MODEL_COUNTERS: dict[str, str] = {
    "nv_inference_request_success": "request_success",
    "nv_inference_count": "inference_count",
    "nv_inference_exec_count": "exec_count",
    "nv_inference_request_duration_us": "request_duration_us",
    "nv_inference_queue_duration_us": "queue_duration_us",
    "nv_inference_compute_input_duration_us": "compute_input_duration_us",
    "nv_inference_compute_infer_duration_us": "compute_infer_duration_us",
    "nv_inference_compute_output_duration_us": "compute_output_duration_us",
}
# Families that exist only for some models or versions (the cache ones only when the
# response cache is on): summed like the counters, but None when absent.
_MODEL_OPTIONAL_SUMS: dict[str, str] = {
    "nv_inference_pending_request_count": "pending_request_count",
    "nv_cache_num_hits_per_model": "cache_hit_count",
    "nv_cache_num_misses_per_model": "cache_miss_count",
    "nv_cache_hit_duration_per_model": "cache_hit_duration_us",
    "nv_cache_miss_duration_per_model": "cache_miss_duration_us",
}
_MODEL_SUMS = {**_MODEL_COUNTERS, **_MODEL_OPTIONAL_SUMS}
# A load time is one duration, not an amount: every reporter of the model carries the
# gauge, so the largest series is the model's load time (a sum could double it).
_MODEL_OPTIONAL_MAX: dict[str, str] = {
    "nv_model_load_duration_secs": "load_duration_s",
}
_FAILURE_FAMILY = "nv_inference_request_failure"
# Triton before 23.x had no reason label on failures.
_FAILURE_REASON_MISSING = "UNSPECIFIED"
_SUMMARY_PREFIXES = ("nv_inference_", "nv_cache_")
# Triton's end-to-end request latency summary (``summary_latencies=true``), in µs.
REQUEST_SUMMARY = "nv_inference_request_summary_us"

_GPU_FAMILIES: dict[str, str] = {
    "nv_gpu_utilization": "utilization_ratio",
    "nv_gpu_memory_total_bytes": "memory_total_bytes",
    "nv_gpu_memory_used_bytes": "memory_used_bytes",
    "nv_gpu_power_usage": "power_w",
    "nv_gpu_power_limit": "power_limit_w",
    "nv_energy_consumption": "energy_j",
}
_SERVER_FAMILIES: dict[str, str] = {
    "nv_cpu_utilization": "cpu_utilization",
    "nv_cpu_memory_total_bytes": "cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes": "cpu_memory_used_bytes",
    "nv_pinned_memory_pool_total_bytes": "pinned_memory_pool_total_bytes",
    "nv_pinned_memory_pool_used_bytes": "pinned_memory_pool_used_bytes",
}


@dataclass(frozen=True)
class TritonMetrics:
    """What ``map_metrics`` makes of one metrics page."""

    models: tuple[ModelMetrics, ...] = ()
    gpus: tuple[DeviceSample, ...] = ()
    server: ServerMetrics | None = None


@dataclass
class _ModelAccumulator:
    sums: dict[str, float] = field(default_factory=dict)
    failures: dict[str, float] = field(default_factory=dict)
    quantiles: dict[str, dict[float, float]] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)

    def maximum(self, field_name: str, value: float) -> None:
        self.sums[field_name] = max(self.sums.get(field_name, value), value)


def parse_metrics(text: str) -> TritonMetrics:
    """Parse and map one Triton metrics page. Raises ``ParseError``."""
    return map_metrics(parse_exposition(text))


class TritonMetricsParser:
    """Parses one target's metrics pages, scrape after scrape (one per target: it keeps
    what it learnt of earlier pages, at most ``max_series`` cache entries, to read the
    next one faster). Gives what ``parse_metrics`` gives for the same page."""

    def __init__(self, *, max_series: int = DEFAULT_MAX_SERIES) -> None:
        self._scanner: ExpositionScanner[_SeriesFold] = ExpositionScanner(
            wanted_family, _fold_of, max_series=max_series
        )

    @property
    def cached_entries(self) -> int:
        return self._scanner.cached_entries

    @property
    def pages_from_shape(self) -> int:
        """Pages read from the previous page's shape (see ``ExpositionScanner``)."""
        return self._scanner.pages_from_shape

    def parse(self, body: bytes) -> TritonMetrics:
        """Parse and map one metrics page given as bytes. Raises ``ParseError``."""
        try:
            pairs, _ = self._scanner.scan(body)
        except IrregularPage:
            # A page whose blocks the caches cannot follow (never seen from Triton):
            # the reference path reads it.
            return parse_metrics(decode(body))
        return _fold_page(pairs)


def map_metrics(families: Mapping[str, MetricFamily]) -> TritonMetrics:
    """Map parsed families to records. Pure; families it does not know are ignored.

    - ``ModelMetrics`` per (model, version), sorted, summed over ``gpu_uuid`` and any
      other extra label (``namespace``, ``metric_tags`` labels ``_*``);
    - one ``DeviceSample(source="triton")`` per ``gpu_uuid`` of the ``nv_gpu_*``
      families, in order of first appearance (empty when Triton exports none, as with
      MIG or a foreign DCGM agent);
    - ``ServerMetrics`` from ``nv_cpu_*``/``nv_pinned_*``, or None when none is present.

    Summary quantiles that are NaN (no observation in the window) are left out. When a
    summary is split over several GPUs, the largest per-GPU quantile is kept: the
    quantile of the merged distribution is never above it, so it is a safe upper bound.

    A series that adds up (a counter, a failure reason, a histogram bucket) found twice
    on one page is a ``ParseError``: summed, it would double the model's counters (a
    rate spike when it comes, a false restart when it goes), and no copy is more right
    than the other.
    """
    # One fold per series (as the fast path's caches give), so a series met twice is
    # the same fold twice.
    folds: dict[tuple[str, str, frozenset[tuple[str, str]]], _SeriesFold] = {}
    pairs = []
    for family in families.values():
        if not wanted_family(family.name):
            continue
        for sample in family.samples:
            series = (family.name, sample.suffix, frozenset(sample.labels.items()))
            fold = folds.get(series)
            if fold is None:
                fold = folds[series] = _fold_of(
                    family.name, family.type, sample.suffix, sample.labels
                )
            pairs.append((fold, sample.value))
    return _fold_page(pairs)


def _model_metrics(model: str, version: str, acc: _ModelAccumulator) -> ModelMetrics:
    # Counters default to 0 (a model without a series has counted nothing); the
    # optional families to None (not exported for this model).
    amounts: dict[str, Any] = {f: acc.sums.get(f, 0.0) for f in _MODEL_COUNTERS.values()}
    for f in (*_MODEL_OPTIONAL_SUMS.values(), *_MODEL_OPTIONAL_MAX.values()):
        amounts[f] = acc.sums.get(f)
    return ModelMetrics(
        model=model,
        version=version,
        request_failure_by_reason=dict(acc.failures),
        summary_quantiles_us={fam: dict(sorted(qs.items())) for fam, qs in acc.quantiles.items()},
        histogram_buckets={fam: dict(sorted(bs.items())) for fam, bs in acc.buckets.items()},
        **amounts,
    )


def _device_sample(uuid: str, r: Mapping[str, float]) -> DeviceSample:
    util = r.get("utilization_ratio")
    used = r.get("memory_used_bytes")
    total = r.get("memory_total_bytes")
    return DeviceSample(
        source="triton",
        uuid=uuid,
        kind="gpu",
        utilization_gpu_pct=None if util is None else util * 100.0,
        memory_used_bytes=_byte_count(uuid, "nv_gpu_memory_used_bytes", used),
        memory_total_bytes=_byte_count(uuid, "nv_gpu_memory_total_bytes", total),
        power_w=r.get("power_w"),
        power_limit_w=r.get("power_limit_w"),
        energy_j=r.get("energy_j"),
    )


def _byte_count(uuid: str, family: str, value: float | None) -> int | None:
    if value is None:
        return None
    if not math.isfinite(value):
        raise ParseError(f"{family} of {uuid}: {value} is not a byte count")
    return int(value)


# --------------------------------------------------------------------------- the fast path
# The one mapping, series by series: each series gets a *fold* (a tuple: an operation
# code and its arguments) -- once, cached with the series by the scanner, on the fast
# path; per sample of the parsed families in map_metrics -- and the folds are applied
# in order. Each figure adds up one family's series in text order in both paths, so the
# floats come out identical.

_SeriesFold = tuple[Any, ...]
_SKIP_OP, _TOUCH, _SUM, _MAX, _FAIL, _QUANTILE, _BUCKET, _BAD_NUMBER, _GPU, _SERVER = range(10)
_SKIP: _SeriesFold = (_SKIP_OP,)


def wanted_family(name: str) -> bool:
    """True for a family ``map_metrics`` reads (whatever its type)."""
    return (
        name.startswith(_SUMMARY_PREFIXES)  # every per-model family but the load time
        or name in _MODEL_OPTIONAL_MAX
        or name in _GPU_FAMILIES
        or name in _SERVER_FAMILIES
    )


def _fold_of(family: str, typ: str, suffix: str, labels: Mapping[str, str]) -> _SeriesFold:
    """How a sample of this series adds to the page's figures (see ``map_metrics``)."""
    if family in _GPU_FAMILIES:
        uuid = labels.get("gpu_uuid")
        return _SKIP if uuid is None or suffix != "" else (_GPU, family, uuid)
    if family in _SERVER_FAMILIES:
        return (_SERVER, _SERVER_FAMILIES[family]) if suffix == "" else _SKIP
    model = labels.get("model")
    if model is None:
        return _SKIP
    key = (model, labels.get("version", ""))
    if family in _MODEL_SUMS:
        return (_SUM, key, _MODEL_SUMS[family]) if suffix == "" else (_TOUCH, key)
    if family in _MODEL_OPTIONAL_MAX:
        return (_MAX, key, _MODEL_OPTIONAL_MAX[family]) if suffix == "" else (_TOUCH, key)
    if family == _FAILURE_FAMILY:
        if suffix != "":
            return (_TOUCH, key)
        return (_FAIL, key, labels.get("reason", _FAILURE_REASON_MISSING))
    if typ == "summary":
        return _number_fold(key, family, suffix == "", "quantile", labels, _QUANTILE)
    if typ == "histogram":
        return _number_fold(key, family, suffix == "_bucket", "le", labels, _BUCKET)
    return _SKIP  # a per-model prefix, but neither a summary nor a histogram


def _number_fold(
    key: tuple[str, str],
    family: str,
    kept: bool,
    label: str,
    labels: Mapping[str, str],
    op: int,
) -> _SeriesFold:
    text = labels.get(label)
    if not kept or text is None:
        return (_TOUCH, key)
    try:
        return (op, key, family, float(text))
    except ValueError:
        # As in map_metrics, the error is raised only when a non-NaN sample needs it.
        return (_BAD_NUMBER, key, f"{family}: {label} label {text!r} is not a number")


def _fold_page(pairs: list[tuple[_SeriesFold, float]]) -> TritonMetrics:
    """The figures of a page's (fold, value) pairs, one fold object per series (so a
    series that adds up and comes twice is found by the fold's identity)."""
    models: dict[tuple[str, str], _ModelAccumulator] = {}
    gpu: dict[str, list[tuple[str, float]]] = {}
    server: dict[str, float] = {}
    added: list[_SeriesFold] = []  # the folds of the series that add up, as met
    for fold, value in pairs:
        op = fold[0]
        if op >= _GPU:
            if op == _GPU:
                gpu.setdefault(fold[1], []).append((fold[2], value))
            elif value == value:  # the first non-NaN value of the family
                server.setdefault(fold[1], value)
            continue
        if op == _SKIP_OP:
            continue
        acc = models.get(fold[1])
        if acc is None:
            acc = models[fold[1]] = _ModelAccumulator()
        if value != value or op == _TOUCH:  # NaN: the model is known, nothing adds up
            continue
        if op == _SUM:
            added.append(fold)
            sums = acc.sums
            sums[fold[2]] = sums.get(fold[2], 0.0) + value
        else:
            if op in (_FAIL, _BUCKET):
                added.append(fold)
            _fold_rare(acc, op, fold, value)
    if len(set(map(id, added))) != len(added):
        raise _twice(added)
    return TritonMetrics(
        models=tuple(
            _model_metrics(model, version, acc) for (model, version), acc in sorted(models.items())
        ),
        gpus=_gpus_in_order(gpu),
        server=ServerMetrics(**server) if server else None,
    )


def _twice(added: list[_SeriesFold]) -> ParseError:
    """The error for the first fold of ``added`` met a second time."""
    seen: set[int] = set()
    for fold in added:
        if id(fold) in seen:
            break
        seen.add(id(fold))
    model, version = fold[1]
    what = {_SUM: "counter", _FAIL: "failure reason", _BUCKET: "bucket of"}[fold[0]]
    return ParseError(
        f"a series appears twice on the page ({what} {' '.join(map(str, fold[2:]))} "
        f"of model {model!r} version {version!r})"
    )


def _fold_rare(acc: _ModelAccumulator, op: int, fold: _SeriesFold, value: float) -> None:
    if op == _FAIL:
        acc.failures[fold[2]] = acc.failures.get(fold[2], 0.0) + value
    elif op == _QUANTILE:
        per_q = acc.quantiles.setdefault(fold[2], {})
        per_q[fold[3]] = max(per_q.get(fold[3], value), value)
    elif op == _BUCKET:
        per_le = acc.buckets.setdefault(fold[2], {})
        per_le[fold[3]] = per_le.get(fold[3], 0.0) + value
    elif op == _MAX:
        acc.maximum(fold[2], value)
    else:
        raise ParseError(fold[2])


def _gpus_in_order(gpu: Mapping[str, list[tuple[str, float]]]) -> tuple[DeviceSample, ...]:
    # As _gpu_samples: families in _GPU_FAMILIES order, series in text order.
    readings: dict[str, dict[str, float]] = {}
    for name, target in _GPU_FAMILIES.items():
        for uuid, value in gpu.get(name, ()):
            per_gpu = readings.setdefault(uuid, {})
            if value == value:
                per_gpu[target] = value
    return tuple(_device_sample(uuid, r) for uuid, r in readings.items())
