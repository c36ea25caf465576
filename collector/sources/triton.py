"""The ``triton`` source: one Triton server's metrics, statistics and model configs.

Three steps, each testable alone:

1. *fetch* (``TritonSource._get``): one bounded HTTP GET -- connect and read timeouts,
   a total deadline, a cap on the body -- that turns every failure into a
   ``collector.errors.CollectError``;
2. *parse* (``collector.sources.exposition.parse_exposition``, ``json.loads``);
3. *map* (``map_metrics``, ``map_model_stats``, ``map_model_config``): pure functions
   from parsed documents to ``collector.records``.

Endpoints read per ``collect()``: ``GET /v2`` (server version, and a cheap liveness
check), the metrics URL, ``GET /v2/models/stats``, and ``GET /v2/models/NAME/config``
for each model in the statistics. Configs are cached (see ``TritonSource``).
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import requests
import urllib3.exceptions

from collector.config import TargetSettings
from collector.errors import (
    CollectError,
    ParseError,
    ResponseTooLarge,
    TargetDown,
    TargetHTTPError,
    TargetTimeout,
)
from collector.records import (
    BatchStat,
    DeviceSample,
    Duration,
    ModelConfig,
    ModelMetrics,
    ModelStats,
    QueuePolicy,
    ServerMetrics,
    TritonSnapshot,
)
from collector.sources.base import SourceSpec, register_source
from collector.sources.exposition import MetricFamily, parse_exposition

__all__ = [
    "TritonMetrics",
    "TritonSource",
    "map_metrics",
    "map_model_config",
    "map_model_stats",
    "parse_metrics",
    "parse_model_config",
    "parse_model_stats",
    "parse_server_version",
]

_T = TypeVar("_T")

_MIB = 1024 * 1024
_READ_CHUNK = 64 * 1024
_ERROR_EXCERPT_BYTES = 512
_ERROR_EXCERPT_CHARS = 200

# --------------------------------------------------------------------------- mapping

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

    def add(self, field_name: str, value: float) -> None:
        self.sums[field_name] = self.sums.get(field_name, 0.0) + value

    def maximum(self, field_name: str, value: float) -> None:
        self.sums[field_name] = max(self.sums.get(field_name, value), value)


def parse_metrics(text: str) -> TritonMetrics:
    """Parse and map one Triton metrics page. Raises ``ParseError``."""
    return map_metrics(parse_exposition(text))


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
    """
    models: dict[tuple[str, str], _ModelAccumulator] = {}

    def model_of(labels: Mapping[str, str]) -> _ModelAccumulator | None:
        name = labels.get("model")
        if name is None:
            return None  # not a per-model series; nothing to attribute it to
        return models.setdefault((name, labels.get("version", "")), _ModelAccumulator())

    for family in families.values():
        name = family.name
        if name in _MODEL_COUNTERS or name in _MODEL_OPTIONAL_SUMS:
            target = _MODEL_COUNTERS.get(name) or _MODEL_OPTIONAL_SUMS[name]
            for s in family.samples:
                acc = model_of(s.labels)
                if acc is not None and s.suffix == "" and not math.isnan(s.value):
                    acc.add(target, s.value)
        elif name in _MODEL_OPTIONAL_MAX:
            for s in family.samples:
                acc = model_of(s.labels)
                if acc is not None and s.suffix == "" and not math.isnan(s.value):
                    acc.maximum(_MODEL_OPTIONAL_MAX[name], s.value)
        elif name == _FAILURE_FAMILY:
            for s in family.samples:
                acc = model_of(s.labels)
                if acc is not None and s.suffix == "" and not math.isnan(s.value):
                    reason = s.labels.get("reason", _FAILURE_REASON_MISSING)
                    acc.failures[reason] = acc.failures.get(reason, 0.0) + s.value
        elif family.type == "summary" and name.startswith(_SUMMARY_PREFIXES):
            for s in family.samples:
                acc = model_of(s.labels)
                quantile = s.labels.get("quantile")
                if acc is None or s.suffix != "" or quantile is None or math.isnan(s.value):
                    continue
                try:
                    q = float(quantile)
                except ValueError as exc:
                    raise ParseError(
                        f"{name}: quantile label {quantile!r} is not a number"
                    ) from exc
                per_q = acc.quantiles.setdefault(name, {})
                per_q[q] = max(per_q.get(q, s.value), s.value)
        elif family.type == "histogram" and name.startswith(_SUMMARY_PREFIXES):
            for s in family.samples:
                acc = model_of(s.labels)
                bound = s.labels.get("le")
                if acc is None or s.suffix != "_bucket" or bound is None or math.isnan(s.value):
                    continue
                try:
                    le = float(bound)  # "+Inf" parses as inf
                except ValueError as exc:
                    raise ParseError(f"{name}: le label {bound!r} is not a number") from exc
                # Buckets are cumulative counts, so series of several GPUs add up.
                per_le = acc.buckets.setdefault(name, {})
                per_le[le] = per_le.get(le, 0.0) + s.value

    return TritonMetrics(
        models=tuple(
            _model_metrics(model, version, acc) for (model, version), acc in sorted(models.items())
        ),
        gpus=_gpu_samples(families),
        server=_server_metrics(families),
    )


def _model_metrics(model: str, version: str, acc: _ModelAccumulator) -> ModelMetrics:
    counters = {f: acc.sums.get(f, 0.0) for f in _MODEL_COUNTERS.values()}
    optional = {
        f: acc.sums.get(f) for f in (*_MODEL_OPTIONAL_SUMS.values(), *_MODEL_OPTIONAL_MAX.values())
    }
    return ModelMetrics(
        model=model,
        version=version,
        request_failure_by_reason=dict(acc.failures),
        summary_quantiles_us={fam: dict(sorted(qs.items())) for fam, qs in acc.quantiles.items()},
        histogram_buckets={fam: dict(sorted(bs.items())) for fam, bs in acc.buckets.items()},
        **counters,
        **optional,
    )


def _gpu_samples(families: Mapping[str, MetricFamily]) -> tuple[DeviceSample, ...]:
    # GPUs in the order Triton lists them (nv_gpu_utilization first); a GPU missing
    # from that family still gets a sample from the others.
    readings: dict[str, dict[str, float]] = {}
    for name, target in _GPU_FAMILIES.items():
        family = families.get(name)
        if family is None:
            continue
        for s in family.samples:
            uuid = s.labels.get("gpu_uuid")
            if uuid is None or s.suffix != "":
                continue
            per_gpu = readings.setdefault(uuid, {})
            if not math.isnan(s.value):
                per_gpu[target] = s.value
    return tuple(_device_sample(uuid, r) for uuid, r in readings.items())


def _device_sample(uuid: str, r: Mapping[str, float]) -> DeviceSample:
    util = r.get("utilization_ratio")
    used = r.get("memory_used_bytes")
    total = r.get("memory_total_bytes")
    return DeviceSample(
        source="triton",
        uuid=uuid,
        kind="gpu",
        utilization_gpu_pct=None if util is None else util * 100.0,
        memory_used_bytes=None if used is None else int(used),
        memory_total_bytes=None if total is None else int(total),
        power_w=r.get("power_w"),
        power_limit_w=r.get("power_limit_w"),
        energy_j=r.get("energy_j"),
    )


def _server_metrics(families: Mapping[str, MetricFamily]) -> ServerMetrics | None:
    values: dict[str, float] = {}
    for name, target in _SERVER_FAMILIES.items():
        family = families.get(name)
        if family is None:
            continue
        for s in family.samples:
            # Server-wide gauges have one unlabelled series; take the first value one.
            if s.suffix == "" and not math.isnan(s.value):
                values[target] = s.value
                break
    return ServerMetrics(**values) if values else None


# --------------------------------------------------------------------------- JSON


def _loads(text: str | bytes, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ParseError(f"{what} is not valid JSON: {exc}") from exc


def _as_int(value: object, path: str) -> int:
    """An integer from a JSON number or a decimal string (protobuf JSON prints 64-bit
    integers as strings; Triton's own JSON writer prints numbers)."""
    if isinstance(value, bool):
        pass  # bool is an int subclass, but never a count
    elif isinstance(value, int):
        return value
    elif isinstance(value, float) and value.is_integer():
        return int(value)
    elif isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ParseError(f"{path}: expected an integer, got {_short_repr(value)}")


def _as_dict(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ParseError(f"{path}: expected an object, got {_short_repr(value)}")
    return value


def _as_list(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise ParseError(f"{path}: expected an array, got {_short_repr(value)}")
    return value


def _as_str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise ParseError(f"{path}: expected a string, got {_short_repr(value)}")
    return value


def _as_bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise ParseError(f"{path}: expected true or false, got {_short_repr(value)}")
    return value


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _duration(doc: Mapping[str, Any], key: str, path: str) -> Duration:
    if key not in doc:
        return Duration()
    d = _as_dict(doc[key], f"{path}.{key}")
    return Duration(
        count=_as_int(d.get("count", 0), f"{path}.{key}.count"),
        ns=_as_int(d.get("ns", 0), f"{path}.{key}.ns"),
    )


def parse_model_stats(text: str | bytes) -> tuple[ModelStats, ...]:
    """Parse a ``GET /v2/models[/NAME]/stats`` body. Raises ``ParseError``."""
    return map_model_stats(_loads(text, "model statistics"))


def map_model_stats(doc: object) -> tuple[ModelStats, ...]:
    """Map a decoded statistics document to records, in document order.

    Counts and nanoseconds may be JSON numbers or decimal strings; a missing
    ``duration_stat`` is zero. ``response_stats`` and ``memory_usage`` are not kept.
    """
    top = _as_dict(doc, "statistics")
    entries = _as_list(top.get("model_stats", []), "model_stats")
    out: list[ModelStats] = []
    for i, raw in enumerate(entries):
        path = f"model_stats[{i}]"
        entry = _as_dict(raw, path)
        if "name" not in entry:
            raise ParseError(f"{path}: no model name")
        infer = _as_dict(entry.get("inference_stats", {}), f"{path}.inference_stats")
        ipath = f"{path}.inference_stats"
        batches: list[BatchStat] = []
        for j, b_raw in enumerate(_as_list(entry.get("batch_stats", []), f"{path}.batch_stats")):
            bpath = f"{path}.batch_stats[{j}]"
            b = _as_dict(b_raw, bpath)
            batches.append(
                BatchStat(
                    batch_size=_as_int(b.get("batch_size"), f"{bpath}.batch_size"),
                    compute_input=_duration(b, "compute_input", bpath),
                    compute_infer=_duration(b, "compute_infer", bpath),
                    compute_output=_duration(b, "compute_output", bpath),
                )
            )
        out.append(
            ModelStats(
                model=_as_str(entry["name"], f"{path}.name"),
                version=_as_str(entry.get("version", ""), f"{path}.version"),
                last_inference_ms=_as_int(entry.get("last_inference", 0), f"{path}.last_inference"),
                inference_count=_as_int(entry.get("inference_count", 0), f"{path}.inference_count"),
                execution_count=_as_int(entry.get("execution_count", 0), f"{path}.execution_count"),
                success=_duration(infer, "success", ipath),
                fail=_duration(infer, "fail", ipath),
                queue=_duration(infer, "queue", ipath),
                compute_input=_duration(infer, "compute_input", ipath),
                compute_infer=_duration(infer, "compute_infer", ipath),
                compute_output=_duration(infer, "compute_output", ipath),
                cache_hit=_duration(infer, "cache_hit", ipath),
                cache_miss=_duration(infer, "cache_miss", ipath),
                batch_stats=tuple(sorted(batches, key=lambda b: b.batch_size)),
            )
        )
    return tuple(out)


def parse_model_config(text: str, model: str | None = None) -> ModelConfig:
    """Parse a ``GET /v2/models/NAME/config`` body; ``raw_json`` keeps ``text`` as is.

    ``model`` names the model when the document lacks ``name``. Raises ``ParseError``.
    """
    return map_model_config(_loads(text, "model config"), raw_json=text, model=model)


def map_model_config(doc: object, *, raw_json: str, model: str | None = None) -> ModelConfig:
    """Map a decoded model config (protobuf JSON, snake_case keys) to a record.

    ``instance_count`` is the number of instances Triton runs: the sum of each group's
    ``count`` (default 1), times the number of listed GPUs for a KIND_GPU group (its
    count applies per GPU). An empty ``instance_group`` list gives 0 (an ensemble runs
    no instances of its own); a missing one keeps the record's default.
    """
    cfg = _as_dict(doc, "config")
    name = cfg.get("name") or model
    if not name:
        raise ParseError("config: no model name")
    values: dict[str, Any] = {
        "model": _as_str(name, "config.name"),
        "max_batch_size": _as_int(cfg.get("max_batch_size", 0), "config.max_batch_size"),
        "backend": _as_str(cfg.get("backend", ""), "config.backend") or None,
        "platform": _as_str(cfg.get("platform", ""), "config.platform") or None,
        "raw_json": raw_json,
    }
    if "dynamic_batching" in cfg:
        values.update(
            _dynamic_batching(_as_dict(cfg["dynamic_batching"], "config.dynamic_batching"))
        )
    if "instance_group" in cfg:
        groups = _as_list(cfg["instance_group"], "config.instance_group")
        count = 0
        for i, g_raw in enumerate(groups):
            gpath = f"config.instance_group[{i}]"
            g = _as_dict(g_raw, gpath)
            kind = _as_str(g.get("kind", "KIND_AUTO"), f"{gpath}.kind")
            per_device = _as_int(g.get("count", 1), f"{gpath}.count")
            gpus = _as_list(g.get("gpus", []), f"{gpath}.gpus")
            count += per_device * len(gpus) if kind == "KIND_GPU" and gpus else per_device
            if i == 0:
                values["instance_kind"] = kind
        values["instance_count"] = count
    return ModelConfig(**values)


def _dynamic_batching(db: Mapping[str, Any]) -> dict[str, Any]:
    path = "config.dynamic_batching"
    out: dict[str, Any] = {
        "dynamic_batching": True,
        "preferred_batch_sizes": tuple(
            _as_int(v, f"{path}.preferred_batch_size[{i}]")
            for i, v in enumerate(_as_list(db.get("preferred_batch_size", []), path))
        ),
        "max_queue_delay_us": _as_int(
            db.get("max_queue_delay_microseconds", 0), f"{path}.max_queue_delay_microseconds"
        ),
        "priority_levels": _as_int(db.get("priority_levels", 0), f"{path}.priority_levels"),
    }
    if "default_queue_policy" in db:
        ppath = f"{path}.default_queue_policy"
        p = _as_dict(db["default_queue_policy"], ppath)
        out["default_queue_policy"] = QueuePolicy(
            timeout_action=_as_str(p.get("timeout_action", "REJECT"), f"{ppath}.timeout_action"),
            default_timeout_us=_as_int(
                p.get("default_timeout_microseconds", 0), f"{ppath}.default_timeout_microseconds"
            ),
            allow_timeout_override=_as_bool(
                p.get("allow_timeout_override", False), f"{ppath}.allow_timeout_override"
            ),
            max_queue_size=_as_int(p.get("max_queue_size", 0), f"{ppath}.max_queue_size"),
        )
    return out


def parse_server_version(text: str | bytes) -> str | None:
    """The ``version`` of a ``GET /v2`` server-metadata body, or None if it has none."""
    doc = _as_dict(_loads(text, "server metadata"), "server metadata")
    version = doc.get("version")
    return None if version is None else _as_str(version, "server metadata.version")


# --------------------------------------------------------------------------- source


class TritonSource:
    """Reads one Triton target per ``collect()`` into one ``TritonSnapshot``.

    Model configs change only when a model is (re)loaded, so they are cached per model
    and fetched again after ``config_refresh_s``, when a counter of the model went down
    or its set of versions changed (both mean a reload), and after a failed fetch. A
    config that fails to fetch or parse is reported in ``partial_errors`` under
    ``"config:NAME"``; the rest of the snapshot stands. A failure of the server
    metadata, metrics or statistics request fails the whole collection.

    ``session`` is owned by the source from then on: ``close()`` closes it.
    ``clock`` (Unix seconds) stamps ``collected_at`` and times the config cache.
    """

    name = "triton"

    def __init__(
        self,
        target: TargetSettings,
        *,
        timeout_s: float = 3.0,
        max_response_bytes: int = 16 * _MIB,
        session: requests.Session | None = None,
        clock: Callable[[], float] = time.time,
        config_refresh_s: float = 30.0,
    ) -> None:
        self.target = target.name
        self._settings = target
        self._base_url = target.url.rstrip("/")
        self._timeout_s = timeout_s
        self._max_response_bytes = max_response_bytes
        self._clock = clock
        self._config_refresh_s = config_refresh_s
        if session is None:
            session = requests.Session()
            # A scrape goes exactly where the settings say: no proxies or netrc from
            # the environment. Pass a session of your own to get them.
            session.trust_env = False
        self._session = session
        self._configs: dict[str, tuple[ModelConfig, float]] = {}
        self._last_stats: dict[str, tuple[ModelStats, ...]] = {}

    # ------------------------------------------------------------------ protocol

    def collect(self) -> list[TritonSnapshot]:
        collected_at = self._clock()
        version_url = f"{self._base_url}/v2"
        server_version = self._parsed(version_url, "server metadata", parse_server_version)
        metrics_url = self._settings.metrics_url
        metrics = self._parsed(metrics_url, "metrics", lambda b: parse_metrics(_utf8(b)))
        stats_url = f"{self._base_url}/v2/models/stats"
        stats = self._parsed(stats_url, "model statistics", parse_model_stats)

        configs, partial_errors = self._model_configs(stats)
        return [
            TritonSnapshot(
                target=self.target,
                collected_at=collected_at,
                server_version=server_version,
                model_metrics=metrics.models,
                model_stats=stats,
                model_configs=configs,
                gpus=metrics.gpus,
                server=metrics.server,
                partial_errors=partial_errors,
            )
        ]

    def close(self) -> None:
        self._session.close()

    # ------------------------------------------------------------------ configs

    def _model_configs(
        self, stats: Sequence[ModelStats]
    ) -> tuple[tuple[ModelConfig, ...], dict[str, str]]:
        by_model: dict[str, list[ModelStats]] = {}
        for s in stats:
            by_model.setdefault(s.model, []).append(s)
        now = self._clock()
        configs: list[ModelConfig] = []
        errors: dict[str, str] = {}
        for model in sorted(by_model):
            current = tuple(by_model[model])
            cached = self._configs.get(model)
            if (
                cached is None
                or now - cached[1] >= self._config_refresh_s
                or _reloaded(self._last_stats.get(model), current)
            ):
                self._configs.pop(model, None)
                url = f"{self._base_url}/v2/models/{quote(model, safe='')}/config"
                try:
                    config = self._parsed(
                        url, "model config", lambda b, m=model: parse_model_config(_utf8(b), m)
                    )
                except CollectError as exc:
                    # Left out of the cache, so the next collection tries again.
                    errors[f"config:{model}"] = str(exc)
                    continue
                cached = (config, now)
                self._configs[model] = cached
            configs.append(cached[0])
        # Models that left the statistics were unloaded: forget them.
        for gone in set(self._configs) - set(by_model):
            del self._configs[gone]
        self._last_stats = {m: tuple(v) for m, v in by_model.items()}
        return tuple(configs), errors

    # ------------------------------------------------------------------ HTTP

    def _parsed(self, url: str, what: str, parse: Callable[[bytes], _T]) -> _T:
        """GET ``url`` and parse its body; a ``ParseError`` gains the URL and target."""
        body = self._get(url)
        try:
            return parse(body)
        except ParseError as exc:
            raise ParseError(f"unparseable {what}: GET {url} ({self._who()}): {exc}") from exc

    def _who(self) -> str:
        return f"target {self.target!r}"

    def _get(self, url: str) -> bytes:
        """GET ``url`` and return its body, or raise the ``CollectError`` that says why not.

        The connect timeout and the read timeout (the longest wait for any one read)
        are both ``timeout_s``; on top of them the body must be complete within
        ``timeout_s`` of the request's start, so a server that drips bytes cannot hold
        a collection for long. The wait for the response *headers* is bounded by the
        read timeout per read only (requests offers no hook before the headers).
        """
        deadline = time.monotonic() + self._timeout_s
        where = f"GET {url} ({self._who()})"
        try:
            response = self._session.get(
                url,
                timeout=(self._timeout_s, self._timeout_s),
                stream=True,
                # Uncompressed, so the byte cap is a cap on what we hold in memory.
                headers={"Accept-Encoding": "identity"},
            )
        except requests.exceptions.Timeout as exc:  # ConnectTimeout and ReadTimeout
            raise TargetTimeout(f"timed out after {self._timeout_s:g} s: {where}") from exc
        except requests.exceptions.ConnectionError as exc:
            raise TargetDown(f"connection failed: {where}: {_reason(exc)}") from exc
        except requests.exceptions.RequestException as exc:
            raise CollectError(f"request failed: {where}: {_reason(exc)}") from exc

        with response:
            try:
                if not 200 <= response.status_code < 300:
                    excerpt = self._error_excerpt(response, deadline, where)
                    raise TargetHTTPError(
                        f"HTTP {response.status_code} {response.reason or ''}".rstrip()
                        + f": {where}"
                        + (f": {excerpt}" if excerpt else ""),
                        status=response.status_code,
                    )
                declared = _content_length(response)
                if declared is not None and declared > self._max_response_bytes:
                    raise ResponseTooLarge(
                        f"response of {declared} bytes exceeds the cap of "
                        f"{self._max_response_bytes} bytes: {where}"
                    )
                body = self._read(response, deadline, self._max_response_bytes, where)
                if len(body) > self._max_response_bytes:
                    raise ResponseTooLarge(
                        f"response exceeds the cap of {self._max_response_bytes} bytes: {where}"
                    )
            except (urllib3.exceptions.ReadTimeoutError, requests.exceptions.Timeout) as exc:
                raise TargetTimeout(f"timed out after {self._timeout_s:g} s: {where}") from exc
            except (
                urllib3.exceptions.DecodeError,
                requests.exceptions.ContentDecodingError,
            ) as exc:
                raise ParseError(f"undecodable response body: {where}: {_reason(exc)}") from exc
            except (
                urllib3.exceptions.HTTPError,
                requests.exceptions.RequestException,
                OSError,
            ) as exc:
                # A reset, or a close before the declared length: the server went away.
                raise TargetDown(
                    f"connection broken while reading: {where}: {_reason(exc)}"
                ) from exc
            # The whole body was read: hand the connection back to the pool for reuse
            # (closing the response would otherwise close it).
            release = getattr(response.raw, "release_conn", None)
            if release is not None:
                release()
            return body

    def _error_excerpt(self, response: requests.Response, deadline: float, where: str) -> str:
        """The start of an error body, best effort: a status is reason enough to fail,
        and an unreadable error page must not turn it into a different error."""
        try:
            return _excerpt(self._read(response, deadline, _ERROR_EXCERPT_BYTES, where))
        except (
            CollectError,
            urllib3.exceptions.HTTPError,
            requests.exceptions.RequestException,
            OSError,
        ):
            return ""

    def _read(self, response: requests.Response, deadline: float, limit: int, where: str) -> bytes:
        """Read the body until its end or until more than ``limit`` bytes are in hand
        (then at most one chunk more than ``limit`` is returned: the caller decides
        whether that is an error or an excerpt). Raises ``TargetTimeout`` past
        ``deadline``."""
        chunks: list[bytes] = []
        total = 0
        # closing(): leaving early must still run _chunks' cleanup (socket timeout) now.
        with contextlib.closing(self._chunks(response, deadline, where)) as stream:
            for chunk in stream:
                chunks.append(chunk)
                total += len(chunk)
                if total > limit:
                    break
                if time.monotonic() >= deadline:
                    raise TargetTimeout(
                        f"response not complete within {self._timeout_s:g} s: {where}"
                    )
        return b"".join(chunks)

    def _chunks(
        self, response: requests.Response, deadline: float, where: str
    ) -> Generator[bytes, None, None]:
        raw = response.raw
        read1 = getattr(raw, "read1", None)
        if read1 is None:
            # Not a urllib3 >= 2 response (an older urllib3, a test adapter): chunk by
            # chunk, with the deadline checked between chunks only.
            yield from response.iter_content(_READ_CHUNK)
            return
        sock = _socket_of(raw)
        saved = sock.gettimeout() if sock is not None else None
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TargetTimeout(
                        f"response not complete within {self._timeout_s:g} s: {where}"
                    )
                if sock is not None:
                    # read1 makes at most one recv, so clipping the socket timeout to
                    # what is left of the deadline bounds the whole read by it.
                    sock.settimeout(min(self._timeout_s, remaining))
                chunk = read1(_READ_CHUNK, decode_content=True)
                if not chunk:
                    return
                yield chunk
        finally:
            if sock is not None:
                with contextlib.suppress(OSError):  # closed already: nothing to restore
                    sock.settimeout(saved)


def _reloaded(previous: Sequence[ModelStats] | None, current: Sequence[ModelStats]) -> bool:
    """True when ``current`` cannot follow ``previous`` without a model reload: the set
    of versions changed, or a cumulative counter of some version went down."""
    if previous is None:
        return False
    before = {s.version: s for s in previous}
    after = {s.version: s for s in current}
    if before.keys() != after.keys():
        return True
    for version, now in after.items():
        then = before[version]
        if (
            now.execution_count < then.execution_count
            or now.inference_count < then.inference_count
            or now.success.count < then.success.count
        ):
            return True
    return False


def _excerpt(body: bytes) -> str:
    """The start of an error body on one line, for a message."""
    text = " ".join(body.decode("utf-8", errors="replace").split())
    return text[:_ERROR_EXCERPT_CHARS]


def _utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"not UTF-8 text: {exc}") from exc


def _content_length(response: requests.Response) -> int | None:
    value = response.headers.get("Content-Length")
    if value is None or response.headers.get("Content-Encoding", "identity") != "identity":
        return None  # an encoded length says nothing about the decoded size
    try:
        return int(value)
    except ValueError:
        return None


def _socket_of(raw: object) -> socket.socket | None:
    # urllib3 2.x keeps the connection on the response while it is being read.
    connection = getattr(raw, "connection", None)
    sock = getattr(connection, "sock", None)
    return sock if isinstance(sock, socket.socket) else None


def _reason(exc: BaseException) -> str:
    """The innermost cause of a requests/urllib3 error, in one short line: their own
    messages repeat the pool and the URL, which the caller already names."""
    inner: BaseException = exc
    for _ in range(8):  # bounded: a cause chain could, in principle, loop
        # urllib3 keeps the cause in .reason (MaxRetryError) or among the args
        # (requests' ConnectionError(MaxRetryError), ProtocolError(text, cause)).
        causes = [getattr(inner, "reason", None), *reversed(inner.args)]
        nxt = next((c for c in causes if isinstance(c, BaseException) and c is not inner), None)
        if nxt is None:
            break
        inner = nxt
    text = " ".join(str(inner).split()) or type(inner).__name__
    return text[:_ERROR_EXCERPT_CHARS]


register_source(SourceSpec("triton", lambda settings, target: TritonSource(target, timeout_s=settings.timeout_s, max_response_bytes=settings.max_response_bytes), per_target=True))  # noqa: E501  # fmt: skip
