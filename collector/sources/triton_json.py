"""Triton's JSON documents -> records: model statistics, model configs, server metadata.

The *parse* and *map* steps of the ``triton`` source for its JSON endpoints. The
``map_*`` functions are pure; every shape they do not expect is a ``ParseError`` that
names the path of the offending value (``model_stats[0].inference_stats.queue``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from collector.errors import ParseError
from collector.records import BatchStat, Duration, ModelConfig, ModelStats, QueuePolicy

__all__ = [
    "ModelStatsParser",
    "map_model_config",
    "map_model_stats",
    "parse_model_config",
    "parse_model_stats",
    "parse_server_version",
]


def _loads(text: str | bytes, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ParseError(f"{what} is not valid JSON: {exc}") from exc
    except RecursionError:
        # json's decoder recurses per nesting level: a document nested thousands deep
        # (no Triton writes one) exhausts the stack.
        raise ParseError(f"{what} is not valid JSON: nested too deeply") from None


def _as_int(value: object, path: str) -> int:
    """An integer from a JSON number or a decimal string (protobuf JSON prints 64-bit
    integers as strings; Triton's own JSON writer prints numbers)."""
    if isinstance(value, bool):
        pass  # bool is an int subclass, but never a count
    elif isinstance(value, int):
        return value
    elif isinstance(value, float) and value.is_integer():
        return int(value)
    elif isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ParseError(f"{path}: expected an integer, got {_short_repr(value)}")


def _as_dict(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ParseError(f"{path}: expected an object, got {_short_repr(value)}")
    return value


def _as_list(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise ParseError(f"{path}: expected an array, got {_short_repr(value)}")
    return value


def _as_str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise ParseError(f"{path}: expected a string, got {_short_repr(value)}")
    return value


def _as_bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise ParseError(f"{path}: expected true or false, got {_short_repr(value)}")
    return value


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _duration(doc: Mapping[str, Any], key: str, path: str) -> Duration:
    if key not in doc:
        return Duration()
    d = _as_dict(doc[key], f"{path}.{key}")
    return Duration(
        count=_as_int(d.get("count", 0), f"{path}.{key}.count"),
        ns=_as_int(d.get("ns", 0), f"{path}.{key}.ns"),
    )


def parse_model_stats(text: str | bytes) -> tuple[ModelStats, ...]:
    """Parse a ``GET /v2/models[/NAME]/stats`` body. Raises ``ParseError``."""
    return map_model_stats(_loads(text, "model statistics"))


def map_model_stats(doc: object) -> tuple[ModelStats, ...]:
    """Map a decoded statistics document to records, in document order.

    Counts and nanoseconds may be JSON numbers or decimal strings; a missing
    ``duration_stat`` is zero. ``response_stats`` and ``memory_usage`` are not kept.
    """
    top = _as_dict(doc, "statistics")
    entries = _as_list(top.get("model_stats", []), "model_stats")
    out: list[ModelStats] = []
    for i, raw in enumerate(entries):
        path = f"model_stats[{i}]"
        entry = _as_dict(raw, path)
        if "name" not in entry:
            raise ParseError(f"{path}: no model name")
        infer = _as_dict(entry.get("inference_stats", {}), f"{path}.inference_stats")
        ipath = f"{path}.inference_stats"
        batches: list[BatchStat] = []
        for j, b_raw in enumerate(_as_list(entry.get("batch_stats", []), f"{path}.batch_stats")):
            bpath = f"{path}.batch_stats[{j}]"
            b = _as_dict(b_raw, bpath)
            batches.append(
                BatchStat(
                    batch_size=_as_int(b.get("batch_size"), f"{bpath}.batch_size"),
                    compute_input=_duration(b, "compute_input", bpath),
                    compute_infer=_duration(b, "compute_infer", bpath),
                    compute_output=_duration(b, "compute_output", bpath),
                )
            )
        out.append(
            ModelStats(
                model=_as_str(entry["name"], f"{path}.name"),
                version=_as_str(entry.get("version", ""), f"{path}.version"),
                last_inference_ms=_as_int(entry.get("last_inference", 0), f"{path}.last_inference"),
                inference_count=_as_int(entry.get("inference_count", 0), f"{path}.inference_count"),
                execution_count=_as_int(entry.get("execution_count", 0), f"{path}.execution_count"),
                success=_duration(infer, "success", ipath),
                fail=_duration(infer, "fail", ipath),
                queue=_duration(infer, "queue", ipath),
                compute_input=_duration(infer, "compute_input", ipath),
                compute_infer=_duration(infer, "compute_infer", ipath),
                compute_output=_duration(infer, "compute_output", ipath),
                cache_hit=_duration(infer, "cache_hit", ipath),
                cache_miss=_duration(infer, "cache_miss", ipath),
                batch_stats=tuple(sorted(batches, key=lambda b: b.batch_size)),
            )
        )
    return tuple(out)


_INFER_DURATIONS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
_NO_DURATION = Duration()


# Records built without their dataclass ``__init__``: filling a new instance's
# ``__dict__`` makes the same record (equality, hash, ``asdict``, pickling) at less than
# half the CPU of the frozen ``__init__``, which sets each field through
# ``object.__setattr__``. Thousands are made per document, so it counts. This is
# ``records.build_record`` inlined for these three fixed shapes, without its per-call
# check of the fields given: the innermost loop of the parse.
_new = object.__new__


def _make_duration(count: int, ns: int) -> Duration:
    record = _new(Duration)
    values = record.__dict__
    values["count"] = count
    values["ns"] = ns
    return record


def _make_batch_stat(
    batch_size: int, compute_input: Duration, compute_infer: Duration, compute_output: Duration
) -> BatchStat:
    record = _new(BatchStat)
    values = record.__dict__
    values["batch_size"] = batch_size
    values["compute_input"] = compute_input
    values["compute_infer"] = compute_infer
    values["compute_output"] = compute_output
    return record


def _make_model_stats(
    model: str,
    version: str,
    counts: tuple[int, int, int],
    durations: Sequence[Duration],
    batch_stats: tuple[BatchStat, ...],
) -> ModelStats:
    """A ``ModelStats`` from its counts (last inference, inferences, executions) and
    its eight inference durations in field order (``_INFER_DURATIONS``)."""
    record = _new(ModelStats)
    values = record.__dict__
    values["model"] = model
    values["version"] = version
    values["last_inference_ms"], values["inference_count"], values["execution_count"] = counts
    values.update(zip(_INFER_DURATIONS, durations, strict=True))
    values["batch_stats"] = batch_stats
    return record


class _NotPlain(Exception):
    """The document strays from the plain shape the fast path reads."""


class ModelStatsParser:
    """Parses one target's statistics documents, scrape after scrape, to the same
    records as ``parse_model_stats`` at a fraction of its CPU.

    Three tiers, each taking what the one before declines:

    1. A document laid out as Triton writes it (``_StatsLayout``) is read from its
       bytes: each model's fixed part by one regular expression, each ``batch_stats``
       entry whose bytes did not change since the previous document keeps its
       ``BatchStat`` without being decoded at all.
    2. Any other document orjson decodes; one of the plain shape (integer counts,
       every object where an object belongs) is mapped without the per-value checks,
       a batch size whose counts did not change keeping its ``BatchStat``.
    3. Anything else -- a count written as a string, a bad value, JSON orjson
       refuses -- goes through ``parse_model_stats``, so the records and the
       ``ParseError``s are exactly its own.
    """

    def __init__(self) -> None:
        self._scanner = _StatsScanner()
        # (model, version) -> {batch_size: (its raw object, its BatchStat)}
        self._batches: dict[tuple[str, str], dict[int, tuple[object, BatchStat]]] = {}

    def parse(self, body: bytes) -> tuple[ModelStats, ...]:
        """Parse a ``GET /v2/models/stats`` body. Raises ``ParseError``."""
        try:
            return self._scanner.scan(body)
        except (_NotPlain, ValueError):  # ValueError: orjson's, or a name not UTF-8
            pass
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return parse_model_stats(body)
        try:
            return self._plain(doc)
        except (_NotPlain, KeyError, TypeError, AttributeError):
            # Decoded again by json: orjson reads an integer past 64 bits as a float.
            return parse_model_stats(body)

    def _plain(self, doc: Any) -> tuple[ModelStats, ...]:
        if type(doc) is not dict:
            raise _NotPlain
        entries = doc.get("model_stats", [])
        if type(entries) is not list:
            raise _NotPlain
        seen: dict[tuple[str, str], dict[int, tuple[object, BatchStat]]] = {}
        out = []
        for entry in entries:
            name = entry["name"]
            version = entry.get("version", "")
            infer = entry.get("inference_stats", {})
            if type(name) is not str or type(version) is not str or type(infer) is not dict:
                raise _NotPlain
            key = (name, version)
            batches = self._batch_stats(entry.get("batch_stats", []), self._batches.get(key))
            seen[key] = batches
            counts = (
                entry.get("last_inference", 0),
                entry.get("inference_count", 0),
                entry.get("execution_count", 0),
            )
            if type(counts[0]) is not int or type(counts[1]) is not int:
                raise _NotPlain
            if type(counts[2]) is not int:
                raise _NotPlain
            durations = [_plain_duration(infer, k) for k in _INFER_DURATIONS]
            ordered = tuple(sorted((b for _, b in batches.values()), key=_batch_size))
            out.append(_make_model_stats(name, version, counts, durations, ordered))
        self._batches = seen
        return tuple(out)

    @staticmethod
    def _batch_stats(
        raw: Any, previous: dict[int, tuple[object, BatchStat]] | None
    ) -> dict[int, tuple[object, BatchStat]]:
        if type(raw) is not list:
            raise _NotPlain
        out: dict[int, tuple[object, BatchStat]] = {}
        for b in raw:
            size = b["batch_size"]
            if type(size) is not int or size in out:
                raise _NotPlain  # a repeated size: the slow path keeps both
            known = previous.get(size) if previous else None
            if known is not None and known[0] == b:
                out[size] = known
                continue
            out[size] = (
                b,
                _make_batch_stat(
                    size,
                    _plain_duration(b, "compute_input"),
                    _plain_duration(b, "compute_infer"),
                    _plain_duration(b, "compute_output"),
                ),
            )
        return out


def _batch_size(b: BatchStat) -> int:
    return b.batch_size


def _plain_duration(doc: dict[str, Any], key: str) -> Duration:
    d = doc.get(key)
    if d is None:
        if key in doc:
            raise _NotPlain
        return _NO_DURATION
    count, ns = d.get("count", 0), d.get("ns", 0)
    if type(count) is not int or type(ns) is not int:
        raise _NotPlain
    return _make_duration(count, ns)


# --------------------------------------------------------------------------- byte scan


class _StatsLayout:
    """The bytes of a statistics document as Triton lays it out, in one spelling:
    ``comma`` and ``colon`` are the separators (Triton's own ``,`` and ``:``, or
    ``, `` and ``: `` as Python's ``json.dumps`` writes).

    ``{"model_stats":[ENTRY,...]}``, each ENTRY its keys in Triton's order: ``name``,
    ``version``, ``last_inference``, ``inference_count``, ``execution_count``,
    ``inference_stats`` (its eight durations in order), ``response_stats`` (any JSON
    value), ``batch_stats`` (entries of ``batch_size`` and its three durations, sizes
    rising) and ``memory_usage`` (any JSON value); counts are plain non-negative
    integers, names strings without escapes.
    """

    def __init__(self, comma: bytes, colon: bytes) -> None:
        def key(name: str) -> bytes:
            return b'"' + name.encode() + b'"' + colon

        def duration(name: str, number: bytes) -> bytes:
            return key(name) + b"{" + key("count") + number + comma + key("ns") + number + b"}"

        def pattern(text: bytes) -> bytes:
            # ``text`` with each ``@`` a captured integer, the rest literal.
            return _INT.join(re.escape(part) for part in text.split(b"@"))

        self.start = b"{" + key("model_stats") + b"["
        self.end = b"}]}"  # the last entry, the list, the document
        self.head = re.compile(
            re.escape(b"{" + key("name"))
            + _STRING
            + re.escape(comma + key("version"))
            + _STRING
            + pattern(
                comma
                + comma.join(key(k) + b"@" for k in _HEAD_COUNTS)
                + comma
                + key("inference_stats")
                + b"{"
                + comma.join(duration(k, b"@") for k in _INFER_DURATIONS)
                + b"}"
                + comma
                + key("response_stats")
            )
        )
        self.no_response_stats = b"{}" + comma + key("batch_stats") + b"["
        self.batch_stats = comma + key("batch_stats") + b"["
        self.first_batch = b"{" + key("batch_size")
        self.next_batch = comma + self.first_batch
        # A batch_stats entry after its batch_size key, each number a ``%d``.
        self.batch_format = (
            b"%d"
            + comma
            + comma.join(
                duration(k, b"%d") for k in ("compute_input", "compute_infer", "compute_output")
            )
            + b"}"
        )
        self.batches_end = b"}}]"  # the last entry's compute_output, the entry, the list
        self.memory_usage = b"]" + comma + key("memory_usage")
        self.next_entry = b"}" + comma + b"{" + key("name")
        self.entry_gap = len(b"}" + comma)


_INT = rb"(0|[1-9][0-9]{0,19})"
_STRING = rb'"([^"\\\x00-\x1f]*)"'
_HEAD_COUNTS = ("last_inference", "inference_count", "execution_count")
_LAYOUTS = (_StatsLayout(b",", b":"), _StatsLayout(b", ", b": "))
# Every byte but the ASCII digits made a space: what is left to split are the numbers.
_DIGITS_ONLY = bytes(c if 0x30 <= c <= 0x39 else 0x20 for c in range(256))
_ENTRY_END = b"|"  # ends each entry checked at once: no valid entry holds one
_NUMBERS_PER_BATCH = 7
# What a model's batch_stats held in the previous document: the list's bytes, its
# records, and each entry's bytes (after its batch_size key), in list order.
_KnownBatches = tuple[bytes, tuple[BatchStat, ...], list[bytes]]


class _StatsScanner:
    """Reads statistics documents laid out as ``_StatsLayout`` says straight from their
    bytes; raises ``_NotPlain`` (or ``ValueError``) for any other, never ``ParseError``.

    Every byte of an accepted document is checked: the fixed parts by the layout's
    regular expression and formats, ``response_stats`` and ``memory_usage`` by orjson
    (their values are not kept), so a document that is not valid JSON is never
    accepted. A ``batch_stats`` list, or one entry of it, with the same bytes as in the
    previous document keeps its records without being read again.
    """

    def __init__(self) -> None:
        self._batches: dict[tuple[bytes, bytes], _KnownBatches] = {}
        self._valid_values: set[bytes] = set()  # response_stats, memory_usage seen valid

    def scan(self, body: bytes) -> tuple[ModelStats, ...]:
        layout = next((x for x in _LAYOUTS if body.startswith(x.start)), None)
        if layout is None or not body.endswith(layout.end):
            raise _NotPlain
        last = len(body) - len(layout.end)
        seen: dict[tuple[bytes, bytes], _KnownBatches] = {}
        out = []
        pos = len(layout.start)
        while True:
            head = layout.head.match(body, pos)
            if head is None:
                raise _NotPlain
            name, version, *texts = head.groups()
            numbers = [*map(int, texts)]
            durations = [
                _make_duration(count, ns) if count or ns else _NO_DURATION
                for count, ns in zip(numbers[3::2], numbers[4::2], strict=True)
            ]
            pos = head.end()
            if body.startswith(layout.no_response_stats, pos):
                pos += len(layout.no_response_stats)
            else:
                pos = self._value_up_to(body, pos, layout.batch_stats)
            batch_stats, pos = self._batch_list(body, pos, layout, (name, version), seen)
            if not body.startswith(layout.memory_usage, pos):
                raise _NotPlain
            pos += len(layout.memory_usage)
            following = pos + 2  # past ``[]``, the usual memory_usage
            if not (body.startswith(b"[]", pos) and following == last) and not (
                body.startswith(b"[]", pos) and body.startswith(layout.next_entry, following)
            ):
                following = body.find(layout.next_entry, pos)
                self._check_value(body[pos : last if following < 0 else following])
            counts = (numbers[0], numbers[1], numbers[2])
            out.append(
                _make_model_stats(name.decode(), version.decode(), counts, durations, batch_stats)
            )
            if following < 0 or following == last:
                break
            pos = following + layout.entry_gap
        self._batches = seen
        if len(self._valid_values) > 1024:  # values that come and go: forget them
            self._valid_values.clear()
        return tuple(out)

    def _value_up_to(self, body: bytes, start: int, after: bytes) -> int:
        """Check that the bytes from ``start`` to the next ``after`` are one JSON value;
        the position past ``after``."""
        end = body.find(after, start)
        if end < 0:
            raise _NotPlain
        self._check_value(body[start:end])
        return end + len(after)

    def _check_value(self, value: bytes) -> None:
        # An object or array cut short (the delimiter found inside one of its strings)
        # is not valid JSON, so a value that decodes is the whole value.
        if value not in self._valid_values:
            orjson.loads(value)  # raises orjson.JSONDecodeError, a ValueError
            self._valid_values.add(value)

    def _batch_list(
        self,
        body: bytes,
        pos: int,
        layout: _StatsLayout,
        key: tuple[bytes, bytes],
        seen: dict[tuple[bytes, bytes], _KnownBatches],
    ) -> tuple[tuple[BatchStat, ...], int]:
        """The records of the batch_stats list starting at ``pos`` (past its ``[``) and
        the position of its ``]``; keeps what it held under ``key`` in ``seen``."""
        if body.startswith(b"]", pos):
            return (), pos
        known = self._batches.get(key)
        # Look for the list's end near where it ended last time (the numbers grow
        # slowly). A list far shorter than last time (a reload or restart: counts back
        # near zero) ends before that: the end found is then another list's or none,
        # and the slice up to it holds a ``]``, which no list can. Look again from the
        # start of the list.
        hint = pos if known is None else max(pos, pos + len(known[0]) - 64)
        end = body.find(layout.batches_end, hint) + len(layout.batches_end) - 1
        if hint > pos and (end < pos or body.find(b"]", pos, end) >= 0):
            end = body.find(layout.batches_end, pos) + len(layout.batches_end) - 1
        if end < pos:
            raise _NotPlain
        listed = body[pos:end]
        if known is not None and known[0] == listed:
            seen[key] = known
            return known[1], end
        if not listed.startswith(layout.first_batch):
            raise _NotPlain
        entries = listed[len(layout.first_batch) :].split(layout.next_batch)
        records: list[BatchStat | None] = [None] * len(entries)
        if known is not None:
            # An entry keeps its record when its bytes are those of the same place in
            # the previous list: sizes without a new execution since.
            records[: len(known[2])] = [
                record if same else None
                for same, record in zip(
                    map(bytes.__eq__, entries, known[2]), known[1], strict=False
                )
            ]
        new = [i for i, record in enumerate(records) if record is None]
        made = _read_batch_entries([entries[i] for i in new], layout)
        for i, record in zip(new, made, strict=True):
            records[i] = record
        # The kept records are in order already (they were in the previous list); each
        # new one must sit between its neighbours.
        for i in new:
            size = records[i].batch_size  # type: ignore[union-attr]
            if (i > 0 and records[i - 1].batch_size >= size) or (  # type: ignore[union-attr]
                i + 1 < len(records) and records[i + 1].batch_size <= size  # type: ignore[union-attr]
            ):
                raise _NotPlain  # sizes out of order or repeated: the other tiers sort
        batch_stats: tuple[BatchStat, ...] = tuple(records)  # type: ignore[arg-type]
        seen[key] = (listed, batch_stats, entries)
        return batch_stats, end


def _read_batch_entries(entries: list[bytes], layout: _StatsLayout) -> list[BatchStat]:
    """The records of batch_stats ``entries`` (each after its batch_size key), all
    checked at once: their numbers are every run of digits, and printed back into the
    layout's ``batch_format`` they must give the entries byte for byte."""
    if not entries:
        return []
    joined = _ENTRY_END.join(entries) + _ENTRY_END
    numbers = [*map(int, joined.translate(_DIGITS_ONLY).split())]
    if len(numbers) != _NUMBERS_PER_BATCH * len(entries):
        raise _NotPlain
    if (layout.batch_format + _ENTRY_END) * len(entries) % tuple(numbers) != joined:
        raise _NotPlain  # not the layout, or a number not as JSON writes it
    new, zero, duration_type = _new, _NO_DURATION, Duration
    out = []
    for i in range(0, len(numbers), _NUMBERS_PER_BATCH):
        figures = tuple(numbers[i : i + _NUMBERS_PER_BATCH])  # ``BATCH_STAT_FIGURES``
        size, in_count, in_ns, infer_count, infer_ns, out_count, out_ns = figures
        # Inlined _make_duration: the innermost loop of the parse.
        durations = []
        for count, ns in ((in_count, in_ns), (infer_count, infer_ns), (out_count, out_ns)):
            if count or ns:
                d = new(duration_type)
                values = d.__dict__
                values["count"] = count
                values["ns"] = ns
                durations.append(d)
            else:
                durations.append(zero)
        record = _make_batch_stat(size, *durations)
        # Its ``figures`` are these numbers: set now, not read back from the record.
        record.__dict__["figures"] = figures
        out.append(record)
    return out


def parse_model_config(text: str, model: str | None = None) -> ModelConfig:
    """Parse a ``GET /v2/models/NAME/config`` body; ``raw_json`` keeps ``text`` as is.

    ``model`` names the model when the document lacks ``name``. Raises ``ParseError``.
    """
    return map_model_config(_loads(text, "model config"), raw_json=text, model=model)


def map_model_config(doc: object, *, raw_json: str, model: str | None = None) -> ModelConfig:
    """Map a decoded model config (protobuf JSON, snake_case keys) to a record.

    ``instance_count`` is the number of instances Triton runs: the sum of each group's
    ``count`` (default 1), times the number of listed GPUs for a KIND_GPU group (its
    count applies per GPU). An empty ``instance_group`` list gives 0 (an ensemble runs
    no instances of its own); a missing one keeps the record's default.
    """
    cfg = _as_dict(doc, "config")
    name = cfg.get("name") or model
    if not name:
        raise ParseError("config: no model name")
    values: dict[str, Any] = {
        "model": _as_str(name, "config.name"),
        "max_batch_size": _as_int(cfg.get("max_batch_size", 0), "config.max_batch_size"),
        "backend": _as_str(cfg.get("backend", ""), "config.backend") or None,
        "platform": _as_str(cfg.get("platform", ""), "config.platform") or None,
        "raw_json": raw_json,
    }
    if "dynamic_batching" in cfg:
        values.update(
            _dynamic_batching(_as_dict(cfg["dynamic_batching"], "config.dynamic_batching"))
        )
    if "instance_group" in cfg:
        groups = _as_list(cfg["instance_group"], "config.instance_group")
        count = 0
        for i, g_raw in enumerate(groups):
            gpath = f"config.instance_group[{i}]"
            g = _as_dict(g_raw, gpath)
            kind = _as_str(g.get("kind", "KIND_AUTO"), f"{gpath}.kind")
            per_device = _as_int(g.get("count", 1), f"{gpath}.count")
            gpus = _as_list(g.get("gpus", []), f"{gpath}.gpus")
            count += per_device * len(gpus) if kind == "KIND_GPU" and gpus else per_device
            if i == 0:
                values["instance_kind"] = kind
        values["instance_count"] = count
    return ModelConfig(**values)


def _dynamic_batching(db: Mapping[str, Any]) -> dict[str, Any]:
    path = "config.dynamic_batching"
    out: dict[str, Any] = {
        "dynamic_batching": True,
        "preferred_batch_sizes": tuple(
            _as_int(v, f"{path}.preferred_batch_size[{i}]")
            for i, v in enumerate(_as_list(db.get("preferred_batch_size", []), path))
        ),
        "max_queue_delay_us": _as_int(
            db.get("max_queue_delay_microseconds", 0), f"{path}.max_queue_delay_microseconds"
        ),
        "priority_levels": _as_int(db.get("priority_levels", 0), f"{path}.priority_levels"),
    }
    if "default_queue_policy" in db:
        ppath = f"{path}.default_queue_policy"
        p = _as_dict(db["default_queue_policy"], ppath)
        out["default_queue_policy"] = QueuePolicy(
            timeout_action=_as_str(p.get("timeout_action", "REJECT"), f"{ppath}.timeout_action"),
            default_timeout_us=_as_int(
                p.get("default_timeout_microseconds", 0), f"{ppath}.default_timeout_microseconds"
            ),
            allow_timeout_override=_as_bool(
                p.get("allow_timeout_override", False), f"{ppath}.allow_timeout_override"
            ),
            max_queue_size=_as_int(p.get("max_queue_size", 0), f"{ppath}.max_queue_size"),
        )
    return out


def parse_server_version(text: str | bytes) -> str | None:
    """The ``version`` of a ``GET /v2`` server-metadata body, or None if it has none."""
    doc = _as_dict(_loads(text, "server metadata"), "server metadata")
    version = doc.get("version")
    return None if version is None else _as_str(version, "server metadata.version")
