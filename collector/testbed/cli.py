"""``batchscope testbed up`` and ``batchscope load``: the testbed's command-line entry points.

:func:`add_testbed_commands` registers both on the main CLI's subparsers; each sets
``func`` (taking the parsed namespace, returning an exit code).  ``python -m
collector.testbed`` runs the same commands without the rest of batchscope.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from threading import Event
from typing import TYPE_CHECKING, Any

from collector.errors import BatchscopeError, ConfigError
from collector.process_control import stop_on_signals
from collector.testbed.config import (
    DEFAULT_CONFIG,
    TestbedConfig,
    grpc_target,
    load_testbed_config,
)

if TYPE_CHECKING:
    from collector.testbed.server import TritonServer

__all__ = ["add_testbed_commands", "main"]

# The options of `load` that are run_load's keywords: their dests are the keywords' names.
_LOAD_KEYWORDS = (
    "concurrency",
    "rate",
    "duration_s",
    "batch",
    "arrivals",
    "max_in_flight",
    "request_timeout_s",
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def add_testbed_commands(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``testbed up`` and ``load`` on a main CLI's subparsers."""
    _add_up_command(subparsers)
    _add_load_command(subparsers)


def _add_up_command(subparsers: argparse._SubParsersAction[Any]) -> None:
    testbed = subparsers.add_parser(
        "testbed",
        help="a real tritonserver on this machine's CPU, serving synthetic models",
        description="A real tritonserver (from nvidia-pytriton) serving synthetic "
        "Python-backend models whose cost per execution is fixed_ms + per_sample_ms x batch.",
    )
    testbed_sub = testbed.add_subparsers(dest="testbed_command", metavar="COMMAND")
    testbed_sub.required = True
    up = _command_parser(testbed_sub, "up", _cmd_up)
    up.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        metavar="FILE",
        help="testbed YAML (default: the packaged default.yaml with models "
        "'batched' and 'unbatched')",
    )


def _add_load_command(subparsers: argparse._SubParsersAction[Any]) -> None:
    load = _command_parser(subparsers, "load", _cmd_load)
    where = load.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--grpc",
        metavar="HOST:PORT",
        help="Triton's gRPC endpoint, e.g. 127.0.0.1:8001",
    )
    where.add_argument(
        "--triton",
        metavar="URL",
        help="Triton's gRPC endpoint as HOST:PORT, or its HTTP URL http://HOST:PORT; for an "
        "HTTP URL gRPC is assumed on the HTTP port + 1 (Triton's default 8000/8001 "
        "layout, which `testbed up` keeps when it picks the ports); use --grpc "
        "when it is elsewhere",
    )
    load.add_argument("--model", required=True, metavar="NAME", help="model to drive")
    mode = load.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--concurrency",
        type=_positive_int,
        metavar="N",
        help="closed loop: N clients, each sending its next request when the last returns",
    )
    mode.add_argument(
        "--rate",
        type=_positive_float,
        metavar="R",
        help="open loop: R requests per second, whatever the server does",
    )
    load.add_argument(
        "--duration",
        dest="duration_s",
        type=_positive_float,
        required=True,
        metavar="S",
        help="seconds to run",
    )
    load.add_argument(
        "--batch", type=_positive_int, default=1, metavar="B", help="samples per request (1)"
    )
    load.add_argument(
        "--arrivals",
        choices=("poisson", "constant"),
        default="poisson",
        help="open loop: Poisson or evenly spaced arrivals (poisson)",
    )
    load.add_argument(
        "--max-in-flight",
        type=_positive_int,
        default=256,
        metavar="N",
        help="open loop: arrivals beyond N outstanding requests are counted as errors (256)",
    )
    load.add_argument(
        "--timeout",
        dest="request_timeout_s",
        type=_positive_float,
        default=10.0,
        metavar="S",
        help="per-request timeout in seconds (10)",
    )
    load.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _command_parser(
    subparsers: argparse._SubParsersAction[Any],
    name: str,
    command: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    """The parser of a command that runs ``command``: its help is the first paragraph
    of the command's docstring, its description the second."""
    summary, _, details = inspect.cleandoc(command.__doc__ or "").partition("\n\n")
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=" ".join(summary.split()), description=" ".join(details.split()) or None
    )
    parser.set_defaults(func=command)
    return parser


def _cmd_up(args: argparse.Namespace) -> int:
    """start the server, print its URLs and run until Ctrl-C

    Start tritonserver with the models of a YAML config, print its HTTP, gRPC and
    metrics URLs, and serve until Ctrl-C or SIGTERM; then stop it cleanly.
    """
    try:
        config = load_testbed_config(args.config)
    except ConfigError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    from collector.testbed.server import StartCancelled

    server = config.server()
    # SIGTERM (docker stop, systemd, a background job) gets the same orderly stop as
    # Ctrl-C; the stop happens inside the block, so a second signal cannot cut it short.
    with stop_on_signals() as stopping:
        try:
            return _serve_until_stopped(config, server, stopping)
        except StartCancelled:
            print("stopped while starting", flush=True)
            return 0
        except BatchscopeError as exc:
            print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 1
        finally:
            server.close()


def _serve_until_stopped(config: TestbedConfig, server: TritonServer, stopping: Event) -> int:
    server.start(cancel=stopping)
    names = ", ".join(spec.name for spec in config.models)
    print(f"tritonserver pid {server.pid} serving {names}")
    print(f"http    {server.http_url}")
    print(f"grpc    {server.grpc_url}")
    print(f"metrics {server.metrics_url}")
    print(f"log     {server.log_path}")
    print("Ctrl-C to stop", flush=True)
    while not stopping.wait(0.5):
        if not server.is_running():
            print(f"error: tritonserver exited; log tail:\n{server.log_tail()}", file=sys.stderr)
            return 1
    print("stopping ...", flush=True)
    return 0


def _cmd_load(args: argparse.Namespace) -> int:
    """drive a Triton model with gRPC requests and report QPS and latency

    Closed-loop (--concurrency) or open-loop (--rate) load over gRPC. Exit status: 0
    when every request succeeded, 1 when any failed, 2 on bad usage.
    """
    from collector.testbed.load import LoadResult, run_load

    try:
        target, note = grpc_target(args.triton, args.grpc)
    except ConfigError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    if note:
        print(note, file=sys.stderr)
    result: LoadResult = run_load(
        target, args.model, **{name: getattr(args, name) for name in _LOAD_KEYWORDS}
    )
    if args.json:
        print(result.to_json())
    else:
        mode = (
            f"concurrency {args.concurrency}"
            if args.concurrency is not None
            else f"rate {args.rate:g}/s ({args.arrivals})"
        )

        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f} ms"

        print(
            f"{args.model} @ {target}, {mode}, batch {args.batch}: "
            f"{result.requests} ok, {result.errors} errors in {result.duration_s:.2f} s, "
            f"{result.qps:.1f} QPS; p50 {ms(result.p50_ms)}, p95 {ms(result.p95_ms)}, "
            f"p99 {ms(result.p99_ms)}"
        )
        for message in result.error_samples:
            print(f"  error: {message}")
    return 0 if result.errors == 0 else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the testbed commands on their own (``python -m collector.testbed``)."""
    parser = argparse.ArgumentParser(prog="python -m collector.testbed")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_testbed_commands(sub)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code
