"""What a page's ``layout`` may know about the app serving it, without importing the
app: settings kept in the Flask config by ``create_app``."""

from __future__ import annotations

from typing import Final

import flask

__all__ = ["DEFAULT_REFRESH_S", "REFRESH_MS_KEY", "refresh_ms"]

REFRESH_MS_KEY: Final = "BATCHSCOPE_REFRESH_MS"
DEFAULT_REFRESH_S: Final = 5.0


def refresh_ms() -> int:
    """The live-refresh interval of the app handling this request (the default
    outside a request, e.g. while building the validation layout)."""
    if flask.has_app_context():
        return int(flask.current_app.config.get(REFRESH_MS_KEY, DEFAULT_REFRESH_S * 1000))
    return int(DEFAULT_REFRESH_S * 1000)
