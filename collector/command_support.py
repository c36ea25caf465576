"""What the ``batchscope`` subcommands share: settings for a command that scrapes
Triton, opening an existing store, and stopping on SIGTERM or Ctrl-C. The commands of
``collector.cli``, ``collector.exporter.cli`` and ``alerts.cli`` use these, so each
behaves the same way."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import TYPE_CHECKING, Any

from collector.analysis.health import FLEET_SOURCE
from collector.errors import ConfigError

if TYPE_CHECKING:
    from collector.config import Settings
    from collector.store import Store

__all__ = [
    "NO_TARGET",
    "add_fleet_flags",
    "collecting_settings",
    "describe_targets",
    "existing_store",
    "require_targets",
    "split_list",
    "stop_on_signals",
]

log = logging.getLogger("batchscope")


def stop_on_signals() -> threading.Event:
    """An event that SIGTERM and SIGINT set (when called on the main thread)."""
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    return stop


def split_list(text: str | None) -> list[str] | None:
    return text.split(",") if text else None


def collecting_settings(
    args: argparse.Namespace,
    *,
    interval_s: float | str | None,
    sources: list[str] | None,
    duration_s: float | str | None = None,
    default_db_url: str | None = None,
    check_file_sd: bool = True,
) -> Settings:
    """Settings for a command that scrapes Triton: the file and environment, then the
    command's ``--triton``, ``--metrics-url``, ``--file-sd``, ``--shard`` and ``--db``
    (or ``default_db_url`` when it has its own store) and the given collection
    overrides (``None`` leaves a setting as the file or environment says). The file_sd
    files are read once as a check, unless ``check_file_sd`` is False (a command that
    does not scrape them)."""
    from collector.config import load_settings
    from collector.discovery import FileSd
    from collector.sources import SOURCES

    settings = load_settings(
        config_file=args.config,
        overrides={
            "triton": args.triton,
            "metrics_url": args.metrics_url,
            "db_url": args.db_url or default_db_url,
            "interval_s": interval_s,
            "duration_s": duration_s,
            "sources": sources or ([FLEET_SOURCE] if getattr(args, "prometheus", None) else None),
            "prometheus_url": getattr(args, "prometheus", None),
            # Flags of the commands that scrape a fleet (add_fleet_flags).
            "file_sd": getattr(args, "file_sd", None),
            "dns_sd": getattr(args, "dns_sd", None),
            "shard": getattr(args, "shard", None),
        },
        known_sources=set(SOURCES),
    )
    if settings.file_sd and check_file_sd:
        FileSd(settings.file_sd).load()  # a file missing or invalid stops the start here
    return settings


NO_TARGET = (
    "no Triton target: pass --triton URL, --file-sd FILE or --dns-sd NAME, set "
    "BATCHSCOPE_TRITON or list targets in the config file"
)


def add_fleet_flags(parser: argparse.ArgumentParser) -> None:
    """``--file-sd``, ``--dns-sd`` and ``--shard``, for a command that scrapes targets."""
    parser.add_argument(
        "--file-sd",
        action="append",
        metavar="FILE",
        help="Prometheus file_sd file (JSON or YAML, a glob pattern too) listing more "
        "targets, re-read when it changes (repeatable)",
    )
    parser.add_argument(
        "--dns-sd",
        action="append",
        metavar="NAME",
        help="DNS SRV name whose records list more targets (each record's host:port an "
        "HTTP endpoint, metrics on dns_sd_metrics_port, 8002, of that host), looked up "
        "again every dns_sd_refresh_s (repeatable)",
    )
    parser.add_argument(
        "--shard",
        metavar="I/N",
        help="scrape only the targets whose name hashes to shard I of N (0 <= I < N); "
        "shard 0 also runs the analyses, rollup and retention",
    )


def require_targets(settings: Any) -> None:
    from collector.sources import SOURCES

    # A GPU-only host (``--sources nvml,host``) needs no Triton target; file_sd files
    # and DNS SRV names may list none yet, and gain some later.
    if (
        not settings.targets
        and not settings.file_sd
        and not settings.dns_sd
        and any(SOURCES[n].per_target for n in settings.sources)
    ):
        raise ConfigError("targets", NO_TARGET)


def describe_targets(settings: Settings, *, most: int = 5) -> str:
    """Where the targets come from, in a few words: the URLs (up to ``most``), the
    file_sd files and this collector's shard."""
    urls = [t.url for t in settings.targets]
    parts = [", ".join(urls) if len(urls) <= most else f"{len(urls)} targets"] if urls else []
    if settings.file_sd:
        parts.append(f"the targets of file_sd {', '.join(settings.file_sd)}")
    if settings.dns_sd:
        parts.append(f"the SRV records of {', '.join(settings.dns_sd)}")
    if FLEET_SOURCE in settings.sources and settings.prometheus_url:
        parts.append(f"every Triton that Prometheus {settings.prometheus_url} scrapes")
    text = " and ".join(parts) or "no Triton target"
    return text + (f" (shard {settings.shard})" if settings.shard else "")


def existing_store(db_url: str) -> Store:
    """The store at ``db_url`` for a command that reads what was collected, opened now
    and never created: a mistyped URL ends in one line saying there is no store there,
    not in an empty new file and "no samples yet"."""
    from collector.store import Store

    store = Store(db_url, create=False)
    try:
        store.open()
    except BaseException:
        store.close()
        raise
    return store
