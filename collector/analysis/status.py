"""The latest window per target and model, device and process: what ``batchscope
status`` prints and the UI's overview reads.

The field names of ``ModelStatus``, ``DeviceStatus`` and ``ProcessStatus`` are a
stable contract (``status --json``): add fields, never rename or remove one.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from collector.analysis.rates import window_rates
from collector.records import ModelSample
from collector.store import Store
from collector.store.rows import StoredProcess

__all__ = ["DeviceStatus", "ModelStatus", "ProcessStatus", "StatusReport", "build_status"]


@dataclass(frozen=True)
class ModelStatus:
    target: str
    model: str
    version: str
    up: bool
    window_s: float
    qps: float | None
    infer_per_s: float | None
    exec_per_s: float | None
    avg_batch_size: float | None
    queue_us: float | None
    compute_infer_us: float | None
    request_us: float | None
    queue_share: float | None
    busy_share: float | None
    pending: float | None
    fail_per_s: float | None
    fail_per_s_by_reason: dict[str, float]
    resets: int
    dynamic_batching: bool | None
    max_queue_delay_us: int | None
    preferred_batch_sizes: list[int] | None
    max_batch_size: int | None
    instance_count: int | None
    last_sample_at: float


@dataclass(frozen=True)
class DeviceStatus:
    target: str
    source: str
    uuid: str
    kind: str
    name: str | None
    index: int | None
    parent_uuid: str | None
    utilization_gpu_pct: float | None
    utilization_memory_pct: float | None
    sm_active_pct: float | None
    sm_occupancy_pct: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_w: float | None
    power_limit_w: float | None
    healthy: bool
    last_sample_at: float


@dataclass(frozen=True)
class ProcessStatus:
    target: str
    pid: int
    role: str
    model: str | None
    instance_name: str | None
    cpu_pct: float | None  # mean over the window, percent of one core
    rss_bytes: int | None
    gpu_uuid: str | None
    sm_util_pct: float | None  # NVML, joined by pid
    mem_util_pct: float | None
    last_sample_at: float


@dataclass(frozen=True)
class StatusReport:
    generated_at: float
    window_s: float
    models: list[ModelStatus] = field(default_factory=list)
    devices: list[DeviceStatus] = field(default_factory=list)
    processes: list[ProcessStatus] = field(default_factory=list)

    def to_json_dict(self) -> dict[str, object]:
        return {
            "generated_at": self.generated_at,
            "window_s": self.window_s,
            "models": [asdict(m) for m in self.models],
            "devices": [asdict(d) for d in self.devices],
            "processes": [asdict(p) for p in self.processes],
        }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def build_status(store: Store, *, window_s: float = 60.0, now: float | None = None) -> StatusReport:
    """Rates over the last ``window_s`` seconds of each series (ending at its newest
    sample), with the model's current config and the target's up state."""
    now = time.time() if now is None else now
    up = {t.name: t.up for t in store.targets()}
    configs = store.latest_model_configs()

    series: dict[tuple[str, str, str], list[ModelSample]] = defaultdict(list)
    for s in store.model_samples(since=now - window_s - 300.0, until=now):
        series[(s.target, s.model, s.version)].append(s)

    models: list[ModelStatus] = []
    for (target, model, version), samples in sorted(series.items()):
        newest = samples[-1].collected_at
        in_window = [s for s in samples if s.collected_at >= newest - window_s]
        if len(in_window) < 2 and len(samples) >= 2:
            in_window = samples[-2:]  # scrapes sparser than the window: use the last pair
        stored = configs.get((target, model))
        config = stored.config if stored else None
        rates = window_rates(in_window, instance_count=config.instance_count if config else None)
        models.append(ModelStatus(
            target=target, model=model, version=version, up=up.get(target, False),
            window_s=rates.window_s if rates else 0.0,
            qps=rates.requests_per_s if rates else None,
            infer_per_s=rates.inferences_per_s if rates else None,
            exec_per_s=rates.executions_per_s if rates else None,
            avg_batch_size=rates.avg_batch_size if rates else None,
            queue_us=rates.queue_us_per_request if rates else None,
            compute_infer_us=rates.compute_infer_us_per_request if rates else None,
            request_us=rates.request_us_per_request if rates else None,
            queue_share=rates.queue_share if rates else None,
            busy_share=rates.busy_share if rates else None,
            pending=samples[-1].metrics.pending_request_count,
            fail_per_s=rates.fail_per_s if rates else None,
            fail_per_s_by_reason=dict(rates.fail_per_s_by_reason) if rates else {},
            resets=rates.resets if rates else 0,
            dynamic_batching=config.dynamic_batching if config else None,
            max_queue_delay_us=config.max_queue_delay_us if config else None,
            preferred_batch_sizes=list(config.preferred_batch_sizes) if config else None,
            max_batch_size=config.max_batch_size if config else None,
            instance_count=config.instance_count if config else None,
            last_sample_at=newest,
        ))

    devices: dict[tuple[str, str, str], DeviceStatus] = {}
    for d in store.device_samples(since=now - window_s):
        s = d.sample
        devices[(d.target, s.source, s.uuid)] = DeviceStatus(
            target=d.target, source=s.source, uuid=s.uuid, kind=s.kind, name=s.name,
            index=s.index, parent_uuid=s.parent_uuid,
            utilization_gpu_pct=s.utilization_gpu_pct,
            utilization_memory_pct=s.utilization_memory_pct, sm_active_pct=s.sm_active_pct,
            sm_occupancy_pct=s.sm_occupancy_pct, memory_used_bytes=s.memory_used_bytes,
            memory_total_bytes=s.memory_total_bytes, power_w=s.power_w,
            power_limit_w=s.power_limit_w, healthy=s.healthy, last_sample_at=d.collected_at)

    # NVML's per-process readings, keyed by pid, join the host's pid -> instance map.
    gpu_by_pid: dict[int, StoredProcess] = {}
    host_rows: dict[tuple[str, int], list[StoredProcess]] = defaultdict(list)
    for p in store.process_samples(since=now - window_s):
        if p.sample.source == "nvml":
            gpu_by_pid[p.sample.pid] = p
        else:
            host_rows[(p.target, p.sample.pid)].append(p)
    host_pids = {pid for _, pid in host_rows}
    for pid, p in gpu_by_pid.items():
        if pid not in host_pids:  # a GPU process that is not part of a watched Triton
            host_rows[(p.target, pid)].append(p)
    processes: list[ProcessStatus] = []
    for (target, pid), rows in sorted(host_rows.items()):
        last = rows[-1]
        gpu = gpu_by_pid.get(pid)
        gpu_uuid, sm, mem = ((gpu.sample.gpu_uuid, gpu.sample.sm_util_pct,
                              gpu.sample.mem_util_pct) if gpu else (None, None, None))
        processes.append(ProcessStatus(
            target=target, pid=pid, role=last.sample.role, model=last.sample.model,
            instance_name=last.sample.instance_name,
            cpu_pct=_mean([r.sample.cpu_pct for r in rows if r.sample.cpu_pct is not None]),
            rss_bytes=last.sample.rss_bytes, gpu_uuid=gpu_uuid, sm_util_pct=sm,
            mem_util_pct=mem, last_sample_at=last.collected_at))
    # Only processes seen in the newest host tick of their target are still alive.
    newest_tick: dict[str, float] = {}
    for p in processes:
        newest_tick[p.target] = max(newest_tick.get(p.target, 0.0), p.last_sample_at)
    processes = [p for p in processes if p.last_sample_at >= newest_tick[p.target] - 1e-6]

    return StatusReport(generated_at=now, window_s=window_s, models=models,
                        devices=sorted(devices.values(), key=lambda d: (d.target, d.uuid)),
                        processes=processes)
