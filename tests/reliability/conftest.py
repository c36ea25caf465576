"""The reliability suite's ledger: every fault or bad input a test injects is
recorded with how many times it was tried, what happened and how much was lost.

``make reliability`` sets ``$BATCHSCOPE_RELIABILITY_LOG`` and renders the ledger into
``docs/reliability.md`` (``python -m tests.reliability.report``); inside ``make test``
the ledger is kept in memory only, and the tests' assertions are what counts.
Tests marked ``long`` (the soak, the load test, the 20 kill -9 runs) run only under
``make reliability``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

LOG_ENV = "BATCHSCOPE_RELIABILITY_LOG"
# Read once, when pytest loads this file: every test's environment is cleaned of
# BATCHSCOPE_* variables (tests/conftest.py) before the test records anything.
LOG_PATH = os.environ.get(LOG_ENV)


@dataclass(frozen=True)
class FaultOutcome:
    """One row of the ledger."""

    # "targets", "nvml", "store", "alerts", "bad input", "access", "secrets", "load", "soak"
    area: str
    fault: str  # what was injected, in words
    tries: int  # how many times it was injected (runs, examples, requests)
    outcome: str  # what batchscope did, in words, with the measured figures
    lost: str  # what was lost: "nothing", or the count and what
    test: str  # the test that showed it


class FaultLedger:
    def __init__(self, test: str) -> None:
        self._test = test
        self.rows: list[FaultOutcome] = []

    def record(
        self, *, area: str, fault: str, tries: int, outcome: str, lost: str = "nothing"
    ) -> None:
        """Record one fault after the test's assertions about it passed."""
        row = FaultOutcome(area, fault, int(tries), outcome, lost, self._test)
        self.rows.append(row)
        if LOG_PATH:
            with Path(LOG_PATH).open("a", encoding="utf-8") as out:
                out.write(json.dumps(asdict(row)) + "\n")


@pytest.fixture
def fault_ledger(request: pytest.FixtureRequest) -> Iterator[FaultLedger]:
    """Call ``fault_ledger.record(...)`` once per fault, after asserting on it."""
    yield FaultLedger(request.node.nodeid)
