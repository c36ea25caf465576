"""A linter for Grafana dashboard JSON, run by the tests over the committed dashboards,
and a PromQL check of queries through Prometheus's own parser (``promtool``).

Each rule returns ``LintProblem``s naming the rule, so a test can break a dashboard by
hand and see that exact rule flag it.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from collector.exporter.families import FAMILIES, Kind
from grafana.dashgen.metrics import TRITON_SUMMARIES, metric_names
from grafana.dashgen.render import DATASOURCE_VARIABLE
from grafana.dashgen.spec import GRID_WIDTH

__all__ = [
    "KnownMetrics",
    "LintProblem",
    "check_promql",
    "known_metrics",
    "lint_dashboard",
]

_DATASOURCE_UID = f"${{{DATASOURCE_VARIABLE}}}"
# Grafana's own variables a query may use without defining them.
_BUILTIN_VARIABLES = frozenset({"__rate_interval", "__interval", "__range", "__range_s"})
_RATE_CALL = re.compile(r"(?<![\w:])(rate|irate|increase)\s*\(")
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_GROUPING = re.compile(r"\bby\s*\(([^()]*)\)")


@dataclass(frozen=True)
class LintProblem:
    rule: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.where}: {self.detail}"


@dataclass(frozen=True)
class KnownMetrics:
    """Sample names a query may select, and which of them are counters (which only make
    sense through rate, irate or increase)."""

    names: frozenset[str]
    counters: frozenset[str]


def _exposition_names(text: str) -> tuple[set[str], set[str]]:
    types: dict[str, str] = {}
    samples: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            types[name] = kind.strip()
        elif line and not line.startswith("#"):
            samples.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    counters = set()
    for sample in samples:
        for suffix in ("", "_sum", "_count", "_bucket"):
            base = sample[: len(sample) - len(suffix)] if suffix else sample
            if sample.endswith(suffix) and base in types:
                kind = types[base]
                if kind == "counter" or (suffix and kind in ("summary", "histogram")):
                    counters.add(sample)
                break
    return samples, counters


def known_metrics(expositions: Iterable[str]) -> KnownMetrics:
    """The metrics in Triton's ``expositions`` (recorded /metrics texts), Triton's optional
    summaries (``name`` with quantiles, ``name_sum``, ``name_count``) and every family of
    batchscope's exporter."""
    names: set[str] = set()
    counters: set[str] = set()
    for text in expositions:
        found, found_counters = _exposition_names(text)
        names |= found
        counters |= found_counters
    for summary in TRITON_SUMMARIES:
        names |= {summary, f"{summary}_sum", f"{summary}_count"}
        counters |= {f"{summary}_sum", f"{summary}_count"}
    names |= {f.name for f in FAMILIES}
    counters |= {f.name for f in FAMILIES if f.kind is Kind.COUNTER}
    return KnownMetrics(frozenset(names), frozenset(counters))


# --------------------------------------------------------------------- walking
def _panels(model: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every panel, rows and the panels inside collapsed rows included."""
    for panel in model.get("panels", []):
        yield panel
        yield from panel.get("panels", []) if panel.get("type") == "row" else ()


def _where(panel: Mapping[str, Any]) -> str:
    return f"panel {panel.get('id')} {panel.get('title', '')!r}"


def _exprs(model: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(where, expr, legend) of every panel target and annotation."""
    for panel in _panels(model):
        for target in panel.get("targets", []):
            yield _where(panel), target.get("expr", ""), target.get("legendFormat", "")
    for annotation in model.get("annotations", {}).get("list", []):
        if "expr" in annotation:
            yield f"annotation {annotation.get('name')!r}", annotation["expr"], ""


def _variables(model: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(model.get("templating", {}).get("list", []))


def _walk(value: Any) -> Iterator[tuple[str | None, Any]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield key, item
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)
    else:
        yield None, value


# ----------------------------------------------------------------------- rules
def _datasource_rules(model: Mapping[str, Any]) -> Iterator[LintProblem]:
    variables = [v for v in _variables(model) if v.get("type") == "datasource"]
    if not any(
        v.get("name") == DATASOURCE_VARIABLE and v.get("query") == "prometheus" for v in variables
    ):
        yield LintProblem(
            "datasource-variable", "templating", f"no prometheus ${DATASOURCE_VARIABLE} variable"
        )
    users = [(_where(p), p) for p in _panels(model) if p.get("type") != "row"]
    users += [
        (f"{_where(p)} target {t.get('refId')}", t)
        for p in _panels(model)
        for t in p.get("targets", [])
    ]
    users += [
        (f"variable {v.get('name')}", v) for v in _variables(model) if v.get("type") == "query"
    ]
    users += [
        (f"annotation {a.get('name')!r}", a) for a in model.get("annotations", {}).get("list", [])
    ]
    for where, user in users:
        if (user.get("datasource") or {}).get("uid") != _DATASOURCE_UID:
            yield LintProblem("datasource", where, f"datasource is not {_DATASOURCE_UID}")
    for key, value in _walk(model):
        if key == "__inputs" or (isinstance(value, str) and "${DS_" in value):
            yield LintProblem(
                "inputs", "dashboard", "uses __inputs / ${DS_...} (breaks provisioning)"
            )
            break


def _panel_rules(model: Mapping[str, Any]) -> Iterator[LintProblem]:
    seen_ids: set[Any] = set()
    for panel in _panels(model):
        where = _where(panel)
        if panel.get("id") in seen_ids or panel.get("id") is None:
            yield LintProblem("ids", where, "panel id missing or used twice")
        seen_ids.add(panel.get("id"))
        if panel.get("type") == "row":
            continue
        if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            yield LintProblem("unit", where, "no unit")
        if not panel.get("title") or not panel.get("description"):
            yield LintProblem("description", where, "no title or no description")
        targets = panel.get("targets", [])
        if not targets or not all(t.get("expr") for t in targets):
            yield LintProblem("targets", where, "no targets, or a target without a query")


def _grid_rules(model: Mapping[str, Any]) -> Iterator[LintProblem]:
    boxes: list[tuple[str, tuple[int, int, int, int]]] = []
    for panel in _panels(model):
        pos = panel.get("gridPos") or {}
        x, y, w, h = (pos.get(k, 0) for k in ("x", "y", "w", "h"))
        if w <= 0 or h <= 0 or x < 0 or x + w > GRID_WIDTH:
            yield LintProblem("grid", _where(panel), f"gridPos {pos} off the grid")
        for other_where, (ox, oy, ow, oh) in boxes:
            if x < ox + ow and ox < x + w and y < oy + oh and oy < y + h:
                yield LintProblem("grid", _where(panel), f"overlaps {other_where}")
        boxes.append((_where(panel), (x, y, w, h)))


def _closing(expr: str, start: int) -> int:
    """Index of the parenthesis that closes the one opened just before ``start``."""
    depth = 1
    for i in range(start, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return i
    return len(expr)


def _query_rules(model: Mapping[str, Any], known: KnownMetrics) -> Iterator[LintProblem]:
    for where, expr, legend in _exprs(model):
        for call in _RATE_CALL.finditer(expr):
            argument = expr[call.end() : _closing(expr, call.end())]
            if not re.search(r"\[\$__rate_interval\]\s*$", argument):
                yield LintProblem(
                    "rate-interval", where, f"{call.group(1)}() without $__rate_interval"
                )
        for name in sorted(metric_names(expr)):
            if name not in known.names:
                yield LintProblem(
                    "metric", where, f"{name} is in neither Triton's nor batchscope's exposition"
                )
            elif name in known.counters:
                uses = len(re.findall(rf"(?<![\w:]){name}(?![\w:])", expr))
                rated = len(
                    re.findall(rf"(?<![\w:])(?:rate|irate|increase)\s*\(\s*{name}(?![\w:])", expr)
                )
                if rated < uses:
                    yield LintProblem("counter-rate", where, f"counter {name} used without rate()")
        groupings = _GROUPING.findall(expr)
        if groupings:
            kept = {label.strip() for g in groupings for label in g.split(",")}
            for label in _LEGEND_LABEL.findall(legend):
                if label not in kept:
                    yield LintProblem("legend", where, f"legend names {label}, grouped away")


def _variable_rules(model: Mapping[str, Any], known: KnownMetrics) -> Iterator[LintProblem]:
    defined = {v.get("name") for v in _variables(model)}
    texts = [expr for _, expr, _ in _exprs(model)]
    texts += [str(v.get("query", "")) for v in _variables(model) if v.get("type") == "query"]
    used = {m.group(1) or m.group(2) for text in texts for m in _VARIABLE.finditer(text)}
    for name in sorted(used - defined - _BUILTIN_VARIABLES):
        yield LintProblem("variables", "dashboard", f"${name} is used but not defined")
    for variable in _variables(model):
        where = f"variable {variable.get('name')}"
        if variable.get("type") == "query" and variable.get("name") not in used:
            yield LintProblem("variables", where, "defined but used by no query")
        query = str(variable.get("query", ""))
        if variable.get("type") == "query":
            selector = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
            names = metric_names(selector.group(1)) if selector else frozenset()
            if not selector or not names <= known.names:
                yield LintProblem("metric", where, f"{query!r} selects no known metric")


def lint_dashboard(model: Mapping[str, Any], known: KnownMetrics) -> list[LintProblem]:
    """Every problem the rules find in the dashboard JSON ``model``."""
    return [
        *_datasource_rules(model),
        *_panel_rules(model),
        *_grid_rules(model),
        *_query_rules(model, known),
        *_variable_rules(model, known),
    ]


# ---------------------------------------------------------------------- promtool
def check_promql(exprs: Sequence[str], promtool: str = "promtool") -> tuple[bool, str]:
    """Run ``promtool check rules`` on ``exprs`` written as recording rules; (passed,
    promtool's output). Prometheus's own parser: a broken query fails here."""
    rules = [{"record": f"dashboard:query_{i}:check", "expr": e} for i, e in enumerate(exprs)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dashboard-queries.yml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
        done = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
        )
    return done.returncode == 0, done.stdout + done.stderr
