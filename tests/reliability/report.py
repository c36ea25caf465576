"""Renders the reliability ledger (JSON lines written by the suite under ``make
reliability``) as the Markdown of ``docs/reliability.md``.

    python -m tests.reliability.report LEDGER.jsonl [PYTEST_OUTPUT] > docs/reliability.md

With pytest's output, its closing line (how many passed and failed, and the time)
heads the table, and each failed test is listed: a fault whose test failed has no row.
"""

from __future__ import annotations

import json
import re
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


_CLOSING = re.compile(r"^=*\s*(\d+ (passed|failed|error).* in [\d.]+s.*?)\s*=*$")


def pytest_outcome(output: str) -> list[str]:
    """pytest's lines naming what failed, then its closing line (if it printed one)."""
    lines = output.splitlines()
    failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    closing = [m.group(1) for m in map(_CLOSING.match, lines) if m]
    return [*failed, *closing[-1:]]


def render(rows: list[FaultOutcome], outcome: list[str] | None = None) -> str:
    lines = [_HEADER]
    if outcome:
        lines += [f"The run: {outcome[-1]}", ""]
        lines += [f"- {line}" for line in outcome[:-1]]
        if len(outcome) > 1:
            lines.append("")
    lines += [
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
    if len(argv) not in (1, 2):
        print(
            "usage: python -m tests.reliability.report LEDGER.jsonl [PYTEST_OUTPUT]",
            file=sys.stderr,
        )
        return 2
    rows = [
        FaultOutcome(**json.loads(line))
        for line in Path(argv[0]).read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    outcome = pytest_outcome(Path(argv[1]).read_text(encoding="utf-8")) if len(argv) == 2 else None
    sys.stdout.write(render(rows, outcome))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
