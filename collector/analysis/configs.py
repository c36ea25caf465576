"""Turning a ``BatcherConfig`` into what Triton takes: the whole model config as JSON
for the model-repository load API, and the ``config.pbtxt`` fragment a person pastes.

The load API replaces the model's config entirely, so a change is always applied to
the *effective* config Triton reported (``ModelConfig.raw_json``), never sent alone.

The effective config holds what Triton's auto-complete filled in, not only what the
operator wrote. For batching that matters once: when ``dynamic_batching`` is on with no
``preferred_batch_size``, Triton's normalisation sets it to ``[max_batch_size]``
(``NormalizeModelConfig``). The batcher then aims at ``max_batch_size`` — exactly what
it does with no preferred size — so a reported ``[max_batch_size]`` says nothing the
operator chose: :func:`preferred_sizes_origin` calls it ``"auto"``, and
:func:`operator_preferred_sizes` / :func:`effective_batcher` read it as no preferred
sizes. A list that a config we applied set explicitly is the operator's.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any, Literal

from collector.records import BatcherConfig, ConfigChange, ModelConfig

__all__ = [
    "PreferredOrigin",
    "config_changes",
    "config_with",
    "effective_batcher",
    "has_own_batcher_choice",
    "operator_preferred_sizes",
    "preferred_sizes_origin",
    "render_pbtxt",
]

PreferredOrigin = Literal["none", "auto", "operator"]


def preferred_sizes_origin(
    config: ModelConfig, applied: BatcherConfig | None = None
) -> PreferredOrigin:
    """Who set ``config``'s preferred batch sizes: ``"none"`` (there are none, or
    dynamic batching is off), ``"auto"`` (``[max_batch_size]``, what Triton's
    auto-complete fills in when none was given, unless ``applied`` — the config we
    sent — asked for exactly that), else ``"operator"``."""
    sizes = tuple(config.preferred_batch_sizes)
    if not config.dynamic_batching or not sizes:
        return "none"
    if sizes == (config.max_batch_size,) and (
        applied is None or tuple(applied.preferred_batch_sizes) != sizes
    ):
        return "auto"
    return "operator"


def operator_preferred_sizes(
    config: ModelConfig, applied: BatcherConfig | None = None
) -> tuple[int, ...]:
    """The preferred batch sizes the operator chose; ``()`` for Triton's own fill."""
    if preferred_sizes_origin(config, applied) != "operator":
        return ()
    return tuple(config.preferred_batch_sizes)


def effective_batcher(config: ModelConfig, applied: BatcherConfig | None = None) -> BatcherConfig:
    """``config``'s batcher settings with Triton's auto-filled preferred size read as
    none (the batcher behaves the same; a proposal then never lists a change to it)."""
    batcher = BatcherConfig.from_model_config(config)
    if preferred_sizes_origin(config, applied) == "auto":
        batcher = replace(batcher, preferred_batch_sizes=())
    return batcher


def has_own_batcher_choice(config: ModelConfig) -> bool:
    """False for ensembles (they schedule their steps' models, which have their own
    batchers) and sequence-batched models (the sequence batcher owns batching)."""
    if config.platform == "ensemble":
        return False
    try:
        doc = json.loads(config.raw_json)
    except ValueError:
        return True
    return not (isinstance(doc, dict) and "sequence_batching" in doc)


def config_with(base_raw_json: str, proposed: BatcherConfig) -> dict[str, Any]:
    """The effective config ``base_raw_json`` with the batching fields of ``proposed``."""
    doc: dict[str, Any] = copy.deepcopy(json.loads(base_raw_json or "{}"))
    doc["max_batch_size"] = proposed.max_batch_size
    if proposed.dynamic_batching:
        batching = dict(doc.get("dynamic_batching") or {})
        batching["preferred_batch_size"] = list(proposed.preferred_batch_sizes)
        batching["max_queue_delay_microseconds"] = proposed.max_queue_delay_us
        if proposed.max_queue_size or proposed.default_timeout_us:
            policy = dict(batching.get("default_queue_policy") or {})
            policy["max_queue_size"] = proposed.max_queue_size
            policy["default_timeout_microseconds"] = proposed.default_timeout_us
            policy["timeout_action"] = proposed.timeout_action
            batching["default_queue_policy"] = policy
        doc["dynamic_batching"] = batching
    else:
        doc.pop("dynamic_batching", None)
    groups = [dict(g) for g in doc.get("instance_group") or [{"kind": "KIND_AUTO"}]]
    # The count goes to the first group; further groups (other devices) are kept as they
    # are, so the total is the proposed count only for the common one-group case.
    others = sum(int(g.get("count", 1)) for g in groups[1:])
    groups[0]["count"] = max(proposed.instance_count - others, 1)
    doc["instance_group"] = groups
    return doc


def config_changes(current: BatcherConfig, proposed: BatcherConfig) -> tuple[ConfigChange, ...]:
    """Each field that differs, in the order a person reads a config."""
    names = (
        "dynamic_batching",
        "max_batch_size",
        "preferred_batch_sizes",
        "max_queue_delay_us",
        "instance_count",
        "max_queue_size",
        "default_timeout_us",
        "timeout_action",
    )
    changes = []
    for name in names:
        before, after = getattr(current, name), getattr(proposed, name)
        if before != after:
            if isinstance(before, tuple):
                before, after = list(before), list(after)
            changes.append(ConfigChange(field=name, before=before, after=after))
    return tuple(changes)


def render_pbtxt(config: BatcherConfig, *, instance_kind: str = "KIND_CPU") -> str:
    """The ``config.pbtxt`` lines that set ``config`` (batching and instances only)."""
    lines = [f"max_batch_size: {config.max_batch_size}"]
    if config.dynamic_batching:
        lines.append("dynamic_batching {")
        if config.preferred_batch_sizes:
            sizes = ", ".join(str(s) for s in config.preferred_batch_sizes)
            lines.append(f"  preferred_batch_size: [ {sizes} ]")
        lines.append(f"  max_queue_delay_microseconds: {config.max_queue_delay_us}")
        if config.max_queue_size or config.default_timeout_us:
            lines.append("  default_queue_policy {")
            lines.append(f"    timeout_action: {config.timeout_action}")
            lines.append(f"    default_timeout_microseconds: {config.default_timeout_us}")
            lines.append(f"    max_queue_size: {config.max_queue_size}")
            lines.append("  }")
        lines.append("}")
    # KIND_AUTO is Triton's default and is left for Triton to choose.
    kind = f", kind: {instance_kind}" if instance_kind and instance_kind != "KIND_AUTO" else ""
    lines.append("instance_group [")
    lines.append(f"  {{ count: {config.instance_count}{kind} }}")
    lines.append("]")
    return "\n".join(lines) + "\n"
