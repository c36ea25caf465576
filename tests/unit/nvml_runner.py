"""Run ``NvmlSource`` for a scripted number of ticks and print what it returned as JSON.

``tests/unit/test_nvml_source.py`` starts this script in a fresh interpreter, because
the loader reads ``LD_LIBRARY_PATH`` (where the fake ``libnvidia-ml.so.1`` lives) only
at process start. The plan arrives as JSON on stdin::

    {"scenario_path": "...",          # the file FAKE_NVML_SCENARIO names
     "clock": 1000.0,                  # fixed Unix time for the source, or null
     "ticks": ["<scenario text>", null, ...]}   # null: keep the file as it is

Before each tick the scenario text, when given, replaces the file (atomically, so the
fake never reads half a file). The output is one JSON object on stdout::

    {"ticks": [{"records": [{"record": "DeviceSample", ...asdict...}], "error": null}
               | {"records": [], "error": {"type": ..., "error_kind": ..., "message": ...}}],
     "closed": true}
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from typing import Any


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    plan: dict[str, Any] = json.load(sys.stdin)

    from collector.errors import CollectError
    from collector.sources.nvml import NvmlSource
    from tests.nvml_support import write_scenario

    fixed = plan.get("clock")
    kwargs: dict[str, Any] = {} if fixed is None else {"clock": lambda: float(fixed)}
    source = NvmlSource("test-host", **kwargs)
    ticks = []
    for text in plan["ticks"]:
        if text is not None:
            write_scenario(plan["scenario_path"], text)
        try:
            records = source.collect()
        except CollectError as exc:
            ticks.append(
                {
                    "records": [],
                    "error": {
                        "type": type(exc).__name__,
                        "error_kind": exc.error_kind,
                        "message": str(exc),
                    },
                }
            )
            continue
        ticks.append(
            {
                "records": [{"record": type(r).__name__, **dataclasses.asdict(r)} for r in records],
                "error": None,
            }
        )
    source.close()
    json.dump({"ticks": ticks, "closed": True}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
