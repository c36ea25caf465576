"""NVML source: per-GPU, per-MIG-instance and per-process readings from the local driver.

One ``NvmlSource`` per host reads every GPU once per tick through ``pynvml``
(nvidia-ml-py) and returns ``DeviceSample`` and ``ProcessSample`` records.

The shape follows nvitop's device API: typed classes (``Gpu``, ``MigInstance``) whose
reading methods each make at most one NVML call per tick (cached until
``begin_tick()``), and one call site, ``NvmlSource._query``, that turns NVML's error
codes into what a collector can use:

- NOT_SUPPORTED, NO_PERMISSION: ``None``; the (device, reading) pair is remembered and
  not polled again. FunctionNotFound (a driver older than the binding): ``None``; the
  function is remembered for the whole library, which is also how the process
  utilization API falls back to its older form.
- NOT_FOUND, and a base ``NVMLError`` with value 0 (pynvml raises it when a driver
  answers a sizing call with SUCCESS): "no samples", the caller's ``not_found``.
- GPU_IS_LOST, RESET_REQUIRED: ``GpuLost``; that GPU yields an unhealthy
  ``DeviceSample``, the others are read as usual, and the next tick re-enumerates.
- anything else: ``None`` for that reading, logged once.

Units: NVML reports power in milliwatts and energy in millijoules; the records carry
watts and joules. Memory is in bytes, clocks in MHz, utilization in percent.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import time
import types
from collections.abc import Callable
from typing import Any

from collector.errors import CollectError, NvmlUnavailable
from collector.records import DeviceSample, ProcessSample
from collector.sources.base import SourceSpec, register_source

__all__ = ["Gpu", "GpuLost", "MigInstance", "NvmlSource"]

log = logging.getLogger(__name__)

# NVML return codes (nvml.h ``nvmlReturn_t``; part of the C ABI, so fixed).
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_NOT_FOUND = 6
_INSUFFICIENT_SIZE = 7
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_RESET_REQUIRED = 16
_LIB_RM_VERSION_MISMATCH = 18

# Init failures that mean "no usable NVML on this host (yet)": the scheduler logs the
# NvmlUnavailable once and retries; each message says what an operator can do.
_INIT_UNAVAILABLE = {
    _LIBRARY_NOT_FOUND: (
        "libnvidia-ml.so.1 was not found: no NVIDIA driver is installed on this host, "
        "or the library is not on the loader path"
    ),
    _DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
    _LIB_RM_VERSION_MISMATCH: (
        "the NVML library and the loaded kernel driver differ in version (driver upgraded "
        "without reloading the kernel module); reload the nvidia modules or reboot"
    ),
}

# Device failures: the value becomes ``DeviceSample.error``.
_DEVICE_FAILURES = {_GPU_IS_LOST: "gpu_is_lost", _RESET_REQUIRED: "reset_required"}

_MEMORY_V2 = 0x02000028  # nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24
_CLOCK_SM = 1  # NVML_CLOCK_SM
_MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
_GPM_METRICS_GET_VERSION = 1

# GPM metric ids (NVML_GPM_METRIC_*), in percent.
_GPM_SM_UTIL = 2  # share of SMs busy
_GPM_SM_OCCUPANCY = 3  # resident warps / theoretical maximum
_GPM_ANY_TENSOR_UTIL = 5  # share of time any tensor pipe was active
_GPM_METRICS = (_GPM_SM_UTIL, _GPM_SM_OCCUPANCY, _GPM_ANY_TENSOR_UTIL)

# Newest first: the older API is used only when the driver lacks the newer one.
_PROCESS_UTILIZATION_APIS = (
    "nvmlDeviceGetProcessesUtilizationInfo",
    "nvmlDeviceGetProcessUtilization",
)
# First query of a device: samples of the last second, as nvitop does. Asking for
# everything (0) returns an average over the driver's whole buffer, which lags.
_FIRST_WINDOW_US = 1_000_000

_Query = Callable[..., Any]


class GpuLost(CollectError):
    """NVML reports a GPU as lost (fell off the bus) or in need of a reset.

    It never leaves ``NvmlSource.collect``: the GPU is reported with
    ``healthy=False`` and ``error=reason``, and the other GPUs are read as usual.
    """

    error_kind = "gpu_is_lost"

    def __init__(self, reason: str, fn_name: str) -> None:
        super().__init__(f"{fn_name}: {reason}")
        self.reason = reason


class _Device:
    """What the source keeps for one NVML handle (a GPU or a MIG instance) between
    ticks: the handle, the readings known to be unsupported, the GPM samples and
    this tick's cached readings."""

    def __init__(self, query: _Query, handle: Any, uuid: str) -> None:
        self._query = query
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
            self._tick[key] = self._query(fn_name, self.handle, *args, device=self, label=key)
        return self._tick[key]

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
        """GPM metrics (percent) between the previous tick and this one; ``None`` on
        the first tick and where GPM is unsupported."""
        return None if self.gpm is None else self.gpm.tick()

    def release(self) -> None:
        """Free NVML-side resources (the GPM samples)."""
        if self.gpm is not None:
            self.gpm.free()


class Gpu(_Device):
    """A physical GPU, by enumeration index. ``lost`` is set while NVML reports it as
    lost; ``migs`` holds its MIG instances by UUID."""

    def __init__(self, query: _Query, handle: Any, index: int, uuid: str, name: str | None) -> None:
        super().__init__(query, handle, uuid)
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
        return self._read("nvmlDeviceGetPowerUsage")

    def power_limit_mw(self) -> int | None:
        """Enforced power limit in milliwatts [enforced.power.limit]."""
        return self._read("nvmlDeviceGetEnforcedPowerLimit")

    def energy_mj(self) -> int | None:
        """Energy used since the driver was last loaded, in millijoules."""
        return self._read("nvmlDeviceGetTotalEnergyConsumption")

    def sm_clock_mhz(self) -> int | None:
        """Current SM clock in MHz [clocks.sm]."""
        return self._read("nvmlDeviceGetClockInfo", _CLOCK_SM, label="clock_sm")

    def mig_enabled(self) -> bool:
        """Whether MIG mode is currently on [mig.mode.current]; GPUs without MIG answer
        NOT_SUPPORTED, which means off."""
        mode = self._read("nvmlDeviceGetMigMode")
        return mode is not None and mode[0] == _MIG_ENABLED

    def mig_handles(self) -> list[Any]:
        """Handles of the MIG devices that exist now. They are fetched every tick: a
        handle becomes invalid, and may be reused, when its instance is destroyed."""
        count = self._read("nvmlDeviceGetMaxMigDeviceCount") or 0
        handles = []
        for slot in range(count):
            # NOT_FOUND (-> None) is an empty slot.
            handle = self._query(
                "nvmlDeviceGetMigDeviceHandleByIndex",
                self.handle,
                slot,
                device=self,
                label="mig_handle",
            )
            if handle is not None:
                handles.append(handle)
        return handles

    def process_utilization(self, api: str, since_us: int) -> list[Any] | None:
        """Per-process utilization samples newer than ``since_us`` (µs since the epoch)
        from ``api``; ``[]`` when there are none, ``None`` when unsupported (e.g. MIG)."""
        return self._query(api, self.handle, since_us, device=self, not_found=[])

    # -- records

    def sample(self) -> DeviceSample:
        """This tick's ``DeviceSample``. May raise ``GpuLost``."""
        util = self.utilization()
        memory = self.memory()
        power, limit, energy = self.power_mw(), self.power_limit_mw(), self.energy_mj()
        gpm = self.gpm_percent() or {}
        return DeviceSample(
            source="nvml",
            uuid=self.uuid,
            kind="gpu",
            index=self.index,
            name=self.name,
            utilization_gpu_pct=None if util is None else float(util[0]),
            utilization_memory_pct=None if util is None else float(util[1]),
            memory_used_bytes=None if memory is None else memory[0],
            memory_total_bytes=None if memory is None else memory[1],
            power_w=None if power is None else power / 1000.0,
            power_limit_w=None if limit is None else limit / 1000.0,
            energy_j=None if energy is None else energy / 1000.0,
            sm_clock_mhz=self.sm_clock_mhz(),
            sm_active_pct=gpm.get(_GPM_SM_UTIL),
            sm_occupancy_pct=gpm.get(_GPM_SM_OCCUPANCY),
            tensor_active_pct=gpm.get(_GPM_ANY_TENSOR_UTIL),
        )

    def lost_sample(self) -> DeviceSample:
        """The record of a GPU NVML cannot reach: identity only, ``healthy=False``."""
        return DeviceSample(
            source="nvml",
            uuid=self.uuid,
            kind="gpu",
            index=self.index,
            name=self.name,
            healthy=False,
            error=self.lost,
        )

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
        for mig in self.migs.values():
            mig.release()
        self.migs.clear()


class MigInstance(_Device):
    """A MIG device: one compute instance inside a GPU instance of ``parent``.
    Utilization rates and per-process utilization are not supported under MIG;
    memory, processes and GPM (per GPU instance) are."""

    def __init__(
        self,
        query: _Query,
        handle: Any,
        uuid: str,
        parent: Gpu,
        gpu_instance_id: int | None,
        compute_instance_id: int | None,
        name: str | None,
    ) -> None:
        super().__init__(query, handle, uuid)
        self.parent = parent
        self.gpu_instance_id = gpu_instance_id
        self.compute_instance_id = compute_instance_id
        self.name = name

    def sample(self) -> DeviceSample:
        """This tick's ``DeviceSample(kind="mig")``. May raise ``GpuLost``."""
        memory = self.memory()
        gpm = self.gpm_percent() or {}
        return DeviceSample(
            source="nvml",
            uuid=self.uuid,
            kind="mig",
            name=self.name,
            parent_uuid=self.parent.uuid,
            gpu_instance_id=self.gpu_instance_id,
            compute_instance_id=self.compute_instance_id,
            memory_used_bytes=None if memory is None else memory[0],
            memory_total_bytes=None if memory is None else memory[1],
            sm_active_pct=gpm.get(_GPM_SM_UTIL),
            sm_occupancy_pct=gpm.get(_GPM_SM_OCCUPANCY),
            tensor_active_pct=gpm.get(_GPM_ANY_TENSOR_UTIL),
        )


class _GpmSampler:
    """The previous and current GPM sample of one device. GPM metrics are defined
    between two samples (>100 ms apart), so each tick takes a sample, computes the
    metrics against the previous tick's one, and swaps the two buffers."""

    def __init__(
        self,
        nvml: types.ModuleType,
        query: _Query,
        device: _Device,
        take: Callable[[Any], Any],
    ) -> None:
        self._nvml = nvml  # only for its ctypes struct class
        self._query = query
        self._device = device
        self._take = take  # fills a sample buffer through _query; None on failure
        self._buffers: list[Any] | None = None
        self._have_previous = False

    def tick(self) -> dict[int, float | None] | None:
        """Metric id -> percent since the previous tick; ``None`` on the first tick, or
        when a sample could not be taken (the next tick starts a new pair)."""
        if self._buffers is None:
            first = self._query("nvmlGpmSampleAlloc", device=self._device, label="gpm")
            second = self._query("nvmlGpmSampleAlloc", device=self._device, label="gpm")
            if first is None or second is None:
                for buffer in (first, second):
                    if buffer is not None:
                        self._query("nvmlGpmSampleFree", buffer)
                return None
            self._buffers = [first, second]
        previous, current = self._buffers
        if self._take(current) is None:
            self._have_previous = False
            return None
        values = self._metrics(previous, current) if self._have_previous else None
        self._buffers = [current, previous]
        self._have_previous = True
        return values

    def _metrics(self, earlier: Any, later: Any) -> dict[int, float | None] | None:
        request = self._nvml.c_nvmlGpmMetricsGet_t()
        request.version = _GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM_METRICS)
        request.sample1 = earlier
        request.sample2 = later
        for i, metric_id in enumerate(_GPM_METRICS):
            request.metrics[i].metricId = metric_id
        result = self._query("nvmlGpmMetricsGet", request, device=self._device)
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
                self._query("nvmlGpmSampleFree", buffer)
        self._buffers = None
        self._have_previous = False


def _percent(value: int) -> float | None:
    """A per-process utilization in percent, or ``None`` for an impossible value
    (drivers have reported garbage for zombie processes, see nvtop #110)."""
    return float(value) if 0 <= value <= 100 else None


class NvmlSource:
    """Reads every GPU of this host through NVML once per ``collect()``.

    ``target`` names the host the records belong to. ``nvml`` is the ``pynvml``
    module (the seam tests replace); ``clock`` returns Unix seconds and anchors the
    first per-process utilization window of each GPU.

    NVML is initialised on the first ``collect()``; when that fails because there is
    no library or driver, ``collect()`` raises ``NvmlUnavailable`` and tries again on
    its next call. ``close()`` frees the GPM samples and pairs the init with
    ``nvmlShutdown``.
    """

    name = "nvml"

    def __init__(
        self,
        target: str,
        *,
        nvml: types.ModuleType | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if nvml is None:
            import pynvml as nvml  # imported here: it loads no library until nvmlInit
        self.target = target
        self._nvml = nvml
        self._clock = clock
        self._initialized = False
        self._gpus: list[Gpu] = []
        self._stale = True  # enumerate (again) before the next reading
        self._uuid_by_index: dict[int, str] = {}
        # Functions (or labelled call forms) this library lacks: FunctionNotFound.
        self._missing: set[str] = set()
        self._logged: set[tuple[str, str, int | None]] = set()
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        self._mismatch_errors: tuple[type[BaseException], ...] = (mismatch,) if mismatch else ()

    # -- Source protocol

    def collect(self) -> list[DeviceSample | ProcessSample]:
        """One reading of every GPU, its MIG instances and its processes.

        Raises ``NvmlUnavailable`` (no library or driver) or ``CollectError`` (NVML
        cannot count the GPUs). A lost GPU does not raise: it is reported unhealthy.
        """
        self._ensure_initialized()
        if self._stale:
            self._enumerate()
        devices: list[DeviceSample | ProcessSample] = []
        processes: list[DeviceSample | ProcessSample] = []
        for gpu in self._gpus:
            if gpu.lost is not None:
                devices.append(gpu.lost_sample())
                continue
            gpu.begin_tick()
            try:
                gpu_sample = gpu.sample()
                migs = self._mig_instances(gpu)
                mig_samples = [mig.sample() for mig in migs]
                gpu_processes = self._processes(gpu, migs)
            except GpuLost as lost:
                log.warning("GPU %s (index %d) is unreachable: %s", gpu.uuid, gpu.index, lost)
                gpu.mark_lost(lost.reason)
                devices.append(gpu.lost_sample())
                # Re-enumerate next tick: indices and handles may have moved.
                self._stale = True
                continue
            devices.append(gpu_sample)
            devices.extend(mig_samples)
            processes.extend(gpu_processes)
        return devices + processes

    def close(self) -> None:
        """Free GPM samples and shut NVML down (once per successful init)."""
        if not self._initialized:
            return
        for gpu in self._gpus:
            gpu.release()
        self._gpus = []
        self._stale = True
        self._initialized = False
        try:
            self._query("nvmlShutdown", raw=True)
        except self._nvml.NVMLError as exc:
            log.warning("nvmlShutdown failed: %s", exc)

    # -- the one NVML call site

    def _query(
        self,
        fn_name: str,
        *args: Any,
        device: _Device | None = None,
        label: str | None = None,
        not_found: Any = None,
        raw: bool = False,
    ) -> Any:
        """Call ``pynvml.<fn_name>(*args)`` and map its errors (see the module docstring).

        ``label`` names the reading when one function serves several (the memory
        struct versions, clock types); it defaults to ``fn_name`` and is what the
        unsupported and missing sets remember. ``not_found`` is returned for "no
        samples". ``raw=True`` lets every ``NVMLError`` through (init, shutdown).
        """
        key = label or fn_name
        if not raw and (key in self._missing or (device is not None and key in device.unsupported)):
            return None
        fn = getattr(self._nvml, fn_name)
        retried = False
        while True:
            try:
                return fn(*args)
            except self._mismatch_errors:
                # pynvml's unversioned wrappers raise this when the versioned symbol
                # they call is missing: the same situation as FunctionNotFound.
                if raw:
                    raise
                return self._unavailable(key, _FUNCTION_NOT_FOUND, device)
            except self._nvml.NVMLError as exc:
                if raw:
                    raise
                code = getattr(exc, "value", None)
                if code == _INSUFFICIENT_SIZE and not retried:
                    # The list grew between NVML's sizing call and the copy: ask again.
                    retried = True
                    continue
                if code in (_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND):
                    return self._unavailable(key, code, device)
                if code in (_NOT_FOUND, 0):
                    # Value 0: pynvml raises NVMLError(SUCCESS) when a driver answers a
                    # sizing call with SUCCESS, i.e. nothing to copy.
                    return not_found
                if code in _DEVICE_FAILURES:
                    raise GpuLost(_DEVICE_FAILURES[code], fn_name) from exc
                self._log_once(logging.WARNING, device, key, code, "%s failed: %s", key, exc)
                return None

    def _unavailable(self, key: str, code: int, device: _Device | None) -> None:
        """Remember that ``key`` cannot be read, so it is not polled again."""
        if code == _FUNCTION_NOT_FOUND:
            self._missing.add(key)
            self._log_once(logging.INFO, None, key, code, "NVML library lacks %s", key)
        elif device is not None:
            device.unsupported.add(key)
            self._log_once(
                logging.DEBUG, device, key, code, "%s: %s unsupported (%d)", device.uuid, key, code
            )
        return None

    def _log_once(
        self, level: int, device: _Device | None, key: str, code: int | None, msg: str, *args: Any
    ) -> None:
        marker = (device.uuid if device is not None else "", key, code)
        if marker not in self._logged:
            self._logged.add(marker)
            log.log(level, msg, *args)

    # -- lifecycle and enumeration

    def _ensure_initialized(self) -> None:
        if self._initialized:
            return
        try:
            self._query("nvmlInit", raw=True)
        except self._nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            reason = _INIT_UNAVAILABLE.get(code) if code is not None else None
            if reason is not None:
                raise NvmlUnavailable(f"NVML is unavailable: {reason} ({exc})") from exc
            raise CollectError(f"NVML initialisation failed: {exc} (error {code})") from exc
        self._initialized = True
        self._stale = True

    def _enumerate(self) -> None:
        """(Re)build the GPU list, keeping the state of GPUs whose UUID is unchanged."""
        count = self._query("nvmlDeviceGetCount")
        if count is None:
            raise CollectError("NVML could not count the GPUs on this host")
        previous = {gpu.uuid: gpu for gpu in self._gpus}
        gpus: list[Gpu] = []
        for index in range(count):
            try:
                gpu = self._open_gpu(index, previous)
            except GpuLost as lost:
                # Unreachable before we could read its UUID: report it under the UUID it
                # had at the last enumeration, if there was one.
                uuid = self._uuid_by_index.get(index, f"nvml-index-{index}")
                gpu = previous.pop(uuid, None) or Gpu(self._query, None, index, uuid, None)
                gpu.mark_lost(lost.reason)
            if gpu is not None:
                gpus.append(gpu)
        for gone in previous.values():
            gone.release()
        self._gpus = gpus
        self._uuid_by_index = {gpu.index: gpu.uuid for gpu in gpus}
        # A GPU still lost keeps the list stale, so it is retried every tick.
        self._stale = any(gpu.lost is not None for gpu in gpus)

    def _open_gpu(self, index: int, previous: dict[str, Gpu]) -> Gpu | None:
        handle = self._query("nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            log.warning("NVML returned no handle for GPU index %d; skipping it", index)
            return None
        uuid = self._query("nvmlDeviceGetUUID", handle) or f"nvml-index-{index}"
        gpu = previous.pop(uuid, None)
        if gpu is not None:
            gpu.handle, gpu.index, gpu.lost = handle, index, None
            gpu.begin_tick()
        else:
            gpu = Gpu(self._query, handle, index, uuid, self._query("nvmlDeviceGetName", handle))
        try:
            if gpu.gpm is None and self._gpm_supported(gpu):
                gpu.gpm = _GpmSampler(
                    self._nvml,
                    self._query,
                    gpu,
                    lambda buffer, gpu=gpu: self._query(
                        "nvmlGpmSampleGet", gpu.handle, buffer, device=gpu, label="gpm"
                    ),
                )
        except GpuLost as lost:
            # Keep this object (and its UUID) rather than a placeholder.
            gpu.mark_lost(lost.reason)
        return gpu

    def _gpm_supported(self, device: _Device) -> bool:
        support = self._query(
            "nvmlGpmQueryDeviceSupport", device.handle, device=device, label="gpm"
        )
        return support is not None and bool(support.isSupportedDevice)

    def _mig_instances(self, gpu: Gpu) -> list[MigInstance]:
        """The MIG instances of ``gpu`` this tick (none when MIG is off)."""
        if not gpu.mig_enabled():
            for mig in gpu.migs.values():
                mig.release()
            gpu.migs.clear()
            return []
        current: dict[str, MigInstance] = {}
        for handle in gpu.mig_handles():
            uuid = self._query("nvmlDeviceGetUUID", handle)
            if uuid is None:
                continue
            mig = gpu.migs.pop(uuid, None)
            if mig is None:
                mig = self._open_mig(gpu, handle, uuid)
            else:
                mig.handle = handle
            mig.begin_tick()
            current[uuid] = mig
        for gone in gpu.migs.values():  # destroyed since the last tick
            gone.release()
        gpu.migs = current
        return list(current.values())

    def _open_mig(self, gpu: Gpu, handle: Any, uuid: str) -> MigInstance:
        mig = MigInstance(
            self._query,
            handle,
            uuid,
            parent=gpu,
            gpu_instance_id=self._query("nvmlDeviceGetGpuInstanceId", handle),
            compute_instance_id=self._query("nvmlDeviceGetComputeInstanceId", handle),
            name=self._query("nvmlDeviceGetName", handle),
        )
        if gpu.gpm is not None and mig.gpu_instance_id is not None:
            # GPM counts per GPU instance; the sample is taken through the parent.
            mig.gpm = _GpmSampler(
                self._nvml,
                self._query,
                mig,
                lambda buffer, mig=mig: self._query(
                    "nvmlGpmMigSampleGet",
                    mig.parent.handle,
                    mig.gpu_instance_id,
                    buffer,
                    device=mig,
                    label="gpm",
                ),
            )
        return mig

    # -- processes

    def _processes(self, gpu: Gpu, migs: list[MigInstance]) -> list[ProcessSample]:
        """Per-process records of ``gpu``. Under MIG, processes are listed per instance
        (the parent's list needs extra privileges) without utilization, which NVML does
        not offer there."""
        if gpu.mig_enabled():
            return [
                ProcessSample(
                    source="nvml", pid=pid, role="gpu", gpu_uuid=mig.uuid, gpu_memory_bytes=used
                )
                for mig in migs
                for pid, used in (mig.running_processes() or {}).items()
            ]
        running = gpu.running_processes()
        util = self._process_utilization(gpu)
        pids: dict[int, int | None] = dict(running or {})
        for pid in util or {}:
            pids.setdefault(pid, None)
        samples = []
        for pid, used in pids.items():
            if util is None:
                sm = mem = None  # no utilization API on this device: unknown, not idle
            elif pid in util:
                sm, mem = util[pid]
            else:
                # A known process with no sample had no activity in the window.
                sm = mem = 0.0
            samples.append(
                ProcessSample(
                    source="nvml",
                    pid=pid,
                    role="gpu",
                    gpu_uuid=gpu.uuid,
                    sm_util_pct=sm,
                    mem_util_pct=mem,
                    gpu_memory_bytes=used,
                )
            )
        return samples

    def _process_utilization(self, gpu: Gpu) -> dict[int, tuple[float | None, float | None]] | None:
        """pid -> (SM %, memory %) from the newest sample of each process since the
        previous tick; ``{}`` when none, ``None`` when no API works on this GPU."""
        since = gpu.last_seen_us
        if since is None:
            since = int(self._clock() * 1_000_000) - _FIRST_WINDOW_US
        samples = None
        for api in _PROCESS_UTILIZATION_APIS:
            if api in self._missing:
                continue  # the driver predates it; the missing set caches the choice
            samples = gpu.process_utilization(api, since)
            if samples is not None or api not in self._missing:
                break  # an answer, or unsupported on this device (MIG): no fallback
        if samples is None:
            return None
        newest: dict[int, Any] = {}
        for sample in samples:
            held = newest.get(sample.pid)
            if held is None or sample.timeStamp >= held.timeStamp:
                newest[sample.pid] = sample
        gpu.last_seen_us = max([since, *(int(s.timeStamp) for s in samples)])
        return {int(pid): (_percent(s.smUtil), _percent(s.memUtil)) for pid, s in newest.items()}


register_source(
    SourceSpec("nvml", lambda settings, target: NvmlSource(socket.gethostname()), per_target=False)
)
