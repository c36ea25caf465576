"""``batchscope testbed up`` and ``batchscope load``: the testbed's command-line entry points.

:func:`add_testbed_commands` registers both on the main CLI's subparsers; each sets
``func`` (taking the parsed namespace, returning an exit code).  ``python -m
collector.testbed`` runs the same commands without the rest of batchscope.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import yaml

from collector.errors import BatchscopeError, ConfigError
from collector.testbed.models import ModelSpec

__all__ = [
    "DEFAULT_CONFIG",
    "TestbedConfig",
    "add_testbed_commands",
    "grpc_target",
    "load_testbed_config",
    "main",
]

DEFAULT_CONFIG = Path(__file__).with_name("default.yaml")
# Triton's own default ports: HTTP 8000, gRPC 8001, metrics 8002.
_DEFAULT_HTTP_PORT = 8000
_DEFAULT_GRPC_PORT = 8001


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class TestbedConfig:
    """A parsed testbed YAML file: server options and the models to serve."""

    __test__ = False  # not a pytest test class, despite the name

    models: tuple[ModelSpec, ...]
    host: str = "127.0.0.1"
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    extra_args: tuple[str, ...] = ()


_SERVER_KEYS = {"host", "http_port", "grpc_port", "metrics_port", "extra_args"}
_MODEL_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "fixed_ms": (int, float),
    "per_sample_ms": (int, float),
    "max_batch_size": (int,),
    "dynamic_batching": (bool,),
    "preferred_batch_sizes": (list,),
    "max_queue_delay_us": (int,),
    "instance_count": (int,),
    "ensemble_of": (str,),
}
assert set(_MODEL_TYPES) == {f.name for f in fields(ModelSpec)}


def _check_type(field: str, value: Any, types: tuple[type, ...]) -> None:
    # bool is an int in Python; a YAML `true` must not pass as a batch size.
    wrong_bool = isinstance(value, bool) and bool not in types
    if wrong_bool or not isinstance(value, types):
        names = " or ".join(t.__name__ for t in types)
        raise ConfigError(field, f"expected {names}, got {value!r}")


def _port(field: str, value: Any) -> int | None:
    if value is None:
        return None
    _check_type(field, value, (int,))
    if not 0 <= value < 65536:
        raise ConfigError(field, f"{value} is not a port number (0 picks a free one)")
    return value or None


def parse_testbed_config(data: Any, source: str = "config") -> TestbedConfig:
    """Validate a decoded YAML document; errors name the offending field."""
    if not isinstance(data, dict):
        raise ConfigError(source, "expected a mapping with a 'models' list")
    unknown = set(data) - {"server", "models"}
    if unknown:
        raise ConfigError(", ".join(sorted(unknown)), "unknown key (expected server, models)")
    server = data.get("server") or {}
    if not isinstance(server, dict):
        raise ConfigError("server", "expected a mapping")
    unknown = set(server) - _SERVER_KEYS
    if unknown:
        raise ConfigError(f"server.{sorted(unknown)[0]}", "unknown key")
    host = server.get("host", "127.0.0.1")
    _check_type("server.host", host, (str,))
    extra = server.get("extra_args") or []
    _check_type("server.extra_args", extra, (list,))
    for i, arg in enumerate(extra):
        _check_type(f"server.extra_args[{i}]", arg, (str,))

    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise ConfigError("models", "expected a non-empty list of models")
    specs: list[ModelSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(models):
        where = f"models[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(where, "expected a mapping")
        unknown = set(entry) - set(_MODEL_TYPES)
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]}", "unknown key")
        if "name" not in entry:
            raise ConfigError(f"{where}.name", "is required")
        for key, value in entry.items():
            _check_type(f"{where}.{key}", value, _MODEL_TYPES[key])
        for j, size in enumerate(entry.get("preferred_batch_sizes", [])):
            _check_type(f"{where}.preferred_batch_sizes[{j}]", size, (int,))
        if entry["name"] in seen:
            raise ConfigError(f"{where}.name", f"duplicate model name {entry['name']!r}")
        seen.add(entry["name"])
        kwargs = dict(entry)
        kwargs["preferred_batch_sizes"] = tuple(entry.get("preferred_batch_sizes", ()))
        try:
            specs.append(ModelSpec(**kwargs))
        except ValueError as exc:
            # ModelSpec's messages start with the field they are about.
            field, _, message = str(exc).partition(": ")
            if field in _MODEL_TYPES:
                raise ConfigError(f"{where}.{field}", message) from exc
            raise ConfigError(where, str(exc)) from exc
    for i, spec in enumerate(specs):
        if spec.ensemble_of is not None and spec.ensemble_of not in seen:
            raise ConfigError(f"models[{i}].ensemble_of",
                              f"{spec.ensemble_of!r} is not one of the models")
    return TestbedConfig(
        models=tuple(specs),
        host=host,
        http_port=_port("server.http_port", server.get("http_port")),
        grpc_port=_port("server.grpc_port", server.get("grpc_port")),
        metrics_port=_port("server.metrics_port", server.get("metrics_port")),
        extra_args=tuple(extra),
    )


def load_testbed_config(path: Path = DEFAULT_CONFIG) -> TestbedConfig:
    """Read and validate a testbed YAML file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError("--config", f"cannot read {path}: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), f"not valid YAML: {exc}") from exc
    return parse_testbed_config(data, str(path))


# --------------------------------------------------------------------------- URLs


def grpc_target(triton: str | None = None, grpc: str | None = None) -> tuple[str, str | None]:
    """The gRPC ``host:port`` to drive, and a note when it had to be derived.

    ``grpc`` is used as given (``host:port``, ``grpc://host:port`` or a bare host, port
    8001).  ``triton`` may be the same, or an ``http(s)://host[:port]`` URL: Triton's
    HTTP API does not say where gRPC listens, so gRPC is then assumed to be on the HTTP
    port + 1 — Triton's default layout (8000/8001), which the testbed keeps too.
    """
    if grpc is not None:
        return _host_port(grpc, "--grpc"), None
    if triton is None:
        raise ConfigError("--triton", "give --triton or --grpc")
    parts = urlsplit(triton if "://" in triton else f"grpc://{triton}")
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            raise ConfigError("--triton", f"no host in {triton!r}")
        try:
            http_port = parts.port or _DEFAULT_HTTP_PORT
        except ValueError as exc:
            raise ConfigError("--triton", f"bad port in {triton!r}") from exc
        target = f"{_bracket(parts.hostname)}:{http_port + 1}"
        note = (
            f"note: {triton} is an HTTP URL; assuming gRPC at {target} (HTTP port + 1, "
            "Triton's default layout). Pass --grpc HOST:PORT if it listens elsewhere."
        )
        return target, note
    return _host_port(triton, "--triton"), None


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _host_port(value: str, field: str) -> str:
    parts = urlsplit(value if "://" in value else f"grpc://{value}")
    if parts.scheme != "grpc" or not parts.hostname or parts.path not in ("", "/"):
        raise ConfigError(field, f"expected host:port for gRPC, got {value!r}")
    try:
        port = parts.port or _DEFAULT_GRPC_PORT
    except ValueError as exc:
        raise ConfigError(field, f"bad port in {value!r}") from exc
    return f"{_bracket(parts.hostname)}:{port}"


# --------------------------------------------------------------------------- commands


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
    testbed = subparsers.add_parser(
        "testbed",
        help="a real tritonserver on this machine's CPU, serving synthetic models",
        description="A real tritonserver (from nvidia-pytriton) serving synthetic "
        "Python-backend models whose cost per execution is fixed_ms + per_sample_ms x batch.",
    )
    testbed_sub = testbed.add_subparsers(dest="testbed_command", metavar="COMMAND")
    testbed_sub.required = True
    up = testbed_sub.add_parser(
        "up",
        help="start the server, print its URLs and run until Ctrl-C",
        description="Start tritonserver with the models of a YAML config, print its HTTP, "
        "gRPC and metrics URLs, and serve until Ctrl-C or SIGTERM; then stop it cleanly.",
    )
    up.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        metavar="FILE",
        help="testbed YAML (default: the packaged default.yaml with models "
        "'batched' and 'unbatched')",
    )
    up.set_defaults(func=_cmd_up)

    load = subparsers.add_parser(
        "load",
        help="drive a Triton model with gRPC requests and report QPS and latency",
        description="Closed-loop (--concurrency) or open-loop (--rate) load over gRPC. "
        "Exit status: 0 when every request succeeded, 1 when any failed, 2 on bad usage.",
    )
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
        "--duration", type=_positive_float, required=True, metavar="S", help="seconds to run"
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
        type=_positive_float,
        default=10.0,
        metavar="S",
        help="per-request timeout in seconds (10)",
    )
    load.add_argument("--json", action="store_true", help="print the result as one JSON object")
    load.set_defaults(func=_cmd_load)


def _cmd_up(args: argparse.Namespace) -> int:
    from collector.testbed.server import TritonServer

    try:
        config = load_testbed_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server = TritonServer(
        config.models,
        host=config.host,
        http_port=config.http_port,
        grpc_port=config.grpc_port,
        metrics_port=config.metrics_port,
        extra_args=config.extra_args,
    )
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    # SIGTERM (docker stop, systemd) gets the same orderly stop as Ctrl-C.
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        names = ", ".join(spec.name for spec in config.models)
        print(f"tritonserver pid {server.pid} serving {names}")
        print(f"http    {server.http_url}")
        print(f"grpc    {server.grpc_url}")
        print(f"metrics {server.metrics_url}")
        print(f"log     {server.log_path}")
        print("Ctrl-C to stop", flush=True)
        while not stopping.wait(0.5):
            if not server.is_running():
                print(
                    f"error: tritonserver exited; log tail:\n{server.log_tail()}", file=sys.stderr
                )
                return 1
        print("stopping ...", flush=True)
        return 0
    except BatchscopeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        try:
            server.close()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _cmd_load(args: argparse.Namespace) -> int:
    from collector.testbed.load import run_load

    try:
        target, note = grpc_target(args.triton, args.grpc)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if note:
        print(note, file=sys.stderr)
    result = run_load(
        target,
        args.model,
        concurrency=args.concurrency,
        rate=args.rate,
        duration_s=args.duration,
        batch=args.batch,
        arrivals=args.arrivals,
        max_in_flight=args.max_in_flight,
        request_timeout_s=args.timeout,
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
