"""The one NVML call site: ``NvmlLibrary.query`` and how NVML's error codes map.

Every NVML call of the ``nvml`` source goes through ``NvmlLibrary.query``, which
turns NVML's error codes into what a collector can use:

- NOT_SUPPORTED, NO_PERMISSION: ``None``; the (device, reading) pair is remembered and
  not polled again. FunctionNotFound (a driver older than the binding): ``None``; the
  function is remembered for the whole library, which is also how the process
  utilization API falls back to its older form.
- NOT_FOUND, and a base ``NVMLError`` with value 0 (pynvml raises it when a driver
  answers a sizing call with SUCCESS): "no samples", the caller's ``not_found``.
- GPU_IS_LOST, RESET_REQUIRED: ``GpuLost``; that GPU yields an unhealthy
  ``DeviceSample``, the others are read as usual, and the next tick re-enumerates.
- UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH after a successful init
  (the driver unloaded or upgraded under a running collector, NVML shut down):
  ``NvmlStopped``; the source fails that collection with the reason and initialises
  NVML again on the next one.
- anything else: ``None`` for that reading, logged once.
"""

from __future__ import annotations

import importlib
import logging
import types
from typing import Any, Protocol

from collector.errors import CollectError, NvmlUnavailable

__all__ = ["GpuLost", "NoNvidiaGpu", "NvmlLibrary", "NvmlStopped", "QueriedDevice"]

# Messages keep the logger name of the source, which operators filter on.
log = logging.getLogger("collector.sources.nvml")

# NVML return codes (nvml.h ``nvmlReturn_t``; part of the C ABI, so fixed).
_UNINITIALIZED = 1
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

# Of those, the ones that mean the host has no NVIDIA GPU to read at all (no driver
# library, no kernel driver): a fact about the host, not a failure. A version
# mismatch is a GPU host in trouble, and stays a failure.
_INIT_ABSENT = {_LIBRARY_NOT_FOUND, _DRIVER_NOT_LOADED}

# What a call answers when NVML as a whole stopped working after its init: no reading
# of any device can be had until NVML is initialised again (which may fail for good:
# the driver is gone).
_LIBRARY_STOPPED = {
    _UNINITIALIZED: "NVML is no longer initialised",
    _DRIVER_NOT_LOADED: _INIT_UNAVAILABLE[_DRIVER_NOT_LOADED],
    _LIB_RM_VERSION_MISMATCH: _INIT_UNAVAILABLE[_LIB_RM_VERSION_MISMATCH],
}

# Device failures: the value becomes ``DeviceSample.error``.
_DEVICE_FAILURES = {_GPU_IS_LOST: "gpu_is_lost", _RESET_REQUIRED: "reset_required"}


class GpuLost(CollectError, kind="gpu_is_lost"):
    """NVML reports a GPU as lost (fell off the bus) or in need of a reset.

    It never leaves ``NvmlSource.collect``: the GPU is reported with
    ``healthy=False`` and ``error=reason``, and the other GPUs are read as usual.
    """

    def __init__(self, reason: str, fn_name: str) -> None:
        super().__init__(f"{fn_name}: {reason}")
        self.reason = reason


class NvmlStopped(NvmlUnavailable, kind="nvml_unavailable"):
    """NVML stopped answering after a successful init (the kernel driver unloaded or
    upgraded under a running collector). ``NvmlSource.collect`` fails that collection
    with it and initialises NVML again on the next one."""

    def __init__(self, reason: str, fn_name: str) -> None:
        super().__init__(f"NVML stopped answering ({fn_name}): {reason}")
        self.reason = reason


class NoNvidiaGpu(NvmlUnavailable, kind="nvml_absent"):
    """This host has no NVML library or NVIDIA kernel driver: no NVIDIA GPU to read.

    ``NvmlSource.collect`` turns it into a host fact (``HostFacts.nvml_absent``), not
    a failed scrape. ``reason`` says what is missing."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"no NVIDIA GPU on this host: {reason}")
        self.reason = reason


class QueriedDevice(Protocol):
    """What ``NvmlLibrary.query`` needs of the device a reading is about."""

    uuid: str
    # Reading labels that answered NOT_SUPPORTED or NO_PERMISSION: not polled again.
    unsupported: set[str]


class NvmlLibrary:
    """``pynvml`` behind one call site, with what it has learnt about the library.

    ``nvml`` is the ``pynvml`` module (the seam tests replace); it is imported on
    construction when not given, which loads no library until ``init``.
    """

    def __init__(self, nvml: types.ModuleType | None = None) -> None:
        self.nvml: types.ModuleType = (
            nvml if nvml is not None else importlib.import_module("pynvml")
        )
        # Functions (or labelled call forms) this library lacks: FunctionNotFound.
        self.missing: set[str] = set()
        self._logged: set[tuple[str, str, int | None]] = set()
        mismatch = getattr(self.nvml, "NVMLLibraryMismatchError", None)
        self._mismatch_errors: tuple[type[BaseException], ...] = (mismatch,) if mismatch else ()

    def init(self) -> None:
        """``nvmlInit``. Raises ``NoNvidiaGpu`` when there is no library or driver,
        ``NvmlUnavailable`` when they do not match (the caller retries later), and
        ``CollectError`` on any other failure."""
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            reason = _INIT_UNAVAILABLE.get(code) if code is not None else None
            if reason is not None and code in _INIT_ABSENT:
                raise NoNvidiaGpu(reason) from exc
            if reason is not None:
                raise NvmlUnavailable(f"NVML is unavailable: {reason} ({exc})") from exc
            raise CollectError(f"NVML initialisation failed: {exc} (error {code})") from exc

    def shutdown(self) -> None:
        """``nvmlShutdown``; a failure is logged, not raised (nothing is left to do)."""
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as exc:
            log.warning("nvmlShutdown failed: %s", exc)

    def query(
        self,
        fn_name: str,
        *args: Any,
        device: QueriedDevice | None = None,
        label: str | None = None,
        not_found: Any = None,
    ) -> Any:
        """Call ``pynvml.<fn_name>(*args)`` and map its errors (see the module docstring).

        ``label`` names the reading when one function serves several (the memory
        struct versions, clock types); it defaults to ``fn_name`` and is what the
        unsupported and missing sets remember. ``not_found`` is returned for "no
        samples".
        """
        key = label or fn_name
        if key in self.missing or (device is not None and key in device.unsupported):
            return None
        fn = getattr(self.nvml, fn_name)
        retried = False
        while True:
            try:
                return fn(*args)
            except self._mismatch_errors:
                # pynvml's unversioned wrappers raise this when the versioned symbol
                # they call is missing: the same situation as FunctionNotFound.
                return self._unavailable(key, _FUNCTION_NOT_FOUND, device)
            except self.nvml.NVMLError as exc:
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
                if code in _LIBRARY_STOPPED:
                    raise NvmlStopped(_LIBRARY_STOPPED[code], fn_name) from exc
                self._log_once(logging.WARNING, device, key, code, "%s failed: %s", key, exc)
                return None

    def _unavailable(self, key: str, code: int, device: QueriedDevice | None) -> None:
        """Remember that ``key`` cannot be read, so it is not polled again."""
        if code == _FUNCTION_NOT_FOUND:
            self.missing.add(key)
            self._log_once(logging.INFO, None, key, code, "NVML library lacks %s", key)
        elif device is not None:
            device.unsupported.add(key)
            self._log_once(
                logging.DEBUG, device, key, code, "%s: %s unsupported (%d)", device.uuid, key, code
            )
        return None

    def _log_once(
        self,
        level: int,
        device: QueriedDevice | None,
        key: str,
        code: int | None,
        msg: str,
        *args: Any,
    ) -> None:
        marker = (device.uuid if device is not None else "", key, code)
        if marker not in self._logged:
            self._logged.add(marker)
            log.log(level, msg, *args)
