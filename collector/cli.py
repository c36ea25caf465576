"""``batchscope`` subcommands: collect, status, recommend, apply, dashboard, testbed up,
load, demo."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from collector.errors import ConfigError

__all__ = ["main"]

log = logging.getLogger("batchscope")


def _add_common_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", dest="db_url", metavar="URL",
                        help="SQLAlchemy database URL (default sqlite:///batchscope.db)")
    parser.add_argument("--config", metavar="FILE", help="YAML settings file")


def _stop_on_signals() -> threading.Event:
    """An event that SIGTERM and SIGINT set (when called on the main thread)."""
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    return stop


def _cmd_collect(args: argparse.Namespace) -> int:
    from sqlalchemy.engine import make_url

    from collector.analysis.detect import detector_job, detector_settings
    from collector.config import load_settings
    from collector.scheduler import CollectorService, build_sources
    from collector.sources import SOURCES
    from collector.store import Store

    settings = load_settings(
        config_file=args.config,
        overrides={"triton": args.triton, "metrics_url": args.metrics_url, "db_url": args.db_url,
                   "interval_s": args.interval, "duration_s": args.duration,
                   "sources": args.sources.split(",") if args.sources else None},
        known_sources=set(SOURCES))
    # A GPU-only host (``--sources nvml,host``) needs no Triton target.
    if not settings.targets and any(SOURCES[n].per_target for n in settings.sources):
        raise ConfigError("targets", "no Triton target: pass --triton URL, set BATCHSCOPE_TRITON "
                                     "or list targets in the config file")
    detectors = detector_job(detector_settings(settings.analysis))  # validated before start
    store = Store(settings.db_url)
    service = CollectorService(settings, store, build_sources(settings), analyses=[detectors])
    stop = _stop_on_signals()
    log.info("collecting from %s every %.3g s into %s",
             ", ".join([t.url for t in settings.targets] + [
                 n for n in settings.sources if not SOURCES[n].per_target]),
             settings.interval_s,
             make_url(settings.db_url).render_as_string(hide_password=True))
    try:
        service.run(settings.duration_s, stop)
    finally:
        store.close()
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from collector.analysis.status import build_status
    from collector.config import load_settings
    from collector.report import render_status
    from collector.store import Store

    if args.window <= 0:
        raise ConfigError("window", f"must be > 0, got {args.window:g}")
    settings = load_settings(config_file=args.config, overrides={"db_url": args.db_url})
    store = Store(settings.db_url)
    try:
        report = build_status(store, window_s=args.window)
    finally:
        store.close()
    if args.json:
        data = report.to_json_dict()
        json.dump({k: data[k] for k in ("models", "devices", "processes")}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_status(report))
    return 0


def _collect_for(settings: Any, store: Any, seconds: float) -> None:
    from collector.scheduler import CollectorService, build_sources

    print(f"observing {', '.join(t.url for t in settings.targets)} for {seconds:g} s ...",
          file=sys.stderr)
    CollectorService(settings, store, build_sources(settings)).run(seconds)


def _cmd_recommend(args: argparse.Namespace) -> int:
    from collector.analysis.recommend import recommend_model, store_recommendation
    from collector.config import load_settings
    from collector.report import render_findings, render_recommendation
    from collector.sources import SOURCES
    from collector.store import Store

    if args.slo_p95_ms is not None and args.slo_p95_ms <= 0:
        raise ConfigError("slo_p95_ms", f"must be > 0, got {args.slo_p95_ms:g}")
    if args.db_url is None and not args.triton:
        raise ConfigError("db", "give --db URL (recommend from stored samples) or --triton URL "
                                "(observe the server live first)")
    settings = load_settings(
        config_file=args.config,
        overrides={"triton": args.triton, "metrics_url": args.metrics_url, "db_url": args.db_url,
                   "interval_s": 1.0 if args.triton else None,
                   "sources": ["triton", "host"] if args.triton else None},
        known_sources=set(SOURCES))
    store = Store(settings.db_url)
    try:
        if args.triton:
            _collect_for(settings, store, args.observe)
        findings = _findings(store, settings)
        targets = ([t.name for t in settings.targets] if args.triton
                   else [t.name for t in store.targets() if t.kind == "triton"])
        recs = []
        for target in targets:
            models = sorted({m for (t, m) in store.latest_model_configs(target) if t == target})
            for model in models:
                if args.model and model != args.model:
                    continue
                slo = (args.slo_p95_ms if args.slo_p95_ms is not None
                       else settings.slo_p95_ms.get(model))
                rec = recommend_model(store, target, model, slo_p95_ms=slo,
                                      window_s=args.window)
                if rec is None:
                    continue
                store_recommendation(store, rec)
                recs.append(rec)
    finally:
        store.close()
    if args.json:
        json.dump({"findings": [_finding_json(f) for f in findings],
                   "recommendations": [_recommendation_json(r) for r in recs]},
                  sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    print(render_findings(findings))
    print()
    if not recs:
        print("no recommendation: no model has enough observed traffic in the window")
    for rec in recs:
        print(render_recommendation(rec))
        print()
    return 0


def _findings(store: Any, settings: Any) -> list[Any]:
    from collector.analysis.detect import detector_settings, run_detectors

    return list(run_detectors(store, detector_settings(settings.analysis)))


def _finding_json(finding: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(finding)


def _recommendation_json(rec: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "target": rec.target, "model": rec.model, "kind": rec.kind,
        "changes": [{"field": c.field, "from": c.before, "to": c.after} for c in rec.changes],
        "current": asdict(rec.current), "predicted": asdict(rec.predicted),
        "confidence": rec.confidence, "reason": rec.reason, "slo_p95_ms": rec.slo_p95_ms,
        "config_pbtxt": rec.config_pbtxt, "config_json": json.loads(rec.config_json),
        "evidence": rec.evidence, "created_at": rec.created_at,
    }


def _cmd_apply(args: argparse.Namespace) -> int:
    from collector.analysis.recommend import recommendation_from_dict
    from collector.apply import ApplyRefused, apply_recommendation
    from collector.config import load_settings
    from collector.report import render_recommendation
    from collector.store import Store

    settings = load_settings(config_file=args.config,
                             overrides={"triton": [args.triton], "db_url": args.db_url,
                                        "metrics_url": [args.metrics_url]
                                        if args.metrics_url else None})
    (target,) = settings.targets
    if args.verify_s <= 0:
        raise ConfigError("verify_s", f"must be > 0, got {args.verify_s:g}")
    store = Store(settings.db_url)
    try:
        stored = store.recommendations(target=target.name, model=args.model)
        if not stored:
            print(f"batchscope: no recommendation for {args.model!r} on {target.name} in the "
                  f"store; run `batchscope recommend` first", file=sys.stderr)
            return 1
        rec = recommendation_from_dict(stored[-1].change)
        print(render_recommendation(rec))
        if not rec.changes:
            print("nothing to apply: the recommendation is to keep the current config")
            return 0
        if not args.yes:
            answer = input(f"apply this change to {args.model} on {target.url}? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("not applied")
                return 1
        try:
            result = apply_recommendation(target, rec, verify_s=args.verify_s, store=store,
                                          say=lambda m: print(m, file=sys.stderr))
        except ApplyRefused as exc:
            print(f"batchscope: {exc}", file=sys.stderr)
            return 3
    finally:
        store.close()
    print(result.verdict)
    return 0 if not result.rolled_back else 4


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from collector.config import load_settings
    from dashboard.app import serve

    if not 0 < args.port < 65536:
        raise ConfigError("port", f"must be 1..65535, got {args.port}")
    if args.refresh <= 0:
        raise ConfigError("refresh", f"must be > 0, got {args.refresh:g}")
    settings = load_settings(config_file=args.config,
                             overrides={"db_url": args.db_url, "triton": args.triton})
    serve(settings.db_url, host=args.host, port=args.port, refresh_s=args.refresh,
          ui=settings.ui, targets=settings.targets, slo_p95_ms=settings.slo_p95_ms)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from collector.config import load_settings
    from collector.serve import Service
    from collector.sources import SOURCES

    if not 0 < args.port < 65536:
        raise ConfigError("port", f"must be 1..65535, got {args.port}")
    if args.refresh <= 0:
        raise ConfigError("refresh", f"must be > 0, got {args.refresh:g}")
    settings = load_settings(
        config_file=args.config,
        overrides={"triton": args.triton, "metrics_url": args.metrics_url, "db_url": args.db_url,
                   "interval_s": args.interval,
                   "sources": args.sources.split(",") if args.sources else None},
        known_sources=set(SOURCES))
    if not settings.targets:
        raise ConfigError("targets", "no Triton target: pass --triton URL, set BATCHSCOPE_TRITON "
                                     "or list targets in the config file")
    service = Service(settings, host=args.host, port=args.port, refresh_s=args.refresh)
    stop = _stop_on_signals()
    service.start()
    print(f"batchscope: collecting from {', '.join(t.url for t in settings.targets)}; "
          f"UI on {service.url}", flush=True)
    try:
        stop.wait(settings.duration_s)
    finally:
        service.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchscope",
        description="Monitor NVIDIA Triton Inference Server: utilisation, queueing, batching.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    collect = sub.add_parser("collect", help="scrape Triton targets, NVML and the host into the "
                                             "store")
    collect.add_argument("--triton", action="append", metavar="URL",
                         help="Triton HTTP endpoint, e.g. http://localhost:8000 (repeatable)")
    collect.add_argument("--metrics-url", action="append", metavar="URL",
                         help="metrics endpoint per --triton, in the same order "
                              "(default: same host, port 8002, /metrics)")
    collect.add_argument("--interval", type=str, metavar="S", help="seconds between scrapes")
    collect.add_argument("--duration", type=str, metavar="S",
                         help="stop after S seconds (default: run until stopped)")
    collect.add_argument("--sources", metavar="LIST",
                         help="comma-separated sources to run (default triton,nvml,host)")
    _add_common_db(collect)
    collect.set_defaults(func=_cmd_collect)

    status = sub.add_parser("status", help="the latest window per target, model, device, process")
    status.add_argument("--window", type=float, default=60.0, metavar="S",
                        help="window in seconds (default 60)")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    _add_common_db(status)
    status.set_defaults(func=_cmd_status)

    recommend = sub.add_parser("recommend", help="findings and batching recommendations")
    recommend.add_argument("--triton", action="append", metavar="URL",
                           help="observe this Triton live first (instead of stored samples)")
    recommend.add_argument("--metrics-url", action="append", metavar="URL",
                           help="metrics endpoint per --triton (default: same host, port 8002)")
    recommend.add_argument("--model", metavar="NAME", help="only this model")
    recommend.add_argument("--slo-p95-ms", type=float, metavar="X",
                           help="latency objective; without it p95 may rise at most 10 %%")
    recommend.add_argument("--window", type=float, default=30.0, metavar="S",
                           help="the load to recommend for: the last S seconds (default 30)")
    recommend.add_argument("--observe", type=float, default=30.0, metavar="S",
                           help="with --triton: seconds to observe first (default 30)")
    recommend.add_argument("--json", action="store_true")
    _add_common_db(recommend)
    recommend.set_defaults(func=_cmd_recommend)

    apply = sub.add_parser("apply", help="apply the latest recommendation live, verify, "
                                         "roll back on a regression")
    apply.add_argument("--triton", required=True, metavar="URL", help="Triton HTTP endpoint")
    apply.add_argument("--metrics-url", metavar="URL",
                       help="its metrics endpoint (default: same host, port 8002)")
    apply.add_argument("--model", required=True, metavar="NAME")
    apply.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    apply.add_argument("--verify-s", type=float, default=30.0, metavar="S",
                       help="length of the before and after windows (default 30)")
    _add_common_db(apply)
    apply.set_defaults(func=_cmd_apply)

    dashboard = sub.add_parser("dashboard", help="serve the web UI over the store")
    dashboard.add_argument("--host", default="127.0.0.1",
                           help="address to bind (default 127.0.0.1: this machine only)")
    dashboard.add_argument("--port", type=int, default=8050, help="port (default 8050)")
    dashboard.add_argument("--refresh", type=float, default=5.0, metavar="S",
                           help="seconds between live refreshes (default 5)")
    dashboard.add_argument("--triton", action="append", metavar="URL",
                           help="a Triton server an admin may apply changes to (repeatable)")
    _add_common_db(dashboard)
    dashboard.set_defaults(func=_cmd_dashboard)

    serve = sub.add_parser("serve", help="collector, analysis and the web UI in one process")
    serve.add_argument("--triton", action="append", metavar="URL",
                       help="Triton HTTP endpoint (repeatable)")
    serve.add_argument("--metrics-url", action="append", metavar="URL",
                       help="metrics endpoint per --triton (default: same host, port 8002)")
    serve.add_argument("--interval", type=str, metavar="S", help="seconds between scrapes")
    serve.add_argument("--sources", metavar="LIST",
                       help="comma-separated sources to run (default triton,nvml,host)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address the UI binds (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8050, help="UI port (default 8050)")
    serve.add_argument("--refresh", type=float, default=5.0, metavar="S",
                       help="seconds between live refreshes of the UI (default 5)")
    _add_common_db(serve)
    serve.set_defaults(func=_cmd_serve)

    try:
        from collector.demo import add_demo_command
        from collector.testbed.cli import add_testbed_commands
    except ImportError as exc:  # the testbed extra is not installed
        missing = str(exc)

        def _no_testbed(_args: argparse.Namespace) -> int:
            print(f"the testbed needs the 'testbed' extra: pip install 'batchscope[testbed]' "
                  f"({missing})", file=sys.stderr)
            return 2

        for name in ("testbed", "load", "demo"):
            sub.add_parser(name, help="(needs the testbed extra)").set_defaults(func=_no_testbed)
    else:
        add_testbed_commands(sub)
        add_demo_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.ERROR if not args.verbose else logging.INFO)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"batchscope: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
