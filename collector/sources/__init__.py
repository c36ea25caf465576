"""Sources: one module per endpoint, each registering itself with one line.

Adding a source is one new module and one import line here.
"""

from collector.sources import host, nvml, triton  # noqa: E402,F401  (each registers itself)
from collector.sources.base import SOURCES, Source, SourceSpec, register_source

__all__ = ["SOURCES", "Source", "SourceSpec", "register_source"]
