"""A real Triton Inference Server on the CPU, synthetic models, and a load generator.

Used by the demo, the integration tests and the benchmarks.  The names below are
imported lazily: registering the CLI commands must not need the testbed extra
(nvidia-pytriton, tritonclient, numpy) until a command actually runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collector.testbed.load import LoadResult, run_load, run_load_async
    from collector.testbed.models import ModelSpec, write_model_repository
    from collector.testbed.server import TestbedError, TritonServer, find_triton

__all__ = [
    "LoadResult",
    "ModelSpec",
    "TestbedError",
    "TritonServer",
    "find_triton",
    "run_load",
    "run_load_async",
    "write_model_repository",
]

_HOMES = {
    "LoadResult": "load",
    "run_load": "load",
    "run_load_async": "load",
    "ModelSpec": "models",
    "write_model_repository": "models",
    "TestbedError": "server",
    "TritonServer": "server",
    "find_triton": "server",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
