"""``bench/collector.py --quick`` for its headline point: batchscope and a real
Prometheus scrape one small simulated fleet side by side, and the bench prints and
saves both CPU costs per target-scrape, the scrapes each completed and their ratio.
Run as a user runs it: a script, from another folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "collector.py"


def test_the_quick_headline_point_measures_both_collectors(tmp_path: Path) -> None:
    rows_file = tmp_path / "rows.json"
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--points", "headline", "--seconds", "10"]
        + ["--json", str(rows_file)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (row,) = json.loads(rows_file.read_text())
    detail = out.stdout
    assert row["point"]["targets"] == 3 and row["point"]["models"] == 3, detail
    # Both scraped through the window (1 s interval, 3 targets, 10 s: 30 due). Ten
    # seconds, so that the collector's few ms of CPU span several of /proc's 10 ms ticks.
    assert 24 <= row["b_scrapes"] <= 36 and 24 <= row["p_scrapes"] <= 36, detail
    assert row["b_cpu_s"] > 0 and row["b_ms"] > 0, detail
    assert row["p_cpu_s"] is not None and row["p_cpu_s"] >= 0, detail
    assert row["ratio"] is None or row["ratio"] > 0, detail
    assert "headline ratio (3 x 3 @ 1 s, sqlite)" in out.stdout or row["ratio"] is None, detail
    assert "headline  3 x 3 @ 1 s" in out.stdout, detail
