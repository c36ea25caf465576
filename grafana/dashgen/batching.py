"""Dashboard 1, batching overview: is the dynamic batcher forming the batches it should,
and what does the queue cost each request?"""

from __future__ import annotations

from grafana.dashgen.metrics import exporter, triton
from grafana.dashgen.spec import (
    EXPORTER,
    EXPORTER_MODEL,
    TRITON_MODEL,
    Annotation,
    Dashboard,
    Panel,
    Query,
    Row,
    Viz,
    rate,
    selector,
    sum_rate,
)
from grafana.dashgen.variables import INSTANCE, MODEL, TARGET

__all__ = [
    "BATCHING_OVERVIEW",
    "FINDINGS",
    "average_batch_size",
    "batch_size_references",
    "compute_per_request",
    "qps",
    "queue_per_request",
]

_SUCCESS = triton("nv_inference_request_success")
_MODEL = TRITON_MODEL
_TAIL = 'quantile=~"0.95|0.99"'


def qps(by: str = "model") -> str:
    """Successful requests per second (one per request, whatever its batch size)."""
    return sum_rate(selector(_SUCCESS, _MODEL), by)


def average_batch_size(by: str = "model") -> str:
    """Inferences per execution: the two counters' rates summed first, then divided."""
    inferences = sum_rate(selector(triton("nv_inference_count"), _MODEL), by)
    executions = sum_rate(selector(triton("nv_inference_exec_count"), _MODEL), by)
    return f"{inferences} / {executions}"


def queue_per_request(by: str = "model") -> str:
    """Seconds queued per request: summed queue microseconds over summed requests."""
    queued = sum_rate(selector(triton("nv_inference_queue_duration_us"), _MODEL), by)
    return f"{queued} / {qps(by)} / 1e6"


def compute_per_request(by: str = "model") -> str:
    """Seconds of compute (input + infer + output) charged per request."""
    parts = " + ".join(
        rate(selector(triton(name), _MODEL))
        for name in (
            "nv_inference_compute_input_duration_us",
            "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_output_duration_us",
        )
    )
    return f"sum by ({by}) ({parts}) / {qps(by)} / 1e6"


def batch_size_references(legend_prefix: str = "{{model}} ") -> tuple[Query, ...]:
    """The configured preferred sizes and max_batch_size, drawn as reference lines.
    ``max`` folds the identical configs of replicas into one line."""
    preferred = selector(exporter("batchscope_model_preferred_batch_size"), EXPORTER_MODEL)
    largest = selector(exporter("batchscope_model_max_batch_size"), EXPORTER_MODEL)
    return (
        Query(
            f"max by (model, position) ({preferred})",
            f"{legend_prefix}preferred #{{{{position}}}}",
        ),
        Query(f"max by (model) ({largest})", f"{legend_prefix}max_batch_size"),
    )


REFERENCE_SERIES = "/preferred #|max_batch_size/"

FINDINGS = Annotation(
    name="batchscope findings",
    expr=f"{selector(exporter('batchscope_finding'), EXPORTER_MODEL)} == 1",
    title_format="{{kind}} ({{severity}})",
    text_format="target {{target}}, model {{model}}, device {{device}}",
    tag_keys="kind,severity,model",
    color="orange",
)

_PENDING = selector(triton("nv_inference_pending_request_count"), _MODEL)
_SCRAPE_DURATION = selector(exporter("batchscope_source_scrape_duration_seconds"), EXPORTER)
_EXECUTIONS = selector(exporter("batchscope_model_executions_total"), EXPORTER_MODEL)

_THROUGHPUT = Row(
    "Throughput and batching",
    (
        Panel(
            "Requests per second",
            "Successful inference requests per second, per model, across the selected "
            "Tritons: sum by (model) of rate(nv_inference_request_success). A request "
            "counts once whatever its batch size.",
            "reqps",
            (Query(qps(), "{{model}}"),),
        ),
        Panel(
            "Average batch size against the configured sizes",
            "Inferences per executed batch, per model: sum of rate(nv_inference_count) "
            "divided by sum of rate(nv_inference_exec_count) (summed first, then divided; "
            "never an average of per-series ratios). Dashed: the model's preferred batch "
            "sizes and max_batch_size, as batchscope's exporter reads them from the config.",
            "short",
            (Query(average_batch_size(), "{{model}} average"), *batch_size_references()),
            reference_series=REFERENCE_SERIES,
            min_value=0,
        ),
        Panel(
            "Batch-size distribution (share of executions)",
            "Share of executions at each executed batch size, over the selected models: "
            "rate of batchscope_model_executions_total by batch_size over the rate of all "
            "executions. From Triton's statistics API (batch_stats), which batchscope's "
            "exporter turns into counters; Triton's metrics have no batch-size histogram.",
            "percentunit",
            (
                Query(
                    f"sum by (batch_size) ({rate(_EXECUTIONS)}) / ignoring (batch_size) "
                    f"group_left sum ({rate(_EXECUTIONS)})",
                    "batch {{batch_size}}",
                ),
            ),
            stacked=True,
            min_value=0,
            max_value=1,
        ),
        Panel(
            "Pending requests",
            "Requests waiting in Triton's scheduler queues that no model instance has "
            "picked up yet, per model: sum by (model) of the gauge "
            "nv_inference_pending_request_count. A level that keeps growing means the "
            "instances cannot keep up.",
            "short",
            (
                Query(
                    f"sum by (model) ({_PENDING})",
                    "{{model}}",
                ),
            ),
            min_value=0,
        ),
    ),
)

_LATENCY = Row(
    "Latency",
    (
        Panel(
            "Queue and compute time per request",
            "Seconds per request, per model. Queue: sum of rate(nv_inference_queue_duration_us) "
            "over the sum of rate(nv_inference_request_success). Compute: the same for "
            "compute input + infer + output. Counters are summed first, then divided. In a "
            "dynamic batch Triton charges every request the whole batch's compute time.",
            "s",
            (
                Query(queue_per_request(), "{{model}} queue"),
                Query(compute_per_request(), "{{model}} compute"),
            ),
            min_value=0,
        ),
        Panel(
            "Latency p95 and p99 (Triton summaries)",
            "p95 and p99 of request and queue time, in seconds, from Triton's summaries "
            "(nv_inference_request_summary_us, nv_inference_queue_summary_us; quantile label). "
            "Quantiles are computed by Triton over its own sliding window and cannot be "
            "aggregated across servers, so this shows the worst server: max by (model, quantile).",
            "s",
            tuple(
                Query(
                    f"max by (model, quantile) ({selector(triton(name), _MODEL, _TAIL)}) / 1e6",
                    f"{{{{model}}}} {what} q{{{{quantile}}}}",
                )
                for name, what in (
                    ("nv_inference_request_summary_us", "request"),
                    ("nv_inference_queue_summary_us", "queue"),
                )
            ),
            min_value=0,
        ),
    ),
)

_HEALTH = Row(
    "Failures, findings and sources",
    (
        Panel(
            "Failed requests by reason",
            "Failed requests per second, per model and reason: sum by (model, reason) of "
            "rate(nv_inference_request_failure). REJECTED is the scheduler's queue policy "
            "(queue full or timed out), BACKEND an error during execution.",
            "reqps",
            (
                Query(
                    sum_rate(
                        selector(triton("nv_inference_request_failure"), _MODEL), "model, reason"
                    ),
                    "{{model}} {{reason}}",
                ),
            ),
            min_value=0,
        ),
        Panel(
            "Active findings",
            "batchscope's active findings (batchscope_finding == 1): idle capacity, queue "
            "saturation, batching off, batches below the preferred size. The same findings "
            "are drawn as annotations on the time series panels.",
            "short",
            (Query(FINDINGS.expr, instant=True),),
            viz=Viz.TABLE,
        ),
        Panel(
            "batchscope sources up",
            "Whether each of batchscope's sources last scraped its target successfully and "
            "recently (batchscope_source_up: 1 yes, 0 no), per source and target.",
            "bool_yes_no",
            (
                Query(
                    f"min by (source, target) "
                    f"({selector(exporter('batchscope_source_up'), EXPORTER)})",
                    "{{source}} {{target}}",
                ),
            ),
            viz=Viz.STAT,
            height=6,
        ),
        Panel(
            "batchscope scrape duration",
            "How long each of batchscope's sources took for its last scrape of the target "
            "(batchscope_source_scrape_duration_seconds), in seconds.",
            "s",
            (
                Query(
                    f"max by (source, target) ({_SCRAPE_DURATION})",
                    "{{source}} {{target}}",
                ),
            ),
            height=6,
            min_value=0,
        ),
    ),
)

BATCHING_OVERVIEW = Dashboard(
    uid="batchscope-batching",
    title="batchscope / Batching overview",
    description="Throughput, batch sizes formed against the configured ones, queue against "
    "compute time, tail latency, pending requests, failures and batchscope's findings.",
    filename="batching-overview.json",
    variables=(INSTANCE, TARGET, MODEL),
    rows=(_THROUGHPUT, _LATENCY, _HEALTH),
    annotations=(FINDINGS,),
)
