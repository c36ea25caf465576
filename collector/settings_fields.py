"""Value types the settings share (``collector.config`` and ``collector.alert_settings``):
positive numbers and durations that refuse YAML's booleans."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field

__all__ = ["Positive", "Seconds", "not_bool"]


def not_bool(value: object) -> object:
    if isinstance(value, bool):  # YAML's `yes` is a bool, and pydantic would take it for 1
        raise ValueError("must be a number")
    return value


Positive = Annotated[float, BeforeValidator(not_bool), Field(gt=0, allow_inf_nan=False)]
Seconds = Positive
