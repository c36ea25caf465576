"""Errors batchscope raises while collecting, and how each maps to an ``error_kind``.

::

    BatchscopeError
    ├── ConfigError            a setting is invalid; the message names the field
    └── CollectError           one collection from one target failed
        ├── TargetDown         connection refused / reset / DNS failure
        ├── TargetTimeout      no complete answer within the timeout
        ├── TargetHTTPError    an HTTP status other than 2xx
        ├── ResponseTooLarge   the body exceeded the configured cap
        ├── ParseError         the body could not be understood
        └── NvmlUnavailable    no NVML library or driver on this host

A source raises a ``CollectError``; the scheduler's wrapper records its
``error_kind`` and the message, and the next run retries with backoff.
"""

from __future__ import annotations

__all__ = [
    "BatchscopeError",
    "CollectError",
    "ConfigError",
    "NvmlUnavailable",
    "ParseError",
    "ResponseTooLarge",
    "TargetDown",
    "TargetHTTPError",
    "TargetTimeout",
]


class BatchscopeError(Exception):
    """Base of every error batchscope raises on purpose."""


class ConfigError(BatchscopeError):
    """A setting is invalid. ``field`` is its dotted name, e.g. ``scrape.interval_s``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"invalid setting {field}: {message}")
        self.field = field


class CollectError(BatchscopeError):
    """One collection failed; ``error_kind`` is the short, stable name stored with it.

    A subclass names its kind in its class line: ``class TargetDown(CollectError,
    kind="down")``.
    """

    error_kind = "error"

    def __init_subclass__(cls, *, kind: str | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if kind is not None:
            cls.error_kind = kind


class TargetDown(CollectError, kind="down"):
    """Connection refused or reset, or the name did not resolve."""


class TargetTimeout(CollectError, kind="timeout"):
    """No complete answer within the timeout."""


class TargetHTTPError(CollectError, kind="http"):
    """An HTTP status other than 2xx; ``status`` is the code."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ResponseTooLarge(CollectError, kind="too_large"):
    """The body exceeded the configured cap."""


class ParseError(CollectError, kind="parse"):
    """The body could not be understood."""


class NvmlUnavailable(CollectError, kind="nvml_unavailable"):
    """No NVML library or driver on this host."""
