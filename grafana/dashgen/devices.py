"""Dashboard 2, GPUs and instances: how busy each GPU, MIG instance and model-instance
process is, and how much capacity stands idle."""

from __future__ import annotations

from collector.analysis.detect.detectors import IDLE_CAPACITY
from grafana.dashgen.batching import FINDINGS
from grafana.dashgen.metrics import Need, exporter, triton
from grafana.dashgen.spec import (
    EXPORTER,
    EXPORTER_MODEL,
    TRITON,
    Dashboard,
    Panel,
    Query,
    Row,
    Viz,
    selector,
)
from grafana.dashgen.variables import INSTANCE, MODEL, TARGET

__all__ = ["GPUS_AND_INSTANCES"]

_WIDTH = 8
_MIG = frozenset({Need.MIG})


def _device(name: str, kind: str) -> str:
    return selector(exporter(name), EXPORTER, f'kind="{kind}"')


_TRITON_GPUS = Row(
    "GPUs, as Triton reports them",
    (
        Panel(
            "GPU utilisation (Triton)",
            "Share of time the GPU was busy, per Triton and GPU, from Triton's own DCGM "
            "reading (nv_gpu_utilization, 0 to 1). Triton exports no GPU metrics under MIG "
            "or when another DCGM agent owns the GPU; batchscope's NVML view below still works.",
            "percentunit",
            (Query(selector(triton("nv_gpu_utilization"), TRITON), "{{instance}} {{gpu_uuid}}"),),
            width=_WIDTH,
            min_value=0,
            max_value=1,
        ),
        Panel(
            "GPU memory used (Triton)",
            "Device memory in use per GPU (nv_gpu_memory_used_bytes; whole GPU, not per "
            "model), with the GPU's total (nv_gpu_memory_total_bytes) dashed.",
            "bytes",
            (
                Query(
                    selector(triton("nv_gpu_memory_used_bytes"), TRITON),
                    "{{instance}} {{gpu_uuid}} used",
                ),
                Query(
                    selector(triton("nv_gpu_memory_total_bytes"), TRITON),
                    "{{instance}} {{gpu_uuid}} total",
                ),
            ),
            width=_WIDTH,
            reference_series="/ total$/",
            min_value=0,
        ),
        Panel(
            "Host CPU utilisation (Triton)",
            "Share of all the host's CPU cores in use, as Triton reads it from /proc "
            "(nv_cpu_utilization, 0 to 1), per Triton.",
            "percentunit",
            (Query(selector(triton("nv_cpu_utilization"), TRITON), "{{instance}}"),),
            width=_WIDTH,
            min_value=0,
            max_value=1,
        ),
    ),
)


def _device_row(title: str, kind: str, legend: str, needs: frozenset[Need]) -> Row:
    """Utilisation, SM activity and memory of batchscope's NVML devices of ``kind``."""
    noun = "MIG instance" if kind == "mig" else "GPU"
    return Row(
        title,
        (
            Panel(
                f"{noun} utilisation (NVML)",
                f"Share of time a kernel ran on each {noun}, as batchscope reads it from NVML "
                f'(batchscope_device_utilization_ratio{{kind="{kind}"}}, 0 to 1).',
                "percentunit",
                (Query(_device("batchscope_device_utilization_ratio", kind), legend, needs=needs),),
                width=_WIDTH,
                min_value=0,
                max_value=1,
            ),
            Panel(
                f"{noun} SM active",
                f"Share of the {noun}'s streaming multiprocessors busy, from NVML's GPM "
                "metrics where the GPU supports them "
                f'(batchscope_device_sm_active_ratio{{kind="{kind}"}}). '
                "Kernel utilisation counts any kernel running; SM activity counts how much of "
                "the GPU it used, so it shows idle capacity that utilisation hides.",
                "percentunit",
                (Query(_device("batchscope_device_sm_active_ratio", kind), legend, needs=needs),),
                width=_WIDTH,
                min_value=0,
                max_value=1,
            ),
            Panel(
                f"{noun} memory used (NVML)",
                f"Device memory in use on each {noun} "
                f'(batchscope_device_memory_used_bytes{{kind="{kind}"}}).',
                "bytes",
                (Query(_device("batchscope_device_memory_used_bytes", kind), legend, needs=needs),),
                width=_WIDTH,
                min_value=0,
            ),
        ),
    )


_PROCESS = EXPORTER_MODEL
_IDLE_FINDINGS = selector(exporter("batchscope_finding"), EXPORTER_MODEL, f'kind="{IDLE_CAPACITY}"')

_PROCESSES = Row(
    "Model-instance processes",
    (
        Panel(
            "CPU per process",
            "CPU used by each Triton process and Python-backend model-instance process, in "
            "cores (batchscope_process_cpu_cores, from /proc). role tells the server from "
            "the model-instance stubs.",
            "short",
            (
                Query(
                    selector(exporter("batchscope_process_cpu_cores"), _PROCESS),
                    "{{role}} {{model}} pid {{pid}}",
                ),
            ),
            width=_WIDTH,
            min_value=0,
        ),
        Panel(
            "SM utilisation per process",
            "Share of the GPU's SMs each process used, from NVML's per-process utilisation "
            "(batchscope_process_sm_utilization_ratio), per model, pid and GPU.",
            "percentunit",
            (
                Query(
                    selector(exporter("batchscope_process_sm_utilization_ratio"), _PROCESS),
                    "{{model}} pid {{pid}} {{gpu_uuid}}",
                ),
            ),
            width=_WIDTH,
            min_value=0,
            max_value=1,
        ),
        Panel(
            "GPU memory per process",
            "GPU memory each process holds (batchscope_process_gpu_memory_bytes).",
            "bytes",
            (
                Query(
                    selector(exporter("batchscope_process_gpu_memory_bytes"), _PROCESS),
                    "{{model}} pid {{pid}} {{gpu_uuid}}",
                ),
            ),
            width=_WIDTH,
            min_value=0,
        ),
    ),
)

_IDLE = Row(
    "Idle capacity",
    (
        Panel(
            "Idle instances",
            "Idle capacity in instance-equivalents over batchscope's analysis window, per "
            "model summed across targets: instance count x (1 - instance busy share) "
            "(batchscope_model_idle_instances). 1.5 means one and a half instances' worth of "
            "compute stood idle.",
            "short",
            (
                Query(
                    f"sum by (model) "
                    f"({selector(exporter('batchscope_model_idle_instances'), EXPORTER_MODEL)})",
                    "{{model}}",
                ),
            ),
            width=_WIDTH,
            min_value=0,
        ),
        Panel(
            "Instance busy share",
            "Share of the analysis window the model's instances were computing: batch_stats "
            "compute time / (window x instance count) (batchscope_model_instance_busy_ratio), "
            "per model and target. A ratio, so it is shown per series, never averaged.",
            "percentunit",
            (
                Query(
                    selector(exporter("batchscope_model_instance_busy_ratio"), EXPORTER_MODEL),
                    "{{model}} @ {{target}}",
                ),
            ),
            width=_WIDTH,
            min_value=0,
            max_value=1,
        ),
        Panel(
            "Idle-capacity findings",
            'Active idle-capacity findings (batchscope_finding{kind="idle_capacity"} == 1): '
            "a GPU, MIG instance or model whose instances stayed idle for a sustained window.",
            "short",
            (
                Query(
                    f"{_IDLE_FINDINGS} == 1",
                    instant=True,
                ),
            ),
            viz=Viz.TABLE,
            width=_WIDTH,
        ),
    ),
)

GPUS_AND_INSTANCES = Dashboard(
    uid="batchscope-gpus",
    title="batchscope / GPUs and instances",
    description="Per GPU, per MIG instance and per model-instance process: utilisation, SM "
    "activity, memory and CPU; and the idle capacity batchscope finds.",
    filename="gpus-and-instances.json",
    variables=(INSTANCE, TARGET, MODEL),
    rows=(
        _TRITON_GPUS,
        _device_row(
            "GPUs, as batchscope reads them (NVML)", "gpu", "{{name}} {{uuid}}", frozenset()
        ),
        _device_row("MIG instances", "mig", "{{parent_uuid}} / {{name}} {{uuid}}", _MIG),
        _PROCESSES,
        _IDLE,
    ),
    annotations=(FINDINGS,),
)
