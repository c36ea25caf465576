"""The metric names the dashboards query, and what a query needs to have data.

batchscope's own names come from the exporter's contract (``collector.exporter.families``)
so a rename there breaks generation here. Triton's names are listed once below; the tests
check each against Triton's recorded expositions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from collector.exporter.families import FAMILIES, Family, family

__all__ = [
    "TRITON_METRICS",
    "TRITON_SUMMARIES",
    "Need",
    "TritonMetric",
    "exporter",
    "metric_names",
    "needs_of",
    "triton",
]


class Need(StrEnum):
    """What a query needs, beyond a running Triton and exporter, to return data."""

    GPU = "an NVIDIA GPU"
    MIG = "a GPU in MIG mode"
    SUMMARIES = "Triton's latency summaries on (--metrics-config summary_latencies=true)"
    ACTIVE_FINDING = "an active finding"
    RECOMMENDATION = "a recommendation from batchscope"
    PREFERRED_SIZES = "a model with preferred_batch_size set"
    DYNAMIC_BATCHING = "a model with dynamic batching on"


@dataclass(frozen=True)
class TritonMetric:
    """One of Triton's metric families. ``name`` is the family name; a summary's samples
    are ``name`` (with ``quantile``), ``name_sum`` and ``name_count``."""

    name: str
    kind: Literal["counter", "gauge", "summary"]
    needs: frozenset[Need] = frozenset()


_GPU = frozenset({Need.GPU})
_SUMMARY = frozenset({Need.SUMMARIES})

TRITON_METRICS: tuple[TritonMetric, ...] = (
    TritonMetric("nv_inference_request_success", "counter"),
    TritonMetric("nv_inference_request_failure", "counter"),
    TritonMetric("nv_inference_count", "counter"),
    TritonMetric("nv_inference_exec_count", "counter"),
    TritonMetric("nv_inference_request_duration_us", "counter"),
    TritonMetric("nv_inference_queue_duration_us", "counter"),
    TritonMetric("nv_inference_compute_input_duration_us", "counter"),
    TritonMetric("nv_inference_compute_infer_duration_us", "counter"),
    TritonMetric("nv_inference_compute_output_duration_us", "counter"),
    TritonMetric("nv_inference_pending_request_count", "gauge"),
    TritonMetric("nv_cpu_utilization", "gauge"),
    TritonMetric("nv_gpu_utilization", "gauge", _GPU),
    TritonMetric("nv_gpu_memory_used_bytes", "gauge", _GPU),
    TritonMetric("nv_gpu_memory_total_bytes", "gauge", _GPU),
    # Off by default; experimental in Triton (--metrics-config summary_latencies=true).
    TritonMetric("nv_inference_request_summary_us", "summary", _SUMMARY),
    TritonMetric("nv_inference_queue_summary_us", "summary", _SUMMARY),
    TritonMetric("nv_inference_compute_input_summary_us", "summary", _SUMMARY),
    TritonMetric("nv_inference_compute_infer_summary_us", "summary", _SUMMARY),
    TritonMetric("nv_inference_compute_output_summary_us", "summary", _SUMMARY),
)
TRITON_SUMMARIES: tuple[str, ...] = tuple(m.name for m in TRITON_METRICS if m.kind == "summary")

_TRITON_BY_NAME = {m.name: m for m in TRITON_METRICS}

# Exporter families that exist only under a condition the exporter cannot create itself.
_FAMILY_NEEDS: dict[str, Need] = {
    "batchscope_finding": Need.ACTIVE_FINDING,
    "batchscope_recommendation_info": Need.RECOMMENDATION,
    "batchscope_recommendation_current_requests_per_second": Need.RECOMMENDATION,
    "batchscope_recommendation_predicted_requests_per_second": Need.RECOMMENDATION,
    "batchscope_recommendation_current_p95_seconds": Need.RECOMMENDATION,
    "batchscope_recommendation_predicted_p95_seconds": Need.RECOMMENDATION,
    "batchscope_recommendation_confidence_ratio": Need.RECOMMENDATION,
    "batchscope_model_preferred_batch_size": Need.PREFERRED_SIZES,
    "batchscope_model_max_queue_delay_seconds": Need.DYNAMIC_BATCHING,
}


def triton(name: str) -> str:
    """Triton's metric ``name``, checked against the list above (KeyError if unknown)."""
    return _TRITON_BY_NAME[name].name


def exporter(name: str) -> str:
    """The exporter's metric ``name``, through its contract (KeyError if unknown)."""
    return family(name).name


def _family_needs(fam: Family) -> frozenset[Need]:
    needs = {Need.GPU} if fam.needs_gpu else set()
    if fam.name in _FAMILY_NEEDS:
        needs.add(_FAMILY_NEEDS[fam.name])
    return frozenset(needs)


def _base_name(sample_name: str) -> str:
    for suffix in ("_sum", "_count", "_bucket"):
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in _TRITON_BY_NAME:
            return sample_name[: -len(suffix)]
    return sample_name


def needs_of(expr: str) -> frozenset[Need]:
    """What the PromQL ``expr`` needs to return data, from the metrics it names."""
    families = {f.name: f for f in FAMILIES}
    needs: set[Need] = set()
    for name in metric_names(expr):
        base = _base_name(name)
        if base in _TRITON_BY_NAME:
            needs |= _TRITON_BY_NAME[base].needs
        elif base in families:
            needs |= _family_needs(families[base])
    return frozenset(needs)


# ------------------------------------------------------------------ PromQL scanning
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_BRACES = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
# by (...), without (...), on (...), ignoring (...), group_left (...), group_right (...)
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan", "Inf", "NaN"}
)


def metric_names(expr: str) -> frozenset[str]:
    """The metric names a PromQL expression selects (functions, keywords, label names
    and values, and ranges left out). A scanner, not a parser: promtool parses."""
    text = _STRING.sub('""', expr)
    text = _BRACES.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        word, call = match.group(1), match.group(2)
        if call or word in _KEYWORDS:
            continue
        names.add(word)
    return frozenset(names)
