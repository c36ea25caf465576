"""The README's table of exported families is the contract's: every family the exporter
yields is documented there with its type and labels, and the table names no other."""

from __future__ import annotations

import re
from pathlib import Path

from collector.exporter.families import FAMILIES

README = Path(__file__).resolve().parents[2] / "README.md"
_ROW = re.compile(r"^\| `(batchscope_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \|", re.MULTILINE)


def _documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = _ROW.findall(README.read_text(encoding="utf-8"))
    return {
        name: (kind, tuple(x.strip() for x in labels.split(",") if x.strip() not in ("", "—")))
        for name, kind, labels in rows
    }


def test_every_exported_family_is_in_the_readme_with_its_type_and_labels() -> None:
    documented = _documented()
    contract = {f.name: (str(f.kind), f.labels) for f in FAMILIES}
    assert documented == contract
