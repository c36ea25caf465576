"""Value types the settings share (``collector.config`` and ``collector.alert_settings``):
positive numbers and durations that refuse YAML's booleans."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, Field

from collector.errors import ConfigError

__all__ = ["Positive", "Seconds", "not_bool", "parse_duration_s"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def not_bool(value: object) -> object:
    if isinstance(value, bool):  # YAML's `yes` is a bool, and pydantic would take it for 1
        raise ValueError("must be a number")
    return value


Positive = Annotated[float, BeforeValidator(not_bool), Field(gt=0, allow_inf_nan=False)]
Seconds = Positive


def parse_duration_s(text: str, field: str = "for") -> float:
    """``90``, ``90s``, ``30m``, ``2h`` or ``1d`` in seconds; ``ConfigError(field, ...)``
    otherwise (a silence's length, from the command line or the UI)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise ConfigError(field, f"expected a duration such as 90s, 30m, 2h or 1d; got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]
