"""The fast exposition parser against prometheus_client's, on the same bytes.

``parse_exposition`` (prometheus_client's parser) is the reference. Generated pages
(random families and types, label names and values with escapes and unicode, labels in
any order, whitespace, timestamps, special floats, comments, HELP/TYPE lines) must give
the same families, cold and with warm caches; Triton pages (recorded, scaled and
generated from the recorded one) must give the same ``TritonMetrics`` as
``parse_metrics``; anything else raises ``ParseError`` naming the line.

Exemplars are checked against the text parser of prometheus_client too: it reads the
value before ``# {...}`` and drops the rest, which is what the fast parser does, so a
page with exemplars must equal the same page without them.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from collector.errors import ParseError
from collector.sources.exposition import MetricFamily, parse_exposition
from collector.sources.fast_exposition import FastExpositionParser
from collector.sources.triton_metrics import TritonMetricsParser, parse_metrics

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "triton"
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def normal(families: Mapping[str, MetricFamily]) -> dict[str, object]:
    """Families as plain data, NaN made comparable."""
    return {
        name: (
            f.type,
            [
                (s.suffix, dict(s.labels), "nan" if math.isnan(s.value) else s.value)
                for s in f.samples
            ],
        )
        for name, f in families.items()
    }


def reference(text: str, wanted: set[str] | None = None) -> dict[str, object]:
    families = parse_exposition(text)
    return normal({n: f for n, f in families.items() if wanted is None or n in wanted})


def fast(text: str, wanted: set[str] | None = None) -> dict[str, object]:
    parser = FastExpositionParser(wanted)
    body = text.encode("utf-8")
    cold = normal(parser.parse(body))
    assert normal(parser.parse(body)) == cold  # warm: from the caches
    return cold


def same(text: str, wanted: set[str] | None = None) -> None:
    assert fast(text, wanted) == reference(text, wanted)


# --------------------------------------------------------------------------- edge cases


def test_escapes_in_label_values() -> None:
    text = 'm{a="back\\\\slash",b="quo\\"te",c="new\\nline",d="tab\\t kept",e="é 漢"} 1\n'
    same(text)
    (sample,) = FastExpositionParser().parse(text.encode())["m"].samples
    assert dict(sample.labels) == {
        "a": "back\\slash",
        "b": 'quo"te',
        "c": "new\nline",
        "d": "tab\\t kept",  # not one of the three escapes: kept as written
        "e": "é 漢",
    }


def test_comments_help_and_type_lines() -> None:
    text = (
        "# a comment\n"
        "#\n"
        '# HELP m Some help with "quotes" and a \\\\ backslash\n'
        "# TYPE m counter\n"
        "m 1\n"
        "#TYPE n counter is a plain comment\n"
        "# HELP only_help has no TYPE line\n"
        "only_help 2\n"
        "# TYPE typed_only gauge\n"
    )
    same(text)
    families = FastExpositionParser().parse(text.encode())
    assert {n: f.type for n, f in families.items()} == {
        "m": "counter",
        "only_help": "unknown",
        "typed_only": "gauge",
    }


def test_timestamps_and_special_values() -> None:
    text = (
        "# TYPE g gauge\n"
        'g{k="a"} NaN 1700000000000\n'
        'g{k="b"} +Inf\n'
        'g{k="c"} -Inf 17\n'
        'g{k="d"} 1e3\n'
        'g{k="e"} -0.5\t1700000000000\n'
        'g{k="f"} Nan\n'
    )
    same(text)
    values = [s.value for s in FastExpositionParser().parse(text.encode())["g"].samples]
    assert math.isnan(values[0]) and math.isnan(values[5])
    assert values[1:5] == [math.inf, -math.inf, 1000.0, -0.5]


def test_labels_in_any_order_trailing_commas_and_whitespace() -> None:
    text = (
        "# TYPE s summary\n"
        's{quantile="0.5",model="m"} 1\n'
        '  s { model = "m" , quantile = "0.9" , } 2  \n'
        's_count{,model="m"}\t\t3\n'
        's_sum{model="m",}4\r\n'
        "\n   \n"
    )
    same(text)
    samples = FastExpositionParser().parse(text.encode())["s"].samples
    assert [(s.suffix, dict(s.labels), s.value) for s in samples] == [
        ("", {"quantile": "0.5", "model": "m"}, 1.0),
        ("", {"model": "m", "quantile": "0.9"}, 2.0),
        ("_count", {"model": "m"}, 3.0),
        ("_sum", {"model": "m"}, 4.0),
    ]


def test_exemplars_are_ignored() -> None:
    with_exemplars = (
        "# TYPE h histogram\n"
        'h_bucket{le="0.5"} 3 # {trace_id="a b}c"} 0.42 1700000000.5\n'
        'h_bucket{le="+Inf"} 5 1700000000000 # {trace_id="x"} 7\n'
        "h_count 5\n"
        "h_sum 2.5 # {} 1\n"
    )
    without = re.sub(r" # \{.*$", "", with_exemplars, flags=re.M)
    assert fast(with_exemplars) == fast(without) == reference(without)
    assert fast(with_exemplars) == reference(with_exemplars)


def test_repeated_family_is_merged_and_counter_total_is_the_family_value() -> None:
    text = (
        "# TYPE c_total counter\n"
        "c_total 1\n"
        'u{model="m"} 1\n'
        "other 2\n"
        'u{model="m"} 3\n'
        "# TYPE c_total counter\n"
        "c_total 4\n"
    )
    same(text)
    families = FastExpositionParser().parse(text.encode())
    assert [s.value for s in families["u"].samples] == [1.0, 3.0]
    assert [(s.suffix, s.value) for s in families["c"].samples] == [("", 1.0), ("", 4.0)]


def test_only_wanted_families_and_unwanted_lines_are_not_read() -> None:
    text = (
        "# TYPE keep gauge\nkeep 1\n"
        "# TYPE skip gauge\n"
        'skip{a="unterminated} whatever\n'  # not read: its family is not wanted
        "keep_too 2\n"
    )
    families = FastExpositionParser({"keep", "keep_too"}).parse(text.encode())
    assert set(families) == {"keep", "keep_too"}
    with pytest.raises(ParseError, match="line 4"):
        FastExpositionParser().parse(text.encode())


def test_quoted_names_from_the_utf8_exposition() -> None:
    text = (
        '# HELP "my.metric" dotted\n'
        '# TYPE "my.metric" gauge\n'
        '{"my.metric", "a.b"="c"} 1\n'
        '{__name__="my.metric", x="y"} 2\n'
    )
    same(text)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("<html><body><h1>502 Bad Gateway</h1></body></html>", 1),
        ('{"model_stats": []}', 1),
        ('# TYPE m gauge\nm{model="m",version="1" 12\n', 2),
        ('m{model="m"} twelve\n', 1),
        ("m 1 2 3\n", 1),
        ("m 1_000\n", 1),
        ('m{a="1",,b="2"} 1\n', 1),
        ('m{a="1",a="2"} 1\n', 1),
        ('m{__reserved="1"} 1\n', 1),
        ("m\n", 1),
        ("# TYPE m\n", 1),
        ("# TYPE m sometimes\n", 1),
        ("# HELP\n", 1),
        ("ok 1\nm 1 # not an exemplar\n", 2),
        ('m{a="\xff"} 1\n', 1),
    ],
)
def test_garbled_input_raises_parse_error_naming_the_line(text: str, line: int) -> None:
    body = text.encode("latin-1") if "\xff" in text else text.encode("utf-8")
    with pytest.raises(ParseError, match=f"line {line}:"):
        FastExpositionParser().parse(body)
    with pytest.raises(ParseError):
        TritonMetricsParser().parse(body.replace(b"m", b"nv_inference_count"))


@FAST
@given(st.binary(max_size=200) | st.text(max_size=200).map(lambda t: t.encode("utf-8", "replace")))
def test_any_bytes_give_families_or_a_parse_error(body: bytes) -> None:
    for parser in (FastExpositionParser(), TritonMetricsParser()):
        with contextlib.suppress(ParseError):
            parser.parse(body)


def test_irregular_pages_are_read_by_the_reference() -> None:
    retyped = "# HELP s x\ns 1\n# TYPE s summary\ns_count 2\n"
    two_types = "# TYPE s summary\ns_count 1\ns 2\n# TYPE s gauge\ns 3\n"
    for text in (retyped, two_types):
        same(text)


def test_caches_are_bounded_under_label_churn() -> None:
    parser = FastExpositionParser(max_series=500)
    for scrape in range(30):
        lines = [f'g{{id="{scrape}-{i}"}} {i}' for i in range(100)]
        body = ("# TYPE g gauge\n" + "\n".join(lines) + "\n").encode()
        assert len(parser.parse(body)["g"].samples) == 100
        assert parser.cached_entries <= 500 + 100 + 2


# --------------------------------------------------------------------------- generated pages

_NAMES = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,7}", fullmatch=True)
_LABEL_NAMES = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,5}", fullmatch=True)
_LABEL_VALUES = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
_VALUES = st.sampled_from(
    ["NaN", "+Inf", "-Inf", "0", "1", "-2.5", "1e3", "3.14", "17"]
) | st.floats(allow_nan=False).map(repr)
_BLANKS = st.sampled_from([" ", "  ", "\t", " \t "])


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def _label_set(draw: st.DrawFn, extra: Mapping[str, str]) -> str:
    labels = dict(draw(st.dictionaries(_LABEL_NAMES, _LABEL_VALUES, max_size=3)))
    labels.update(extra)
    items = draw(st.permutations(list(labels.items())))
    if not items and draw(st.booleans()):
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in items)
    if items and draw(st.booleans()):
        inner = draw(st.sampled_from(["", " "])) + inner.replace(
            ",", draw(st.sampled_from([",", ", "]))
        )
        inner += draw(st.sampled_from(["", ",", " , "]))
    return "{" + inner + "}"


@st.composite
def _sample(draw: st.DrawFn, name: str, extra: Mapping[str, str]) -> str:
    labels = draw(_label_set(extra))
    lead = draw(st.sampled_from(["", "", " "]))
    gap = draw(st.sampled_from(["", " "])) if labels else ""
    line = f"{lead}{name}{gap}{labels}{draw(_BLANKS)}{draw(_VALUES)}"
    if draw(st.booleans()):
        line += draw(_BLANKS) + str(draw(st.integers(0, 2**41)))
    return line + draw(st.sampled_from(["", "", " "]))


@st.composite
def _family(draw: st.DrawFn) -> list[str]:
    name = draw(_NAMES)
    typ = draw(st.sampled_from(["counter", "gauge", "summary", "histogram", "untyped", None]))
    lines: list[str] = []
    if typ is not None:
        if draw(st.booleans()):
            lines.append(f"# HELP {name} {draw(st.text(max_size=12))}".replace("\n", " "))
        lines.append(f"# TYPE {name} {typ}")
    for _ in range(draw(st.integers(0, 3))):
        if typ == "summary":
            q = draw(st.sampled_from(["0.5", "0.9", "0.99"]))
            lines.append(draw(_sample(name, {"quantile": q})))
            lines.append(draw(_sample(name + draw(st.sampled_from(["_count", "_sum"])), {})))
        elif typ == "histogram":
            le = draw(st.sampled_from(["0.1", "1", "+Inf"]))
            lines.append(draw(_sample(name + "_bucket", {"le": le})))
            lines.append(draw(_sample(name + draw(st.sampled_from(["_count", "_sum"])), {})))
        else:
            lines.append(draw(_sample(name, {})))
    if draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), f"# note {draw(st.text(max_size=10))}")
    return [line.replace("\n", " ") if line.startswith("#") else line for line in lines]


@st.composite
def _page(draw: st.DrawFn) -> str:
    families = draw(st.lists(_family(), max_size=5))
    return "\n".join(line for fam in families for line in fam) + draw(st.sampled_from(["", "\n"]))


@FAST
@given(_page(), st.randoms())
def test_generated_pages_match_prometheus_client(text: str, rnd: random.Random) -> None:
    expected = reference(text)
    assert fast(text) == expected
    wanted = {name for name in expected if rnd.random() < 0.5}
    assert fast(text, wanted) == reference(text, wanted)


@FAST
@given(_page(), _page())
def test_one_parser_over_changing_pages_matches(first: str, second: str) -> None:
    parser = FastExpositionParser()
    for text in (first, second, first):
        assert normal(parser.parse(text.encode())) == reference(text)


# --------------------------------------------------------------------------- Triton pages


def _scaled(n_models: int) -> str:
    text = (FIXTURES / "metrics_gpu.txt").read_text()
    out: list[str] = []
    for line in text.splitlines():
        if 'model="resnet50"' in line:
            out.extend(line.replace('model="resnet50"', f'model="m{i}"') for i in range(n_models))
        elif 'model="text_encoder"' not in line:
            out.append(line)
    return "\n".join(out) + "\n"


def _advanced(text: str, step: int) -> str:
    """The page with every finite value moved on, as a later scrape reads it."""
    return re.sub(r" (\d+(?:\.\d+)?)$", lambda m: f" {float(m.group(1)) + step}", text, flags=re.M)


@pytest.mark.parametrize(
    "text",
    [
        (FIXTURES / "metrics_gpu.txt").read_text(),
        (FIXTURES / "metrics_cpu.txt").read_text(),
        _scaled(20),
        _scaled(100),
    ],
    ids=["gpu", "cpu", "20-models", "100-models"],
)
def test_triton_parser_gives_what_parse_metrics_gives(text: str) -> None:
    parser = TritonMetricsParser()
    # Cold, then warm on a page whose counters moved, then three pages read from the
    # shape the warm one left (folded by the plan made of it).
    for step in range(5):
        page = _advanced(text, step)
        assert parser.parse(page.encode()) == parse_metrics(page)
    assert parser.pages_from_shape == 3


_GPU_LINES = (FIXTURES / "metrics_gpu.txt").read_text().splitlines()


_TRITON_VALUES = st.sampled_from(["0", "1", "2.5", "1e3", "NaN", "+Inf", "-Inf", "0.1"])


@st.composite
def _triton_page(draw: st.DrawFn) -> str:
    """The recorded page cut, reordered, renamed and revalued: every fold gets exercised."""
    out: list[str] = []
    models = draw(st.lists(st.sampled_from(["a", "b", 'q"x', "é"]), min_size=1, max_size=3))
    keep_comments = draw(st.booleans())
    for line in _GPU_LINES:
        if line.startswith("#"):
            if keep_comments or draw(st.integers(0, 9)) == 0:
                out.append(line)
            continue
        if draw(st.integers(0, 2)) != 0:
            continue
        model = _escape(draw(st.sampled_from(models)))
        line = re.sub(r'model="[^"]*"', f'model="{model}"', line)
        line = re.sub(r" \S+$", " " + draw(_TRITON_VALUES), line)
        if draw(st.integers(0, 20)) == 0:
            line = line.replace('quantile="', 'quantile="x')
        out.append(line)
    if draw(st.booleans()):
        out.insert(draw(st.integers(0, len(out))), 'nv_trt_llm_request_metrics{model="a"} 1')
    return "\n".join(out) + "\n"


def _metrics_or_error(parse: object, arg: object) -> str:
    """What a parse gave, as text: NaN (Inf minus Inf in a sum) then equals NaN."""
    try:
        return repr(parse(arg))  # type: ignore[operator]
    except ParseError as exc:
        return f"ParseError({exc})"


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # shrinking pages this big is slow
)
@given(_triton_page(), _triton_page())
def test_generated_triton_pages_match_parse_metrics(first: str, second: str) -> None:
    parser = TritonMetricsParser()
    for text in (first, second, first):
        assert _metrics_or_error(parser.parse, text.encode()) == _metrics_or_error(
            parse_metrics, text
        )


# --------------------------------------------------------------------------- page shapes

# What a later scrape may put where a value was: numbers, special floats, and text the
# shape must not take (an underscore, a word, a timestamp after the value, nothing).
_LATER_VALUES = st.sampled_from(
    ["0", "7", "2.5e3", "NaN", "+Inf", "-Inf", "nan", "1_0", "abc", "5 1700000000", "", "1e"]
)


def _revalued(text: str, values: list[str]) -> str:
    """``text`` with each sample line's last token replaced by the next of ``values``."""
    lines = text.split("\n")
    k = 0
    for i, line in enumerate(lines):
        if line and not line.startswith("#") and " " in line:
            lines[i] = line.rpartition(" ")[0] + " " + values[k % len(values)]
            k += 1
    return "\n".join(lines)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(_triton_page(), st.lists(st.lists(_LATER_VALUES, min_size=1, max_size=6), max_size=4))
def test_pages_of_one_shape_match_parse_metrics(first: str, later: list[list[str]]) -> None:
    """Scrape after scrape of one page whose values move (or turn to text that is not a
    value): every page as parse_metrics reads it, from the shape or not."""
    parser = TritonMetricsParser()
    for text in (first, first, *(_revalued(first, values) for values in later), first):
        expected = _metrics_or_error(parse_metrics, text)
        got = _metrics_or_error(parser.parse, text.encode())
        if expected.startswith("ParseError("):
            # The two parsers word an error differently; both must refuse the page.
            assert got.startswith("ParseError(")
        else:
            assert got == expected


def test_a_triton_page_whose_values_move_is_read_from_its_shape() -> None:
    page = _scaled(20)
    parser = TritonMetricsParser()
    for step in range(5):
        moved = _advanced(page, step)
        assert parser.parse(moved.encode()) == parse_metrics(moved)
    # Cold, then warm (the shape kept), then three pages read from it.
    assert parser.pages_from_shape == 3


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("# TYPE nv_inference_count counter", "# TYPE nv_inference_count gauge"),
        ("# HELP nv_inference_count Number", "# HELP nv_inference_count Count"),
        (
            'nv_inference_count{model="m1",version="1"}',
            'nv_inference_count{model="m1",version="2"}',
        ),
    ],
    ids=["type", "help", "series"],
)
def test_a_page_of_another_text_is_not_read_from_the_shape(old: str, new: str) -> None:
    page = _advanced(_scaled(3), 1)
    changed = page.replace(old, new, 1)
    assert changed != page
    parser = TritonMetricsParser()
    parser.parse(page.encode())
    parser.parse(page.encode())
    assert _metrics_or_error(parser.parse, changed.encode()) == _metrics_or_error(
        parse_metrics, changed
    )
    assert parser.pages_from_shape == 0


def test_a_value_the_shape_must_not_take_is_a_parse_error_naming_its_line() -> None:
    page = _advanced(_scaled(3), 1)
    parser = TritonMetricsParser()
    parser.parse(page.encode())
    parser.parse(page.encode())
    bad = re.sub(r"(nv_inference_count\{[^}]*\}) \S+", r"\1 1_000", page, count=1)
    with pytest.raises(ParseError, match="line"):
        parser.parse(bad.encode())
    assert parser.parse(page.encode()) == parse_metrics(page)
    assert parser.pages_from_shape == 0  # the bad page left no shape to read this one


def test_label_less_lines_are_read_from_the_caches() -> None:
    """Gauges without labels (Triton's nv_cpu_*, nv_pinned_*) come from the caches once
    seen, like every other series: a page of them keeps a shape."""
    page = "# TYPE nv_cpu_utilization gauge\nnv_cpu_utilization 0.5\n"
    parser = TritonMetricsParser()
    for value in ("0.5", "0.25", "0.75"):
        text = page.replace("0.5", value)
        assert parser.parse(text.encode()) == parse_metrics(text)
    assert parser.pages_from_shape == 1


@pytest.mark.parametrize(
    ("page", "from_shape"),
    [
        # One value and one other token (the type): the first page fills the caches,
        # the second leaves a shape, the third is read from it.
        ('# TYPE nv_inference_count counter\nnv_inference_count{model="a",version="1"} 5\n', 1),
        # No value (a comment alone; nothing): the first page leaves a shape already.
        ("# TYPE nv_inference_count counter\n", 2),
        ("", 2),
    ],
    ids=["one-value", "comment-only", "empty"],
)
def test_pages_with_one_token_or_none_are_read_from_their_shape(page: str, from_shape: int) -> None:
    parser = TritonMetricsParser()
    for step in range(3):
        text = page.replace(" 5", f" {5 + step}")
        assert parser.parse(text.encode()) == parse_metrics(text)
    assert parser.pages_from_shape == from_shape
