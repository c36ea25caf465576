"""Synthetic Python-backend models whose cost per execution is known in advance.

Each model costs ``fixed_ms + per_sample_ms × batch`` per ``execute()`` call, where
``batch`` is the number of samples across every request Triton hands to that call.
That is the shape of a real accelerator model (a fixed launch/latency cost plus a
per-sample compute cost), so dynamic batching pays off on the CPU exactly as it does
on a GPU, and the recommender can be checked against a service-time curve whose true
coefficients are known.

The per-sample part is spent as real CPU work (small numpy matrix products run until
its deadline), so per-instance CPU readings from ``/proc`` move with load; the fixed
part is spent sleeping, like waiting on a device.  Running the CPU work against a
deadline rather than a calibrated iteration count keeps the wall-clock cost right on
any machine, even under contention.

The cost coefficients travel in the model config's ``parameters``, so one generic
``model.py`` serves every spec, and a config re-sent through the load API keeps them.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BATCHED_AND_UNBATCHED",
    "INPUT_DIM",
    "INPUT_NAME",
    "OUTPUT_NAME",
    "ModelSpec",
    "write_model_repository",
]

INPUT_NAME = "INPUT0"
OUTPUT_NAME = "OUTPUT0"
INPUT_DIM = 16


@dataclass(frozen=True)
class ModelSpec:
    """One synthetic model: its cost coefficients and its batching/instance settings."""

    name: str
    fixed_ms: float = 4.0
    per_sample_ms: float = 0.5
    max_batch_size: int = 32
    dynamic_batching: bool = False
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    instance_count: int = 1
    #: When set, an ensemble that forwards each request to this model: Triton serves
    #: it without a backend process, so its name may hold what a shell would not take
    #: (the Python backend starts its stub through a shell with the name unquoted).
    ensemble_of: str | None = None

    def __post_init__(self) -> None:
        # Messages start with the field's name, so a config loader can point at it.
        # Triton would reject most of these at load time with a less direct message;
        # failing here names the field and happens before a server is started.
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"name: {self.name!r} is not a usable model directory name")
        if self.fixed_ms < 0:
            raise ValueError(f"fixed_ms: must be >= 0, got {self.fixed_ms}")
        if self.per_sample_ms < 0:
            raise ValueError(f"per_sample_ms: must be >= 0, got {self.per_sample_ms}")
        if self.ensemble_of is not None and (not self.ensemble_of or self.ensemble_of == self.name):
            raise ValueError(f"ensemble_of: must name another model, got {self.ensemble_of!r}")
        if self.max_batch_size < 1:
            # max_batch_size 0 would drop the batch dimension the load generator sends.
            raise ValueError(f"max_batch_size: must be >= 1, got {self.max_batch_size}")
        if self.instance_count < 1:
            raise ValueError(f"instance_count: must be >= 1, got {self.instance_count}")
        if self.max_queue_delay_us < 0:
            raise ValueError(f"max_queue_delay_us: must be >= 0, got {self.max_queue_delay_us}")
        for size in self.preferred_batch_sizes:
            if not 1 <= size <= self.max_batch_size:
                raise ValueError(
                    f"preferred_batch_sizes: {size} is outside 1..max_batch_size "
                    f"({self.max_batch_size})"
                )
        # A tuple keeps the dataclass hashable when a caller passed a list.
        object.__setattr__(self, "preferred_batch_sizes", tuple(self.preferred_batch_sizes))


#: The same model twice, with and without Triton's dynamic batcher: the pair the demo
#: and the end-to-end tests serve, so the unbatched one draws a finding and a
#: recommendation while the batched one shows what batching gives.
BATCHED_AND_UNBATCHED = (
    ModelSpec(
        "batched",
        fixed_ms=4.0,
        per_sample_ms=0.5,
        max_batch_size=32,
        dynamic_batching=True,
        preferred_batch_sizes=(8, 16),
        max_queue_delay_us=2000,
    ),
    ModelSpec("unbatched", fixed_ms=4.0, per_sample_ms=0.5, max_batch_size=32),
)


def _pbtxt_string(text: str) -> str:
    # Protobuf text format takes C-style escapes; JSON's are a subset of them here.
    return json.dumps(text)


def _ensemble_pbtxt(spec: ModelSpec) -> str:
    io = (
        f'input [ {{ name: "{INPUT_NAME}" data_type: TYPE_FP32 dims: [ {INPUT_DIM} ] }} ]\n'
        f'output [ {{ name: "{OUTPUT_NAME}" data_type: TYPE_FP32 dims: [ {INPUT_DIM} ] }} ]'
    )
    step = (
        f"{{ model_name: {_pbtxt_string(spec.ensemble_of or '')} model_version: -1 "
        f'input_map {{ key: "{INPUT_NAME}" value: "{INPUT_NAME}" }} '
        f'output_map {{ key: "{OUTPUT_NAME}" value: "{OUTPUT_NAME}" }} }}'
    )
    return (
        f'name: {_pbtxt_string(spec.name)}\nplatform: "ensemble"\n'
        f"max_batch_size: {spec.max_batch_size}\n{io}\n"
        f"ensemble_scheduling {{ step [ {step} ] }}\n"
    )


def config_pbtxt(spec: ModelSpec) -> str:
    """The ``config.pbtxt`` text for ``spec``."""
    if spec.ensemble_of is not None:
        return _ensemble_pbtxt(spec)
    lines = [
        f"name: {_pbtxt_string(spec.name)}",
        'backend: "python"',
        f"max_batch_size: {spec.max_batch_size}",
        f'input [ {{ name: "{INPUT_NAME}" data_type: TYPE_FP32 dims: [ {INPUT_DIM} ] }} ]',
        f'output [ {{ name: "{OUTPUT_NAME}" data_type: TYPE_FP32 dims: [ {INPUT_DIM} ] }} ]',
        f"instance_group [ {{ kind: KIND_CPU count: {spec.instance_count} }} ]",
    ]
    if spec.dynamic_batching:
        body = []
        if spec.preferred_batch_sizes:
            sizes = ", ".join(str(s) for s in spec.preferred_batch_sizes)
            body.append(f"preferred_batch_size: [ {sizes} ]")
        body.append(f"max_queue_delay_microseconds: {spec.max_queue_delay_us}")
        lines.append("dynamic_batching { " + " ".join(body) + " }")
    for key, value in (("fixed_ms", spec.fixed_ms), ("per_sample_ms", spec.per_sample_ms)):
        lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{value!r}" }} }}')
    return "\n".join(lines) + "\n"


# The model file runs inside Triton's stub process, not in batchscope, so it may only
# use what the stub's interpreter has: numpy and triton_python_backend_utils.
_MODEL_PY = textwrap.dedent(
    '''\
    """Synthetic model written by batchscope's testbed: costs fixed_ms + per_sample_ms x batch."""

    import json
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            params = config.get("parameters", {})
            self.fixed_s = float(params.get("fixed_ms", {}).get("string_value", "4.0")) / 1e3
            self.per_sample_s = (
                float(params.get("per_sample_ms", {}).get("string_value", "0.5")) / 1e3
            )
            rng = np.random.default_rng(0)
            # Output weights: a real (tiny) computation so OUTPUT0 depends on INPUT0.
            self.weights = rng.standard_normal((16, 16)).astype(np.float32)
            # Operand for the CPU burn: 64x64 products take a few microseconds, so the
            # deadline below is overshot by little.
            self.burn = rng.standard_normal((64, 64)).astype(np.float32)

        def _spend_cpu(self, seconds):
            deadline = time.perf_counter() + seconds
            acc = self.burn
            while time.perf_counter() < deadline:
                acc = np.tanh(acc @ self.burn)

        def execute(self, requests):
            start = time.perf_counter()
            inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
            batch = sum(int(x.shape[0]) for x in inputs)
            self._spend_cpu(self.per_sample_s * batch)
            rest = self.fixed_s + self.per_sample_s * batch - (time.perf_counter() - start)
            if rest > 0:
                time.sleep(rest)
            responses = []
            for x in inputs:
                out = (x @ self.weights).astype(np.float32)
                tensor = pb_utils.Tensor("OUTPUT0", out)
                responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
            return responses
    '''
)


def write_model_repository(root: Path, specs: Iterable[ModelSpec]) -> Path:
    """Write one model directory per spec under ``root`` and return ``root``.

    Layout: ``<root>/<name>/config.pbtxt`` and ``<root>/<name>/1/model.py`` (an
    ensemble's version folder stays empty).
    """
    specs = list(specs)
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"duplicate model names: {', '.join(duplicates)}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        version_dir = root / spec.name / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        (root / spec.name / "config.pbtxt").write_text(config_pbtxt(spec))
        if spec.ensemble_of is None:
            (version_dir / "model.py").write_text(_MODEL_PY)
        elif spec.ensemble_of not in names:
            raise ValueError(
                f"ensemble_of: {spec.name!r} forwards to {spec.ensemble_of!r}, "
                f"which is not in the repository"
            )
    return root
