"""The per-scrape batch compute time equals the sum over ``batch_stats_increase``, the
records it is the shortcut for; and what counts as an execution at one batch size."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.analysis.rates import _batch_compute_ns_increase, batch_stats_increase
from collector.records import BatchStat, Duration
from collector.sources.triton_json import parse_model_stats

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "triton"

_durations = st.builds(Duration, st.integers(0, 50), st.integers(0, 10**6))
_batches = st.lists(
    st.builds(BatchStat, st.integers(1, 6), _durations, _durations, _durations), max_size=6
)


@settings(max_examples=300, deadline=None)
@given(_batches, _batches, st.booleans())
def test_batch_time_increase_is_the_sum_over_the_increase_records(
    prev: list[BatchStat], cur: list[BatchStat], reset: bool
) -> None:
    expected = sum(b.compute_ns for b in batch_stats_increase(prev, cur, reset=reset))
    assert _batch_compute_ns_increase(() if reset else prev, cur) == expected


def test_executions_per_batch_size_add_up_to_the_execution_count() -> None:
    """Triton counts one execution at a batch size in that size's compute_infer.count
    (a batch_stats entry has no execution count of its own): the counts over all
    sizes are the model's execution_count."""
    before = json.loads((FIXTURES / "stats.json").read_text())
    after = json.loads(json.dumps(before))
    entry = after["model_stats"][0]
    for size, runs in ((1, 3), (8, 2)):
        batch = next(b for b in entry["batch_stats"] if b["batch_size"] == size)
        for key in ("compute_input", "compute_infer", "compute_output"):
            batch[key]["count"] += runs
            batch[key]["ns"] += runs * 1000
    entry["execution_count"] += 5
    entry["inference_count"] += 3 * 1 + 2 * 8
    (old, *_), (new, *_) = (parse_model_stats(json.dumps(d)) for d in (before, after))
    assert sum(b.exec_count for b in old.batch_stats) == old.execution_count
    increase = batch_stats_increase(old.batch_stats, new.batch_stats)
    assert {b.batch_size: b.exec_count for b in increase} == {1: 3, 8: 2}
    assert sum(b.exec_count for b in increase) == new.execution_count - old.execution_count
