"""What the simulated Triton fleet serves (``collector.testbed.fleet``), made cheap.

The metrics page is the exposition recorded from the CPU testbed (Triton 2.52, the
``batched`` model, ``tests/fixtures/triton/metrics_cpu.txt``) with its model series
repeated for M models; the statistics are shaped like the testbed's, with a
``batch_stats`` entry per batch size 1-16 in the recorded proportions. Every counter
is a whole-number function of time, so both documents of one target agree within a
tick and advance from tick to tick; failures stay zero. Each target and model runs at
its own rate (:class:`ModelLoad`).

Both documents are compiled once per fleet into ``%`` formats (:class:`FleetTemplates`);
a target's documents of a tick are one format each of its values
(:class:`TargetDocuments`), rendered on the first request of the tick that needs them.
"""

from __future__ import annotations

import json
import operator
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BATCH_PROFILE",
    "MODEL_CONFIG",
    "RECORDED_METRICS",
    "RECORDED_MODEL",
    "SERVER_METADATA",
    "FleetTemplates",
    "ModelLoad",
    "TargetDocuments",
    "compact_json",
    "model_names",
]

# Recorded from the CPU testbed: the model series of ``batched`` (the per-model lines
# are repeated for every simulated model) and the server's own gauges, in page order.
RECORDED_METRICS = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="batched",version="1"} 4051
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="batched",reason="BACKEND",version="1"} 0
nv_inference_request_failure{model="batched",reason="CANCELED",version="1"} 0
nv_inference_request_failure{model="batched",reason="REJECTED",version="1"} 0
nv_inference_request_failure{model="batched",reason="OTHER",version="1"} 0
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{model="batched",version="1"} 4051
# HELP nv_inference_exec_count Number of model executions performed (does not include cached requests)
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="batched",version="1"} 708
# HELP nv_inference_request_duration_us Cumulative inference request duration in microseconds (includes cached requests)
# TYPE nv_inference_request_duration_us counter
nv_inference_request_duration_us{model="batched",version="1"} 69791351
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds (includes cached requests)
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="batched",version="1"} 26455651
# HELP nv_inference_compute_input_duration_us Cumulative compute input duration in microseconds (does not include cached requests)
# TYPE nv_inference_compute_input_duration_us counter
nv_inference_compute_input_duration_us{model="batched",version="1"} 609836
# HELP nv_inference_compute_infer_duration_us Cumulative compute inference duration in microseconds (does not include cached requests)
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{model="batched",version="1"} 39111776
# HELP nv_inference_compute_output_duration_us Cumulative inference compute output duration in microseconds (does not include cached requests)
# TYPE nv_inference_compute_output_duration_us counter
nv_inference_compute_output_duration_us{model="batched",version="1"} 3540558
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="batched",version="1"} 7
# HELP nv_pinned_memory_pool_total_bytes Pinned memory pool total memory size, in bytes
# TYPE nv_pinned_memory_pool_total_bytes gauge
nv_pinned_memory_pool_total_bytes 268435456
# HELP nv_pinned_memory_pool_used_bytes Pinned memory pool used memory size, in bytes
# TYPE nv_pinned_memory_pool_used_bytes gauge
nv_pinned_memory_pool_used_bytes 0
# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0.4489795918367347
# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes
# TYPE nv_cpu_memory_total_bytes gauge
nv_cpu_memory_total_bytes 25275990016
# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes
# TYPE nv_cpu_memory_used_bytes gauge
nv_cpu_memory_used_bytes 692531200
"""  # noqa: E501
RECORDED_MODEL = "batched"
SERVER_METADATA: dict[str, Any] = {
    "name": "triton",
    "version": "2.52.0",
    "extensions": [
        "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
        "schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
        "binary_tensor_data", "parameters", "statistics", "trace", "logging",
    ],
}  # fmt: skip
# The testbed's batched model's configuration as Triton returns it (name replaced).
MODEL_CONFIG: dict[str, Any] = {
    "name": RECORDED_MODEL, "platform": "", "backend": "python", "runtime": "",
    "version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": 32,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "format": "FORMAT_NONE",
               "dims": [16], "is_shape_tensor": False, "allow_ragged_batch": False,
               "optional": False, "is_non_linear_format_io": False}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16],
                "label_filename": "", "is_shape_tensor": False,
                "is_non_linear_format_io": False}],
    "batch_input": [], "batch_output": [],
    "optimization": {"priority": "PRIORITY_DEFAULT", "input_pinned_memory": {"enable": True},
                     "output_pinned_memory": {"enable": True},
                     "gather_kernel_buffer_threshold": 0, "eager_batching": False},
    "dynamic_batching": {"preferred_batch_size": [8, 16], "max_queue_delay_microseconds": 2000,
                         "preserve_ordering": False, "priority_levels": 0,
                         "default_priority_level": 0, "priority_queue_policy": {}},
    "instance_group": [{"name": "batched_0", "kind": "KIND_CPU", "count": 1, "gpus": [],
                        "secondary_devices": [], "profile": [], "passive": False,
                        "host_policy": ""}],
    "default_model_filename": "model.py", "cc_model_filenames": {}, "metric_tags": {},
    "parameters": {"per_sample_ms": {"string_value": "0.5"}, "fixed_ms": {"string_value": "4.0"}},
    "model_warmup": [],
}  # fmt: skip
# Recorded batch_stats of the testbed's batched model: (batch size, executions, then
# compute input, infer and output ns per execution).
BATCH_PROFILE: tuple[tuple[int, int, int, int, int], ...] = (
    (1, 229, 64907, 5375437, 374715), (2, 58, 44733, 5896884, 426709),
    (3, 42, 63547, 6386284, 545867), (4, 21, 66755, 6815458, 599462),
    (5, 24, 85426, 7327066, 574143), (6, 46, 116025, 7953504, 747783),
    (7, 24, 88547, 8360134, 753113), (8, 170, 124899, 8975703, 804372),
    (9, 19, 124567, 9409341, 807831), (10, 40, 133786, 10078551, 999756),
    (11, 21, 152010, 10565565, 1103090), (12, 17, 170407, 11035212, 1054501),
    (13, 33, 168635, 11595877, 1008436), (14, 44, 285617, 12279172, 1124535),
    (15, 14, 234403, 12617143, 932610), (16, 6, 211176, 13527523, 1725847),
)  # fmt: skip
# The recording covered about this long: its executions / this = executions per second.
_RECORDED_S = 80.0
_QUEUE_NS = 6_544_000  # per request, as recorded
_OVERHEAD_NS = 150_000  # request time outside queue and compute

# Layout of one model's values within a target's flat list of values: scalars, then
# (executions, input ns, infer ns, output ns) per batch size of BATCH_PROFILE.
_REQUESTS, _INFERENCES, _EXECUTIONS, _PENDING, _LAST_MS = 0, 1, 2, 3, 4
_SUCCESS_NS, _QUEUE_NS_TOTAL, _CIN_NS, _CINF_NS, _COUT_NS = 5, 6, 7, 8, 9
_SUCCESS_US, _QUEUE_US, _CIN_US, _CINF_US, _COUT_US = 10, 11, 12, 13, 14
_SCALARS = 15
_PER_MODEL = _SCALARS + 4 * len(BATCH_PROFILE)
# Metric families whose per-model value is computed; the others keep the recorded value.
_METRIC_VALUE: dict[str, int] = {
    "nv_inference_request_success": _REQUESTS,
    "nv_inference_count": _INFERENCES,
    "nv_inference_exec_count": _EXECUTIONS,
    "nv_inference_request_duration_us": _SUCCESS_US,
    "nv_inference_queue_duration_us": _QUEUE_US,
    "nv_inference_compute_input_duration_us": _CIN_US,
    "nv_inference_compute_infer_duration_us": _CINF_US,
    "nv_inference_compute_output_duration_us": _COUT_US,
    "nv_inference_pending_request_count": _PENDING,
}
_SLOT = re.compile(r'"?@@(\d+)@@"?')


def model_names(models: int) -> list[str]:
    """The simulated models' names, the same on every target."""
    return [f"model{i:03d}" for i in range(models)]


def _slot(index: int) -> str:
    return f"@@{index}@@"


def _compile(text: str) -> tuple[str, list[int]]:
    """A ``%`` format of ``text`` with each slot (``@@i@@``, quoted or not) made ``%d``,
    and the value indices of the slots in order."""
    pieces = _SLOT.split(text)
    order = [int(i) for i in pieces[1::2]]
    fmt = "%d".join(p.replace("%", "%%") for p in pieces[0::2])
    return fmt, order


@dataclass(frozen=True)
class FleetTemplates:
    """The documents every target serves, compiled once for M models: ``%`` formats
    filled from a target's flat list of values (``_PER_MODEL`` per model)."""

    models: tuple[str, ...]
    metrics_fmt: str
    metrics_order: tuple[int, ...]
    stats_fmt: str
    stats_order: tuple[int, ...]
    configs: dict[str, bytes]

    @classmethod
    def build(cls, models: int) -> FleetTemplates:
        names = model_names(models)
        metrics_fmt, metrics_order = _compile(_metrics_template(names))
        stats_fmt, stats_order = _compile(_stats_template(names))
        configs = {n: compact_json({**MODEL_CONFIG, "name": n}) for n in names}
        return cls(
            tuple(names), metrics_fmt, tuple(metrics_order), stats_fmt, tuple(stats_order), configs
        )


def _metrics_template(names: Sequence[str]) -> str:
    """The recorded page, each ``batched`` series once per model with a value slot."""
    out: list[str] = []
    marker = f'model="{RECORDED_MODEL}"'
    labels = [f'model="{name}"' for name in names]
    for line in RECORDED_METRICS.splitlines():
        if marker not in line:
            out.append(line)
            continue
        series, _, recorded = line.rpartition(" ")
        family = series.split("{", 1)[0]
        index = _METRIC_VALUE.get(family)
        for m, label in enumerate(labels):
            shown = recorded if index is None else _slot(m * _PER_MODEL + index)
            out.append(f"{series.replace(marker, label)} {shown}")
    return "\n".join(out) + "\n"


def _stats_template(names: Sequence[str]) -> str:
    def span(count: int | str, ns: int | str) -> dict[str, int | str]:
        return {"count": count, "ns": ns}

    entries = []
    for m, name in enumerate(names):
        base = m * _PER_MODEL

        def s(i: int, base: int = base) -> str:
            return _slot(base + i)

        batch_stats = [
            {
                "batch_size": size,
                "compute_input": span(s(_SCALARS + 4 * j), s(_SCALARS + 4 * j + 1)),
                "compute_infer": span(s(_SCALARS + 4 * j), s(_SCALARS + 4 * j + 2)),
                "compute_output": span(s(_SCALARS + 4 * j), s(_SCALARS + 4 * j + 3)),
            }
            for j, (size, *_) in enumerate(BATCH_PROFILE)
        ]
        entries.append(
            {
                "name": name,
                "version": "1",
                "last_inference": s(_LAST_MS),
                "inference_count": s(_INFERENCES),
                "execution_count": s(_EXECUTIONS),
                "inference_stats": {
                    "success": span(s(_REQUESTS), s(_SUCCESS_NS)),
                    "fail": span(0, 0),
                    "queue": span(s(_REQUESTS), s(_QUEUE_NS_TOTAL)),
                    "compute_input": span(s(_INFERENCES), s(_CIN_NS)),
                    "compute_infer": span(s(_INFERENCES), s(_CINF_NS)),
                    "compute_output": span(s(_INFERENCES), s(_COUT_NS)),
                    "cache_hit": span(0, 0),
                    "cache_miss": span(0, 0),
                },
                "response_stats": {},
                "batch_stats": batch_stats,
                "memory_usage": [],
            }
        )
    return json.dumps({"model_stats": entries}, separators=(",", ":"))


def compact_json(doc: Any) -> bytes:
    """JSON as Triton writes it: no spaces."""
    return json.dumps(doc, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- the load


@dataclass(frozen=True)
class ModelLoad:
    """How one model of one target runs: executions per second per batch size and the
    time per execution (ns, per batch size) and per request (queue, overhead)."""

    exec_rates: tuple[float, ...]
    input_ns: tuple[int, ...]
    infer_ns: tuple[int, ...]
    output_ns: tuple[int, ...]
    queue_ns: int

    @classmethod
    def for_model(cls, target: int, model: int) -> ModelLoad:
        # Deterministic spread: each (target, model) runs at 0.5-1.5x the recorded
        # rate, at 0.8-1.2x its times.
        speed = 0.5 + ((target * 7919 + model * 104729) % 1000) / 1000
        cost = 0.8 + ((target * 104729 + model * 7919) % 400) / 1000
        return cls(
            exec_rates=tuple(b[1] / _RECORDED_S * speed for b in BATCH_PROFILE),
            input_ns=tuple(int(b[2] * cost) for b in BATCH_PROFILE),
            infer_ns=tuple(int(b[3] * cost) for b in BATCH_PROFILE),
            output_ns=tuple(int(b[4] * cost) for b in BATCH_PROFILE),
            queue_ns=int(_QUEUE_NS * cost),
        )

    def values(self, elapsed_s: float, now_ms: int, pending: int) -> list[int]:
        """This model's ``_PER_MODEL`` values after ``elapsed_s`` seconds of serving."""
        execs = [int(r * elapsed_s) for r in self.exec_rates]
        per_size: list[int] = []
        inferences = cin = cinf = cout = 0
        for (size, *_), n, i_ns, f_ns, o_ns in zip(
            BATCH_PROFILE, execs, self.input_ns, self.infer_ns, self.output_ns, strict=True
        ):
            per_size += (n, n * i_ns, n * f_ns, n * o_ns)
            inferences += n * size
            # Every request of a batch is charged the batch's compute time.
            cin += n * size * i_ns
            cinf += n * size * f_ns
            cout += n * size * o_ns
        queue = inferences * self.queue_ns
        success = queue + cin + cinf + cout + inferences * _OVERHEAD_NS
        scalars = [
            inferences, inferences, sum(execs), pending, now_ms,
            success, queue, cin, cinf, cout,
            success // 1000, queue // 1000, cin // 1000, cinf // 1000, cout // 1000,
        ]  # fmt: skip
        return scalars + per_size


class TargetDocuments:
    """One simulated server: its load, and its documents of the current tick (each
    passed through ``frame(kind, body)`` once, ``kind`` "metrics" or "stats")."""

    def __init__(
        self,
        index: int,
        templates: FleetTemplates,
        tick_s: float,
        started: float,
        frame: Callable[[str, bytes], bytes] | None = None,
    ):
        self.index = index
        # Made once per document and tick: an HTTP response around it, say.
        self._frame = frame or (lambda kind, body: body)
        self._templates = templates
        self._tick_s = tick_s
        # A server that has been up a while: counters start well above zero.
        self._origin = started - 3600.0 - (index * 37) % 600
        self._loads = [ModelLoad.for_model(index, m) for m in range(len(templates.models))]
        self._metrics_of = _getter(templates.metrics_order)
        self._stats_of = _getter(templates.stats_order)
        self._tick = -1
        self._values: list[int] = []
        self._metrics: bytes | None = None
        self._stats: bytes | None = None

    def _advance(self) -> None:
        tick = int(time.time() // self._tick_s)
        if tick == self._tick:
            return
        self._tick = tick
        at = tick * self._tick_s
        now_ms = int(at * 1000)
        values: list[int] = []
        for m, load in enumerate(self._loads):
            values += load.values(at - self._origin, now_ms, (tick + m) % 9)
        self._values = values
        self._metrics = self._stats = None

    def metrics(self) -> bytes:
        self._advance()
        if self._metrics is None:
            text = self._templates.metrics_fmt % self._metrics_of(self._values)
            self._metrics = self._frame("metrics", text.encode())
        return self._metrics

    def stats(self) -> bytes:
        self._advance()
        if self._stats is None:
            text = self._templates.stats_fmt % self._stats_of(self._values)
            self._stats = self._frame("stats", text.encode())
        return self._stats


def _getter(order: Sequence[int]) -> Callable[[list[int]], tuple[int, ...]]:
    if len(order) == 1:
        only = order[0]
        return lambda values: (values[only],)
    return operator.itemgetter(*order)
