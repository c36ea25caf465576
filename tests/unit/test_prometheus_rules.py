"""The bundled Prometheus rules (``deploy/prometheus``) load in a real Prometheus's
``promtool``, and every alerting and recording rule passes its unit tests there:
each alert fires on the series that should raise it and stays quiet on the others."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = RULES_DIR / "triton-rules.yml"
RULE_TESTS = RULES_DIR / "tests" / "triton-rules.test.yml"
CONFIG = RULES_DIR / "prometheus.yml"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make system-deps` installs Debian's prometheus"
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, timeout=60, cwd=RULES_DIR
    )


def test_the_rules_load_in_promtool() -> None:
    out = _promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_rule_passes_its_promtool_unit_tests() -> None:
    out = _promtool("test", "rules", str(RULE_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_and_recording_rule_is_tested() -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    alerts_tested = {a["alertname"] for t in tests for a in t.get("alert_rule_test", [])}
    exprs_tested = {e["expr"] for t in tests for e in t.get("promql_expr_test", [])}
    assert {r["alert"] for r in rules if "alert" in r} <= alerts_tested
    assert {r["record"] for r in rules if "record" in r} <= exprs_tested
    # Recording rules follow level:metric:operations.
    assert all(r["record"].count(":") == 2 for r in rules if "record" in r)


def test_the_bundled_prometheus_config_loads_the_rules_and_scrapes_triton() -> None:
    out = _promtool("check", "config", str(CONFIG))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 13 rules found" in out.stdout
    jobs = [c["job_name"] for c in yaml.safe_load(CONFIG.read_text())["scrape_configs"]]
    assert "triton" in jobs  # the alerts' up{job="triton"}
