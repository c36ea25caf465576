"""The bundled Grafana dashboards (``grafana/``): the committed JSON is exactly what the
generator writes, it passes the dashboard lint (and each lint rule does catch what it is
for), every query parses in Prometheus's own parser, and the provisioning files point the
dashboards at a datasource they resolve."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from collector.exporter.families import FAMILIES
from grafana.dashgen import (
    DASHBOARD_DIR,
    DASHBOARDS,
    Need,
    panel_queries,
    substitute,
    variable_queries,
)
from grafana.dashgen.lint import KnownMetrics, check_promql, known_metrics, lint_dashboard
from grafana.dashgen.metrics import TRITON_METRICS, exporter, metric_names
from grafana.dashgen.render import PROVISIONED_DATASOURCE_UID

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "triton"
PROVISIONING = ROOT / "grafana" / "provisioning"


@pytest.fixture(scope="module")
def known() -> KnownMetrics:
    return known_metrics(p.read_text() for p in sorted(FIXTURES.glob("metrics_*.txt")))


def _committed() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARD_DIR.glob("*.json"))}


def _promtool() -> str:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make system-deps` installs Debian's prometheus"
    return promtool


# ------------------------------------------------------------------ regeneration
def test_regenerating_gives_the_committed_files_byte_for_byte(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "grafana.dashgen", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    fresh = {p.name: p.read_bytes() for p in tmp_path.glob("*.json")}
    committed = {p.name: p.read_bytes() for p in DASHBOARD_DIR.glob("*.json")}
    assert sorted(fresh) == sorted(committed) == sorted(d.filename for d in DASHBOARDS)
    for name, text in fresh.items():
        assert text == committed[name], f"{name} is stale: run python -m grafana.dashgen"
        assert text.endswith(b"}\n")


def test_each_dashboard_has_a_stable_uid_and_title() -> None:
    uids = {name: model["uid"] for name, model in _committed().items()}
    assert uids == {
        "batching-overview.json": "batchscope-batching",
        "gpus-and-instances.json": "batchscope-gpus",
        "model-drilldown.json": "batchscope-model",
    }
    assert all("id" not in model for model in _committed().values())  # instance-specific


# -------------------------------------------------------------------------- lint
@pytest.mark.parametrize("filename", sorted(d.filename for d in DASHBOARDS))
def test_the_committed_dashboard_passes_the_lint(filename: str, known: KnownMetrics) -> None:
    problems = lint_dashboard(_committed()[filename], known)
    assert problems == [], "\n".join(map(str, problems))


def _panel(model: dict[str, Any], title: str) -> dict[str, Any]:
    return next(p for p in model["panels"] if p.get("title") == title)


def _qps(model: dict[str, Any]) -> dict[str, Any]:
    return _panel(model, "Requests per second")


def _first_row(model: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in model["panels"] if p["type"] == "row")


def _drop_datasource_variable(m: dict[str, Any]) -> None:
    m["templating"]["list"] = [v for v in m["templating"]["list"] if v["type"] != "datasource"]


def _fixed_datasource(m: dict[str, Any]) -> None:
    _qps(m)["targets"][0]["datasource"] = {"type": "prometheus", "uid": "PBFA97CFB590B2093"}


def _inputs(m: dict[str, Any]) -> None:
    m["__inputs"] = [{"name": "DS_PROMETHEUS", "type": "datasource"}]


def _no_unit(m: dict[str, Any]) -> None:
    del _qps(m)["fieldConfig"]["defaults"]["unit"]


def _no_description(m: dict[str, Any]) -> None:
    _qps(m)["description"] = ""


def _no_targets(m: dict[str, Any]) -> None:
    _qps(m)["targets"] = []


def _fixed_window(m: dict[str, Any]) -> None:
    target = _qps(m)["targets"][0]
    target["expr"] = target["expr"].replace("$__rate_interval", "30s")


def _raw_counter(m: dict[str, Any]) -> None:
    _qps(m)["targets"][0]["expr"] = 'sum by (model) (nv_inference_request_success{model=~"$model"})'


def _gone_metric(m: dict[str, Any]) -> None:
    # Triton's older dashboards still query this; Triton no longer exports it.
    _qps(m)["targets"][0]["expr"] = (
        "sum by (model) (rate(nv_inference_load_ratio[$__rate_interval]))"
    )


def _summary_unknown(m: dict[str, Any]) -> None:
    target = _qps(m)["targets"][0]
    target["expr"] = target["expr"].replace("nv_inference_request_success", "nv_request_success")


def _legend_grouped_away(m: dict[str, Any]) -> None:
    _qps(m)["targets"][0]["legendFormat"] = "{{pod}}"


def _same_id(m: dict[str, Any]) -> None:
    _qps(m)["id"] = _first_row(m)["id"]


def _overlapping_panels(m: dict[str, Any]) -> None:
    panels = [p for p in m["panels"] if p["type"] != "row"]
    panels[1]["gridPos"] = dict(panels[0]["gridPos"], x=panels[0]["gridPos"]["x"] + 1)


def _over_a_row(m: dict[str, Any]) -> None:
    _qps(m)["gridPos"]["y"] = _first_row(m)["gridPos"]["y"]


def _unused_variable(m: dict[str, Any]) -> None:
    extra = copy.deepcopy(m["templating"]["list"][-1])
    extra["name"] = "pod"
    m["templating"]["list"].append(extra)


def _undefined_variable(m: dict[str, Any]) -> None:
    target = _qps(m)["targets"][0]
    target["expr"] = target["expr"].replace('model=~"$model"', 'model=~"$model", pod=~"$pod"')


BREAKAGES: dict[str, tuple[str, Callable[[dict[str, Any]], None]]] = {
    "no datasource variable": ("datasource-variable", _drop_datasource_variable),
    "a target on a fixed datasource": ("datasource", _fixed_datasource),
    "__inputs": ("inputs", _inputs),
    "no unit": ("unit", _no_unit),
    "no description": ("description", _no_description),
    "no targets": ("targets", _no_targets),
    "a fixed rate window": ("rate-interval", _fixed_window),
    "a raw counter": ("counter-rate", _raw_counter),
    "a metric Triton no longer exports": ("metric", _gone_metric),
    "a misspelt metric": ("metric", _summary_unknown),
    "a legend label grouped away": ("legend", _legend_grouped_away),
    "a panel id used twice": ("ids", _same_id),
    "overlapping panels": ("grid", _overlapping_panels),
    "a panel over a row": ("grid", _over_a_row),
    "an unused variable": ("variables", _unused_variable),
    "an undefined variable": ("variables", _undefined_variable),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_each_lint_rule_flags_a_dashboard_broken_by_hand(
    breakage: str, known: KnownMetrics
) -> None:
    rule, breaker = BREAKAGES[breakage]
    model = copy.deepcopy(_committed()["batching-overview.json"])
    breaker(model)
    rules = {problem.rule for problem in lint_dashboard(model, known)}
    assert rule in rules, f"{breakage} went unflagged (flagged: {rules})"


def test_the_known_metrics_come_from_triton_and_the_exporter(known: KnownMetrics) -> None:
    # Triton's counters and a summary's _sum/_count count as counters; gauges do not.
    assert {"nv_inference_request_success", "nv_inference_queue_summary_us_count"} <= (
        known.counters
    )
    assert "nv_inference_pending_request_count" in known.names - known.counters
    assert exporter("batchscope_model_executions_total") in known.counters
    assert exporter("batchscope_model_config_info") in known.names - known.counters
    # The generator's own list of Triton's metrics matches the recorded expositions.
    assert {m.name for m in TRITON_METRICS} <= known.names
    with pytest.raises(KeyError):
        exporter("batchscope_model_executions")  # a rename breaks generation


def test_metric_names_skips_functions_labels_and_ranges() -> None:
    expr = (
        'sum by (batch_size) (rate(a_total{model=~"x|y", le="1e3"}[$__rate_interval])) '
        "/ ignoring (batch_size) group_left sum (rate(a_total[5m])) * on (model) b / 1e6"
    )
    assert metric_names(expr) == {"a_total", "b"}


# ---------------------------------------------------------------------- PromQL
def test_every_query_parses_in_promtool() -> None:
    exprs = [substitute(q.expr) for q in panel_queries()]
    exprs += [substitute(v.selector) for v in variable_queries()]
    passed, output = check_promql(exprs, _promtool())
    assert passed, output
    assert f"SUCCESS: {len(exprs)} rules found" in output


def test_promtool_rejects_a_broken_query() -> None:
    passed, output = check_promql(["sum(rate(nv_inference_count[1m])"], _promtool())
    assert not passed
    assert "parse error" in output


# ------------------------------------------------------------- the query API
def test_panel_queries_lists_every_target_and_annotation_of_the_committed_json() -> None:
    listed = {(q.dashboard_uid, q.panel_id, q.ref_id): q.expr for q in panel_queries()}
    in_json = {}
    for model in _committed().values():
        for panel in model["panels"]:
            for target in panel.get("targets", []):
                in_json[(model["uid"], panel["id"], target["refId"])] = target["expr"]
        for annotation in model["annotations"]["list"]:
            in_json[(model["uid"], 0, "annotation")] = annotation["expr"]
    assert listed == in_json


def test_queries_that_need_a_gpu_are_marked_and_say_so() -> None:
    gpu_families = {f.name for f in FAMILIES if f.needs_gpu}
    queries = panel_queries()
    for query in queries:
        names = metric_names(query.expr)
        on_gpu = any(n.startswith("nv_gpu_") or n in gpu_families for n in names)
        assert query.needs_gpu == on_gpu, query
    assert any(q.needs_summaries for q in queries)
    assert {Need.MIG, Need.GPU} <= next(q.needs for q in queries if 'kind="mig"' in q.expr)
    descriptions = {
        (m["uid"], p["id"]): p.get("description", "")
        for m in _committed().values()
        for p in m["panels"]
    }
    for query in queries:
        if query.needs_gpu and not query.is_annotation:
            description = descriptions[(query.dashboard_uid, query.panel_id)]
            assert "NVIDIA GPU" in description or "MIG" in description


def test_substitute_fills_every_variable_and_rejects_unknown_ones() -> None:
    expr = 'rate(x{instance=~"$instance", model=~"${model}", target=~"$target"}[$__rate_interval])'
    assert substitute(expr, rate_interval="2s", values={"model": "resnet"}) == (
        'rate(x{instance=~".*", model=~"resnet", target=~".*"}[2s])'
    )
    for query in panel_queries():
        assert "$" not in substitute(query.expr)
    with pytest.raises(ValueError, match=r"\$pod"):
        substitute('x{pod=~"$pod"}')


def test_variable_queries_are_label_values_of_known_selectors() -> None:
    by_name = {(v.dashboard_uid, v.name): v for v in variable_queries()}
    assert {name for _, name in by_name} == {"instance", "target", "model"}
    model = by_name[("batchscope-batching", "model")]
    assert model.query == 'label_values(nv_inference_request_success{instance=~"$instance"}, model)'
    assert by_name[("batchscope-batching", "target")].selector == exporter("batchscope_source_up")
    # The drill-down shows one model at a time.
    variables = _committed()["model-drilldown.json"]["templating"]["list"]
    drill_model = next(v for v in variables if v["name"] == "model")
    assert drill_model["multi"] is False and drill_model["includeAll"] is False


# ------------------------------------------------------------------ provisioning
def test_the_provisioned_datasource_is_the_one_the_dashboards_start_on() -> None:
    config = yaml.safe_load((PROVISIONING / "datasources" / "batchscope.yaml").read_text())
    (datasource,) = config["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["uid"] == PROVISIONED_DATASOURCE_UID
    assert datasource["url"] == "${PROMETHEUS_URL}"
    for model in _committed().values():
        variable = next(v for v in model["templating"]["list"] if v["type"] == "datasource")
        assert variable["current"]["value"] == PROVISIONED_DATASOURCE_UID
        assert variable["query"] == "prometheus"


def test_the_dashboard_provider_reads_a_folder_of_files() -> None:
    config = yaml.safe_load((PROVISIONING / "dashboards" / "batchscope.yaml").read_text())
    (provider,) = config["providers"]
    assert config["apiVersion"] == 1
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/batchscope"
    assert provider["folder"] == "batchscope"
