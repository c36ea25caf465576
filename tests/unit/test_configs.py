"""A batcher config becomes the whole model config for Triton's load API and a
config.pbtxt fragment; changes are listed field by field."""

from __future__ import annotations

import json
from pathlib import Path

from collector.analysis.configs import config_changes, config_with, render_pbtxt
from collector.records import BatcherConfig, ConfigChange
from collector.sources.triton import parse_model_config

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "triton"


def test_config_with_keeps_everything_else_and_sets_batching() -> None:
    raw = (FIXTURES / "config_no_batching.json").read_text()
    base = json.loads(raw)
    proposed = BatcherConfig(
        max_batch_size=base["max_batch_size"],
        dynamic_batching=True,
        preferred_batch_sizes=(8, 16),
        max_queue_delay_us=500,
        instance_count=2,
    )
    doc = config_with(raw, proposed)
    assert doc["dynamic_batching"]["preferred_batch_size"] == [8, 16]
    assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert sum(g["count"] for g in doc["instance_group"]) == 2
    for key in ("name", "input", "output", "backend"):
        if key in base:
            assert doc[key] == base[key]
    # What Triton would report back parses to the proposed batcher config.
    parsed = parse_model_config(json.dumps(doc))
    assert BatcherConfig.from_model_config(parsed) == proposed


def test_config_with_turns_batching_off() -> None:
    raw = (FIXTURES / "config_batched.json").read_text()
    doc = config_with(raw, BatcherConfig(max_batch_size=32, dynamic_batching=False))
    assert "dynamic_batching" not in doc
    assert not parse_model_config(json.dumps(doc)).dynamic_batching


def test_changes_and_pbtxt() -> None:
    cur = BatcherConfig(max_batch_size=32)
    new = BatcherConfig(
        max_batch_size=32,
        dynamic_batching=True,
        preferred_batch_sizes=(16,),
        max_queue_delay_us=1000,
        instance_count=2,
    )
    changes = config_changes(cur, new)
    assert changes == (
        ConfigChange("dynamic_batching", False, True),
        ConfigChange("preferred_batch_sizes", [], [16]),
        ConfigChange("max_queue_delay_us", 0, 1000),
        ConfigChange("instance_count", 1, 2),
    )
    assert str(changes[-1]) == "instance_count: 1 -> 2"
    text = render_pbtxt(new, instance_kind="KIND_CPU")
    assert "dynamic_batching {" in text
    assert "preferred_batch_size: [ 16 ]" in text
    assert "max_queue_delay_microseconds: 1000" in text
    assert "{ count: 2, kind: KIND_CPU }" in text
    assert "dynamic_batching" not in render_pbtxt(cur, instance_kind="KIND_AUTO")
    assert "{ count: 1 }" in render_pbtxt(cur, instance_kind="KIND_AUTO")
