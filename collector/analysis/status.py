"""The latest window per target and model, device and process: what ``batchscope
status`` prints and the UI's overview reads.

A status composes the records it shows instead of copying their fields: a model's
``rates`` are a ``ModelRates`` (``collector.analysis.rates``) and its ``config`` a
``BatcherConfig``; a device's ``sample`` is its latest ``DeviceSample``; a process
holds its latest ``ProcessSample`` and NVML's reading of the same (target, pid). Their
JSON (``StatusReport.to_json_dict``, ``status --json``) nests the records under those
names with the records' own field names; the shape is pinned by a golden test.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from collector.analysis.rates import gauge_mean, window_rates
from collector.records import BatcherConfig, DeviceSample, ModelRates, ModelSample, ProcessSample
from collector.store import Store, StoredDevice, StoredModelConfig, StoredProcess

__all__ = ["DeviceStatus", "ModelStatus", "ProcessStatus", "StatusReport", "build_status"]

# Model samples are read this much before the window, so that scrapes sparser than
# the window still give a pair to take rates from.
_LOOKBACK_S = 300.0


@dataclass(frozen=True)
class ModelStatus:
    """One (target, model, version): its rates over the window ending at its newest
    sample (``None`` with fewer than two samples), the latest pending-request gauge,
    and the model's current batcher config (``None`` when none was read)."""

    target: str
    model: str
    version: str
    up: bool
    last_sample_at: float
    rates: ModelRates | None
    pending_request_count: float | None
    config: BatcherConfig | None


@dataclass(frozen=True)
class DeviceStatus:
    """One GPU or MIG instance as a source reported it last (``sample.source``)."""

    target: str
    last_sample_at: float
    sample: DeviceSample


@dataclass(frozen=True)
class ProcessStatus:
    """One process of a target, alive in the target's newest host tick.

    ``sample`` is its latest reading: the host source's for a Triton process, NVML's
    for a GPU process that no watched Triton owns. ``cpu_pct_mean`` is its CPU share
    (percent of one core) averaged over the window. ``gpu`` is NVML's reading of the
    same process, when there is one (see ``_process_statuses`` for the join)."""

    target: str
    last_sample_at: float
    sample: ProcessSample
    cpu_pct_mean: float | None = None
    gpu: ProcessSample | None = None


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


def build_status(store: Store, *, window_s: float = 60.0, now: float | None = None) -> StatusReport:
    """Rates over the last ``window_s`` seconds of each series (ending at its newest
    sample), with the model's current config and the target's up state; the latest
    reading of each device; the processes alive in their target's newest host tick."""
    now = time.time() if now is None else now
    up = {t.name: bool(t.up) for t in store.targets()}
    models = _model_statuses(
        store.model_samples(since=now - window_s - _LOOKBACK_S, until=now),
        store.latest_model_configs(),
        up,
        window_s,
    )
    device_rows = store.device_samples(since=now - window_s)
    devices = _device_statuses(device_rows)
    processes = _process_statuses(
        store.process_samples(since=now - window_s), _machines(device_rows)
    )
    return StatusReport(
        generated_at=now, window_s=window_s, models=models, devices=devices, processes=processes
    )


def _model_statuses(
    samples: Sequence[ModelSample],
    configs: Mapping[tuple[str, str], StoredModelConfig],
    up: Mapping[str, bool],
    window_s: float,
) -> list[ModelStatus]:
    series: dict[tuple[str, str, str], list[ModelSample]] = defaultdict(list)
    for s in samples:
        series[(s.target, s.model, s.version)].append(s)
    statuses: list[ModelStatus] = []
    for (target, model, version), rows in sorted(series.items()):
        newest = rows[-1].collected_at
        in_window = [s for s in rows if s.collected_at >= newest - window_s]
        if len(in_window) < 2 and len(rows) >= 2:
            in_window = rows[-2:]  # scrapes sparser than the window: use the last pair
        stored = configs.get((target, model))
        statuses.append(
            ModelStatus(
                target=target,
                model=model,
                version=version,
                up=up.get(target, False),
                last_sample_at=newest,
                rates=window_rates(
                    in_window, instance_count=stored.config.instance_count if stored else None
                ),
                pending_request_count=rows[-1].metrics.pending_request_count,
                config=BatcherConfig.from_model_config(stored.config) if stored else None,
            )
        )
    return statuses


def _device_statuses(rows: Sequence[StoredDevice]) -> list[DeviceStatus]:
    """The latest reading per (target, source, device)."""
    latest: dict[tuple[str, str, str], DeviceStatus] = {}
    for d in rows:
        latest[(d.target, d.sample.source, d.sample.uuid)] = DeviceStatus(
            target=d.target, last_sample_at=d.collected_at, sample=d.sample
        )
    return sorted(latest.values(), key=lambda d: (d.target, d.sample.uuid))


def _machines(devices: Sequence[StoredDevice]) -> dict[str, str]:
    """The machine each Triton target runs on, named as NVML files its readings (the
    collector's host): the one whose NVML sees a GPU that the Triton server reports.
    GPU uuids are unique across machines; a target whose server reports no GPU has no
    known machine."""
    nvml_machine = {d.sample.uuid: d.target for d in devices if d.sample.source == "nvml"}
    return {
        d.target: nvml_machine[d.sample.uuid]
        for d in devices
        if d.sample.source == "triton" and d.sample.uuid in nvml_machine
    }


def _process_statuses(
    rows: Sequence[StoredProcess], machines: Mapping[str, str]
) -> list[ProcessStatus]:
    """The host's processes per (target, pid), each with NVML's reading of the same
    pid on the machine the target runs on (``machines``; pids are only unique on one
    machine, so never a reading of another machine's process); NVML's processes that
    no host process joined, on their own. Only processes seen in the newest tick of
    their target are still alive."""
    gpu: dict[tuple[str, int], StoredProcess] = {}
    readings: dict[tuple[str, int], list[StoredProcess]] = defaultdict(list)
    for p in rows:
        if p.sample.source == "nvml":
            gpu[(p.target, p.sample.pid)] = p
        else:
            readings[(p.target, p.sample.pid)].append(p)
    on_machine = {
        (target, pid): (machines[target], pid) for target, pid in readings if target in machines
    }
    joined = set(on_machine.values())
    for key, p in gpu.items():
        if key not in joined and key not in readings:  # not part of a watched Triton
            readings[key].append(p)
    statuses: list[ProcessStatus] = []
    for key, seen in sorted(readings.items()):
        last = seen[-1]
        reading = gpu.get(on_machine.get(key, key))
        statuses.append(
            ProcessStatus(
                target=last.target,
                last_sample_at=last.collected_at,
                sample=last.sample,
                cpu_pct_mean=gauge_mean(r.sample.cpu_pct for r in seen),
                gpu=reading.sample if reading is not None else None,
            )
        )
    newest_tick: dict[str, float] = {}
    for s in statuses:
        newest_tick[s.target] = max(newest_tick.get(s.target, 0.0), s.last_sample_at)
    return [s for s in statuses if s.last_sample_at >= newest_tick[s.target] - 1e-6]
