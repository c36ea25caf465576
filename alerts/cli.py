"""``batchscope alerts``: the alerts' states, silences and outbox; a test notification
to one receiver; silences (registered by ``collector.cli``).

* ``batchscope alerts [--db URL] [--json]``: every alert with its state, the silences
  in force, and the outbox per receiver (with each dead or gone notification);
* ``batchscope alerts test --receiver NAME``: put a test notification in the outbox
  and deliver it now; exit 0 when the receiver took it;
* ``batchscope alerts silence [--rule R] [--target T] [--subject S] --for 2h``: hold
  back notifications of matching alerts; ``--list`` shows them, ``--end ID`` ends one;
* ``batchscope alerts run``: evaluate the rules and deliver the outbox until stopped.

Only ``argparse`` is imported when the parser is built; the rest when a command runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from collector.errors import ConfigError
from collector.settings_fields import parse_duration_s

if TYPE_CHECKING:
    from collector.config import Settings
    from collector.store import Store
    from collector.store.alerts import AlertState, Notification, Silence

__all__ = ["add_alerts_command"]

log = logging.getLogger("batchscope.alerts")

#: The fingerprint of ``alerts test``'s notifications.
TEST_FINGERPRINT = "test"


def add_alerts_command(sub: Any) -> None:
    """Add ``alerts`` (and its ``test`` and ``silence``) to ``batchscope``'s commands."""
    parser = sub.add_parser(
        "alerts",
        help="alert states, silences and the notification outbox",
        description="List every alert (pending, firing, resolved), the silences in "
        "force and the notification outbox per receiver.",
    )
    _common(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=_cmd_list)
    commands = parser.add_subparsers(dest="alerts_command", metavar="SUBCOMMAND")

    test = commands.add_parser(
        "test",
        help="send a test notification to one receiver now",
        description="Put a test notification for RECEIVER in the outbox and deliver it "
        "now, signed as every notification is; exit 0 when the receiver answered 2xx.",
    )
    _common(test)
    test.add_argument("--receiver", required=True, metavar="NAME", help="a receiver's name")
    test.set_defaults(func=_cmd_test)

    silence = commands.add_parser(
        "silence",
        help="hold back notifications of matching alerts for a while",
        description="Silence alerts by rule, target and subject (model or device; any "
        "left out matches every value) for a duration. States still change; only "
        "notifications are held back.",
    )
    _common(silence)
    silence.add_argument("--rule", help="a rule name, e.g. queue_saturation")
    silence.add_argument("--target", help="a target name")
    silence.add_argument("--subject", help="a model name or device uuid")
    silence.add_argument("--for", dest="for_", metavar="DURATION", help="e.g. 30m, 2h, 1d")
    silence.add_argument("--comment", default="", help="why")
    silence.add_argument("--list", action="store_true", help="list the silences in force")
    silence.add_argument("--end", type=int, metavar="ID", help="end silence ID now")
    silence.set_defaults(func=_cmd_silence)

    run = commands.add_parser(
        "run",
        help="evaluate the alert rules and deliver notifications until stopped",
        description="Evaluate the alert rules on the store every analysis_every_s and "
        "deliver the outbox every alerts.deliver_every_s, until SIGTERM or Ctrl-C. "
        "Notifications left pending by an earlier run are delivered too. serve, "
        "collect and the exporter do this themselves; on a store that one of them (or "
        "another alerts run) evaluates, this one stands by and takes over when it stops.",
    )
    _common(run)
    run.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    run.add_argument(
        "--deliver-only",
        action="store_true",
        help="only deliver the outbox; another process evaluates the rules",
    )
    run.set_defaults(func=_cmd_run)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", dest="db_url", metavar="URL", help="the store (SQLAlchemy URL)")
    parser.add_argument("--config", metavar="FILE", help="YAML settings file")


def _settings(args: argparse.Namespace) -> Settings:
    from collector.config import load_settings

    return load_settings(config_file=args.config, overrides={"db_url": args.db_url})


def _store(settings: Settings) -> Store:
    from collector.command_support import existing_store

    return existing_store(settings.db_url)


def _when(at: float | None) -> str:
    if at is None:
        return "—"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


# --------------------------------------------------------------------------- list


def _silence_line(s: Silence) -> str:
    match = " ".join(
        f"{k}={v or '*'}"
        for k, v in (("rule", s.rule), ("target", s.target), ("subject", s.subject))
    )
    return f"#{s.id} {match} until {_when(s.ends_at)} {s.comment}".rstrip()


def _cmd_list(args: argparse.Namespace) -> int:
    settings = _settings(args)
    store = _store(settings)
    try:
        now = time.time()
        states = store.alert_states()
        silences = store.silences(active_at=now)
        counts = store.notification_counts()
        failed = store.notifications(state="dead") + store.notifications(state="gone")
        gone = store.receivers_gone()
    finally:
        store.close()
    if args.json:
        doc = {
            "alerts": [asdict(s) for s in states],
            "silences": [asdict(s) for s in silences],
            "outbox": [
                {"receiver": r, "state": s, "count": n} for (r, s), n in sorted(counts.items())
            ],
            "failed": [{k: v for k, v in asdict(n).items() if k != "body"} for n in failed],
            "receivers_gone": gone,
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(_render(states, silences, counts, failed, gone))
    return 0


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _render(
    states: list[AlertState],
    silences: list[Silence],
    counts: dict[tuple[str, str], int],
    failed: list[Notification],
    gone: dict[str, str],
) -> str:
    lines = ["Alerts"]
    if states:
        rows = [["STATE", "SEVERITY", "RULE", "TARGET", "SUBJECT", "SINCE", "SUMMARY"]]
        for s in states:
            since = s.resolved_at if s.state == "resolved" else s.fired_at or s.active_since
            summary = s.annotations.get("summary", "")
            rows.append(
                [s.state, s.severity, s.rule, s.target, s.subject or "—", _when(since), summary]
            )
        lines += ["  " + line for line in _table(rows)]
    else:
        lines.append("  none")
    lines.append("Silences in force")
    lines += ["  " + _silence_line(s) for s in silences]
    if not silences:
        lines.append("  none")
    lines.append("Outbox")
    receivers = sorted({r for r, _ in counts})
    if receivers:
        rows = [["RECEIVER", "PENDING", "DELIVERED", "DEAD", "GONE"]]
        for r in receivers:
            rows.append(
                [r] + [str(counts.get((r, s), 0)) for s in ("pending", "delivered", "dead", "gone")]
            )
        lines += ["  " + line for line in _table(rows)]
    else:
        lines.append("  empty")
    for name, reason in sorted(gone.items()):
        lines.append(f"  receiver {name} is gone ({reason}): nothing is sent to it")
    for n in failed:
        lines.append(
            f"  {n.state} {n.webhook_id} to {n.receiver} ({n.alert_status}, {n.attempts} tries): "
            f"{n.last_error or ''}".rstrip()
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- test


def _cmd_test(args: argparse.Namespace) -> int:
    from alerts.delivery import deliver_due
    from alerts.engine import new_webhook_id, render_body
    from collector.store.alerts import AlertState, NewNotification

    settings = _settings(args)
    try:
        receiver = settings.alerts.receiver(args.receiver)
    except KeyError:
        known = ", ".join(r.name for r in settings.alerts.receivers) or "none configured"
        raise ConfigError(
            "receiver", f"no receiver named {args.receiver!r}; known: {known}"
        ) from None
    now = time.time()
    alert = AlertState(
        fingerprint=TEST_FINGERPRINT,
        rule="test",
        target="batchscope",
        subject="",
        state="firing",
        severity="info",
        active_since=now,
        evaluated_at=now,
        held_at=now,
        fired_at=now,
        labels={"alertname": "BatchscopeTest", "rule": "test", "severity": "info"},
        annotations={"summary": "A test notification from batchscope alerts test"},
    )
    body = render_body(alert, "firing", receiver, settings.alerts, now)
    note = NewNotification(new_webhook_id(), receiver.name, TEST_FINGERPRINT, "test", body, now)
    store = _store(settings)
    try:
        store.clear_receiver_gone(receiver.name)  # a test is how one checks it is back
        store.enqueue_notifications([note])
        deliver_due(store, settings.alerts, now=now, only={note.webhook_id})
        [sent] = [
            n
            for n in store.notifications(receiver=receiver.name, limit=20)
            if n.webhook_id == note.webhook_id
        ]
    finally:
        store.close()
    if sent.state == "delivered":
        print(
            f"batchscope: {receiver.name} took the test notification {sent.webhook_id} "
            f"(HTTP {sent.last_status})"
        )
        return 0
    later = "delivery retries it" if sent.state == "pending" else "it is not tried again"
    print(
        f"batchscope: {receiver.name} did not take the test notification {sent.webhook_id}: "
        f"{sent.last_error} (it is {sent.state}; {later})",
        file=sys.stderr,
    )
    return 1


# --------------------------------------------------------------------------- silence


def _cmd_silence(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if args.end is None and not args.list and args.for_ is None:
        raise ConfigError("for", "give --for DURATION (or --list, or --end ID)")
    duration_s = parse_duration_s(args.for_) if args.for_ is not None else None
    if args.rule is not None:
        from alerts.rules import RULE_NAMES

        if args.rule not in RULE_NAMES:
            raise ConfigError("rule", f"unknown rule {args.rule!r}; known: {', '.join(RULE_NAMES)}")
    store = _store(settings)
    try:
        now = time.time()
        if args.end is not None:
            try:
                store.end_silence(args.end, now)
            except KeyError:
                raise ConfigError("end", f"no silence with id {args.end}") from None
            print(f"batchscope: silence #{args.end} ended")
        elif duration_s is not None:
            silence = store.add_silence(
                starts_at=now,
                ends_at=now + duration_s,
                rule=args.rule,
                target=args.target,
                subject=args.subject,
                comment=args.comment,
            )
            print(f"batchscope: silence #{silence.id} until {_when(silence.ends_at)}")
        if args.list:
            for s in store.silences(active_at=now):
                print(_silence_line(s))
    finally:
        store.close()
    return 0


# --------------------------------------------------------------------------- run


def _cmd_run(args: argparse.Namespace) -> int:
    from alerts.delivery import DeliveryWorker
    from alerts.engine import evaluate_alerts, new_evaluator_id
    from alerts.runtime import PRUNE_EVERY_S
    from collector.command_support import stop_on_signals

    if args.duration is not None and args.duration <= 0:
        raise ConfigError("duration", f"must be > 0, got {args.duration:g}")
    settings = _settings(args)
    stop = stop_on_signals()
    store = _store(settings)
    deadline = None if args.duration is None else time.monotonic() + args.duration
    pruned_at = -float("inf")
    holder = new_evaluator_id()
    try:
        with DeliveryWorker(store, settings.alerts):
            while not stop.is_set():
                if time.monotonic() - pruned_at >= PRUNE_EVERY_S:
                    store.prune_alerts(time.time() - settings.alerts.keep_s)
                    pruned_at = time.monotonic()
                if not args.deliver_only:
                    try:
                        evaluate_alerts(store, settings, holder=holder)
                    except Exception:  # a store hiccup: the next pass tries again
                        log.exception("alert evaluation failed; trying again")
                wait = settings.analysis_every_s
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        break
                stop.wait(wait)
        store.release_alert_evaluation(holder)  # another evaluator takes over at once
    finally:
        store.close()
    return 0
