"""ModelStatsParser: the same records and errors as parse_model_stats, document after
document, whatever the shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.errors import ParseError
from collector.sources.triton_json import ModelStatsParser, parse_model_stats

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "triton"


def both(body: bytes, parser: ModelStatsParser | None = None) -> Any:
    """What each parser makes of ``body``: records, or the error's message."""
    results = []
    for parse in ((parser or ModelStatsParser()).parse, parse_model_stats):
        try:
            results.append(parse(body))
        except ParseError as exc:
            results.append(("ParseError", str(exc).split(":")[0]))
    return results


@pytest.mark.parametrize("name", ["stats.json", "stats_two_models.json"])
def test_fixtures_map_to_the_same_records(name: str) -> None:
    fast, slow = both((FIXTURES / name).read_bytes())
    assert fast == slow and len(fast) >= 2


def test_documents_in_a_row_follow_every_change() -> None:
    doc = json.loads((FIXTURES / "stats.json").read_text())
    parser = ModelStatsParser()
    for step in range(6):
        entry = doc["model_stats"][0]
        entry["inference_count"] += 3
        batch = entry["batch_stats"][step % len(entry["batch_stats"])]
        batch["compute_infer"]["count"] += 1
        if step == 3:
            del entry["batch_stats"][-1]  # a batch size gone (a reload)
        if step == 4:
            entry["version"] = "2"  # another version: nothing reused from version 1
        body = json.dumps(doc).encode()
        fast, slow = both(body, parser)
        assert fast == slow


@pytest.mark.parametrize(
    "body",
    [
        b'{"model_stats":[{"name":"m","version":"1","inference_count":"12"}]}',
        b'{"model_stats":[{"name":"m","inference_count":12.0}]}',
        b'{"model_stats":[{"name":"m","inference_count":true}]}',
        b'{"model_stats":[{"name":"m","inference_stats":{"queue":null}}]}',
        b'{"model_stats":[{"name":"m","inference_stats":{"queue":{"count":"7","ns":1}}}]}',
        b'{"model_stats":[{"name":"m","batch_stats":[{"batch_size":2},{"batch_size":2}]}]}',
        b'{"model_stats":[{"name":"m","batch_stats":[{"batch_size":"4"},{"batch_size":1}]}]}',
        b'{"model_stats":[{"name":"m","batch_stats":[{}]}]}',
        b'{"model_stats":[{"version":"1"}]}',
        b'{"model_stats":[{"name":7}]}',
        b'{"model_stats":{"name":"m"}}',
        b'{"model_stats":[["m"]]}',
        b"[]",
        b'{"model_stats":[{"name":"m","last_inference":NaN}]}',
        b'{"model_stats":[{"name":"m","inference_count":123456789012345678901234567890}]}',
        b'{"model_stats":[{"name":',
        b"\xff\xfe",
        b"{}",
    ],
)
def test_odd_documents_give_the_same_records_or_error(body: bytes) -> None:
    fast, slow = both(body)
    assert fast == slow


_count = st.one_of(
    st.integers(min_value=0, max_value=2**63),
    st.integers(min_value=0, max_value=99).map(str),
    st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=1e6),
    st.booleans(),
    st.none(),
)
_duration = st.fixed_dictionaries({}, optional={"count": _count, "ns": _count})
_batch = st.fixed_dictionaries(
    {"batch_size": st.one_of(st.integers(1, 8), _count)},
    optional={k: _duration for k in ("compute_input", "compute_infer", "compute_output")},
)
_entry = st.fixed_dictionaries(
    {"name": st.one_of(st.sampled_from(["a", "b"]), st.integers())},
    optional={
        "version": st.sampled_from(["1", "2", ""]),
        "inference_count": _count,
        "execution_count": _count,
        "last_inference": _count,
        "inference_stats": st.dictionaries(
            st.sampled_from(["success", "fail", "queue", "compute_infer", "cache_hit"]),
            _duration,
        ),
        "batch_stats": st.lists(_batch, max_size=4),
    },
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_entry, max_size=3), min_size=1, max_size=3))
def test_any_sequence_of_documents_maps_like_the_checked_parser(
    documents: list[list[dict[str, Any]]],
) -> None:
    parser = ModelStatsParser()
    for entries in documents:
        body = json.dumps({"model_stats": entries}).encode()
        fast, slow = both(body, parser)
        assert fast == slow
