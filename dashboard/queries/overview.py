"""The overview: every target judged at now, every model's status over the latest
window (from ``collector.analysis.status``) with its open findings, and a tile per GPU
or MIG instance weighted by the share of a GPU it stands for. Only fresh readings
count: a model of a target that is not up adds no idle instances, and a device not
read lately has no tile."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from collector.analysis.status import DeviceStatus, build_status
from collector.records import DeviceSample
from collector.store import Store, StoredFinding
from dashboard.queries.views import DeviceTile, ModelRow, OverviewData, TargetTile

__all__ = ["device_tiles", "read_overview"]


def read_overview(store: Store, *, window_s: float, now: float) -> OverviewData:
    report = build_status(store, window_s=window_s, now=now)
    findings = store.active_findings()
    by_subject: dict[tuple[str, str], list[StoredFinding]] = defaultdict(list)
    for f in findings:
        by_subject[(f.target, f.subject)].append(f)

    models = [
        ModelRow(status=m, findings=by_subject.get((m.target, m.model), [])) for m in report.models
    ]
    model_count: dict[str, int] = defaultdict(int)
    for m in report.models:
        model_count[m.target] += 1
    targets = [
        TargetTile(
            state=t.target, models=model_count.get(t.name, 0), health=t.health, facts=t.facts
        )
        for t in report.targets
    ]

    devices = device_tiles(report.devices)
    uuids = {d.sample.uuid for d in devices}
    device_findings = [f for f in findings if f.subject in uuids]
    idle = [d.idle_gpus for d in devices if d.idle_gpus is not None]

    instances_total = 0
    instances_idle = 0.0
    for m in report.models:
        busy = m.rates.busy_share if m.rates and m.up else None
        instances = m.config.instance_count if m.config else None
        if instances and busy is not None:
            instances_total += instances
            instances_idle += instances * (1.0 - min(max(busy, 0.0), 1.0))
    return OverviewData(
        generated_at=now,
        window_s=window_s,
        targets=targets,
        models=models,
        devices=devices,
        device_findings=device_findings,
        idle_gpus=sum(idle) if idle else None,
        instances_total=instances_total,
        instances_idle=instances_idle if instances_total else None,
        last_sample_at=store.latest_collected_at(),
    )


def _utilisation(d: DeviceSample) -> tuple[float | None, str | None]:
    """SM activity (GPM) when read, else the coarser utilisation counter; and which."""
    if d.sm_active_pct is not None:
        return d.sm_active_pct, "sm_active_pct"
    if d.utilization_gpu_pct is not None:
        return d.utilization_gpu_pct, "utilization_gpu_pct"
    return None, None


def device_tiles(devices: Sequence[DeviceStatus]) -> list[DeviceTile]:
    """One tile per device uuid (NVML's reading preferred over Triton's), weighted by
    the share of a GPU each stands for."""
    chosen: dict[str, DeviceStatus] = {}
    for d in devices:
        held = chosen.get(d.sample.uuid)
        if held is None or (held.sample.source != "nvml" and d.sample.source == "nvml"):
            chosen[d.sample.uuid] = d
    children: dict[str, list[DeviceSample]] = defaultdict(list)
    for d in chosen.values():
        if d.sample.kind == "mig" and d.sample.parent_uuid:
            children[d.sample.parent_uuid].append(d.sample)

    def order(d: DeviceStatus) -> tuple[str, bool, int, str]:
        return (d.target, d.sample.index is None, d.sample.index or 0, d.sample.uuid)

    tiles: list[DeviceTile] = []
    for d in sorted(chosen.values(), key=order):
        s = d.sample
        util, metric = _utilisation(s)
        if s.kind == "mig":
            held = chosen.get(s.parent_uuid or "")
            parent = held.sample if held is not None else None
            siblings = children.get(s.parent_uuid or "", [s])
            if parent is not None and parent.memory_total_bytes and s.memory_total_bytes:
                weight = min(s.memory_total_bytes / parent.memory_total_bytes, 1.0)
            else:
                weight = 1.0 / max(len(siblings), 1)
        else:
            weight = 0.0 if children.get(s.uuid) else 1.0
        idle = weight * (1.0 - min(max(util, 0.0), 100.0) / 100.0) if util is not None else None
        tiles.append(
            DeviceTile(
                target=d.target,
                sample=s,
                utilisation_pct=util,
                metric=metric,
                weight=round(weight, 4),
                idle_gpus=idle,
            )
        )
    return tiles
