"""``batchscope`` subcommands: collect, status, recommend, apply, dashboard, serve,
exporter, testbed up, load, demo.

Each command loads its settings once, opens one ``Store`` and passes it down. A user
mistake (an invalid setting), an unreachable server or database, and Ctrl-C end with
one line on stderr and an exit status, not a traceback:

    0 done   1 nothing done (no recommendation, not confirmed, database error)
    2 invalid setting   3 Triton refused the change   4 change rolled back
    5 server unreachable   130 interrupted
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from alerts.cli import add_alerts_command
from collector.command_support import (
    add_fleet_flags,
    collecting_settings,
    describe_targets,
    existing_store,
    require_targets,
    split_list,
    stop_on_signals,
)
from collector.errors import BatchscopeError, ConfigError
from collector.exporter.cli import add_exporter_command
from collector.process_control import dump_stacks_on_sigusr1, tune_gc_for_service

if TYPE_CHECKING:
    from collector.config import Settings
    from collector.store import Store

__all__ = ["build_parser", "main"]

log = logging.getLogger("batchscope")

EXIT_NOTHING_DONE, EXIT_CONFIG, EXIT_REFUSED, EXIT_ROLLED_BACK, EXIT_UNREACHABLE = 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130
#: The shell's status for a command whose output pipe closed (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141
DEFAULT_PORT = 8050


def _check_ui_flags(args: argparse.Namespace) -> None:
    if not 0 < args.port < 65536:
        raise ConfigError("port", f"must be 1..65535, got {args.port}")
    if args.refresh <= 0:
        raise ConfigError("refresh", f"must be > 0, got {args.refresh:g}")


# ----------------------------------------------------------------------- commands


def _cmd_collect(args: argparse.Namespace) -> int:
    from sqlalchemy.engine import make_url

    from alerts.runtime import AlertsInProcess
    from collector.analysis.detect import detector_job, detector_settings
    from collector.scheduler import CollectorService, build_sources, store_pool_size
    from collector.sources import SOURCES
    from collector.store import Store

    settings = collecting_settings(
        args, interval_s=args.interval, sources=split_list(args.sources), duration_s=args.duration
    )
    require_targets(settings)
    detectors = detector_job(detector_settings(settings.analysis))
    store = Store(settings.db_url, pool_size=store_pool_size(settings, other_threads=1))  # + alerts
    try:
        store.open()  # a database that cannot be opened is one line now, not a log per scrape
        alerting = AlertsInProcess(store, settings)  # the rules after the detectors
        service = CollectorService(
            settings, store, build_sources(settings), analyses=[detectors, *alerting.jobs]
        )
        stop = stop_on_signals()
        log.info(
            "collecting from %s every %.3g s into %s",
            ", ".join(
                [describe_targets(settings)]
                + [n for n in settings.sources if not SOURCES[n].per_target]
            ),
            settings.interval_s,
            make_url(settings.db_url).render_as_string(hide_password=True),
        )
        with alerting:  # delivery stops after the collector's last pass
            service.run(settings.duration_s, stop)
    finally:
        store.close()
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from collector.analysis.status import build_status
    from collector.config import load_settings
    from collector.report import render_status

    if args.window <= 0:
        raise ConfigError("window", f"must be > 0, got {args.window:g}")
    settings = load_settings(config_file=args.config, overrides={"db_url": args.db_url})
    store = existing_store(settings.db_url)
    try:
        report = build_status(store, window_s=args.window)
    finally:
        store.close()
    if args.json:
        data = report.to_json_dict()
        shown = ("targets", "models", "devices", "processes")
        json.dump({k: data[k] for k in shown}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_status(report))
    return 0


def _cmd_recommend(args: argparse.Namespace) -> int:
    from collector.scheduler import store_pool_size
    from collector.store import Store

    if args.slo_p95_ms is not None and args.slo_p95_ms <= 0:
        raise ConfigError("slo_p95_ms", f"must be > 0, got {args.slo_p95_ms:g}")
    if args.db_url is None and not args.triton:
        raise ConfigError(
            "db",
            "give --db URL (recommend from stored samples) or --triton URL "
            "(observe the server live first)",
        )
    # Observing live scrapes every second from Triton and the host, whatever the file says.
    settings = collecting_settings(
        args,
        interval_s=1.0 if args.triton else None,
        sources=["triton", "host"] if args.triton else None,
        check_file_sd=not args.triton,  # observing one server ignores the file_sd files
    )
    if args.triton:  # observe this server, not the fleet the settings may list
        settings = settings.model_copy(update={"file_sd": (), "dns_sd": (), "shard": None})
    # Observing live writes the samples (into a new store if need be); recommending
    # from stored samples needs a store that holds some.
    store = (
        Store(settings.db_url, pool_size=store_pool_size(settings, analyses=False))
        if args.triton
        else existing_store(settings.db_url)
    )
    try:
        if args.triton:
            _observe(settings, store, args.observe)
        findings, recs = _recommend(store, settings, args)
    finally:
        store.close()
    if args.json:
        json.dump(
            {
                "findings": [asdict(f) for f in findings],
                "recommendations": [_recommendation_json(r) for r in recs],
            },
            sys.stdout,
            indent=2,
            default=str,
        )
        sys.stdout.write("\n")
    else:
        _print_recommendations(findings, recs)
    return 0


def _observe(settings: Any, store: Any, seconds: float) -> None:
    """Collect from the targets for ``seconds``; ``TargetUnreachable`` when a target
    never answered, so that "no recommendation" is not said of a server never seen."""
    import time

    from collector.apply import TargetUnreachable
    from collector.scheduler import CollectorService, build_sources

    print(
        f"observing {', '.join(t.url for t in settings.targets)} for {seconds:g} s ...",
        file=sys.stderr,
    )
    started = time.time()
    CollectorService(settings, store, build_sources(settings)).run(seconds)
    states = {t.name: t for t in store.targets()}
    for target in settings.targets:
        state = states.get(target.name)
        if state is None or state.last_seen_at is None or state.last_seen_at < started:
            why = state.last_error if state is not None and state.last_error else "no answer"
            if target.metrics_url in why:
                why += "; pass --metrics-url when its metrics are served elsewhere"
            raise TargetUnreachable(f"could not reach Triton at {target.url}: {why}")


def _recommend(store: Any, settings: Any, args: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    """Active findings, and a stored recommendation per model with enough traffic."""
    from collector.analysis.detect import detector_settings, run_detectors
    from collector.analysis.recommend import recommend_model
    from collector.analysis.recommend.settings import DEFAULT_SETTINGS

    targets = (
        [t.name for t in settings.targets]
        if args.triton
        else [t.name for t in store.targets() if t.kind == "triton"]
    )
    models = {t: sorted({m for (_, m) in store.latest_model_configs(t)}) for t in targets}
    known = sorted({m for names in models.values() for m in names})
    if args.model and args.model not in known:
        raise ConfigError(
            "model",
            f"unknown model {args.model!r}; known models: {', '.join(known) or 'none yet'}",
        )
    if args.window is not None and args.window <= 0:
        raise ConfigError("window", f"must be > 0, got {args.window:g}")
    window_s = DEFAULT_SETTINGS.window_s if args.window is None else args.window
    findings = list(run_detectors(store, detector_settings(settings.analysis)))
    if args.model:
        findings = [f for f in findings if f.subject == args.model]
    recs = []
    for target, names in models.items():
        for model in names:
            if args.model and model != args.model:
                continue
            slo = args.slo_p95_ms if args.slo_p95_ms is not None else settings.slo_p95_ms.get(model)
            rec = recommend_model(store, target, model, slo_p95_ms=slo, window_s=window_s)
            if rec is not None:
                store.add_recommendation(rec)
                recs.append(rec)
    return findings, recs


def _print_recommendations(findings: Sequence[Any], recs: Sequence[Any]) -> None:
    from collector.report import render_findings, render_recommendation

    print(render_findings(findings))
    print()
    if not recs:
        print("no recommendation: no model has enough observed traffic in the window")
    for rec in recs:
        print(render_recommendation(rec))
        print()


def _recommendation_json(rec: Any) -> dict[str, Any]:
    from collector.analysis.recommend import recommendation_figures

    return {
        "target": rec.target,
        "model": rec.model,
        "kind": rec.kind,
        "changes": [{"field": c.field, "from": c.before, "to": c.after} for c in rec.changes],
        "current": asdict(rec.current),
        "predicted": asdict(rec.predicted),
        # The one current figure and gain every view shows (None: no gain claimed).
        "figures": asdict(recommendation_figures(rec)),
        "confidence": rec.confidence,
        "reason": rec.reason,
        "slo_p95_ms": rec.slo_p95_ms,
        "config_pbtxt": rec.config_pbtxt,
        "config_json": json.loads(rec.config_json),
        "evidence": rec.evidence,
        "created_at": rec.created_at,
    }


def _cmd_apply(args: argparse.Namespace) -> int:
    import requests

    from collector.apply import ApplyRefused, check_live_changes, stored_recommendation
    from collector.config import load_settings, target_from_url
    from collector.metrics_endpoint import find_metrics_target
    from collector.report import render_recommendation

    if args.verify_s is not None and args.verify_s <= 0:
        raise ConfigError("verify_s", f"must be > 0, got {args.verify_s:g}")
    windows = {} if args.verify_s is None else {"before_s": args.verify_s, "after_s": args.verify_s}
    # The settings' own targets are where --triton's metrics URL may be written down.
    settings = load_settings(
        config_file=args.config, overrides={"db_url": args.db_url, "apply": windows or None}
    )
    named = target_from_url(args.triton, args.metrics_url, field_name="triton")
    store = existing_store(settings.db_url)  # the recommendation to apply is stored there
    http = requests.Session()
    http.trust_env = False  # talk to the server the settings name, not a proxy
    try:
        found = stored_recommendation(store, named.name, args.model)
        if found is None:
            print(
                f"batchscope: no recommendation for {args.model!r} on {named.name} in the "
                f"store; run `batchscope recommend` first",
                file=sys.stderr,
            )
            return EXIT_NOTHING_DONE
        print(render_recommendation(found[1]))
        if not found[1].changes:
            print("nothing to apply: the recommendation is to keep the current config")
            return 0
        try:
            check_live_changes(http, named.url)  # reachable, and takes live changes
        except ApplyRefused as exc:
            print(f"batchscope: {exc}", file=sys.stderr)
            return EXIT_REFUSED
        metrics = find_metrics_target(
            args.triton,
            args.metrics_url,
            settings.targets,
            http=http,
            model=args.model,
            stored=store.targets(),
        )
        target = metrics.target
        if not args.yes and not _confirmed(f"apply this change to {args.model} on {target.url}?"):
            print("not applied (--yes applies without asking)")
            return EXIT_NOTHING_DONE
        print(f"metrics of {target.name}: {target.metrics_url} ({metrics.origin})", file=sys.stderr)
        return _apply_confirmed(target, found, store, http, settings)
    finally:
        http.close()
        store.close()


def _confirmed(question: str) -> bool:
    """The user's yes to ``question``; no answer (stdin closed) is a no."""
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        print()
        return False


def _apply_confirmed(
    target: Any, found: tuple[int, Any], store: Store, http: Any, settings: Settings
) -> int:
    from collector.apply import ApplyRefused, apply_recommendation

    stop = stop_on_signals()  # Ctrl-C from here on rolls an unverified change back
    try:
        result = apply_recommendation(
            target,
            found[1],
            store=store,
            http=http,
            settings=settings.apply,
            recommendation_id=found[0],
            wait=stop.wait,
            say=lambda m: print(m, file=sys.stderr),
        )
    except ApplyRefused as exc:
        print(f"batchscope: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(result.verdict.summary)
    return EXIT_ROLLED_BACK if result.rolled_back else 0


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from collector.config import load_settings
    from dashboard.actions import ConfigActions
    from dashboard.app import serve

    _check_ui_flags(args)
    settings = load_settings(
        config_file=args.config, overrides={"db_url": args.db_url, "triton": args.triton}
    )
    store = existing_store(settings.db_url)
    actions = ConfigActions(store, settings.targets, apply=settings.ui_apply)
    try:
        serve(
            store,
            actions=actions,
            host=args.host,
            port=args.port,
            refresh_s=args.refresh,
            ui=settings.ui,
            slo_p95_ms=settings.slo_p95_ms,
        )
    finally:
        actions.close()
        store.close()
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from collector.serve import Service

    _check_ui_flags(args)
    settings = collecting_settings(args, interval_s=args.interval, sources=split_list(args.sources))
    require_targets(settings)
    service = Service(settings, host=args.host, port=args.port, refresh_s=args.refresh)
    stop = stop_on_signals()
    try:
        service.start()
        print(
            f"batchscope: collecting from {describe_targets(settings)}; UI on {service.url}",
            flush=True,
        )
        stop.wait(settings.duration_s)
    finally:
        service.close()
    return 0


# ------------------------------------------------------------------------ parsers


def _add_db_and_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        dest="db_url",
        metavar="URL",
        help="SQLAlchemy database URL (default sqlite:///batchscope.db)",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML settings file")


def _add_triton(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--triton", action="append", metavar="URL", help=help_text)
    parser.add_argument(
        "--metrics-url",
        action="append",
        metavar="URL",
        help="metrics endpoint per --triton, in the same order "
        "(default: same host, port 8002, /metrics)",
    )


def _add_collection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=str, metavar="S", help="seconds between scrapes")
    parser.add_argument(
        "--sources",
        metavar="LIST",
        help="comma-separated sources to run (default triton,nvml,host)",
    )
    add_fleet_flags(parser)
    parser.add_argument(
        "--prometheus",
        metavar="URL",
        help="fleet mode: read every Triton that this Prometheus scrapes from its HTTP API "
        "(sources default to prometheus)",
    )


def _add_ui(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help=f"address {what} binds (default 127.0.0.1: this machine only)",
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--refresh",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds between live refreshes (default 5)",
    )


def _add_collect_commands(sub: Any) -> None:
    collect = sub.add_parser(
        "collect", help="scrape Triton targets, NVML and the host into the store"
    )
    _add_triton(collect, "Triton HTTP endpoint, e.g. http://localhost:8000 (repeatable)")
    _add_collection(collect)
    collect.add_argument(
        "--duration",
        type=str,
        metavar="S",
        help="stop after S seconds (default: run until stopped)",
    )
    _add_db_and_config(collect)
    collect.set_defaults(func=_cmd_collect)

    status = sub.add_parser("status", help="the latest window per target, model, device, process")
    status.add_argument(
        "--window", type=float, default=60.0, metavar="S", help="window in seconds (default 60)"
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    _add_db_and_config(status)
    status.set_defaults(func=_cmd_status)


def _add_advice_commands(sub: Any) -> None:
    recommend = sub.add_parser("recommend", help="findings and batching recommendations")
    _add_triton(recommend, "observe this Triton live first (instead of stored samples)")
    recommend.add_argument("--model", metavar="NAME", help="only this model")
    recommend.add_argument(
        "--slo-p95-ms",
        type=float,
        metavar="X",
        help="latency objective; without it p95 may rise at most 10 %%",
    )
    recommend.add_argument(
        "--window",
        type=float,
        default=None,
        metavar="S",
        help="the load to recommend for: the last S seconds (default: the recommender's "
        "window, a minute)",
    )
    recommend.add_argument(
        "--observe",
        type=float,
        default=30.0,
        metavar="S",
        help="with --triton: seconds to observe first (default 30)",
    )
    recommend.add_argument("--json", action="store_true", help="machine-readable output")
    _add_db_and_config(recommend)
    recommend.set_defaults(func=_cmd_recommend)

    apply = sub.add_parser(
        "apply", help="apply the latest recommendation live, verify, roll back on a regression"
    )
    apply.add_argument("--triton", required=True, metavar="URL", help="Triton HTTP endpoint")
    apply.add_argument(
        "--metrics-url", metavar="URL", help="its metrics endpoint (default: same host, port 8002)"
    )
    apply.add_argument(
        "--model",
        required=True,
        metavar="NAME",
        help="the model whose stored recommendation to apply",
    )
    apply.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    apply.add_argument(
        "--verify-s",
        type=float,
        metavar="S",
        help="length of the before and after windows (default: the settings' "
        "apply.before_s and apply.after_s, 30)",
    )
    _add_db_and_config(apply)
    apply.set_defaults(func=_cmd_apply)


def _add_ui_commands(sub: Any) -> None:
    dashboard = sub.add_parser("dashboard", help="serve the web UI over the store")
    _add_ui(dashboard, "the UI")
    dashboard.add_argument(
        "--triton",
        action="append",
        metavar="URL",
        help="a Triton server an admin may apply changes to (repeatable)",
    )
    _add_db_and_config(dashboard)
    dashboard.set_defaults(func=_cmd_dashboard)

    serve = sub.add_parser("serve", help="collector, analysis and the web UI in one process")
    _add_triton(serve, "Triton HTTP endpoint (repeatable)")
    _add_collection(serve)
    _add_ui(serve, "the UI")
    _add_db_and_config(serve)
    serve.set_defaults(func=_cmd_serve)


def _add_testbed_commands(sub: Any) -> None:
    try:
        from collector.demo import add_demo_command
        from collector.testbed.cli import add_testbed_commands
    except ImportError as exc:  # the testbed extra is not installed
        missing = str(exc)

        def _no_testbed(_args: argparse.Namespace) -> int:
            print(
                f"the testbed needs the 'testbed' extra: pip install 'batchscope[testbed]' "
                f"({missing})",
                file=sys.stderr,
            )
            return EXIT_CONFIG

        for name in ("testbed", "load", "demo"):
            sub.add_parser(name, help="(needs the testbed extra)").set_defaults(func=_no_testbed)
    else:
        add_testbed_commands(sub)
        add_demo_command(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchscope",
        description="Monitor NVIDIA Triton Inference Server: utilisation, queueing, batching.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_collect_commands(sub)
    _add_advice_commands(sub)
    _add_ui_commands(sub)
    add_exporter_command(sub)
    add_alerts_command(sub)
    _add_testbed_commands(sub)
    return parser


def _run(args: argparse.Namespace) -> int:
    """The command, with the errors a user can cause or fix as one line and a status."""
    from sqlalchemy.exc import SQLAlchemyError

    from collector.apply import TargetUnreachable

    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is handled, not at exit
        return status
    except ConfigError as exc:
        status, message = EXIT_CONFIG, str(exc)
    except TargetUnreachable as exc:
        status, message = EXIT_UNREACHABLE, str(exc)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in ("tritonclient", "pytriton"):
            raise
        status, message = (
            EXIT_CONFIG,
            (f"this command needs the 'testbed' extra: pip install 'batchscope[testbed]' ({exc})"),
        )
    except SQLAlchemyError as exc:  # the database is unreachable, locked or not ours
        status, message = EXIT_NOTHING_DONE, f"database error: {getattr(exc, 'orig', exc)}"
    except BatchscopeError as exc:
        status, message = EXIT_NOTHING_DONE, str(exc)
    except KeyboardInterrupt:
        status, message = EXIT_INTERRUPTED, "interrupted"
    except BrokenPipeError:
        # The reader went away (`status | head`): what it did not read is nobody's loss.
        # Point stdout at /dev/null so Python's own flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as exc:  # the UI's port is taken, or not ours to bind
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        status = EXIT_CONFIG
        message = (
            f"invalid setting port: cannot listen there ({exc.strerror}); choose another --port"
        )
    # One line, also when the cause spans several (a driver's hint, a YAML error's caret).
    print(f"batchscope: {' '.join(message.split())}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tune_gc_for_service()
    dump_stacks_on_sigusr1()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Their routine messages (each migration step) are noise at INFO.
    logging.getLogger("alembic").setLevel(logging.WARNING if not args.verbose else logging.INFO)
    # urllib3 logs every request's path at DEBUG, and a Slack webhook's path is its
    # token: not even -v prints it.
    logging.getLogger("urllib3").setLevel(logging.INFO)
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
