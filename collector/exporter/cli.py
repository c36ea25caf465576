"""``batchscope exporter``: the sidecar's command line (registered by ``collector.cli``).

Only ``argparse`` is imported when the parser is built; the exporter itself is
imported when the command runs, so other commands start no slower.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector.errors import ConfigError

if TYPE_CHECKING:
    from collector.config import Settings

__all__ = ["DEFAULT_LISTEN", "add_exporter_command", "parse_listen"]

#: Loopback only unless told otherwise; 9478 is ``service.DEFAULT_LISTEN_PORT``.
DEFAULT_LISTEN = "127.0.0.1:9478"
#: The exporter's own store keeps raw samples this much longer than the longest
#: window an analysis reads, so the retention job (every minute) never cuts into one.
_RETENTION_EVERY_S = 60.0


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for an IPv6 address) as (host, port), or
    ``ConfigError("listen", ...)``."""
    host, sep, port_text = text.strip().rpartition(":")
    example = f"expected HOST:PORT, e.g. {DEFAULT_LISTEN} or [::1]:9478"
    if not sep or not host:
        raise ConfigError("listen", f"{example}; got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError("listen", f"an IPv6 address goes in brackets ({example}); got {text!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError("listen", f"port must be a number 1..65535; got {text!r}") from None
    if not 0 < port < 65536:
        raise ConfigError("listen", f"port must be 1..65535; got {port}")
    return host, port


def add_exporter_command(sub: Any) -> None:
    """Add ``exporter`` to ``batchscope``'s subcommands."""
    parser = sub.add_parser(
        "exporter",
        help="sidecar: collect and analyse one Triton, export to Prometheus on /metrics",
        description="Scrape Triton (and NVML and the host), run the detectors and the "
        "recommender, and serve what Triton's own metrics lack on /metrics, with "
        "/healthz, /readyz and a landing page at /. Without --db the samples live in a "
        "temporary SQLite file, kept 15 minutes and removed at exit.",
    )
    parser.add_argument(
        "--triton",
        action="append",
        metavar="URL",
        help="Triton HTTP endpoint, e.g. http://localhost:8000 (repeatable)",
    )
    parser.add_argument(
        "--metrics-url",
        action="append",
        metavar="URL",
        help="metrics endpoint per --triton (default: same host, port 8002, /metrics)",
    )
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address /metrics is served on (default {DEFAULT_LISTEN}: this machine only; "
        "0.0.0.0:9478 for a Prometheus elsewhere)",
    )
    parser.add_argument("--interval", type=str, metavar="S", help="seconds between scrapes")
    parser.add_argument(
        "--sources", metavar="LIST", help="comma-separated sources (default triton,nvml,host)"
    )
    from collector.command_support import add_fleet_flags

    add_fleet_flags(parser)  # --file-sd, --shard
    parser.add_argument(
        "--db",
        dest="db_url",
        metavar="URL",
        help="keep the samples in this database instead (SQLAlchemy URL, e.g. "
        "sqlite:///exporter.db or postgresql+psycopg://user@host/db), with the retention "
        "the settings give",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML settings file")
    parser.set_defaults(func=_cmd_exporter)


def _settings(args: argparse.Namespace, own_db_url: str | None) -> Settings:
    """The settings: file and environment, then the flags; ``own_db_url`` (the
    exporter's temporary store, when no --db) with a retention just long enough."""
    from collector.analysis.detect import detector_settings
    from collector.analysis.recommend.settings import DEFAULT_SETTINGS
    from collector.command_support import collecting_settings, split_list
    from collector.config import RetentionSettings

    settings = collecting_settings(
        args,
        interval_s=args.interval,
        sources=split_list(args.sources),
        default_db_url=own_db_url,
    )
    if own_db_url is None:
        return settings
    # The longest look-back of an analysis: the recommender's batch_stats history.
    longest_s = max(DEFAULT_SETTINGS.lookback_s, detector_settings(settings.analysis).window_s)
    retention = RetentionSettings(
        raw_keep_s=longest_s,
        rollup_keep_s=longest_s * 4,
        rollup_bucket_s=settings.retention.rollup_bucket_s,
        every_s=_RETENTION_EVERY_S,
    )
    return settings.model_copy(update={"retention": retention})


def _cmd_exporter(args: argparse.Namespace) -> int:
    # The CLI's shared pieces: the same Ctrl-C/SIGTERM handling and "no target" line.
    from collector.command_support import require_targets, stop_on_signals

    host, port = parse_listen(args.listen)
    own_dir = None if args.db_url else Path(tempfile.mkdtemp(prefix="batchscope-exporter-"))
    try:
        settings = _settings(args, f"sqlite:///{own_dir / 'exporter.db'}" if own_dir else None)
        require_targets(settings)
        return _serve(settings, host, port, stop_on_signals())
    finally:
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)


def _serve(settings: Settings, host: str, port: int, stop: Any) -> int:
    from collector.exporter.service import Exporter

    exporter = Exporter(settings, host=host, port=port)
    try:
        try:
            exporter.start()
        except OSError as exc:  # taken, not an address of this machine, or not ours
            reason = exc.strerror or str(exc)
            raise ConfigError(
                "listen", f"cannot listen on {host}:{port} ({reason}); choose another --listen"
            ) from None
        print(
            f"batchscope: exporting {', '.join(t.url for t in settings.targets)} "
            f"on {exporter.url}metrics",
            flush=True,
        )
        stop.wait(settings.duration_s)
    finally:
        exporter.close()
    return 0
