"""``bench/recommend.py --quick`` for case (a) on a real Triton: it completes, and the
recommended config is not worse than the baseline and within 10 % of the sweep-best.

Needs the recommender (``collector.analysis.recommend``): without it this module fails
at import, by design, rather than being skipped.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

# Without the recommender this module fails here (ImportError); the bench imports it
# lazily (so that its --sweep-only mode runs without it).
from collector.analysis.recommend import recommend_model  # noqa: F401
from collector.testbed.server import TritonServer

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "recommend.py"


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_recommend", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered first: dataclasses resolve their annotations through sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_quick_bench_case_a(
    triton_factory: Callable[..., TritonServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = _load_bench()
    out = tmp_path / "recommend.json"
    # The conftest factory starts the server, so its leak checks cover the bench's too.
    # Two CLI calls (not the default three) still compare one call's advice with the
    # next's, for five seconds less of the suite.
    report = bench.main(
        ["--quick", "--cases", "a", "--cli-calls", "2", "--json", str(out)],
        server_factory=triton_factory,
    )
    printed = capsys.readouterr().out
    assert "Targets:" in printed, printed
    assert json.loads(out.read_text())["rows"], "the JSON dump has no rows"

    row = report.row("a", 16)
    detail = f"\n{printed}\nrounds: {row.rounds}"
    assert row.recommended is not None and row.recommended.errors == 0, detail
    assert row.recommended.qps >= 0.95 * row.baseline.qps, (
        f"recommended {row.recommended_config} is worse than the baseline:{detail}"
    )
    assert row.sweep_best is not None, f"no sweep config met the objective:{detail}"
    assert row.ratio is not None and row.ratio >= 0.90, (
        f"recommended {row.recommended_config} reaches {row.ratio:.2f} of sweep-best "
        f"{row.sweep_best_config}:{detail}"
    )
