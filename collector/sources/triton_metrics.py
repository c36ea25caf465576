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
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from collector.errors import ParseError
from collector.records import DeviceSample, ModelMetrics, ServerMetrics, build_record
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
        # The folds of the page shape last read, and the plan made of them.
        self._plan_folds: list[_SeriesFold] | None = None
        self._plan: _FoldPlan | None = None

    @property
    def cached_entries(self) -> int:
        return self._scanner.cached_entries

    @property
    def pages_from_shape(self) -> int:
        """Pages read from the previous page's shape (see ``ExpositionScanner``)."""
        return self._scanner.pages_from_shape

    def parse(self, body: bytes) -> TritonMetrics:
        """Parse and map one metrics page given as bytes. Raises ``ParseError``."""
        shaped = self._scanner.scan_shaped(body)
        if shaped is not None:
            folds, values = shaped
            if folds is not self._plan_folds:
                self._plan_folds, self._plan = folds, _FoldPlan.of(folds)
            folded = None if self._plan is None else self._plan.fold(values)
            if folded is not None:
                return folded
            return _fold_page(list(zip(folds, values, strict=True)))
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


# What a model's figures are when the page has no series of them: counters 0 (it has
# counted nothing), the optional families None (not exported for this model).
_ABSENT_FIGURES: dict[str, float | None] = {
    **dict.fromkeys(_MODEL_COUNTERS.values(), 0.0),
    **dict.fromkeys((*_MODEL_OPTIONAL_SUMS.values(), *_MODEL_OPTIONAL_MAX.values())),
}


def _model_metrics(
    model: str,
    version: str,
    sums: Mapping[str, float],
    failures: dict[str, float],
    quantiles: Mapping[str, Mapping[float, float]],
    buckets: Mapping[str, Mapping[float, float]],
) -> ModelMetrics:
    """One model's record from its figures by field (``sums``: fields of
    ``_ABSENT_FIGURES``), failures by reason (the record keeps the dict) and summary
    quantiles and histogram buckets by family."""
    amounts: dict[str, Any] = {**_ABSENT_FIGURES, **sums}
    amounts["model"], amounts["version"] = model, version
    amounts["request_failure_by_reason"] = failures
    amounts["summary_quantiles_us"] = {
        fam: dict(sorted(qs.items())) for fam, qs in quantiles.items()
    }
    amounts["histogram_buckets"] = {fam: dict(sorted(bs.items())) for fam, bs in buckets.items()}
    # Every field: filled directly (``build_record``), one record per model per scrape.
    return build_record(ModelMetrics, amounts)


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
            _model_metrics(model, version, acc.sums, acc.failures, acc.quantiles, acc.buckets)
            for (model, version), acc in sorted(models.items())
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


class _Picks:
    """Names, each made of the values at its positions on a page (added up in text
    order; with ``largest``, the largest): ``values(page)`` gives them as a dict in the
    order the names were first met. Names with one position, most of them, are picked
    by one ``itemgetter`` call."""

    __slots__ = ("_many", "_names", "_one", "_pick", "largest")

    def __init__(self, largest: bool = False) -> None:
        self.largest = largest
        self._names: dict[Any, list[int]] = {}
        self._one: tuple[Any, ...] = ()
        self._pick: Callable[[list[float]], tuple[float, ...]] = lambda _values: ()
        self._many: list[tuple[Any, list[int]]] = []

    def add(self, name: object, at: int) -> None:
        self._names.setdefault(name, []).append(at)

    def __bool__(self) -> bool:
        return bool(self._names)

    def ready(self) -> _Picks:
        """Done adding."""
        single = [(name, at[0]) for name, at in self._names.items() if len(at) == 1]
        self._one = tuple(name for name, _ in single)
        if single:
            getter = operator.itemgetter(*(at for _, at in single))
            self._pick = getter if len(single) > 1 else lambda values: (getter(values),)
        self._many = [(name, at) for name, at in self._names.items() if len(at) > 1]
        return self

    def values(self, page: list[float]) -> dict[Any, float]:
        # One position: the value itself (0.0 + value but for the sign of a zero).
        if not self._many:  # the usual case: every name is one value, in the names' order
            return dict(zip(self._one, self._pick(page), strict=True))
        out: dict[Any, float] = dict.fromkeys(self._names, 0.0)  # the names' order
        out.update(zip(self._one, self._pick(page), strict=True))
        for name, positions in self._many:
            if self.largest:
                out[name] = max(map(page.__getitem__, positions))
            else:
                total = 0.0
                for at in positions:
                    total += page[at]
                out[name] = total
        return out


@dataclass
class _ModelPlan:
    """Where the figures of one (model, version) are on a page of one shape."""

    model: str
    version: str
    amounts: _Picks = field(default_factory=_Picks)  # ``ModelMetrics`` fields
    maxima: _Picks = field(default_factory=lambda: _Picks(largest=True))
    failures: _Picks = field(default_factory=_Picks)
    quantiles: dict[str, _Picks] = field(default_factory=dict)
    buckets: dict[str, _Picks] = field(default_factory=dict)


class _FoldPlan:
    """``_fold_page`` worked out once for the folds of a page shape, so that each page
    of that shape without NaN (the usual page) is folded from its values by position:
    the same records, each figure adding its values in text order.

    ``of`` gives no plan for folds ``_fold_page`` refuses (a series that adds up met
    twice) or holding a label that is not a number, and ``fold`` gives None for a page
    with NaN (left out of the figures one by one): ``_fold_page`` folds those.
    """

    __slots__ = ("_gpus", "_models", "_server")

    def __init__(
        self,
        models: list[_ModelPlan],
        gpus: list[tuple[str, dict[str, int]]],
        server: dict[str, int],
    ) -> None:
        self._models = models
        self._gpus = gpus
        self._server = server

    @classmethod
    def of(cls, folds: Sequence[_SeriesFold]) -> _FoldPlan | None:
        models: dict[tuple[str, str], _ModelPlan] = {}
        gpu: dict[str, list[tuple[str, int]]] = {}
        server: dict[str, int] = {}
        added: set[int] = set()
        for at, fold in enumerate(folds):
            op = fold[0]
            if op == _SKIP_OP:
                continue
            if op == _GPU:
                gpu.setdefault(fold[1], []).append((fold[2], at))
                continue
            if op == _SERVER:
                server.setdefault(fold[1], at)  # the first of the family
                continue
            if op == _BAD_NUMBER:
                return None
            key = fold[1]
            plan = models.get(key)
            if plan is None:
                plan = models[key] = _ModelPlan(*key)
            if op == _TOUCH:
                continue
            if op in (_SUM, _FAIL, _BUCKET):
                if id(fold) in added:
                    return None
                added.add(id(fold))
            if op == _SUM:
                plan.amounts.add(fold[2], at)
            elif op == _MAX:
                plan.maxima.add(fold[2], at)
            elif op == _FAIL:
                plan.failures.add(fold[2], at)
            elif op == _QUANTILE:
                plan.quantiles.setdefault(fold[2], _Picks(largest=True)).add(fold[3], at)
            else:
                plan.buckets.setdefault(fold[2], _Picks()).add(fold[3], at)
        for plan in models.values():
            plan.amounts.ready()
            plan.maxima.ready()
            plan.failures.ready()
            for picks in (*plan.quantiles.values(), *plan.buckets.values()):
                picks.ready()
        gpus: dict[str, dict[str, int]] = {}
        for name, target in _GPU_FAMILIES.items():  # as _gpus_in_order: the last wins
            for uuid, at in gpu.get(name, ()):
                gpus.setdefault(uuid, {})[target] = at
        return cls([models[key] for key in sorted(models)], list(gpus.items()), server)

    def fold(self, values: list[float]) -> TritonMetrics | None:
        """The records of a page of this shape from its values (in pair order); None
        when one is NaN."""
        total = sum(values)
        # NaN, or infinities of both signs: a NaN is left out value by value, by
        # _fold_page.
        if total != total and any(v != v for v in values):
            return None
        models = []
        for plan in self._models:
            amounts = plan.amounts.values(values)
            if plan.maxima:
                amounts.update(plan.maxima.values(values))
            models.append(
                _model_metrics(
                    plan.model,
                    plan.version,
                    amounts,
                    plan.failures.values(values),
                    {family: picks.values(values) for family, picks in plan.quantiles.items()},
                    {family: picks.values(values) for family, picks in plan.buckets.items()},
                )
            )
        server = {name: values[at] for name, at in self._server.items()}
        return TritonMetrics(
            models=tuple(models),
            gpus=tuple(
                _device_sample(uuid, {target: values[at] for target, at in where.items()})
                for uuid, where in self._gpus
            ),
            server=ServerMetrics(**server) if server else None,
        )
