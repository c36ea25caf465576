"""A fast reader of the Prometheus text exposition, from bytes, for the families asked for.

``collector.sources.exposition.parse_exposition`` (prometheus_client's parser) is the
reference: on every page it accepts, ``FastExpositionParser(wanted).parse(body)`` gives
the same ``MetricFamily`` records for the wanted families (the tests check this with
generated pages). What makes it fast, for a scraper that reads the same target again and
again:

- A sample line is cut at its last space into *head* (the series text) and *tail* (the
  value). Each block of the page (a family's ``# TYPE``/``# HELP`` lines and the samples
  under them) keeps a cache from head to what the caller made of that series, so a
  series seen on an earlier page costs one dict lookup and one ``float()``.
- Lines of families the caller does not want are recognised by their metric name and
  skipped: their labels and values are not read (nor checked beyond a well-formed name).
- Only a line the caches do not know is parsed in full.
- A page whose every pair came from the caches leaves its *shape*: the text between
  the tokens that end its lines. The next page of the same text (a target's page,
  scrape after scrape, with only the values moved on) is read with one ``re.split``
  and a few list operations in C, no Python code per line (``_PageShape``).

The caches are bounded (``max_series``): when they hold more entries than that at the
start of a page, they are emptied, so a target whose label values churn costs the full
parse again but cannot grow memory without limit.

What is accepted, as in prometheus_client's parser: ``# HELP`` and ``# TYPE`` lines
(names may be quoted), other comments, blank lines, leading and trailing whitespace, runs
of spaces or tabs between tokens, whitespace inside ``{...}``, a leading or trailing comma
in a label set, labels in any order, quoted label names and a quoted metric name inside
the braces (``{"my.metric", a="b"}``), escapes ``\\\\`` ``\\"`` ``\\n`` in label values
(other backslashes are kept as they are), values such as ``NaN``, ``+Inf``, ``-Inf`` and
``1e3``, an optional timestamp after the value, and an OpenMetrics exemplar after that
(``# {trace_id="..."} 0.5 [ts]``), which is checked for shape and ignored: exemplars are
not part of ``ExpositionSample``, and prometheus_client's text parser ignores them too
(it reads the value before them).

Stricter than prometheus_client, on text that is not exposition: a sample line must have
a well-formed metric name, exactly one value and at most one timestamp; a value may not
contain ``_``; an unknown ``# TYPE`` or a ``# HELP``/``# TYPE`` without a name is an error.
Such text raises ``collector.errors.ParseError`` naming the line (number and excerpt).

A page whose blocks the caches cannot follow exactly -- a ``# TYPE`` that retypes a block
after its samples, or a wanted family whose blocks disagree on its type -- raises
``IrregularPage``; ``FastExpositionParser`` then hands that page to the reference parser.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Generic, TypeVar

from collector.errors import ParseError
from collector.sources.exposition import ExpositionSample, MetricFamily, parse_exposition

__all__ = [
    "ExpositionScanner",
    "FastExpositionParser",
    "IrregularPage",
    "ParsedSample",
    "parse_sample_line",
]

P = TypeVar("P")

#: A wanted family's series -> whatever the caller keeps per series (its "payload").
Resolve = Callable[[str, str, str, Mapping[str, str]], P]

_NAME = re.compile(rb"[a-zA-Z_:][a-zA-Z0-9_:]*")
_QUOTED = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_PAIR = rb'[a-zA-Z_:][a-zA-Z0-9_:]*="(?:[^"\\]|\\.)*"'
# A label set as exporters write it (no blanks, no quoted names): read with two regexes.
_PLAIN_SET = re.compile(rb"\{(?:" + _PAIR + rb"(?:," + _PAIR + rb")*,?)?\}")
_PLAIN_PAIR = re.compile(rb'([a-zA-Z_:][a-zA-Z0-9_:]*)="((?:[^"\\]|\\.)*)"')
_COMMENT_TOKEN = re.compile(r'(?:"(?:[^"\\]|\\.)*"?|[^\s"])+')
_BLANKS = b" \t\r\x0b\x0c"
_HASH = 35  # "#"
_TYPES = frozenset(
    ("counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info", "stateset")
)
_EXCERPT = 120
DEFAULT_MAX_SERIES = 50_000


class IrregularPage(Exception):
    """The page is valid but its blocks do not fit the caches; use the reference parser."""


class _LineError(Exception):
    """A sample or comment line is not exposition; ``parse`` adds the line number."""


@dataclass(frozen=True, slots=True)
class ParsedSample:
    """One sample line, parsed in full."""

    name: str
    labels: dict[str, str]
    value: float
    series_end: int  # index in the line just past the series text (name and labels)
    timestamp: float | None
    exemplar: bool


# --------------------------------------------------------------------------- one line


def parse_sample_line(line: bytes) -> ParsedSample:
    """Parse one sample line. Raises ``_LineError`` (a ``ParseError`` from ``parse``)."""
    n = len(line)
    k = _skip(line, 0)
    if k >= n:
        raise _LineError("empty sample line")
    name: str | None = None
    name_end = -1
    if line[k] != 0x7B:  # "{"
        m = _NAME.match(line, k)
        if m is None:
            raise _LineError("expected a metric name")
        name = m.group().decode("ascii")
        k = name_end = m.end()
        if k < n and line[k] not in _BLANKS and line[k] != 0x7B:
            raise _LineError("invalid character in the metric name")
        k = _skip(line, k)
    labels: dict[str, str] = {}
    if k < n and line[k] == 0x7B:
        labels, in_braces, k = _parse_labels(line, k)
        if in_braces is not None:
            if name is not None:
                raise _LineError("metric name given twice")
            name = in_braces
    elif k == name_end:
        raise _LineError("no value after the metric name")
    if not name:
        raise _LineError("empty metric name")
    series_end = k
    rest = line[k:]
    hash_at = rest.find(b"#")
    exemplar = hash_at >= 0
    if exemplar:
        if hash_at == 0 or rest[hash_at - 1] not in _BLANKS:
            raise _LineError("unexpected '#' after the value")
        _check_exemplar(rest, hash_at + 1)
        rest = rest[:hash_at]
    tokens = rest.split()
    if not tokens:
        raise _LineError("no value")
    if len(tokens) > 2:
        raise _LineError("unexpected text after the timestamp")
    value = _number(tokens[0], "value")
    timestamp = _number(tokens[1], "timestamp") if len(tokens) == 2 else None
    return ParsedSample(name, labels, value, series_end, timestamp, exemplar)


def _skip(line: bytes, k: int) -> int:
    n = len(line)
    while k < n and line[k] in _BLANKS:
        k += 1
    return k


def _number(token: bytes, what: str) -> float:
    if b"_" not in token:
        try:
            return float(token)
        except ValueError:
            pass
    raise _LineError(f"invalid {what} {token.decode('utf-8', 'replace')!r}")


def _quoted(line: bytes, k: int) -> tuple[str, int]:
    m = _QUOTED.match(line, k)
    if m is None:
        raise _LineError("unterminated quoted string")
    try:
        text = m.group(1).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _LineError(f"label text is not UTF-8 ({exc.reason})") from None
    if "\\" in text:
        text = _ESCAPE.sub(lambda e: _UNESCAPED[e.group()], text)
    return text, m.end()


def _parse_labels(line: bytes, k: int) -> tuple[dict[str, str], str | None, int]:
    """The label set opening at ``line[k] == "{"``: labels, a metric name given inside the
    braces (or None) and the index past ``}``."""
    plain = _PLAIN_SET.match(line, k)
    if plain is not None:
        found = _plain_labels(plain.group())
        if found is not None:
            return found, None, plain.end()
    n = len(line)
    labels: dict[str, str] = {}
    name: str | None = None
    k = _skip(line, k + 1)
    if k < n and line[k] == 0x2C:  # a leading comma, as prometheus_client allows
        k = _skip(line, k + 1)
    while True:
        if k >= n:
            raise _LineError("label set not closed")
        if line[k] == 0x7D:  # "}"
            return labels, name, k + 1
        if line[k] == 0x22:  # '"': a quoted label name, or the metric name alone
            label, k = _quoted(line, k)
            k = _skip(line, k)
            if k >= n or line[k] != 0x3D:  # no "=": the metric name
                if name is not None:
                    raise _LineError("metric name given twice")
                name = label
                k = _after_term(line, k)
                continue
        else:
            m = _NAME.match(line, k)
            if m is None:
                raise _LineError("invalid label name")
            label = m.group().decode("ascii")
            k = _skip(line, m.end())
            if k >= n or line[k] != 0x3D:
                raise _LineError(f"expected '=' after label {label}")
        k = _skip(line, k + 1)
        if k >= n or line[k] != 0x22:
            raise _LineError(f"label {label}: value not quoted")
        value, k = _quoted(line, k)
        if label == "__name__":
            if name is not None:
                raise _LineError("metric name given twice")
            name = value
        elif label.startswith("__"):
            raise _LineError(f"reserved label name {label}")
        elif label in labels:
            raise _LineError(f"duplicate label {label}")
        else:
            labels[label] = value
        k = _after_term(line, k)


def _plain_labels(text: bytes) -> dict[str, str] | None:
    """Labels of a plain label set, or None when the general reader must decide."""
    labels: dict[str, str] = {}
    for raw_name, raw_value in _PLAIN_PAIR.findall(text):
        name = raw_name.decode("ascii")
        if name.startswith("__") or name in labels:
            return None  # __name__, a reserved name or a duplicate: the general reader
        try:
            value = raw_value.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if "\\" in value:
            value = _ESCAPE.sub(lambda e: _UNESCAPED[e.group()], value)
        labels[name] = value
    return labels


def _after_term(line: bytes, k: int) -> int:
    k = _skip(line, k)
    if k < len(line) and line[k] == 0x2C:  # ","
        k = _skip(line, k + 1)
        if k < len(line) and line[k] == 0x2C:
            raise _LineError("two commas in the label set")
        return k
    if k < len(line) and line[k] == 0x7D:
        return k
    raise _LineError("expected ',' or '}' in the label set")


def _check_exemplar(rest: bytes, k: int) -> None:
    k = _skip(rest, k)
    if k >= len(rest) or rest[k] != 0x7B:
        raise _LineError("an exemplar must start with '# {'")
    _, _, k = _parse_labels(rest, k)
    tokens = rest[k:].split()
    if not 1 <= len(tokens) <= 2:
        raise _LineError("an exemplar needs a value and at most a timestamp")
    for token in tokens:
        _number(token, "exemplar value")


def _sample_name(line: bytes) -> str:
    """The metric name of a (stripped, non-empty) sample line, without reading labels."""
    if line[0] == 0x7B:
        return parse_sample_line(line).name
    m = _NAME.match(line)
    if m is None:
        raise _LineError("expected a metric name")
    end = m.end()
    if end < len(line) and line[end] not in _BLANKS and line[end] != 0x7B:
        raise _LineError("invalid character in the metric name")
    return m.group().decode("ascii")


def _parse_comment(line: bytes) -> tuple[str, str, str] | None:
    """``("HELP"|"TYPE", name, type)`` for a HELP/TYPE line, None for another comment."""
    try:
        text = line.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise _LineError(f"comment is not UTF-8 ({exc.reason})") from None
    found = list(_COMMENT_TOKEN.finditer(text))[:3]
    parts = [m.group() for m in found]
    if len(parts) < 2 or parts[1] not in ("HELP", "TYPE"):
        return None
    if len(parts) < 3:
        raise _LineError(f"# {parts[1]} without a metric name")
    token = parts[2]
    if token.startswith('"'):
        if len(token) < 2 or not token.endswith('"'):
            raise _LineError("unterminated quoted metric name")
        name = _quoted(token.encode("utf-8"), 0)[0]
    elif _NAME.fullmatch(token.encode("utf-8")) is None:
        raise _LineError(f"invalid metric name {token!r}")
    else:
        name = token
    if not name:
        raise _LineError("empty metric name")
    if parts[1] == "HELP":
        return ("HELP", name, "")
    typ = text[found[2].end() :].strip()
    if not typ:
        raise _LineError(f"# TYPE {name} without a type")
    if typ != "untyped" and typ not in _TYPES:
        raise _LineError(f"# TYPE {name}: unknown type {typ!r}")
    # prometheus_client reads "untyped" as "unknown"; both take the bare name only.
    return ("TYPE", name, "unknown" if typ == "untyped" else typ)


# --------------------------------------------------------------------------- blocks


class _Block(Generic[P]):
    """A ``# HELP``/``# TYPE`` block: a raw name and type, and its series cache."""

    __slots__ = ("family", "raw", "series", "suffixes", "type", "wanted")

    def __init__(self, raw: str, typ: str, wanted: Callable[[str], bool]) -> None:
        self.raw = raw
        family = raw[:-6] if typ == "counter" and raw.endswith("_total") else raw
        if not family:
            raise _LineError("empty family name")
        self.family = family
        self.type = typ
        # Sample name -> ExpositionSample.suffix, as prometheus_client groups samples.
        if typ == "summary":
            self.suffixes = {raw: "", raw + "_count": "_count", raw + "_sum": "_sum"}
        elif typ == "histogram":
            self.suffixes = {
                raw + "_count": "_count",
                raw + "_sum": "_sum",
                raw + "_bucket": "_bucket",
            }
        else:
            self.suffixes = {raw: ""}
        self.wanted = wanted(family)
        self.series: dict[bytes, P] = {}


class ExpositionScanner(Generic[P]):
    """Reads pages of one target into ``(payload, value)`` pairs for the wanted families.

    ``resolve(family, type, suffix, labels)`` is called once per new series and its
    result is cached; ``scan`` returns the pairs in text order and the wanted families
    met (name -> type, in the order prometheus_client completes them).
    """

    def __init__(
        self,
        wanted: Callable[[str], bool],
        resolve: Resolve[P],
        *,
        max_series: int = DEFAULT_MAX_SERIES,
    ) -> None:
        self._wanted_fn = wanted
        self._resolve = resolve
        self._max = max_series
        self._blocks: dict[tuple[str, str], _Block[P]] = {}
        self._comments: dict[bytes, tuple[str, str, str] | None] = {}
        self._singles: dict[bytes, tuple[str, P]] = {}  # series outside any block
        self._wanted_names: dict[str, bool] = {}
        # The hot loop's cache outside wanted blocks: always empty, so every line misses.
        self._none: dict[bytes, P] = {}
        self._entries = 0
        # The last page's text between its values, when the caches gave every pair of
        # it: a page with that same text is read from it (see ``_PageShape``).
        self._shape: _PageShape[P] | None = None
        self.pages_from_shape = 0  # pages read from the last page's shape, for tests
        self._begin()

    @property
    def cached_entries(self) -> int:
        """Entries the caches hold (series, comments, blocks), for tests and sizing."""
        return self._entries

    def _begin(self) -> None:
        if self._entries > self._max:
            for block in self._blocks.values():
                block.series.clear()
            self._blocks.clear()
            self._comments.clear()
            self._singles.clear()
            self._wanted_names.clear()
            self._entries = 0
        self._block: _Block[P] | None = None
        self._block_start = 0
        self._block_samples = False
        self._types: dict[str, str] = {}

    def scan_shaped(self, body: bytes) -> tuple[list[P], list[float]] | None:
        """A page with the last page's shape, read from it: the payloads of its pairs
        (the same list object for every page read from one shape, so a caller may key
        on it what it derives from them) and their values, in order. None when the page
        is not of that shape: ``scan`` reads it."""
        shape = self._shape
        if shape is None:
            return None
        values = shape.numbers(body)
        if values is None:
            return None
        self.pages_from_shape += 1
        return shape.payloads, values

    def scan(self, body: bytes) -> tuple[list[tuple[P, float]], dict[str, str]]:
        """Pairs and families of one page. Raises ``ParseError`` or ``IrregularPage``."""
        shape = self._shape
        if shape is not None:
            pairs = shape.pairs(body)
            if pairs is not None:
                self.pages_from_shape += 1
                return pairs, dict(shape.types)
        self._begin()
        pairs = []
        append = pairs.append
        hits: list[int] = []  # the lines whose pair the caches gave
        series = self._none
        try:
            for number, line in enumerate(body.split(b"\n")):
                if not line:
                    continue
                if line[0] == _HASH:
                    series = self._comment(line, len(pairs))
                    continue
                head, _, tail = line.rpartition(b" ")
                hit = series.get(head)
                if hit is not None and b"_" not in tail:
                    try:
                        append((hit, float(tail)))
                        hits.append(number)
                        continue
                    except ValueError:
                        pass
                series = self._sample(line, pairs)
            self._end_block()
        except _LineError as exc:
            self._shape = None
            line = exc.args[1] if len(exc.args) > 1 else b""
            raise ParseError(_where(body, line, str(exc.args[0]))) from None
        except (ValueError, IndexError, KeyError, UnicodeError) as exc:
            self._shape = None
            raise ParseError(f"invalid Prometheus exposition: {exc}") from exc
        except IrregularPage:
            self._shape = None
            raise
        self._shape = (
            _PageShape.of(body, pairs, hits, self._types) if len(hits) == len(pairs) else None
        )
        return pairs, self._types

    # --------------------------------------------------------------- block changes

    def _open(self, raw: str, typ: str) -> _Block[P]:
        block = self._blocks.get((raw, typ))
        if block is None:
            block = self._blocks[(raw, typ)] = _Block(raw, typ, self._wanted_fn)
            self._entries += 1
        return block

    def _switch(self, block: _Block[P] | None, n_pairs: int) -> dict[bytes, P]:
        self._end_block()
        self._block = block
        self._block_start = n_pairs
        self._block_samples = False
        return self._series_of(block)

    def _series_of(self, block: _Block[P] | None) -> dict[bytes, P]:
        return block.series if block is not None and block.wanted else self._none

    def _end_block(self) -> None:
        block = self._block
        if block is not None and block.wanted:
            self._register(block.family, block.type)

    def _register(self, family: str, typ: str) -> None:
        if self._types.setdefault(family, typ) != typ:
            raise IrregularPage(f"family {family} is typed both {self._types[family]} and {typ}")

    def _comment(self, line: bytes, n_pairs: int) -> dict[bytes, P]:
        try:
            return self._comment_line(line, n_pairs)
        except _LineError as exc:
            raise _LineError(exc.args[0], line) from None

    def _comment_line(self, line: bytes, n_pairs: int) -> dict[bytes, P]:
        try:
            info = self._comments[line]
        except KeyError:
            info = self._comments[line] = _parse_comment(line)
            self._entries += 1
        block = self._block
        if info is None:
            return self._series_of(block)
        kind, raw, typ = info
        if block is None or raw != block.raw:
            return self._switch(self._open(raw, "unknown" if kind == "HELP" else typ), n_pairs)
        if kind == "HELP" or typ == block.type:
            return self._series_of(block)
        if self._block_samples or n_pairs != self._block_start:
            raise IrregularPage(f"# TYPE {raw} after samples of its block")
        self._block = block = self._open(raw, typ)
        return self._series_of(block)

    # --------------------------------------------------------------- sample lines

    def _sample(self, line: bytes, pairs: list[tuple[P, float]]) -> dict[bytes, P]:
        """A sample line the hot loop could not take from the caches."""
        stripped = line.strip()
        block = self._block
        if not stripped:
            return self._series_of(block)
        if stripped[0] == _HASH:
            return self._comment(line, len(pairs))
        try:
            name = _sample_name(stripped)
            if block is not None and name not in block.suffixes:
                self._switch(None, len(pairs))  # not of this block: it ends the block
                block = None
            if block is None:
                self._single(line, name, pairs)
                return self._none
            self._block_samples = True
            if block.wanted:
                self._in_block(block, line, name, pairs)
            return self._series_of(block)
        except _LineError as exc:
            raise _LineError(exc.args[0], line) from None

    def _in_block(
        self, block: _Block[P], line: bytes, name: str, pairs: list[tuple[P, float]]
    ) -> None:
        parsed = parse_sample_line(line)
        key = line[: parsed.series_end]
        payload = block.series.get(key)
        if payload is None:
            labels = MappingProxyType(parsed.labels)
            payload = self._resolve(block.family, block.type, block.suffixes[name], labels)
            self._remember(block.series, key, payload)
        self._remember_head(block.series, line, parsed, payload)
        pairs.append((payload, parsed.value))

    def _single(self, line: bytes, name: str, pairs: list[tuple[P, float]]) -> None:
        """A sample outside any block: prometheus_client makes it a family of its own."""
        wanted = self._wanted_names.get(name)
        if wanted is None:
            wanted = self._wanted_names[name] = self._wanted_fn(name)
            self._entries += 1
        if not wanted:
            return
        self._register(name, "unknown")
        head, _, tail = line.rpartition(b" ")
        known = self._singles.get(head)
        if known is not None and known[0] == name and b"_" not in tail:
            try:
                pairs.append((known[1], float(tail)))
                return
            except ValueError:
                pass
        parsed = parse_sample_line(line)
        payload = self._resolve(name, "unknown", "", MappingProxyType(parsed.labels))
        if parsed.timestamp is None and not parsed.exemplar and _value_at_tail(line, parsed):
            self._singles[head] = (name, payload)
            self._entries += 1
        pairs.append((payload, parsed.value))

    def _remember(self, cache: dict[bytes, P], key: bytes, payload: P) -> None:
        cache[key] = payload
        self._entries += 1

    def _remember_head(
        self, cache: dict[bytes, P], line: bytes, parsed: ParsedSample, payload: P
    ) -> None:
        # The hot loop looks up the text before the last space; when that is the series
        # text plus blanks (say two spaces before the value), cache it under that too.
        head = line.rpartition(b" ")[0]
        if head in cache or parsed.timestamp is not None or parsed.exemplar:
            return
        if _value_at_tail(line, parsed):
            self._remember(cache, head, payload)


def _value_at_tail(line: bytes, parsed: ParsedSample) -> bool:
    """True when the text before the line's last space is the series text plus blanks."""
    cut = line.rfind(b" ")
    # Without labels the series text ends at the blanks after the name.
    end = len(line[: parsed.series_end].rstrip(_BLANKS))
    return cut >= end and not line[end:cut].strip()


def _where(body: bytes, line: bytes, reason: str) -> str:
    lines = body.split(b"\n")
    number = lines.index(line) + 1 if line and line in lines else 0
    excerpt = line.decode("utf-8", "replace").strip()[:_EXCERPT]
    return f"invalid Prometheus exposition: line {number}: {reason}: {excerpt!r}"


# --------------------------------------------------------------------------- page shapes

# The text after a line's last space, up to the end of the line: a sample's value when
# the line has no timestamp. ``split`` with it cuts a page into the text between those
# tokens (even items) and the tokens (odd items). Possessive: a comment's words, which
# a space follows, are given up at once.
_LAST_TOKEN = re.compile(rb"(?m) ([^ \n]++)$")


class _PageShape(Generic[P]):
    """A page read from the caches alone, kept as the text between the tokens that end
    its lines, so that the next page of the same text is read in a few C calls.

    Exact: the shape is kept only when the caches gave every pair of the page (so each
    pair's value is the float of its line's last token, which no timestamp follows),
    and a page is read from it only when the text between the tokens is the same, the
    tokens that gave no pair (comments' last words, lines of families not wanted) are
    the same, and the value tokens pass the checks of ``scan``'s cached path (no ``_``,
    ``float()`` takes them): then ``scan`` would take the same blocks, hit the same
    cache entries and give the same pairs. Anything else and ``scan`` reads the page.
    """

    __slots__ = ("fixed", "fixed_tokens", "payloads", "texts", "types", "values")

    def __init__(
        self,
        texts: list[bytes],
        values: list[int],
        payloads: list[P],
        fixed: list[int],
        fixed_tokens: tuple[bytes, ...],
        types: dict[str, str],
    ) -> None:
        self.texts = texts
        self.values = _picker(values)  # the token of each pair, in pair order
        self.payloads = payloads
        self.fixed = _picker(fixed)  # the tokens that gave no pair, and what they were
        self.fixed_tokens = fixed_tokens
        self.types = dict(types)

    @classmethod
    def of(
        cls,
        body: bytes,
        pairs: list[tuple[P, float]],
        hit_lines: list[int],
        types: dict[str, str],
    ) -> _PageShape[P] | None:
        """The shape of a page whose pair ``i`` came from the caches on line
        ``hit_lines[i]``; None when a pair's line has no token (never expected)."""
        parts = _LAST_TOKEN.split(body)
        texts, tokens = parts[0::2], parts[1::2]
        token_of_line: dict[int, int] = {}
        line = 0
        for index, text in enumerate(texts[: len(tokens)]):
            line += text.count(b"\n")
            token_of_line[line] = index
        values = [token_of_line.get(number, -1) for number in hit_lines]
        if -1 in values:
            return None
        taken = set(values)
        fixed = [i for i in range(len(tokens)) if i not in taken]
        fixed_tokens = tuple(tokens[i] for i in fixed)
        return cls(texts, values, [payload for payload, _ in pairs], fixed, fixed_tokens, types)

    def pairs(self, body: bytes) -> list[tuple[P, float]] | None:
        """The page's pairs, or None when it is not of this shape."""
        values = self.numbers(body)
        return None if values is None else list(zip(self.payloads, values, strict=True))

    def numbers(self, body: bytes) -> list[float] | None:
        """The values of the page's pairs, in the order of ``payloads``, or None when
        it is not of this shape."""
        parts = _LAST_TOKEN.split(body)
        if parts[0::2] != self.texts:
            return None
        tokens = parts[1::2]
        if self.fixed(tokens) != self.fixed_tokens:
            return None
        values = self.values(tokens)
        if b"_" in b" ".join(values):
            return None
        try:
            return list(map(float, values))
        except ValueError:
            return None


def _picker(indices: Sequence[int]) -> Callable[[Sequence[bytes]], tuple[bytes, ...]]:
    """The items at ``indices`` as a tuple, picked in C (``itemgetter`` gives a bare
    item for one index, and takes no empty list)."""
    if not indices:
        return lambda _items: ()
    if len(indices) == 1:
        only = indices[0]
        return lambda items: (items[only],)
    return operator.itemgetter(*indices)


# --------------------------------------------------------------------------- families


class FastExpositionParser:
    """``parse_exposition`` for bytes and for the wanted families only, with caches.

    ``wanted`` is a collection of family names or a predicate on a family name (the
    ``MetricFamily.name``); None wants every family. One instance per target.
    """

    def __init__(
        self,
        wanted: Collection[str] | Callable[[str], bool] | None = None,
        *,
        max_series: int = DEFAULT_MAX_SERIES,
    ) -> None:
        self._wanted = _predicate(wanted)
        self._scanner: ExpositionScanner[tuple[str, str, Mapping[str, str]]] = ExpositionScanner(
            self._wanted, _family_payload, max_series=max_series
        )

    @property
    def cached_entries(self) -> int:
        return self._scanner.cached_entries

    def parse(self, body: bytes) -> dict[str, MetricFamily]:
        """The wanted families of one page, as ``parse_exposition`` gives them."""
        try:
            pairs, types = self._scanner.scan(body)
        except IrregularPage:
            return {n: f for n, f in parse_exposition(decode(body)).items() if self._wanted(n)}
        samples: dict[str, list[ExpositionSample]] = {name: [] for name in types}
        for (family, suffix, labels), value in pairs:
            samples[family].append(ExpositionSample(suffix=suffix, labels=labels, value=value))
        return {
            name: MetricFamily(name=name, type=typ, samples=tuple(samples[name]))
            for name, typ in types.items()
        }


def _family_payload(
    family: str, typ: str, suffix: str, labels: Mapping[str, str]
) -> tuple[str, str, Mapping[str, str]]:
    return (family, suffix, labels)


def _predicate(wanted: Collection[str] | Callable[[str], bool] | None) -> Callable[[str], bool]:
    if wanted is None:
        return lambda name: True
    if callable(wanted):
        return wanted
    names = frozenset(wanted)
    return names.__contains__


def decode(body: bytes) -> str:
    """``body`` as text. Raises ``ParseError`` when it is not UTF-8."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"not UTF-8 text: {exc}") from exc
