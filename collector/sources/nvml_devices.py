"""Typed NVML devices, after nvitop's device API: ``Gpu`` and its ``MigInstance``s.

Each reading method makes at most one NVML call per tick (cached until
``begin_tick()``), through the one call site ``NvmlLibrary.query``. The classes keep
what must live between ticks -- handles, readings known to be unsupported, GPM sample
buffers, the newest per-process utilization timestamp, the MIG instances -- and return
plain readings; ``collector.sources.nvml`` turns them into records.

Units are NVML's: power in milliwatts, energy in millijoules, memory in bytes, clocks
in MHz, utilization in percent.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from collector.sources.nvml_library import GpuLost, NvmlLibrary

__all__ = [
    "GPM_ANY_TENSOR_UTIL",
    "GPM_SM_OCCUPANCY",
    "GPM_SM_UTIL",
    "Gpu",
    "MigInstance",
    "NvmlDevice",
    "ProcessUtilization",
]

_MEMORY_V2 = 0x02000028  # nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24
_CLOCK_SM = 1  # NVML_CLOCK_SM
_MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
_GPM_METRICS_GET_VERSION = 1

# GPM metric ids (NVML_GPM_METRIC_*), in percent.
GPM_SM_UTIL = 2  # share of SMs busy
GPM_SM_OCCUPANCY = 3  # resident warps / theoretical maximum
GPM_ANY_TENSOR_UTIL = 5  # share of time any tensor pipe was active
_GPM_METRICS = (GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_ANY_TENSOR_UTIL)

# Newest first: the older API is used only when the driver lacks the newer one.
_PROCESS_UTILIZATION_APIS = (
    "nvmlDeviceGetProcessesUtilizationInfo",
    "nvmlDeviceGetProcessUtilization",
)
# First query of a device: samples of the last second, as nvitop does. Asking for
# everything (0) returns an average over the driver's whole buffer, which lags.
_FIRST_WINDOW_US = 1_000_000

# pid -> (SM %, memory %), either None when the driver's value is impossible.
ProcessUtilization = dict[int, tuple[float | None, float | None]]


class NvmlDevice:
    """What the source keeps for one NVML handle (a GPU or a MIG instance) between
    ticks: the handle, the readings known to be unsupported, the GPM samples and
    this tick's cached readings."""

    def __init__(self, lib: NvmlLibrary, handle: Any, uuid: str) -> None:
        self._lib = lib
        self.handle = handle
        self.uuid = uuid
        # Reading labels that answered NOT_SUPPORTED or NO_PERMISSION: not polled again.
        self.unsupported: set[str] = set()
        self.gpm: _GpmSampler | None = None
        self._tick: dict[str, Any] = {}

    def begin_tick(self) -> None:
        """Forget the cached readings, so the next call of each reading asks NVML."""
        self._tick.clear()

    def _read(self, fn_name: str, *args: Any, label: str | None = None) -> Any:
        """One NVML reading of this device, cached until ``begin_tick`` (nvitop's
        ``oneshot``), so two records built from it cost one call."""
        key = label or fn_name
        if key not in self._tick:
            self._tick[key] = self._lib.query(fn_name, self.handle, *args, device=self, label=key)
        return self._tick[key]

    def _read_int(self, fn_name: str, *args: Any, label: str | None = None) -> int | None:
        value = self._read(fn_name, *args, label=label)
        return None if value is None else int(value)

    def memory(self) -> tuple[int, int] | None:
        """``(used, total)`` device memory in bytes.

        The v2 struct's ``used`` excludes the driver-reserved part, as nvidia-smi
        shows it; drivers without v2 fall back to v1, whose ``used`` includes it.
        """
        info = self._read("nvmlDeviceGetMemoryInfo", _MEMORY_V2, label="memory_v2")
        if info is None:
            info = self._read("nvmlDeviceGetMemoryInfo", label="memory_v1")
        return None if info is None else (int(info.used), int(info.total))

    def running_processes(self) -> dict[int, int | None] | None:
        """Compute processes on this device: pid -> used GPU memory in bytes
        (``None`` where NVML reports it as not available); ``None`` if unsupported."""
        procs = self._read("nvmlDeviceGetComputeRunningProcesses")
        if procs is None:
            return None
        out: dict[int, int | None] = {}
        for proc in procs:
            used = proc.usedGpuMemory
            out.setdefault(int(proc.pid), None if used is None else int(used))
        return out

    def gpm_percent(self) -> dict[int, float | None] | None:
        """GPM metrics (percent) between the previous tick and this one, by metric id
        (``GPM_*``); ``None`` on the first tick and where GPM is unsupported."""
        return None if self.gpm is None else self.gpm.tick()

    def take_gpm_sample(self, buffer: Any) -> Any:
        """Fill a GPM sample buffer for this device; ``None`` on failure."""
        raise NotImplementedError

    def release(self) -> None:
        """Free NVML-side resources (the GPM samples)."""
        if self.gpm is not None:
            self.gpm.free()


class Gpu(NvmlDevice):
    """A physical GPU, by enumeration index. ``lost`` is set while NVML reports it as
    lost; ``migs`` holds its MIG instances by UUID."""

    def __init__(
        self, lib: NvmlLibrary, handle: Any, index: int, uuid: str, name: str | None
    ) -> None:
        super().__init__(lib, handle, uuid)
        self.index = index
        self.name = name
        self.lost: str | None = None
        self.migs: dict[str, MigInstance] = {}
        # Newest process-utilization timestamp seen, in µs since the epoch. pynvml drops
        # the lastSeenTimeStamp NVML fills in, so the source keeps its own.
        self.last_seen_us: int | None = None

    # -- readings (``nvidia-smi --query-gpu=`` names in brackets)

    def utilization(self) -> tuple[int, int] | None:
        """``(gpu, memory)`` in percent over the driver's last sample period (1/6 s to
        1 s): time with at least one kernel running [utilization.gpu], and time device
        memory was read or written [utilization.memory]. Not supported under MIG."""
        util = self._read("nvmlDeviceGetUtilizationRates")
        return None if util is None else (int(util.gpu), int(util.memory))

    def power_mw(self) -> int | None:
        """Board power draw in milliwatts [power.draw]; a 1 s average on Ampere and
        newer (except GA100), instantaneous before."""
        return self._read_int("nvmlDeviceGetPowerUsage")

    def power_limit_mw(self) -> int | None:
        """Enforced power limit in milliwatts [enforced.power.limit]."""
        return self._read_int("nvmlDeviceGetEnforcedPowerLimit")

    def energy_mj(self) -> int | None:
        """Energy used since the driver was last loaded, in millijoules."""
        return self._read_int("nvmlDeviceGetTotalEnergyConsumption")

    def sm_clock_mhz(self) -> int | None:
        """Current SM clock in MHz [clocks.sm]."""
        return self._read_int("nvmlDeviceGetClockInfo", _CLOCK_SM, label="clock_sm")

    def mig_enabled(self) -> bool:
        """Whether MIG mode is currently on [mig.mode.current]; GPUs without MIG answer
        NOT_SUPPORTED, which means off."""
        mode = self._read("nvmlDeviceGetMigMode")
        return mode is not None and mode[0] == _MIG_ENABLED

    def process_utilization(self, now_s: float) -> ProcessUtilization | None:
        """pid -> (SM %, memory %) from the newest sample of each process since the
        previous tick (the last second on the first); ``{}`` when none, ``None`` when no
        API works on this GPU (e.g. under MIG)."""
        since = self.last_seen_us
        if since is None:
            since = int(now_s * 1_000_000) - _FIRST_WINDOW_US
        samples = None
        for api in _PROCESS_UTILIZATION_APIS:
            if api in self._lib.missing:
                continue  # the driver predates it; the missing set caches the choice
            samples = self._lib.query(api, self.handle, since, device=self, not_found=[])
            if samples is not None or api not in self._lib.missing:
                break  # an answer, or unsupported on this device (MIG): no fallback
        if samples is None:
            return None
        newest: dict[int, Any] = {}
        for sample in samples:
            held = newest.get(sample.pid)
            if held is None or sample.timeStamp >= held.timeStamp:
                newest[sample.pid] = sample
        self.last_seen_us = max([since, *(int(s.timeStamp) for s in samples)])
        return {int(pid): (_percent(s.smUtil), _percent(s.memUtil)) for pid, s in newest.items()}

    # -- GPM and MIG

    def start_gpm(self) -> None:
        """Start GPM sampling, once, when the GPU supports it. May raise ``GpuLost``."""
        if self.gpm is not None:
            return
        support = self._lib.query(
            "nvmlGpmQueryDeviceSupport", self.handle, device=self, label="gpm"
        )
        if support is not None and bool(support.isSupportedDevice):
            self.gpm = _GpmSampler(self._lib, self)

    def take_gpm_sample(self, buffer: Any) -> Any:
        return self._lib.query("nvmlGpmSampleGet", self.handle, buffer, device=self, label="gpm")

    def mig_instances(self) -> list[MigInstance]:
        """The MIG instances of this GPU this tick (none when MIG is off). Handles are
        fetched every tick: a handle becomes invalid, and may be reused, when its
        instance is destroyed; an instance keeps its state while its UUID lives."""
        if not self.mig_enabled():
            self._drop_migs()
            return []
        current: dict[str, MigInstance] = {}
        for handle in self._mig_handles():
            uuid = self._lib.query("nvmlDeviceGetUUID", handle)
            if uuid is None:
                continue
            kept = self.migs.pop(uuid, None)
            if kept is None:
                kept = MigInstance.open(self._lib, handle, uuid, self)
            else:
                kept.handle = handle
            kept.begin_tick()
            current[uuid] = kept
        self._drop_migs()  # what is left was destroyed since the last tick
        self.migs = current
        return list(current.values())

    def _mig_handles(self) -> list[Any]:
        count = self._read("nvmlDeviceGetMaxMigDeviceCount") or 0
        handles = []
        for slot in range(count):
            # NOT_FOUND (-> None) is an empty slot.
            handle = self._lib.query(
                "nvmlDeviceGetMigDeviceHandleByIndex",
                self.handle,
                slot,
                device=self,
                label="mig_handle",
            )
            if handle is not None:
                handles.append(handle)
        return handles

    def _drop_migs(self) -> None:
        for mig in self.migs.values():
            mig.release()
        self.migs.clear()

    # -- lifecycle

    def mark_lost(self, reason: str) -> None:
        """Remember the failure and drop what depends on live handles: GPM samples
        (the next pair would straddle the outage), MIG instances, the last-seen time."""
        self.lost = reason
        self.release()
        self.gpm = None
        self.last_seen_us = None
        self.begin_tick()

    def release(self) -> None:
        super().release()
        self._drop_migs()


class MigInstance(NvmlDevice):
    """A MIG device: one compute instance inside a GPU instance of ``parent``.
    Utilization rates and per-process utilization are not supported under MIG;
    memory, processes and GPM (per GPU instance) are."""

    def __init__(
        self,
        lib: NvmlLibrary,
        handle: Any,
        uuid: str,
        parent: Gpu,
        gpu_instance_id: int | None,
        compute_instance_id: int | None,
        name: str | None,
    ) -> None:
        super().__init__(lib, handle, uuid)
        self.parent = parent
        self.gpu_instance_id = gpu_instance_id
        self.compute_instance_id = compute_instance_id
        self.name = name

    @classmethod
    def open(cls, lib: NvmlLibrary, handle: Any, uuid: str, parent: Gpu) -> MigInstance:
        """A MIG instance seen for the first time: its identity, and GPM when the
        parent samples it (GPM counts per GPU instance)."""
        mig = cls(
            lib,
            handle,
            uuid,
            parent=parent,
            gpu_instance_id=lib.query("nvmlDeviceGetGpuInstanceId", handle),
            compute_instance_id=lib.query("nvmlDeviceGetComputeInstanceId", handle),
            name=lib.query("nvmlDeviceGetName", handle),
        )
        if parent.gpm is not None and mig.gpu_instance_id is not None:
            mig.gpm = _GpmSampler(lib, mig)
        return mig

    def take_gpm_sample(self, buffer: Any) -> Any:
        # The sample is taken through the parent, for this GPU instance.
        return self._lib.query(
            "nvmlGpmMigSampleGet",
            self.parent.handle,
            self.gpu_instance_id,
            buffer,
            device=self,
            label="gpm",
        )


class _GpmSampler:
    """The previous and current GPM sample of one device. GPM metrics are defined
    between two samples (>100 ms apart), so each tick takes a sample, computes the
    metrics against the previous tick's one, and swaps the two buffers."""

    def __init__(self, lib: NvmlLibrary, device: NvmlDevice) -> None:
        self._lib = lib
        self._device = device  # fills a sample buffer: take_gpm_sample
        self._buffers: list[Any] | None = None
        self._have_previous = False

    def tick(self) -> dict[int, float | None] | None:
        """Metric id -> percent since the previous tick; ``None`` on the first tick, or
        when a sample could not be taken (the next tick starts a new pair)."""
        if self._buffers is None:
            self._buffers = self._allocate()
            if self._buffers is None:
                return None
        previous, current = self._buffers
        if self._device.take_gpm_sample(current) is None:
            self._have_previous = False
            return None
        values = self._metrics(previous, current) if self._have_previous else None
        self._buffers = [current, previous]
        self._have_previous = True
        return values

    def _allocate(self) -> list[Any] | None:
        first = self._lib.query("nvmlGpmSampleAlloc", device=self._device, label="gpm")
        second = self._lib.query("nvmlGpmSampleAlloc", device=self._device, label="gpm")
        if first is not None and second is not None:
            return [first, second]
        for buffer in (first, second):
            if buffer is not None:
                self._lib.query("nvmlGpmSampleFree", buffer)
        return None

    def _metrics(self, earlier: Any, later: Any) -> dict[int, float | None] | None:
        request = self._lib.nvml.c_nvmlGpmMetricsGet_t()
        request.version = _GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM_METRICS)
        request.sample1 = earlier
        request.sample2 = later
        for i, metric_id in enumerate(_GPM_METRICS):
            request.metrics[i].metricId = metric_id
        result = self._lib.query("nvmlGpmMetricsGet", request, device=self._device)
        if result is None:
            return None
        values: dict[int, float | None] = {}
        for i, metric_id in enumerate(_GPM_METRICS):
            metric = result.metrics[i]
            # Each metric carries its own status; one the GPU cannot count stays None.
            ok = metric.nvmlReturn == 0 and math.isfinite(metric.value)
            values[metric_id] = float(metric.value) if ok else None
        return values

    def free(self) -> None:
        """Return both buffers to NVML."""
        for buffer in self._buffers or ():
            # The buffers are host memory: a GPU lost meanwhile does not matter here.
            with contextlib.suppress(GpuLost):
                self._lib.query("nvmlGpmSampleFree", buffer)
        self._buffers = None
        self._have_previous = False


def _percent(value: int) -> float | None:
    """A per-process utilization in percent, or ``None`` for an impossible value
    (drivers have reported garbage for zombie processes, see nvtop #110)."""
    return float(value) if 0 <= value <= 100 else None
