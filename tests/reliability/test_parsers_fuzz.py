"""Bad input to the parsers: whatever a target answers, a parser gives records or raises
one of batchscope's own errors (``collector.errors.BatchscopeError``, in practice
``ParseError`` with a message), never ``IndexError``, ``KeyError``,
``UnicodeDecodeError``, ``RecursionError`` or another accident of the input.

Each property runs at a moderate example count here and at a high one in the ``long``
test (``make reliability``). The inputs are arbitrary bytes and text, arbitrary JSON,
JSON shaped like Triton's documents, and recorded Triton answers (tests/fixtures/triton)
mutated byte by byte; the caching parsers read a valid page first and the bad one after
it, so their caches meet the bad input too. Every bug these found has its input pinned
below as an ``@example``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from collector.errors import BatchscopeError, ParseError
from collector.sources.exposition import parse_exposition
from collector.sources.fast_exposition import FastExpositionParser
from collector.sources.triton_json import (
    ModelStatsParser,
    map_model_config,
    map_model_stats,
    parse_model_config,
    parse_model_stats,
    parse_server_version,
)
from collector.sources.triton_metrics import TritonMetricsParser, parse_metrics
from tests.reliability.conftest import FaultLedger
from tests.reliability.fuzz_support import FAST_EXAMPLES, LONG_EXAMPLES, run_property

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "triton"
METRICS_PAGES = [(FIXTURES / n).read_bytes() for n in ("metrics_cpu.txt", "metrics_gpu.txt")]
STATS_DOCS = [(FIXTURES / n).read_bytes() for n in ("stats.json", "stats_two_models.json")]
CONFIG_DOCS = [
    (FIXTURES / n).read_bytes()
    for n in (
        "config_batched.json",
        "config_no_batching.json",
        "config_resnet50.json",
        "config_text_encoder.json",
    )
]
METADATA_DOCS = [(FIXTURES / "server_metadata.json").read_bytes()]


# Nesting far past the interpreter's recursion limit: json's decoder recurses.
DEEP_ARRAY = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"model_stats":' + b"[" * 100_000 + b"]" * 100_000 + b"}"


# --------------------------------------------------------------------------- inputs

_BYTES = st.binary(max_size=400)
_TEXT = st.text(max_size=300)


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A recorded answer with a few random edits: bytes replaced, cut out, repeated,
    inserted (random, or characters that matter to the format), or the rest dropped."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 6))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        span = draw(st.integers(1, 40))
        op = draw(st.integers(0, 5))
        if op == 0:
            data[at] = draw(st.integers(0, 255))
        elif op == 1:
            del data[at : at + span]
        elif op == 2:
            data[at:at] = data[at : at + span]
        elif op == 3:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == 4:
            token = draw(
                st.sampled_from(
                    [
                        b"{",
                        b"}",
                        b"[",
                        b"]",
                        b'"',
                        b"\\",
                        b",",
                        b":",
                        b"#",
                        b" ",
                        b"\n",
                        b"=",
                        b"\xff",
                        b"\xc3",
                        b"-1",
                        b"1e400",
                        b"NaN",
                        b"null",
                        b"true",
                        b"99999999999999999999999",
                        b"\x00",
                        b"\t",
                    ]
                )  # fmt: skip
            )
            data[at:at] = token
        else:
            del data[at:]
    return bytes(data)


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
_STATS_KEYS = [
    "model_stats",
    "name",
    "version",
    "last_inference",
    "inference_count",
    "execution_count",
    "inference_stats",
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
    "batch_stats",
    "batch_size",
    "count",
    "ns",
    "response_stats",
    "memory_usage",
]
_CONFIG_KEYS = [
    "name",
    "max_batch_size",
    "backend",
    "platform",
    "dynamic_batching",
    "preferred_batch_size",
    "max_queue_delay_microseconds",
    "priority_levels",
    "default_queue_policy",
    "timeout_action",
    "default_timeout_microseconds",
    "allow_timeout_override",
    "max_queue_size",
    "instance_group",
    "kind",
    "count",
    "gpus",
    "version",
]


def json_like(keys: list[str]) -> st.SearchStrategy[Any]:
    """Any JSON value, its object keys mostly the format's own, so the mapper gets past
    its first checks and meets wrong types deep inside."""
    key = st.sampled_from(keys) | st.text(max_size=6)
    return st.recursive(
        _SCALARS,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(key, inner, max_size=6),
        max_leaves=30,
    )


@st.composite
def leaf_replaced(draw: st.DrawFn, seeds: list[bytes], values: st.SearchStrategy[Any]) -> Any:
    """A recorded document, decoded, with one to three of its values (a leaf or a whole
    object or list) replaced by arbitrary JSON: the mapper meets a wrong type or value
    deep inside an otherwise valid document."""
    doc = json.loads(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc, [])
        path = draw(st.sampled_from(paths))
        if not path:
            doc = draw(values)
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]  # a key left out
        else:
            parent[path[-1]] = draw(values)
    return doc


def _paths(node: Any, path: list[Any]) -> list[list[Any]]:
    """The path of ``node`` and of every value inside it."""
    found = [path]
    if isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, [*path, key])
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += _paths(child, [*path, index])
    return found


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


# --------------------------------------------------------------------------- checks


def own_errors_only(parse: Callable[[], object]) -> None:
    """Call ``parse``: records, or a ``BatchscopeError`` with a message. Anything else
    propagates and fails the property."""
    try:
        parse()
    except BatchscopeError as exc:
        assert str(exc).strip(), f"{type(exc).__name__} without a message"


def check_exposition(body: bytes) -> None:
    text = body.decode("utf-8", "replace")
    own_errors_only(lambda: parse_exposition(text))
    own_errors_only(lambda: parse_metrics(text))
    own_errors_only(lambda: FastExpositionParser().parse(body))
    own_errors_only(lambda: FastExpositionParser({"nv_inference_count"}).parse(body))
    # The caching parsers after a valid page: the bad one meets warm caches.
    for page in METRICS_PAGES:
        fast, triton = FastExpositionParser(), TritonMetricsParser()
        fast.parse(page)
        triton.parse(page)
        own_errors_only(lambda f=fast: f.parse(body))  # type: ignore[misc]
        own_errors_only(lambda t=triton: t.parse(body))  # type: ignore[misc]
        # ... and the caches still read the valid page right after the bad one.
        assert triton.parse(page) == TritonMetricsParser().parse(page)


def check_stats(body: bytes) -> None:
    own_errors_only(lambda: parse_model_stats(body))
    own_errors_only(lambda: ModelStatsParser().parse(body))
    for doc in STATS_DOCS:
        parser = ModelStatsParser()
        parser.parse(doc)
        own_errors_only(lambda p=parser: p.parse(body))  # type: ignore[misc]
        assert parser.parse(doc) == parse_model_stats(doc)


def check_config(body: bytes) -> None:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = body.decode("utf-8", "replace")
    own_errors_only(lambda: parse_model_config(text))
    own_errors_only(lambda: parse_model_config(text, "fallback_name"))
    own_errors_only(lambda: parse_server_version(body))
    own_errors_only(lambda: parse_server_version(text))


def check_stats_doc(doc: Any) -> None:
    own_errors_only(lambda: map_model_stats(doc))
    check_stats(_dumps(doc))


def check_config_doc(doc: Any) -> None:
    own_errors_only(lambda: map_model_config(doc, raw_json="{}", model="m"))
    check_config(_dumps(doc))


# --------------------------------------------------------------------------- strategies

EXPOSITION_INPUTS = _BYTES | _TEXT.map(str.encode) | mutated(METRICS_PAGES)
STATS_INPUTS = _BYTES | mutated(STATS_DOCS)
CONFIG_INPUTS = _BYTES | _TEXT.map(str.encode) | mutated(CONFIG_DOCS + METADATA_DOCS)
STATS_DOCS_GEN = json_like(_STATS_KEYS) | leaf_replaced(STATS_DOCS, json_like(_STATS_KEYS))
CONFIG_DOCS_GEN = json_like(_CONFIG_KEYS) | leaf_replaced(CONFIG_DOCS, json_like(_CONFIG_KEYS))

# (name, strategy, property, pinned examples: inputs that once escaped)
PROPERTIES: list[tuple[str, st.SearchStrategy[Any], Callable[[Any], None], list[Any]]] = [
    ("exposition", EXPOSITION_INPUTS, check_exposition, [b"\xff", b"# TYPE \xff"]),
    ("statistics", STATS_INPUTS, check_stats, [DEEP_ARRAY, DEEP_OBJECT]),
    ("config", CONFIG_INPUTS, check_config, [DEEP_ARRAY, b'"\\ud800"']),
    ("statistics document", STATS_DOCS_GEN, check_stats_doc, [{"model_stats": [{}]}]),
    ("config document", CONFIG_DOCS_GEN, check_config_doc, [{"name": "m", "gpus": []}]),
]


def _run(name: str, examples: int, fault_ledger: FaultLedger) -> None:
    _, strategy, check, pinned = next(p for p in PROPERTIES if p[0] == name)
    run_property(
        fault_ledger,
        fault=f"{name} parser: {_DESCRIBE[name]}",
        strategy=strategy,
        check=check,
        pinned=pinned,
        examples=examples,
        answers=f"records or batchscope's own errors, nothing else{_FIXED.get(name, '')}",
    )


@pytest.mark.parametrize("name", [p[0] for p in PROPERTIES])
def test_parsers_raise_only_their_own_errors(name: str, fault_ledger: FaultLedger) -> None:
    _run(name, FAST_EXAMPLES, fault_ledger)


@pytest.mark.long
@pytest.mark.parametrize("name", [p[0] for p in PROPERTIES])
def test_parsers_raise_only_their_own_errors_long(name: str, fault_ledger: FaultLedger) -> None:
    _run(name, LONG_EXAMPLES, fault_ledger)


_DESCRIBE = {
    "exposition": "arbitrary bytes/text and mutated Triton metrics pages, to "
    "prometheus_client's parser, the fast parser (all and some families) and the Triton "
    "metrics parser (fresh and with warm caches)",
    "statistics": "arbitrary bytes and mutated statistics documents, to the json path "
    "and the cached byte-scan parser (fresh and warm)",
    "config": "arbitrary bytes/text and mutated model configs and server metadata",
    "statistics document": "arbitrary JSON with the statistics' keys, and recorded "
    "statistics with values replaced or left out",
    "config document": "arbitrary JSON with a model config's keys, and recorded configs "
    "with values replaced or left out",
}
_FIXED: dict[str, str] = {
    "statistics": "; found and fixed: a document nested 100000 deep raised RecursionError "
    "from json's decoder (now ParseError, pinned)",
    "config": "; found and fixed: a document nested 100000 deep raised RecursionError from "
    "json's decoder (now ParseError, pinned)",
}


def test_pinned_inputs_give_parse_errors() -> None:
    """The inputs that once escaped as other exceptions, each a ParseError now."""
    for body in (DEEP_ARRAY, DEEP_OBJECT):
        with pytest.raises(ParseError):
            parse_model_stats(body)
        with pytest.raises(ParseError):
            ModelStatsParser().parse(body)
        with pytest.raises(ParseError):
            parse_model_config(body.decode())
        with pytest.raises(ParseError):
            parse_server_version(body)


# --------------------------------------------------------------------------- atheris

FUZZ_S = 300  # libFuzzer's -max_total_time for the whole run


@pytest.mark.long
def test_coverage_guided_fuzzing_finds_no_crash(tmp_path: Path, fault_ledger: FaultLedger) -> None:
    """tests/reliability/fuzz_inputs.py under libFuzzer for FUZZ_S seconds, from the
    recorded answers: every reader gives records or its own errors."""
    pytest.importorskip("atheris", reason="the fuzz extra is not installed")
    corpus = tmp_path / "corpus"
    seeds = _seed(corpus)
    started = time.monotonic()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.reliability.fuzz_inputs",
            f"-max_total_time={FUZZ_S}",
            "-timeout=20",  # one input slower than this is a finding too
            "-rss_limit_mb=3072",
            "-print_final_stats=1",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
        ],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=FUZZ_S + 300,
    )
    elapsed = time.monotonic() - started
    crashes = {p.name: p.read_bytes()[:400] for p in tmp_path.iterdir() if p.is_file()}
    uncaught = run.stderr.find("Uncaught Python exception")
    assert run.returncode == 0 and not crashes, (
        crashes,
        run.stderr[uncaught : uncaught + 4000] if uncaught >= 0 else run.stderr[-4000:],
    )
    stats = dict(re.findall(r"stat::(\w+):\s+(\d+)", run.stderr))
    executed = int(stats["number_of_executed_units"])
    assert executed > 1000, run.stderr[-2000:]
    fault_ledger.record(
        area="bad input",
        fault="coverage-guided fuzzing (atheris/libFuzzer) of the exposition parsers, the "
        "Triton metrics, statistics, config and server metadata parsers and the settings "
        f"file, from {seeds} recorded answers",
        tries=executed,
        outcome=f"{executed} inputs in {elapsed:.0f} s, {stats.get('new_units_added', '?')} "
        "new coverage units kept, peak RSS "
        f"{stats.get('peak_rss_mb', '?')} MB: no crash, no input over 20 s",
    )


def _seed(corpus: Path) -> int:
    # Imported here: importing the harness instruments the parsers' modules.
    code = (
        "import sys; from pathlib import Path; from tests.reliability.fuzz_inputs import "
        "seed_corpus; print(seed_corpus(Path(sys.argv[1])))"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code, str(corpus)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return int(done.stdout.strip().splitlines()[-1])
