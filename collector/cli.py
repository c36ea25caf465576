"""``batchscope`` subcommands: collect, status, testbed up, load."""

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


def _cmd_collect(args: argparse.Namespace) -> int:
    from sqlalchemy.engine import make_url

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
    if not settings.targets:
        raise ConfigError("targets", "no Triton target: pass --triton URL, set BATCHSCOPE_TRITON "
                                     "or list targets in the config file")
    store = Store(settings.db_url)
    service = CollectorService(settings, store, build_sources(settings))
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    log.info("collecting from %s every %.3g s into %s",
             ", ".join(t.url for t in settings.targets), settings.interval_s,
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
