"""The ``prometheus`` source (fleet mode): every Triton an existing Prometheus scrapes,
read from its HTTP API instead of scraping each server.

One source per Prometheus (``prometheus_url``); each ``collect()`` makes **one** instant
query (``GET /api/v1/query``) that returns, for every scraped target:

* the families batchscope reads from Triton (``nv_inference_*``, ``nv_cache_*``,
  ``nv_model_load_duration_secs``, ``nv_gpu_*``, ``nv_energy_consumption``,
  ``nv_cpu_*``, ``nv_pinned_*``), DCGM exporter's ``DCGM_FI_PROF_SM_ACTIVE`` and
  ``DCGM_FI_DEV_GPU_UTIL`` and batchscope exporter's ``batchscope_model_*``;
* ``up`` and ``scrape_duration_seconds``, and -- marked with the label
  ``batchscope_at`` -- the *timestamp* of each target's latest scrape
  (``timestamp(up)``, or ``timestamp(nv_inference_count)`` for series that reached
  Prometheus without a scrape of its own, through federation or remote write).

An instant query answers each series with its newest sample but stamps it with the
evaluation time; the rates must be taken over the time between two *scrapes*, so every
snapshot is stamped with its target's scrape timestamp instead. One query is one
consistent view: Prometheus's isolation shows a query all of a scrape or none of it.

Mapping, per ``(job, instance)`` that exports ``nv_inference_count`` (a Triton):

* one ``TritonSnapshot`` whose ``target`` is the ``instance`` label (``host:port`` of
  the metrics endpoint, e.g. ``10.0.0.5:8002``), or the name of a configured target
  whose ``metrics_url`` has that ``host:port`` (so fleet mode and direct scraping store
  a server under one name); when two jobs scrape one instance, ``job/instance``. The
  series go through the same ``map_metrics`` as a scraped page. A snapshot is returned
  only when the target was scraped again since the last one (a new timestamp);
* one ``ScrapeHealth`` from its ``up`` series: up when Prometheus's latest scrape of it
  succeeded. A Triton whose scrapes fail loses its ``nv_*`` series, so it is known by
  having exported them once since the collector started;
* neither the statistics API nor the config API is read: no ``model_configs`` (so
  no recommendation, which needs the effective config to change) and ``batch_stats``
  only where a batchscope exporter watches the server and Prometheus scrapes it:
  its ``batchscope_model_executions_total`` and ``..._compute_seconds_total`` give
  them, matched by its ``target`` label (see ``_exporter_target``). The exporter's
  config families are not used: a config made of them is not the whole effective
  config, and one sent back to Triton would lose the rest;
* DCGM readings are added to the GPU that Triton names by ``gpu_uuid`` (the DCGM
  ``UUID`` label): ``sm_active_pct`` and, where Triton has none, ``utilization_gpu_pct``.

The series chosen can be narrowed by label matchers in the query string of
``prometheus_url``: ``http://prom:9090?job=triton`` selects ``{job="triton"}``,
``?namespace=~prod-.*`` a regular expression. Instances that the ``triton`` source
scrapes directly (configured targets, when it runs too) are left to it (the two
together take no ``file_sd`` targets: a ``ConfigError`` at start), and with
``--shard i/n`` a collector keeps the Tritons whose name hashes to its shard.

A Prometheus that is down, slow, too large an answer, or that answers an error or
something that is not a query result fails the collection with a ``CollectError``; a
target that lacks a family still gives the rest, and the missing core families are
named in the snapshot's ``partial_errors``.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import requests

from collector.analysis.health import FLEET_SOURCE
from collector.discovery import DISCOVERY_SETTINGS, in_shard
from collector.errors import CollectError, ConfigError, ParseError, TargetHTTPError
from collector.records import (
    BatchStat,
    DeviceSample,
    Duration,
    ModelStats,
    ScrapeHealth,
    TritonSnapshot,
)
from collector.sources.base import SourceSpec, register_source
from collector.sources.exposition import ExpositionSample, MetricFamily
from collector.sources.http_fetch import MIB, HttpFetcher
from collector.sources.triton_metrics import map_metrics

__all__ = [
    "ApiSample",
    "PrometheusSource",
    "fleet_query",
    "parse_query_response",
    "selector_from_url",
]

log = logging.getLogger("batchscope.collector.prometheus")

NAME = FLEET_SOURCE
#: The label that marks a scrape-timestamp series in the answer.
AT_LABEL = "batchscope_at"
_TRITON_FAMILIES = (
    "nv_inference_.*|nv_cache_.*|nv_model_load_duration_secs|nv_gpu_.*|nv_energy_consumption"
    "|nv_cpu_.*|nv_pinned_memory_.*"
)
_DCGM_SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
_DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
_EXECUTIONS = "batchscope_model_executions_total"
_COMPUTE_S = "batchscope_model_execution_compute_seconds_total"
_NAMES = (
    f"{_TRITON_FAMILIES}|{_DCGM_SM_ACTIVE}|{_DCGM_GPU_UTIL}|batchscope_model_.*"
    "|up|scrape_duration_seconds"
)
#: The family whose presence makes a (job, instance) a Triton.
TRITON_MARK = "nv_inference_count"
# Families every Triton exports for every model; one missing is worth a word.
_CORE = (
    "nv_inference_request_success",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
)
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_GroupKey = tuple[str, str]  # (job, instance)


# --------------------------------------------------------------------------- the query


def selector_from_url(url: str) -> tuple[str, str]:
    """``(base_url, matchers)``: the query string of ``prometheus_url`` as PromQL label
    matchers (``job=triton`` -> ``job="triton"``, ``job=~t.*`` -> ``job=~"t.*"``), and
    the URL without it. Raises ``ConfigError`` for a name that is not a label name."""
    parts = urlsplit(url)
    matchers = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if not _LABEL_NAME.fullmatch(name) or name == "__name__":
            raise ConfigError(
                "prometheus_url", f"{name!r} in its query string is not a label to select on"
            )
        op, value = ("=~", value[1:]) if value.startswith("~") else ("=", value)
        matchers.append(f"{name}{op}{json.dumps(value)}")
    base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    return base, ",".join(matchers)


def fleet_query(matchers: str = "") -> str:
    """The one PromQL query of a collection (see the module's docstring)."""
    extra = f",{matchers}" if matchers else ""
    sel = f"{{{matchers}}}" if matchers else ""
    return (
        f'{{__name__=~"{_NAMES}"{extra}}}'
        f' or label_replace(timestamp(up{sel}), "{AT_LABEL}", "up", "", "")'
        f" or label_replace(max by (job, instance) (timestamp({TRITON_MARK}{sel})),"
        f' "{AT_LABEL}", "series", "", "")'
    )


@dataclass(frozen=True)
class ApiSample:
    """One element of an instant query's answer: its name (``""`` for none), its labels
    (``__name__`` left out) and its value."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse_query_response(body: bytes) -> tuple[list[ApiSample], list[str]]:
    """The samples of an instant-vector answer and its warnings. Raises ``ParseError``
    for anything that is not one, and ``CollectError`` for an error answer."""
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ParseError(f"not JSON: {exc}") from exc
    if not isinstance(answer, dict):
        raise ParseError(f"not a Prometheus API answer: {_short(answer)}")
    if answer.get("status") != "success":
        raise CollectError(
            f"Prometheus answered {answer.get('status')!r}: "
            f"{answer.get('errorType', '?')}: {answer.get('error', _short(answer))}"
        )
    data = answer.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise ParseError(f"not an instant vector: {_short(data)}")
    result = data.get("result")
    if not isinstance(result, list):
        raise ParseError(f"no result list: {_short(data)}")
    samples = [_api_sample(element) for element in result]
    warnings = answer.get("warnings") or []
    return samples, [str(w) for w in warnings] if isinstance(warnings, list) else [str(warnings)]


def _api_sample(element: object) -> ApiSample:
    try:
        assert isinstance(element, dict)
        metric = element["metric"]
        _at, text = element["value"]
        assert isinstance(metric, dict) and isinstance(text, str)
        labels = {str(k): str(v) for k, v in metric.items()}
        return ApiSample(labels.pop("__name__", ""), labels, float(text))
    except (AssertionError, KeyError, TypeError, ValueError) as exc:
        raise ParseError(f"malformed sample {_short(element)}") from exc


def _short(value: object) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= 200 else text[:200] + "..."


# --------------------------------------------------------------------------- grouping


@dataclass
class _Group:
    """What the answer holds of one scraped (job, instance)."""

    series: list[ApiSample] = field(default_factory=list)
    scraped_at: float | None = None  # timestamp(up)
    counted_at: float | None = None  # timestamp(nv_inference_count)
    up: float | None = None
    duration_s: float | None = None

    @property
    def at(self) -> float | None:
        return self.scraped_at if self.scraped_at is not None else self.counted_at

    @property
    def is_triton(self) -> bool:
        return any(s.name == TRITON_MARK for s in self.series)


def group_samples(samples: Iterable[ApiSample]) -> dict[_GroupKey, _Group]:
    """The answer's samples by (job, instance), those two labels taken off."""
    groups: dict[_GroupKey, _Group] = {}
    for s in samples:
        labels = dict(s.labels)
        key = (labels.pop("job", ""), labels.pop("instance", ""))
        group = groups.setdefault(key, _Group())
        marker = labels.pop(AT_LABEL, None)
        if not s.name and marker == "up":
            group.scraped_at = s.value
        elif not s.name and marker == "series":
            group.counted_at = s.value
        elif s.name == "up":
            group.up = s.value
        elif s.name == "scrape_duration_seconds":
            group.duration_s = s.value
        elif s.name:
            group.series.append(ApiSample(s.name, labels, s.value))
    return groups


def families_of(series: Iterable[ApiSample]) -> dict[str, MetricFamily]:
    """Series as the exposition parser's families, for ``map_metrics``: a series with a
    ``quantile`` label is a summary's, ``NAME_bucket`` with ``le`` a histogram's
    (``_sum``/``_count`` of either are left out; batchscope reads neither)."""
    kinds: dict[str, str] = {}
    samples: dict[str, list[ExpositionSample]] = {}
    for s in series:
        name, suffix, kind = s.name, "", "unknown"
        if "quantile" in s.labels:
            kind = "summary"
        elif name.endswith("_bucket") and "le" in s.labels:
            name, suffix, kind = name[: -len("_bucket")], "_bucket", "histogram"
        kinds.setdefault(name, kind)
        samples.setdefault(name, []).append(ExpositionSample(suffix, s.labels, s.value))
    summed = {n for n, k in kinds.items() if k != "unknown"}
    out: dict[str, MetricFamily] = {}
    for name, found in samples.items():
        base = name.removesuffix("_sum").removesuffix("_count")
        if base != name and base in summed:
            continue
        out[name] = MetricFamily(name, kinds[name], tuple(found))
    return out


# --------------------------------------------------------------------------- the source


class PrometheusSource:
    """Reads every Triton that one Prometheus scrapes; see the module's docstring.

    ``names`` maps an ``instance`` label to the target name it is stored under (default:
    the label itself); ``skip`` holds instances left to another source; ``shard``
    ``(i, n)`` keeps the targets whose name hashes to shard i of n (``--shard``), so
    collectors sharing one store share the fleet without double work. ``interval_s``
    is the collector's interval (the least a target's ``ScrapeHealth`` says).
    ``session`` is owned by the source from then on.
    """

    name = NAME

    def __init__(
        self,
        url: str,
        *,
        target: str = NAME,
        timeout_s: float = 3.0,
        max_response_bytes: int = 64 * MIB,
        interval_s: float = 5.0,
        names: Mapping[str, str] | None = None,
        skip: Iterable[str] = (),
        shard: tuple[int, int] | None = None,
        session: requests.Session | None = None,
    ) -> None:
        self.target = target
        base, matchers = selector_from_url(url)
        # Messages name the endpoint, not the long encoded query (``fleet_query`` is it).
        self._endpoint = f"{base}/api/v1/query"
        self._url = f"{self._endpoint}?" + urlencode({"query": fleet_query(matchers)})
        self._who = f"Prometheus {base}"
        self._http = HttpFetcher(
            timeout_s=timeout_s, max_response_bytes=max_response_bytes, session=session
        )
        self._interval_s = interval_s
        self._names = dict(names or {})
        self._skip = frozenset(skip)
        self._shard = shard
        self._tritons: set[_GroupKey] = set()  # known as Tritons since the start
        self._last_at: dict[_GroupKey, float] = {}
        self._gap_s: dict[_GroupKey, float] = {}
        self._warned: set[str] = set()

    def collect(self) -> list[TritonSnapshot | ScrapeHealth]:
        where = f"GET {self._endpoint} (the fleet query)"
        try:
            body = self._http.get(self._url, "the fleet query")
        except CollectError as exc:
            short = str(exc).replace(f"GET {self._url}", f"GET {self._endpoint}")
            raise _reworded(exc, short) from exc
        try:
            samples, warnings = parse_query_response(body)
        except ParseError as exc:
            raise ParseError(f"unparseable answer: {where}: {exc}") from exc
        except CollectError as exc:
            raise CollectError(f"{exc}: {where}") from exc
        for warning in warnings:
            if warning not in self._warned:  # said once, not once per collection
                self._warned.add(warning)
                log.warning("%s: the query answered with a warning: %s", self._who, warning)
        groups = group_samples(samples)
        self._tritons.update(k for k, g in groups.items() if g.is_triton)
        # A target Prometheus no longer scrapes (its up went stale) is forgotten.
        for gone in self._tritons - groups.keys():
            self._tritons.discard(gone)
            self._last_at.pop(gone, None)
            self._gap_s.pop(gone, None)
        tritons = sorted(k for k in self._tritons if k in groups and k[1] not in self._skip)
        names = self._target_names(tritons)
        tritons = [k for k in tritons if in_shard(names[k], self._shard)]
        dcgm = _dcgm_by_uuid(groups)
        exporter = _exporter_series(groups)
        out: list[TritonSnapshot | ScrapeHealth] = []
        for key in tritons:
            group = groups[key]
            at = group.at
            if at is None or at <= self._last_at.get(key, -math.inf):
                continue  # not scraped again since the last collection
            previous = self._last_at.get(key)
            if previous is not None:
                self._gap_s[key] = at - previous
            self._last_at[key] = at
            name = names[key]
            if group.up is not None and group.scraped_at is not None:
                out.append(self._health(name, key, group))
            if group.is_triton:
                series = exporter.get(_exporter_target(name, key[1], exporter))
                out.append(_snapshot(name, at, group, dcgm, series or []))
        return out

    def close(self) -> None:
        self._http.close()

    def _target_names(self, keys: Sequence[_GroupKey]) -> dict[_GroupKey, str]:
        jobs_of = Counter(instance for _job, instance in keys)
        return {
            (job, instance): self._names.get(instance, instance)
            if jobs_of[instance] == 1
            else f"{job}/{instance}"
            for job, instance in keys
        }

    def _health(self, name: str, key: _GroupKey, group: _Group) -> ScrapeHealth:
        up = group.up == 1.0
        at = group.scraped_at if group.scraped_at is not None else 0.0
        return ScrapeHealth(
            target=name,
            source=NAME,
            scraped_at=at,
            up=up,
            duration_s=group.duration_s or 0.0,
            interval_s=max(self._interval_s, self._gap_s.get(key, 0.0)),
            error=None
            if up
            else f"{self._who} could not scrape {key[1]} (job {key[0]!r}): up is {group.up:g}",
        )

    @classmethod
    def from_settings(cls, settings: Any) -> PrometheusSource:
        """The source for ``settings`` (``collector.config.Settings``)."""
        if not settings.prometheus_url:
            raise ConfigError(
                "prometheus_url",
                "the prometheus source needs the URL of a Prometheus: --prometheus URL",
            )
        direct = "triton" in settings.sources
        for setting in DISCOVERY_SETTINGS if direct else ():
            if getattr(settings, setting):
                # Discovered targets come and go while this source runs: it could not
                # leave them to the triton source, and would store each under a second
                # name.
                flag = "--" + setting.replace("_", "-")
                raise ConfigError(
                    setting,
                    f"the prometheus source with the triton source cannot take {flag} "
                    "targets too: list the directly scraped targets with --triton or in "
                    "the config file, or leave the triton source out",
                )
        by_instance = {urlsplit(t.metrics_url).netloc: t.name for t in settings.targets}
        return cls(
            settings.prometheus_url,
            timeout_s=settings.timeout_s,
            max_response_bytes=settings.max_response_bytes,
            interval_s=settings.interval_s,
            names=by_instance,
            skip=by_instance if direct else (),
            shard=settings.shard_of,
        )


def _reworded(exc: CollectError, message: str) -> CollectError:
    """``exc`` again, of the same kind, with ``message``."""
    if isinstance(exc, TargetHTTPError):
        return TargetHTTPError(message, status=exc.status)
    return type(exc)(message)


def _snapshot(
    name: str,
    at: float,
    group: _Group,
    dcgm: Mapping[str, Mapping[str, float]],
    exporter: Sequence[ApiSample],
) -> TritonSnapshot:
    metrics = map_metrics(families_of(group.series))
    present = {s.name for s in group.series}
    partial = {
        f"family:{f}": "not in Prometheus for this target" for f in _CORE if f not in present
    }
    stats = _from_exporter(exporter, metrics.models)
    return TritonSnapshot(
        target=name,
        collected_at=at,
        model_metrics=metrics.models,
        model_stats=stats,
        gpus=tuple(_with_dcgm(g, dcgm.get(g.uuid, {})) for g in metrics.gpus),
        server=metrics.server,
        partial_errors=partial if metrics.models else {},
    )


# --------------------------------------------------------------------------- DCGM


def _dcgm_by_uuid(groups: Mapping[_GroupKey, _Group]) -> dict[str, dict[str, float]]:
    """DCGM's whole-GPU readings by GPU UUID (MIG instances' series left out)."""
    out: dict[str, dict[str, float]] = {}
    for group in groups.values():
        for s in group.series:
            if s.name not in (_DCGM_SM_ACTIVE, _DCGM_GPU_UTIL) or math.isnan(s.value):
                continue
            uuid = s.labels.get("UUID")
            if uuid and not s.labels.get("GPU_I_ID"):
                out.setdefault(uuid, {})[s.name] = s.value
    return out


def _with_dcgm(gpu: DeviceSample, readings: Mapping[str, float]) -> DeviceSample:
    sm_active = readings.get(_DCGM_SM_ACTIVE)
    util = readings.get(_DCGM_GPU_UTIL)
    return replace(
        gpu,
        sm_active_pct=gpu.sm_active_pct if sm_active is None else sm_active * 100.0,
        utilization_gpu_pct=gpu.utilization_gpu_pct
        if gpu.utilization_gpu_pct is not None
        else util,
    )


# --------------------------------------------------------------------------- the exporter


def _exporter_series(groups: Mapping[_GroupKey, _Group]) -> dict[str, list[ApiSample]]:
    """batchscope exporter's ``batchscope_model_*`` series by their ``target`` label."""
    out: dict[str, list[ApiSample]] = {}
    for group in groups.values():
        for s in group.series:
            if s.name.startswith("batchscope_model_") and "target" in s.labels:
                out.setdefault(s.labels["target"], []).append(s)
    return out


def _exporter_target(name: str, instance: str, exporter: Mapping[str, object]) -> str:
    """The exporter target that is this Triton: the one named like it, else the only
    one on the same host (an exporter names a server by its HTTP ``host:port``, which
    Prometheus's ``instance`` of the metrics port does not equal)."""
    if name in exporter:
        return name
    host = instance.rsplit(":", 1)[0]
    same_host = [t for t in exporter if t.rsplit(":", 1)[0] == host]
    return same_host[0] if len(same_host) == 1 else ""


def _from_exporter(series: Sequence[ApiSample], models: Sequence[Any]) -> tuple[ModelStats, ...]:
    """batch_stats from the exporter's families, as ``ModelStats`` beside the metrics'
    own counters (its compute seconds as infer time); empty without them."""
    by_size: dict[tuple[str, str], dict[int, list[float]]] = {}
    for s in series:
        if s.name not in (_EXECUTIONS, _COMPUTE_S) or math.isnan(s.value):
            continue
        try:
            size = int(s.labels.get("batch_size", ""))
        except ValueError:
            continue  # not a batch size: nothing to file it under
        key = (s.labels.get("model", ""), s.labels.get("version", ""))
        pair = by_size.setdefault(key, {}).setdefault(size, [0.0, 0.0])
        pair[0 if s.name == _EXECUTIONS else 1] += s.value
    stats = []
    for m in models:
        sizes = by_size.get((m.model, m.version))
        if sizes is None:
            continue
        batch_stats = tuple(
            BatchStat(b, compute_infer=Duration(int(n), int(seconds * 1e9)))
            for b, (n, seconds) in sorted(sizes.items())
        )
        stats.append(
            ModelStats(
                model=m.model,
                version=m.version,
                inference_count=int(m.inference_count),
                execution_count=int(m.exec_count),
                batch_stats=batch_stats,
            )
        )
    return tuple(stats)


register_source(SourceSpec(NAME, lambda settings, _target: PrometheusSource.from_settings(settings), per_target=False, default_enabled=False))  # noqa: E501  # fmt: skip
