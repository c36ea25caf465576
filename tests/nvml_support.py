"""The fake NVML's scenario files (``tests/fakenvml/README.md`` gives the format): the
text of merged settings, written atomically (the fake re-reads the file on every call,
so it must never see half of one), and the GPU identities the tests share."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["GIB", "UUID0", "UUID1", "scenario", "write_scenario"]

UUID0 = "GPU-11111111-0000-0000-0000-000000000000"
UUID1 = "GPU-22222222-0000-0000-0000-000000000001"
GIB = 1024**3


def scenario(*parts: Mapping[str, object]) -> str:
    """Merge mappings (later wins) into scenario text; a value of None drops the key."""
    merged: dict[str, object] = {}
    for part in parts:
        merged.update(part)
    return "".join(f"{k} = {v}\n" for k, v in merged.items() if v is not None)


def write_scenario(path: str | Path, text: str) -> None:
    """Make ``path`` hold ``text`` at once: a temporary file beside it, then a rename."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
