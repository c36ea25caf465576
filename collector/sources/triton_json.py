"""Triton's JSON documents -> records: model statistics, model configs, server metadata.

The *parse* and *map* steps of the ``triton`` source for its JSON endpoints. The
``map_*`` functions are pure; every shape they do not expect is a ``ParseError`` that
names the path of the offending value (``model_stats[0].inference_stats.queue``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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


class _NotPlain(Exception):
    """The document strays from the plain shape the fast path reads."""


class ModelStatsParser:
    """Parses one target's statistics documents, scrape after scrape, to the same
    records as ``parse_model_stats`` at a fraction of its CPU.

    The body is decoded by orjson, and a document of the plain shape Triton writes
    (integer counts, every object where an object belongs) is mapped without the
    per-value checks; a batch size whose counts did not change since the previous
    document keeps its ``BatchStat``. Anything else -- a count written as a string, a
    bad value, JSON orjson refuses -- goes through ``parse_model_stats``, so the
    records and the ``ParseError``s are exactly its own.
    """

    def __init__(self) -> None:
        # (model, version) -> {batch_size: (its raw object, its BatchStat)}
        self._batches: dict[tuple[str, str], dict[int, tuple[object, BatchStat]]] = {}

    def parse(self, body: bytes) -> tuple[ModelStats, ...]:
        """Parse a ``GET /v2/models/stats`` body. Raises ``ParseError``."""
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
            last = entry.get("last_inference", 0)
            inferences = entry.get("inference_count", 0)
            executions = entry.get("execution_count", 0)
            if type(last) is not int or type(inferences) is not int or type(executions) is not int:
                raise _NotPlain
            durations = {k: _plain_duration(infer, k) for k in _INFER_DURATIONS}
            out.append(
                ModelStats(
                    model=name,
                    version=version,
                    last_inference_ms=last,
                    inference_count=inferences,
                    execution_count=executions,
                    batch_stats=tuple(sorted((b for _, b in batches.values()), key=_batch_size)),
                    **durations,
                )
            )
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
                BatchStat(
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
    return Duration(count, ns)


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
