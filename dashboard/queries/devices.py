"""The devices page: utilisation of every GPU / MIG instance and model-instance
process over a range, bucketed for a heatmap, with memory and power.

Device rows come from rollups (plus the raw tail) beyond ``RAW_RANGE_S`` and from raw
samples below; process rows from the database's per-bucket process averages over at
most the last ``RAW_FALLBACK_S`` (processes come and go, so they have no rollups).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from collector.records import DeviceSample
from collector.store import DeviceRollup, Store
from dashboard.queries.views import RAW_FALLBACK_S, RAW_RANGE_S, DevicesView, HeatRow

__all__ = ["read_devices"]


def _bucketed(
    points: Iterable[tuple[str, str, float, float | None]],
    since: float,
    bucket_s: float,
    buckets: int,
) -> list[HeatRow]:
    """(label, kind, time, value) points averaged per label and time bucket."""
    sums: dict[tuple[str, str], list[list[float]]] = {}
    for label, kind, at, value in points:
        if value is None or not math.isfinite(value):
            continue
        i = int((at - since) // bucket_s)
        if 0 <= i < buckets:
            acc = sums.get((label, kind))
            if acc is None:
                acc = sums[(label, kind)] = [[0.0, 0.0] for _ in range(buckets)]
            acc[i][0] += value
            acc[i][1] += 1
    return [
        HeatRow(label=label, kind=kind, values=[a[0] / a[1] if a[1] else None for a in acc])
        for (label, kind), acc in sorted(sums.items())
    ]


def _device_label(target: str, s: DeviceSample) -> str:
    index = s.index if s.index is not None else ""
    return f"{target} · {s.name or s.kind} {index} ({s.uuid[-8:]})"


_Point = tuple[str, str, float, float | None]  # (label, kind, time, value)


def read_devices(
    store: Store, *, since: float, until: float, name: str, max_points: int
) -> DevicesView:
    bucket_s = max((until - since) / max_points, 1.0)
    buckets = max(int(math.ceil((until - since) / bucket_s)), 1)
    utilisation, memory, power, truncated_to_s = _device_points(store, since, until)
    processes, metric, process_since = _process_rows(store, since, until, bucket_s, buckets)
    return DevicesView(
        range_name=name,
        since=since,
        until=until,
        t=[since + i * bucket_s for i in range(buckets)],
        devices=_bucketed(utilisation, since, bucket_s, buckets),
        processes=processes,
        process_metric=metric,
        process_window_s=until - process_since if process_since > since else None,
        devices_truncated_to_s=truncated_to_s,
        memory_used_gb=_bucketed(memory, since, bucket_s, buckets),
        power_w=_bucketed(power, since, bucket_s, buckets),
        no_gpu_hosts=_no_gpu_hosts(store),
    )


def _no_gpu_hosts(store: Store) -> dict[str, str]:
    """The hosts whose NVML source found no NVIDIA GPU (no library or driver), with
    the reason: why the GPU panels of the page are empty."""
    out: dict[str, str] = {}
    for t in store.targets():
        facts = store.host_facts(t.name) if t.kind == "host" else None
        if facts is not None and facts.nvml_absent:
            out[t.name] = facts.nvml_absent
    return out


def _device_points(
    store: Store,
    since: float,
    until: float,
) -> tuple[list[_Point], list[_Point], list[_Point], float | None]:
    """Utilisation, memory (GB) and power points of every device: from rollups (up to
    the last closed bucket) and the raw samples after them beyond ``RAW_RANGE_S``;
    from raw samples below. The last item is set when a long range without rollups
    was read raw over only its last ``RAW_FALLBACK_S``."""
    raw_since = since
    rollups: list[DeviceRollup] = []
    truncated_to_s: float | None = None
    if until - since > RAW_RANGE_S:
        rollups = store.device_rollups(since=since, until=until)
        if rollups:
            width = min(r.bucket_s for r in rollups)
            rollups = [r for r in rollups if r.bucket_s == width]
            raw_since = max(r.bucket_start + r.bucket_s for r in rollups)
        else:
            raw_since = max(since, until - RAW_FALLBACK_S)
            truncated_to_s = until - raw_since if raw_since > since else None

    utilisation: list[_Point] = []
    memory: list[_Point] = []
    power: list[_Point] = []
    raw = store.device_samples(since=raw_since, until=until)
    labels = {(d.target, d.sample.uuid): _device_label(d.target, d.sample) for d in raw}

    def add(label: str, at: float, reading: DeviceSample) -> None:
        kind = reading.kind
        # SM activity (GPM) when read, else the coarser utilisation counter.
        busy = reading.sm_active_pct
        utilisation.append(
            (label, kind, at, busy if busy is not None else reading.utilization_gpu_pct)
        )
        if reading.memory_used_bytes is not None:
            memory.append((label, kind, at, reading.memory_used_bytes / 1e9))
        power.append((label, kind, at, reading.power_w))

    for r in rollups:  # a bucket's means, at its middle
        add(
            labels.get((r.target, r.uuid), f"{r.target} · {r.kind} ({r.uuid[-8:]})"),
            r.bucket_start + r.bucket_s / 2,
            r.mean,
        )
    for d in raw:
        add(labels[(d.target, d.sample.uuid)], d.collected_at, d.sample)
    return utilisation, memory, power, truncated_to_s


def _process_rows(
    store: Store, since: float, until: float, bucket_s: float, buckets: int
) -> tuple[list[HeatRow], str, float]:
    """One row per model-instance process over at most the last ``RAW_FALLBACK_S``:
    NVML's SM share when any process has one, else each Python-backend stub's CPU;
    with the metric's name and where the rows start."""
    process_since = max(since, until - RAW_FALLBACK_S)
    # Process buckets count from ``since`` so their cells line up with the devices'.
    skipped = int((process_since - since) // bucket_s)
    cells = store.process_buckets(since=since + skipped * bucket_s, until=until, bucket_s=bucket_s)
    gpu_cells = [c for c in cells if c.sm_util_pct is not None]
    metric = "SM % (NVML)" if gpu_cells else "CPU % of one core"
    rows: dict[str, list[float | None]] = {}
    for c in gpu_cells or [c for c in cells if c.role == "stub"]:
        label = f"{c.target} · {c.instance_name or c.model or c.role} (pid {c.pid})"
        values = rows.setdefault(label, [None] * buckets)
        if 0 <= skipped + c.bucket < buckets:
            values[skipped + c.bucket] = c.sm_util_pct if gpu_cells else c.cpu_pct
    return (
        [
            HeatRow(label=label, kind="process", values=values)
            for label, values in sorted(rows.items())
        ],
        metric,
        process_since,
    )
