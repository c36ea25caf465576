"""How well the batcher model predicts every grid config, replayed from a bench run.

``bench/recommend.py --json FILE --keep-stores DIR`` keeps, per case and concurrency,
the store its recommender observed and the sweep's measurement of every grid config.
This script observes each final window again, fits the batcher model to it and
predicts every grid config at that load, then compares with what the sweep measured:

* per config: predicted vs measured QPS and p95 (``--detail``);
* per row: the median and worst QPS / p95 errors over the grid, and the model's own
  pick among the grid configs (most predicted QPS whose predicted p95 meets the
  objective) measured against the sweep-best: the grid-restricted ratio.

No server is needed, so a model change can be checked against one recorded bench in
seconds.  Usage: ``python -m bench.model_accuracy --json FILE --stores DIR [--detail]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collector.analysis.recommend import (
    BatcherModel,
    Observation,
    RecommendSettings,
    batcher_model,
    observe_model,
)
from collector.records import BatcherConfig
from collector.store import Store


def _batcher(doc: dict[str, Any]) -> BatcherConfig:
    return BatcherConfig(**{**doc, "preferred_batch_sizes": tuple(doc["preferred_batch_sizes"])})


def _short(config: BatcherConfig) -> str:
    if not config.dynamic_batching:
        return f"off x{config.instance_count}"
    sizes = ",".join(str(s) for s in config.preferred_batch_sizes) or "-"
    return f"d{config.max_queue_delay_us} [{sizes}] x{config.instance_count}"


def _grid_predictions(
    model: Any, grid: list[dict[str, Any]], measured: dict[str, Any], objective: float
) -> tuple[
    list[str], list[float], list[float], tuple[float, str] | None, dict[str, tuple[float, float]]
]:
    """The model's prediction against the sweep's measurement for every grid config:
    printable lines, |QPS| and |p95| errors, the model's best pick under the objective,
    and the signed errors by config name."""
    lines: list[str] = []
    q_err: list[float] = []
    p_err: list[float] = []
    best_pred: tuple[float, str] | None = None
    errors: dict[str, tuple[float, float]] = {}
    for doc in grid:
        config = _batcher(doc)
        name = _short(config)
        m = measured.get(name)
        if m is None or not m["qps"]:
            continue
        pred = model.predict(config)
        qe = (pred.qps - m["qps"]) / m["qps"]
        pe = (
            (pred.p95_ms - m["p95_ms"]) / m["p95_ms"]
            if m["p95_ms"] and pred.p95_ms is not None
            else float("nan")
        )
        errors[name] = (qe, pe)
        q_err.append(abs(qe))
        if pe == pe:
            p_err.append(abs(pe))
        if (
            pred.p95_ms is not None
            and pred.p95_ms <= objective
            and (best_pred is None or pred.qps > best_pred[0])
        ):
            best_pred = (pred.qps, name)
        lines.append(
            f"    {name:<18} measured {m['qps']:6.0f}/{m['p95_ms'] or 0:6.1f}  "
            f"predicted {pred.qps:6.0f}/{pred.p95_ms or 0:6.1f}  "
            f"err {qe:+5.0%} {pe:+5.0%}"
        )
    return lines, q_err, p_err, best_pred, errors


def _against_sweep_best(
    measured: dict[str, dict[str, Any]], objective: float, pick: str | None
) -> tuple[str | None, float | None]:
    """The sweep-best config that meets the objective, and the model's pick's measured
    QPS over it (``None`` when either is missing)."""
    ok = {
        n: m
        for n, m in measured.items()
        if m["errors"] == 0 and m["p95_ms"] is not None and m["p95_ms"] <= objective
    }
    best_name = max(ok, key=lambda n: ok[n]["qps"]) if ok else None
    ratio = (
        measured[pick]["qps"] / ok[best_name]["qps"]
        if pick and best_name and pick in measured
        else None
    )
    return best_name, ratio


def _print_summary(
    summary: dict[str, Any],
    obs: Observation,
    model: BatcherModel,
    detail_lines: list[str] | None,
    errors: dict[str, tuple[float, float]],
) -> None:
    """One row's summary as the replay prints it (with each config's line when given)."""
    pick, ratio = summary["model_pick"], summary["grid_ratio"]
    print(
        f"({summary['case']}) c={summary['concurrency']}: N={obs.population} "
        f"Z={obs.think_ms:.2f} ms (least {obs.least_think_ms:.2f}) "
        f"scale={model.scale:.2f} "
        f"fit {obs.fit.intercept_ms:.2f}+{obs.fit.per_sample_ms:.3f}/sample "
        f"overhead={obs.overhead_ms:.2f} cpu={obs.cpu_fraction:.2f} "
        f"cores={obs.cores_available}"
    )
    if detail_lines is not None:
        print("\n".join(detail_lines))
    print(
        f"    QPS error median {summary['qps_err_median']:.0%} max "
        f"{summary['qps_err_max']:.0%}; p95 error median "
        f"{summary['p95_err_median']:.0%} max {summary['p95_err_max']:.0%}; "
        f"model's pick {pick} vs sweep-best {summary['sweep_best']}: ratio "
        + (f"{ratio:.2f}" if ratio is not None else "-")
        + (
            f"; pick's error QPS {errors[pick][0]:+.0%} p95 {errors[pick][1]:+.0%}"
            if pick in errors
            else ""
        )
    )


def replay(
    report: dict[str, Any],
    stores: Path,
    *,
    detail: bool = False,
    overrides: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One summary per row (case, concurrency); prints as it goes."""
    out: list[dict[str, Any]] = []
    for row in report["rows"]:
        rounds = [r for r in row["rounds"] if r.get("ended_at")]
        sweep = report["sweeps"].get(row.get("sweep_case") or "")
        db = stores / f"{row['case']}_c{row['concurrency']}.db"
        if not rounds or sweep is None or not db.exists():
            continue
        last = rounds[-1]
        store = Store(f"sqlite:///{db}")
        try:
            settings = RecommendSettings(window_s=last["window_s"], **(overrides or {}))
            obs = observe_model(
                store, last["target"], row["model"], settings=settings, now=last["ended_at"]
            )
        finally:
            store.close()
        model = batcher_model(obs, settings) if obs is not None else None
        if obs is None or model is None:
            print(f"({row['case']}) c={row['concurrency']}: no model (too little data)")
            continue
        measured = {
            p["config"]: p["measure"]
            for p in sweep["points"]
            if p["concurrency"] == row["concurrency"]
        }
        objective = row["objective_p95_ms"]
        grid = _grid_predictions(model, sweep["grid"], measured, objective)
        lines, q_err, p_err, best_pred, errors = grid
        pick = best_pred[1] if best_pred else None
        best_name, ratio = _against_sweep_best(measured, objective, pick)
        summary = {
            "case": row["case"],
            "concurrency": row["concurrency"],
            "population": obs.population,
            "think_ms": obs.think_ms,
            "scale": model.scale,
            "qps_err_median": statistics.median(q_err) if q_err else None,
            "qps_err_max": max(q_err) if q_err else None,
            "p95_err_median": statistics.median(p_err) if p_err else None,
            "p95_err_max": max(p_err) if p_err else None,
            "model_pick": pick,
            "sweep_best": best_name,
            "grid_ratio": ratio,
        }
        out.append(summary)
        _print_summary(summary, obs, model, lines if detail else None, errors)
    return out


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="bench/model_accuracy.py", description=__doc__)
    parser.add_argument("--json", required=True, help="bench/recommend.py --json output")
    parser.add_argument("--stores", required=True, help="its --keep-stores folder")
    parser.add_argument("--detail", action="store_true", help="print every grid config")
    parser.add_argument(
        "--think-cv",
        type=float,
        default=None,
        help="replay with this RecommendSettings.client_think_cv",
    )
    args = parser.parse_args(argv)
    report = json.loads(Path(args.json).read_text())
    overrides = {} if args.think_cv is None else {"client_think_cv": args.think_cv}
    return replay(report, Path(args.stores), detail=args.detail, overrides=overrides)


if __name__ == "__main__":
    main()
