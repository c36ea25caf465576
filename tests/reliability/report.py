"""Renders the reliability ledger (JSON lines written by the suite under ``make
reliability``) as the Markdown of ``docs/reliability.md``.

    python -m tests.reliability.report LEDGER.jsonl > docs/reliability.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.reliability.conftest import FaultOutcome

_HEADER = """# Reliability and security

Produced by `make reliability` (the whole suite in `tests/reliability/`, the soak and the
load test included); the fast part runs inside `make test`. Each row is one fault or bad
input a test injected, after that test's assertions about it passed: how many times it
was tried, what batchscope did, and what was lost.

"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(rows: list[FaultOutcome]) -> str:
    lines = [
        _HEADER,
        "| area | fault or input | tries | what happened | lost | test |",
        "|---|---|---:|---|---|---|",
    ]
    for row in sorted(rows, key=lambda r: (r.area, r.test, r.fault)):
        lines.append(
            f"| {_cell(row.area)} | {_cell(row.fault)} | {row.tries} | {_cell(row.outcome)} "
            f"| {_cell(row.lost)} | `{_cell(row.test)}` |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.reliability.report LEDGER.jsonl", file=sys.stderr)
        return 2
    rows = [
        FaultOutcome(**json.loads(line))
        for line in Path(argv[0]).read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    sys.stdout.write(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
