"""Dashboard 3, model drill-down: one model's effective config, batchscope's latest
recommendation (predicted against current) and how the model behaves live."""

from __future__ import annotations

from grafana.dashgen.batching import (
    FINDINGS,
    REFERENCE_SERIES,
    average_batch_size,
    batch_size_references,
    compute_per_request,
    qps,
    queue_per_request,
)
from grafana.dashgen.metrics import exporter, triton
from grafana.dashgen.spec import (
    EXPORTER_MODEL,
    TRITON_MODEL,
    Dashboard,
    Panel,
    Query,
    Row,
    Viz,
    selector,
    sum_rate,
)
from grafana.dashgen.variables import INSTANCE, ONE_MODEL, TARGET

__all__ = ["MODEL_DRILLDOWN"]


def _mine(name: str) -> str:
    """The exporter's series ``name`` for the selected targets and model."""
    return selector(exporter(name), EXPORTER_MODEL)


def _stat(title: str, description: str, unit: str, family_name: str, legend: str) -> Panel:
    return Panel(
        title,
        description,
        unit,
        (Query(_mine(family_name), legend, instant=True),),
        viz=Viz.STAT,
        width=3,
        height=5,
    )


_CONFIG = Row(
    "Effective config",
    (
        Panel(
            "Effective batching config",
            "The model's batching config as Triton reports it, per target: dynamic batching "
            "on or off, the preferred batch sizes and the queue policy's timeout action "
            "(labels of batchscope_model_config_info).",
            "short",
            (Query(_mine("batchscope_model_config_info"), instant=True),),
            viz=Viz.TABLE,
            height=5,
        ),
        _stat(
            "max_batch_size",
            "The largest batch the model accepts (batchscope_model_max_batch_size; 0: the "
            "model does not batch), per target.",
            "short",
            "batchscope_model_max_batch_size",
            "{{target}}",
        ),
        _stat(
            "Max queue delay",
            "How long the dynamic batcher may hold a request to form a larger batch "
            "(max_queue_delay_microseconds, as batchscope_model_max_queue_delay_seconds), "
            "per target.",
            "s",
            "batchscope_model_max_queue_delay_seconds",
            "{{target}}",
        ),
        _stat(
            "Instances",
            "The model's instance count, instance_group counts summed "
            "(batchscope_model_instances), per target.",
            "short",
            "batchscope_model_instances",
            "{{target}}",
        ),
        _stat(
            "Preferred batch sizes",
            "The dynamic batcher's preferred batch sizes, by position "
            "(batchscope_model_preferred_batch_size), per target.",
            "short",
            "batchscope_model_preferred_batch_size",
            "#{{position}} {{target}}",
        ),
    ),
)

_LIVE_P95 = selector(triton("nv_inference_request_summary_us"), TRITON_MODEL, 'quantile="0.95"')

_RECOMMENDATION = Row(
    "Recommendation",
    (
        Panel(
            "Latest recommendation",
            "batchscope's latest recommendation for the model: its kind and the config "
            "fields it changes (labels of batchscope_recommendation_info), per target. "
            "`batchscope recommend` prints the config.pbtxt fragment.",
            "short",
            (Query(_mine("batchscope_recommendation_info"), instant=True),),
            viz=Viz.TABLE,
            width=18,
            height=6,
        ),
        Panel(
            "Confidence",
            "How sure batchscope is of the latest recommendation's prediction, 0 to 1 "
            "(batchscope_recommendation_confidence_ratio), per target.",
            "percentunit",
            (
                Query(
                    _mine("batchscope_recommendation_confidence_ratio"), "{{target}}", instant=True
                ),
            ),
            viz=Viz.STAT,
            width=6,
            height=6,
        ),
        Panel(
            "Throughput: predicted against current",
            "Requests per second: predicted for the recommended config at the observed load "
            "(batchscope_recommendation_predicted_requests_per_second), observed when the "
            "recommendation was made (..._current_requests_per_second), and live now "
            "(sum of rate(nv_inference_request_success)).",
            "reqps",
            (
                Query(
                    _mine("batchscope_recommendation_predicted_requests_per_second"),
                    "predicted {{target}}",
                ),
                Query(
                    _mine("batchscope_recommendation_current_requests_per_second"),
                    "at recommendation {{target}}",
                ),
                Query(qps(), "live"),
            ),
            min_value=0,
        ),
        Panel(
            "p95 latency: predicted against current",
            "p95 request latency in seconds: predicted for the recommended config "
            "(batchscope_recommendation_predicted_p95_seconds), observed when the "
            "recommendation was made (..._current_p95_seconds), and live now from Triton's "
            'summary (nv_inference_request_summary_us{quantile="0.95"}, worst server).',
            "s",
            (
                Query(
                    _mine("batchscope_recommendation_predicted_p95_seconds"),
                    "predicted {{target}}",
                ),
                Query(
                    _mine("batchscope_recommendation_current_p95_seconds"),
                    "at recommendation {{target}}",
                ),
                Query(f"max by (model) ({_LIVE_P95}) / 1e6", "live"),
            ),
            min_value=0,
        ),
    ),
)

_EXECUTIONS = _mine("batchscope_model_executions_total")
_COMPUTE = _mine("batchscope_model_execution_compute_seconds_total")
_QUEUED = selector(triton("nv_inference_queue_duration_us"), TRITON_MODEL)
_REQUEST_TIME = selector(triton("nv_inference_request_duration_us"), TRITON_MODEL)
_FAILURES = selector(triton("nv_inference_request_failure"), TRITON_MODEL)
_PENDING = selector(triton("nv_inference_pending_request_count"), TRITON_MODEL)

_LIVE = Row(
    "Live behaviour",
    (
        Panel(
            "Requests per second",
            "Successful requests per second (sum of rate(nv_inference_request_success)) and "
            "failed ones by reason (sum by (reason) of rate(nv_inference_request_failure)).",
            "reqps",
            (Query(qps(), "succeeded"), Query(sum_rate(_FAILURES, "reason"), "failed {{reason}}")),
            min_value=0,
        ),
        Panel(
            "Average batch size",
            "Inferences per execution: from Prometheus (sum of rate(nv_inference_count) over "
            "sum of rate(nv_inference_exec_count), over $__rate_interval) and batchscope's "
            "figure over its analysis window (batchscope_model_average_batch_size). Dashed: "
            "the preferred batch sizes and max_batch_size.",
            "short",
            (
                Query(average_batch_size(), "average (Prometheus)"),
                Query(
                    _mine("batchscope_model_average_batch_size"), "average (batchscope {{target}})"
                ),
                *batch_size_references(legend_prefix=""),
            ),
            reference_series=REFERENCE_SERIES,
            min_value=0,
        ),
        Panel(
            "Queue share of request time",
            "Share of request time spent queued: from Prometheus, sum of "
            "rate(nv_inference_queue_duration_us) over sum of "
            "rate(nv_inference_request_duration_us); "
            "and batchscope's figure over its analysis window (batchscope_model_queue_ratio).",
            "percentunit",
            (
                Query(
                    f"{sum_rate(_QUEUED)} / {sum_rate(_REQUEST_TIME)}", "queue share (Prometheus)"
                ),
                Query(_mine("batchscope_model_queue_ratio"), "queue share (batchscope {{target}})"),
            ),
            min_value=0,
            max_value=1,
        ),
        Panel(
            "Queue and compute time per request",
            "Seconds per request queued (sum of rate(nv_inference_queue_duration_us) over sum "
            "of rate(nv_inference_request_success)) and computing (compute input + infer + "
            "output, likewise). Triton charges every request in a batch the batch's compute.",
            "s",
            (Query(queue_per_request(), "queue"), Query(compute_per_request(), "compute")),
            min_value=0,
        ),
        Panel(
            "Instance busy share",
            "Share of batchscope's analysis window the model's instances were computing "
            "(batchscope_model_instance_busy_ratio), per target.",
            "percentunit",
            (Query(_mine("batchscope_model_instance_busy_ratio"), "{{target}}"),),
            width=6,
            min_value=0,
            max_value=1,
        ),
        Panel(
            "Idle instances",
            "Idle capacity in instance-equivalents over the analysis window: instance count x "
            "(1 - busy share) (batchscope_model_idle_instances), per target.",
            "short",
            (Query(_mine("batchscope_model_idle_instances"), "{{target}}"),),
            width=6,
            min_value=0,
        ),
        Panel(
            "Pending requests",
            "Requests waiting in Triton's queues for an instance "
            "(sum of nv_inference_pending_request_count).",
            "short",
            (Query(f"sum by (model) ({_PENDING})", "pending"),),
            min_value=0,
        ),
        Panel(
            "Executions per second by batch size",
            "Executions per second at each executed batch size (sum by (batch_size) of "
            "rate(batchscope_model_executions_total), from Triton's batch_stats), stacked.",
            "ops",
            (Query(sum_rate(_EXECUTIONS, "batch_size"), "batch {{batch_size}}"),),
            stacked=True,
            min_value=0,
        ),
        Panel(
            "Compute time per execution by batch size",
            "Seconds of compute per execution at each batch size: sum by (batch_size) of "
            "rate(batchscope_model_execution_compute_seconds_total) over the same of "
            "rate(batchscope_model_executions_total). The batcher's service time curve.",
            "s",
            (
                Query(
                    f"{sum_rate(_COMPUTE, 'batch_size')} / {sum_rate(_EXECUTIONS, 'batch_size')}",
                    "batch {{batch_size}}",
                ),
            ),
            min_value=0,
        ),
    ),
)

MODEL_DRILLDOWN = Dashboard(
    uid="batchscope-model",
    title="batchscope / Model drill-down",
    description="One model: its effective batching config, batchscope's latest "
    "recommendation with the predicted against the current throughput and p95, and its live "
    "throughput, batch sizes, queue share and busy share.",
    filename="model-drilldown.json",
    variables=(INSTANCE, TARGET, ONE_MODEL),
    rows=(_CONFIG, _RECOMMENDATION, _LIVE),
    annotations=(FINDINGS,),
)
