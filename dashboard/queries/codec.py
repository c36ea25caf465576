"""Answers to JSON and back, for a page's ``dcc.Store``: pydantic walks the dataclass
types (nested records, ``X | None``, lists, tuples) so no converter is written by hand."""

from __future__ import annotations

from dataclasses import is_dataclass
from typing import Any, TypeVar

from pydantic import TypeAdapter

__all__ = ["from_json", "to_json"]

_T = TypeVar("_T")


# Building an adapter inspects the whole type tree: once per answer type. (Two threads
# may build the same one; either will do.)
_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


def to_json(value: Any) -> Any:
    """A dataclass answer as JSON-ready dicts and lists (for a ``dcc.Store``); any
    other value as it is."""
    if is_dataclass(value) and not isinstance(value, type):
        return _adapter(type(value)).dump_python(value, mode="json")
    return value


def from_json(cls: type[_T], data: Any) -> _T:
    """Rebuild an answer of type ``cls`` from ``to_json``'s output."""
    result: _T = _adapter(cls).validate_python(data)
    return result
