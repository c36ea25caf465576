"""The testbed's YAML config, and where its load generator finds Triton's gRPC port.

``load_testbed_config`` reads a file such as the packaged ``default.yaml``; every
mistake is a ``ConfigError`` that names its field (``models[1].max_batch_size``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import yaml

from collector.errors import ConfigError
from collector.testbed.models import ModelSpec

if TYPE_CHECKING:
    from collector.testbed.server import TritonServer

__all__ = [
    "DEFAULT_CONFIG",
    "TestbedConfig",
    "grpc_target",
    "load_testbed_config",
    "parse_testbed_config",
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

    def server(self) -> TritonServer:
        """The (not yet started) server this config describes."""
        from collector.testbed.server import TritonServer

        return TritonServer(
            self.models,
            host=self.host,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            extra_args=self.extra_args,
        )


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
    return TestbedConfig(
        models=_model_specs(data.get("models")),
        host=host,
        http_port=_port("server.http_port", server.get("http_port")),
        grpc_port=_port("server.grpc_port", server.get("grpc_port")),
        metrics_port=_port("server.metrics_port", server.get("metrics_port")),
        extra_args=tuple(extra),
    )


def _model_specs(models: Any) -> tuple[ModelSpec, ...]:
    """The ``models`` list: each entry a valid ``ModelSpec``, names unique, and every
    ``ensemble_of`` naming one of them."""
    if not isinstance(models, list) or not models:
        raise ConfigError("models", "expected a non-empty list of models")
    specs: list[ModelSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(models):
        specs.append(_model_spec(f"models[{i}]", entry, seen))
    for i, spec in enumerate(specs):
        if spec.ensemble_of is not None and spec.ensemble_of not in seen:
            raise ConfigError(
                f"models[{i}].ensemble_of", f"{spec.ensemble_of!r} is not one of the models"
            )
    return tuple(specs)


def _model_spec(where: str, entry: Any, seen: set[str]) -> ModelSpec:
    """One entry of the list; ``seen`` holds the names before it and gains this one."""
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
        return ModelSpec(**kwargs)
    except ValueError as exc:
        # ModelSpec's messages start with the field they are about.
        field, _, message = str(exc).partition(": ")
        if field in _MODEL_TYPES:
            raise ConfigError(f"{where}.{field}", message) from exc
        raise ConfigError(where, str(exc)) from exc


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
