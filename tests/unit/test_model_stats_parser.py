"""ModelStatsParser: the same records and errors as parse_model_stats, document after
document, whatever the shape."""

from __future__ import annotations

import json
import operator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.errors import ParseError
from collector.records import BATCH_STAT_FIGURES
from collector.sources.triton_json import ModelStatsParser, _StatsScanner, parse_model_stats

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "triton"


def both(body: bytes, parser: ModelStatsParser | None = None) -> Any:
    """What each parser makes of ``body``: records, or the error's message."""
    results: list[Any] = []
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


# --------------------------------------------------------------------------- Triton's layout
# Documents laid out exactly as Triton writes them, which the parser reads from their
# bytes (its first tier): every key, in Triton's order.

_number = st.one_of(st.integers(0, 3), st.integers(0, 2**64 - 1))


def _span(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


_spans = st.builds(_span, _number, _number)
_batch_entry = st.builds(
    lambda size, a, b, c: {
        "batch_size": size,
        "compute_input": a,
        "compute_infer": b,
        "compute_output": c,
    },
    st.integers(1, 64),
    _spans,
    _spans,
    _spans,
)
_triton_entry = st.builds(
    lambda name, version, counts, durations, response, batches, memory: {
        "name": name,
        "version": version,
        "last_inference": counts[0],
        "inference_count": counts[1],
        "execution_count": counts[2],
        "inference_stats": dict(
            zip(
                [
                    "success",
                    "fail",
                    "queue",
                    "compute_input",
                    "compute_infer",
                    "compute_output",
                    "cache_hit",
                    "cache_miss",
                ],
                durations,
                strict=True,
            )
        ),  # fmt: skip
        "response_stats": response,
        "batch_stats": batches,
        "memory_usage": memory,
    },
    st.sampled_from(["mlp", "m x", "résumé", "a}}]b", "m-2"]),
    st.sampled_from(["1", "2", ""]),
    st.tuples(_number, _number, _number),
    st.lists(_spans, min_size=8, max_size=8),
    st.sampled_from([{}, {"1": {"success": _span(3, 4)}}, {"x": '}}],"batch_stats":['}]),
    st.lists(_batch_entry, max_size=5).map(
        lambda bs: sorted({b["batch_size"]: b for b in bs}.values(), key=lambda b: b["batch_size"])
    ),
    st.sampled_from([[], [{"type": "GPU", "id": 0, "byte_size": 1}], ['},{"name":']]),
)


_figures_of = operator.attrgetter(*BATCH_STAT_FIGURES)


def _triton_json(entries: list[dict[str, Any]], spaced: bool) -> bytes:
    separators = (", ", ": ") if spaced else (",", ":")
    return json.dumps({"model_stats": entries}, separators=separators).encode()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_triton_entry, min_size=1, max_size=3), min_size=1, max_size=4))
def test_documents_in_triton_layout_map_like_the_checked_parser(
    documents: list[list[dict[str, Any]]],
) -> None:
    parser = ModelStatsParser()
    for i, entries in enumerate(documents):
        body = _triton_json(entries, spaced=i % 2 == 1)
        parsed = parser.parse(body)
        assert parsed == parse_model_stats(body)
        # The figures the fast path sets as it reads an entry are the entry's own.
        batches = [b for s in parsed for b in s.batch_stats]
        assert [b.figures for b in batches] == [_figures_of(b) for b in batches]


def test_a_changing_batch_list_keeps_unchanged_entries_and_reads_the_rest() -> None:
    doc = json.loads((FIXTURES / "stats.json").read_text())
    parser = ModelStatsParser()
    first = parser.parse(_triton_json(doc["model_stats"], spaced=False))
    batches = doc["model_stats"][0]["batch_stats"]
    batches[3]["compute_infer"]["count"] += 1
    batches.insert(5, {**batches[5], "batch_size": 99})  # out of order: sorted as checked
    body = _triton_json(doc["model_stats"], spaced=False)
    second = parser.parse(body)
    assert second == parse_model_stats(body)
    del batches[5]
    body = _triton_json(doc["model_stats"], spaced=False)
    third = parser.parse(body)
    assert third == parse_model_stats(body)
    # An unchanged batch size keeps its record from the document before.
    assert third[0].batch_stats[0] is first[0].batch_stats[0]
    assert third[0].batch_stats[3] != first[0].batch_stats[3]


@pytest.mark.parametrize(
    "edit",
    [
        (b'"count":229,', b'"count":0229,'),  # a leading zero: not JSON
        (b'"count":229,', b'"count":-229,'),
        (b'"count":229,', b'"count":229.0,'),
        (b'"count":229,', b'"count":"229",'),
        (b'"name":"batched"', b'"name":"bat\\u0063hed"'),
        (b'"memory_usage":[]', b'"memory_usage":[}'),
        (b'"response_stats":{}', b'"response_stats":{"a":}'),
        (b'"batch_size":2,', b'"batch_size":1,'),  # a repeated size: both kept
        (b'"batch_stats":[', b'"batch_stats" :['),
        (b"]}", b"]} "),
    ],
)
def test_a_document_near_triton_layout_maps_or_fails_like_the_checked_parser(
    edit: tuple[bytes, bytes],
) -> None:
    body = (FIXTURES / "stats.json").read_bytes().strip()
    old, new = edit
    assert old in body
    edited = body.replace(old, new, 1)
    parser = ModelStatsParser()
    parser.parse(body)  # what it read before must not change what it reads now
    fast, slow = both(edited, parser)
    assert fast == slow


@pytest.mark.parametrize("name", ["stats.json", "stats_two_models.json"])
@pytest.mark.parametrize("spaced", [False, True])
def test_triton_layout_is_read_from_the_bytes(name: str, spaced: bool) -> None:
    """The byte-reading tier takes Triton's own documents (a decline would only cost
    speed, so nothing else would show it)."""
    entries = json.loads((FIXTURES / name).read_text())["model_stats"]
    body = _triton_json(entries, spaced)
    assert _StatsScanner().scan(body) == parse_model_stats(body)


def test_a_batch_list_much_shorter_than_before_is_still_read_from_the_bytes() -> None:
    """After a reload or restart the counts start again near zero, so a model's
    batch_stats list can be far shorter than in the document before: the byte-reading
    tier still finds its end, for this document and every one after."""
    doc = json.loads((FIXTURES / "stats_two_models.json").read_text())

    def with_counts(value: int) -> bytes:
        for entry in doc["model_stats"]:
            for batch in entry["batch_stats"]:
                for span in ("compute_input", "compute_infer", "compute_output"):
                    batch[span] = _span(value, value)
        return _triton_json(doc["model_stats"], spaced=False)

    assert all(entry["batch_stats"] for entry in doc["model_stats"])
    scanner = _StatsScanner()
    for body in [with_counts(10**15)] + [with_counts(1)] * 5 + [with_counts(2)]:
        assert scanner.scan(body) == parse_model_stats(body)
