"""NVML source: per-GPU, per-MIG-instance and per-process readings from the local driver.

One ``NvmlSource`` per host reads every GPU once per tick through ``pynvml``
(nvidia-ml-py) and returns ``DeviceSample`` and ``ProcessSample`` records.

The shape follows nvitop's device API, in three modules:

- ``collector.sources.nvml_library``: the one NVML call site, ``NvmlLibrary.query``,
  and how NVML's error codes map (unsupported readings are not polled again; a lost
  GPU raises ``GpuLost``);
- ``collector.sources.nvml_devices``: typed ``Gpu`` and ``MigInstance`` classes whose
  reading methods each make at most one NVML call per tick;
- this module: the source, which (re)enumerates the GPUs and turns their readings
  into records. A lost GPU yields an unhealthy ``DeviceSample``, the others are read
  as usual, and the next tick re-enumerates. The GPU count is asked every tick, so a
  GPU that appears later (hot-plugged, or back after a reset) is enumerated at once.
  NVML that stops answering as a whole after its init (the driver unloaded or
  upgraded under the collector) fails that collection with ``NvmlStopped`` (the
  reason recorded); the next one initialises NVML again.

Units: NVML reports power in milliwatts and energy in millijoules; the records carry
watts and joules. Memory is in bytes, clocks in MHz, utilization in percent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import time
import types
from collections.abc import Callable

from collector.errors import CollectError
from collector.records import DeviceSample, HostFacts, ProcessSample
from collector.sources.base import SourceSpec, register_source
from collector.sources.nvml_devices import (
    GPM_ANY_TENSOR_UTIL,
    GPM_SM_OCCUPANCY,
    GPM_SM_UTIL,
    Gpu,
    MigInstance,
    NvmlDevice,
)
from collector.sources.nvml_library import GpuLost, NoNvidiaGpu, NvmlLibrary, NvmlStopped

__all__ = ["Gpu", "GpuLost", "MigInstance", "NvmlSource"]

log = logging.getLogger(__name__)


class NvmlSource:
    """Reads every GPU of this host through NVML once per ``collect()``.

    ``target`` names the host the records belong to. ``nvml`` is the ``pynvml``
    module (the seam tests replace); ``clock`` returns Unix seconds and anchors the
    first per-process utilization window of each GPU.

    NVML is initialised on the first ``collect()``. A host without NVML's library or
    kernel driver has no NVIDIA GPU to read: that is a fact about the host, not a
    failure, so ``collect()`` returns it as ``HostFacts(nvml_absent=reason)`` (and
    tries NVML again on its next call); NVML that is there but fails (a driver and
    library of different versions) raises ``NvmlUnavailable``. Each successful
    reading also carries ``HostFacts`` (``nvml_absent=None``), so a driver loaded
    later clears the fact. ``close()`` frees the GPM samples and pairs the init with
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
        self.target = target
        self._lib = NvmlLibrary(nvml)
        self._clock = clock
        self._initialized = False
        self._gpus: list[Gpu] = []
        self._stale = True  # enumerate (again) before the next reading
        self._count: int | None = None  # the GPU count NVML gave at the last enumeration
        self._uuid_by_index: dict[int, str] = {}
        self._absent_logged = False

    # -- Source protocol

    def collect(self) -> list[DeviceSample | ProcessSample | HostFacts]:
        """One reading of every GPU, its MIG instances and its processes, and the
        host's facts; on a host without NVIDIA GPU, the facts alone.

        Raises ``NvmlUnavailable`` (a library and driver that do not match) or
        ``CollectError`` (NVML cannot count the GPUs). A lost GPU does not raise: it
        is reported unhealthy.
        """
        try:
            self._ensure_initialized()
        except NoNvidiaGpu as absent:
            if not self._absent_logged:
                log.info("%s; NVML readings are skipped until it appears", absent)
                self._absent_logged = True
            return [self._facts(absent.reason)]
        self._absent_logged = False
        try:
            readings = self._readings()
        except NvmlStopped as stopped:
            log.warning("%s; NVML is initialised again on the next collection", stopped)
            self._forget_nvml()
            raise
        return [self._facts(None), *readings]

    def _facts(self, nvml_absent: str | None) -> HostFacts:
        return HostFacts(
            target=self.target,
            collected_at=self._clock(),
            cpu_count=os.cpu_count() or 1,
            nvml_absent=nvml_absent,
        )

    def _readings(self) -> list[DeviceSample | ProcessSample]:
        if not self._stale and self._lib.query("nvmlDeviceGetCount") != self._count:
            self._stale = True  # a GPU came or went
        if self._stale:
            self._enumerate()
        devices: list[DeviceSample | ProcessSample] = []
        processes: list[DeviceSample | ProcessSample] = []
        for gpu in self._gpus:
            if gpu.lost is not None:
                devices.append(_lost_sample(gpu))
                continue
            gpu.begin_tick()
            try:
                gpu_sample = _gpu_sample(gpu)
                migs = gpu.mig_instances()
                mig_samples = [_mig_sample(mig) for mig in migs]
                gpu_processes = self._processes(gpu, migs)
            except GpuLost as lost:
                log.warning("GPU %s (index %d) is unreachable: %s", gpu.uuid, gpu.index, lost)
                gpu.mark_lost(lost.reason)
                devices.append(_lost_sample(gpu))
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
        self._lib.shutdown()

    def _forget_nvml(self) -> None:
        """Drop every handle of an NVML that stopped answering, so that the next
        collection initialises it again (best effort: it may not answer this either)."""
        for gpu in self._gpus:
            with contextlib.suppress(CollectError):
                gpu.release()
        self._gpus = []
        self._count = None
        self._stale = True
        self._initialized = False
        with contextlib.suppress(CollectError):
            self._lib.shutdown()

    # -- lifecycle and enumeration

    def _ensure_initialized(self) -> None:
        if self._initialized:
            return
        self._lib.init()
        self._initialized = True
        self._stale = True

    def _enumerate(self) -> None:
        """(Re)build the GPU list, keeping the state of GPUs whose UUID is unchanged."""
        count = self._lib.query("nvmlDeviceGetCount")
        if count is None:
            raise CollectError("NVML could not count the GPUs on this host")
        self._count = count
        previous = {gpu.uuid: gpu for gpu in self._gpus}
        gpus: list[Gpu] = []
        for index in range(count):
            try:
                gpu = self._open_gpu(index, previous)
            except GpuLost as lost:
                # Unreachable before we could read its UUID: report it under the UUID it
                # had at the last enumeration, if there was one.
                uuid = self._uuid_by_index.get(index, f"nvml-index-{index}")
                gpu = previous.pop(uuid, None) or Gpu(self._lib, None, index, uuid, None)
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
        handle = self._lib.query("nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            log.warning("NVML returned no handle for GPU index %d; skipping it", index)
            return None
        uuid = self._lib.query("nvmlDeviceGetUUID", handle) or f"nvml-index-{index}"
        gpu = previous.pop(uuid, None)
        if gpu is not None:
            gpu.handle, gpu.index, gpu.lost = handle, index, None
            gpu.begin_tick()
        else:
            name = self._lib.query("nvmlDeviceGetName", handle)
            gpu = Gpu(self._lib, handle, index, uuid, name)
        try:
            gpu.start_gpm()
        except GpuLost as lost:
            # Keep this object (and its UUID) rather than a placeholder.
            gpu.mark_lost(lost.reason)
        return gpu

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
        util = gpu.process_utilization(self._clock())
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


# -- records


def _device_sample(device: NvmlDevice) -> DeviceSample:
    """What every NVML device reports -- memory and GPM -- as the base of its record.
    May raise ``GpuLost``."""
    memory = device.memory()
    gpm = device.gpm_percent() or {}
    return DeviceSample(
        source="nvml",
        uuid=device.uuid,
        memory_used_bytes=None if memory is None else memory[0],
        memory_total_bytes=None if memory is None else memory[1],
        sm_active_pct=gpm.get(GPM_SM_UTIL),
        sm_occupancy_pct=gpm.get(GPM_SM_OCCUPANCY),
        tensor_active_pct=gpm.get(GPM_ANY_TENSOR_UTIL),
    )


def _gpu_sample(gpu: Gpu) -> DeviceSample:
    """This tick's ``DeviceSample`` of a GPU. May raise ``GpuLost``."""
    util = gpu.utilization()
    base = _device_sample(gpu)
    power, limit, energy = gpu.power_mw(), gpu.power_limit_mw(), gpu.energy_mj()
    return dataclasses.replace(
        base,
        kind="gpu",
        index=gpu.index,
        name=gpu.name,
        utilization_gpu_pct=None if util is None else float(util[0]),
        utilization_memory_pct=None if util is None else float(util[1]),
        power_w=None if power is None else power / 1000.0,
        power_limit_w=None if limit is None else limit / 1000.0,
        energy_j=None if energy is None else energy / 1000.0,
        sm_clock_mhz=gpu.sm_clock_mhz(),
    )


def _mig_sample(mig: MigInstance) -> DeviceSample:
    """This tick's ``DeviceSample(kind="mig")``. May raise ``GpuLost``."""
    return dataclasses.replace(
        _device_sample(mig),
        kind="mig",
        name=mig.name,
        parent_uuid=mig.parent.uuid,
        gpu_instance_id=mig.gpu_instance_id,
        compute_instance_id=mig.compute_instance_id,
    )


def _lost_sample(gpu: Gpu) -> DeviceSample:
    """The record of a GPU NVML cannot reach: identity only, ``healthy=False``."""
    return DeviceSample(
        source="nvml",
        uuid=gpu.uuid,
        kind="gpu",
        index=gpu.index,
        name=gpu.name,
        healthy=False,
        error=gpu.lost,
    )


register_source(
    SourceSpec("nvml", lambda settings, target: NvmlSource(socket.gethostname()), per_target=False)
)
