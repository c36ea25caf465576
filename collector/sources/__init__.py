"""Sources: one module per endpoint, each registering itself with one line.

Adding a source is one new module and one import line here. The sources are
``host``, ``nvml`` and ``triton``; the other modules are the parts they are made of
(``base``: the protocol and registry; ``exposition``, ``http_fetch``,
``triton_metrics``, ``triton_json``: the triton source's fetch, parse and map steps;
``nvml_library``, ``nvml_devices``: the NVML call site and device classes).
"""

from collector.sources import host, nvml, prometheus, triton  # noqa: E402,F401 (they register)
from collector.sources.base import SOURCES, Source, SourceSpec, register_source

__all__ = ["SOURCES", "Source", "SourceSpec", "register_source"]
