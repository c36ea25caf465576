"""``batchscope demo``: the main job on the embedded default, end to end.

Starts the CPU testbed (a real Triton, explicit model control, with a ``batched`` and
an ``unbatched`` model), drives both with a load that changes every few seconds, and
runs ``batchscope serve`` on them into SQLite: the collector, the detectors, the
recommender and the web UI on http://127.0.0.1:8050, whose URL it prints. Within a
minute the UI shows the unbatched model's finding and a recommendation. It runs until
interrupted (Ctrl-C or SIGTERM, also when started in the background) or for
``--duration`` seconds, and stops within seconds, leaving no process and no temporary
folder behind; should it be SIGKILLed, Triton dies with it (see
:mod:`collector.testbed.server`).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import shlex
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.engine import make_url

from collector.config import Settings, load_settings, target_from_url
from collector.errors import ConfigError
from collector.process_control import stop_on_signals
from collector.testbed.load import run_load, start_load_loop
from collector.testbed.models import BATCHED_AND_UNBATCHED
from collector.testbed.server import StartCancelled, TritonServer

__all__ = ["DEMO_MODELS", "LOAD_PHASES", "add_demo_command", "apply_command", "run_demo"]

DEMO_MODELS = BATCHED_AND_UNBATCHED
#: The model that draws the finding and the recommendation: the one without a batcher.
ADVISED_MODEL = next(m.name for m in DEMO_MODELS if not m.dynamic_batching)
#: (closed-loop clients, seconds) per phase, repeated: the load an operator sees move.
LOAD_PHASES = ((16, 10.0), (24, 10.0), (8, 10.0), (16, 10.0), (32, 10.0))
# Quicker analysis than the defaults, so the demo shows findings within a minute.
DEMO_ANALYSIS = {"window_s": 15.0, "sustain": 2, "clear_after": 2}
# A phase is driven in runs this long, so that a stop waits for one run at most.
_LOAD_RUN_S = 2.0
# How long a stop waits for the load beyond that: its runs end at once when told to.
_LOAD_STOP_GRACE_S = 3.0


def _drive(grpc_url: str, stop: threading.Event) -> None:
    for clients, seconds in itertools.cycle(LOAD_PHASES):
        for run_s in _chunks(seconds, _LOAD_RUN_S):
            if stop.is_set():
                return
            runs = [
                threading.Thread(
                    target=run_load,
                    args=(grpc_url, m.name),
                    # With the stop, a run ends at once rather than after its seconds.
                    kwargs={"concurrency": clients, "duration_s": run_s, "stop": stop},
                    daemon=True,
                )
                for m in DEMO_MODELS
            ]
            for t in runs:
                t.start()
            for t in runs:
                t.join()


def _chunks(total_s: float, most_s: float) -> list[float]:
    """``total_s`` cut into pieces of at most ``most_s`` seconds."""
    pieces = []
    while total_s > 1e-9:
        pieces.append(min(total_s, most_s))
        total_s -= pieces[-1]
    return pieces


def apply_command(http_url: str, db_url: str, model: str) -> str:
    """The ``batchscope apply`` line for ``model`` of the demo's server, to copy into
    another terminal: a SQLite file is named by its absolute path, so the line works
    from any directory; a password in a database URL is not printed. The demo collects
    into that store, which keeps the server's metrics URL for ``apply`` to find."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        url = url.set(database=str(Path(url.database).resolve()))
    return shlex.join(
        [
            "batchscope",
            "apply",
            "--triton",
            http_url,
            "--db",
            url.render_as_string(hide_password=True),
            "--model",
            model,
        ]
    )


def _demo_settings(db_url: str, interval_s: float) -> Settings:
    """The demo's settings without their target (the server's URLs come once it runs),
    checked before anything starts: a bad ``--db`` is one line, not a started Triton."""
    return load_settings(
        env={},
        overrides={
            "db_url": db_url,
            "interval_s": interval_s,
            "jitter_s": 0.0,
            "analysis_every_s": 8.0,
            "recommend_every_s": 15.0,
            "analysis": dict(DEMO_ANALYSIS),
        },
    )


def run_demo(
    *,
    duration_s: float | None = None,
    db_url: str = "sqlite:///batchscope.db",
    port: int = 8050,
    interval_s: float = 1.0,
    stop: threading.Event | None = None,
) -> int:
    stop = stop or threading.Event()
    if not 0 < port < 65536:
        raise ConfigError("port", f"must be 1..65535, got {port}")
    settings = _demo_settings(db_url, interval_s)
    print(
        f"starting a CPU Triton testbed with models: {', '.join(m.name for m in DEMO_MODELS)}",
        flush=True,
    )
    server = TritonServer(DEMO_MODELS)
    stopping = _StopTimes()
    # Ctrl-C and SIGTERM set `stop`; everything is stopped inside the block, so a
    # second signal cannot cut the cleanup short and leave Triton or its folder behind.
    with stop_on_signals(stop):
        try:
            # Before anything is served: the load's first run then starts at once, and a
            # stop that comes right after the UI's line waits on no gRPC import.
            start_load_loop()
            server.start(cancel=stop)
            _serve_demo(server, stop, duration_s, settings, port, stopping)
        except StartCancelled:
            pass
        finally:
            print("stopping ...", flush=True)
            with stopping.step("Triton"):
                server.close()
            print(stopping.summary(), flush=True)
    return 0


class _StopTimes:
    """How long each part of the demo took to stop, for the line it prints last: a
    stop that drags says which part dragged."""

    def __init__(self) -> None:
        self.began: float | None = None
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def step(self, part: str) -> Iterator[None]:
        started = time.monotonic()
        if self.began is None:
            self.began = started
        try:
            yield
        finally:
            self.seconds[part] = time.monotonic() - started

    def summary(self) -> str:
        total = time.monotonic() - (self.began or time.monotonic())
        parts = ", ".join(f"{part} {s:.1f} s" for part, s in self.seconds.items())
        return f"stopped in {total:.1f} s ({parts})"


def _serve_demo(
    server: TritonServer,
    stop: threading.Event,
    duration_s: float | None,
    settings: Settings,
    port: int,
    stopping: _StopTimes,
) -> None:
    print(
        f"  HTTP {server.http_url}   gRPC {server.grpc_url}   metrics {server.metrics_url}",
        flush=True,
    )
    target = target_from_url(server.http_url, server.metrics_url)
    settings = settings.model_copy(update={"targets": (target,)})
    # Imported here: every command's parser reads this module, and the service pulls in
    # the analysis, the store and the UI, which only the running demo needs.
    from collector.serve import Service

    service = Service(settings, host="127.0.0.1", port=port, refresh_s=2.0)
    driver = threading.Thread(target=_drive, args=(server.grpc_url, stop), name="load", daemon=True)
    service.start()
    try:
        driver.start()
        print(
            f"collecting every {settings.interval_s:g} s into "
            f"{make_url(settings.db_url).render_as_string(hide_password=True)} while driving "
            f"both models with {' → '.join(str(c) for c, _ in LOAD_PHASES)} clients",
            flush=True,
        )
        print(f"batchscope UI: {service.url}   (Ctrl-C stops)", flush=True)
        print(
            f"once the UI recommends a change for {ADVISED_MODEL}, apply it from another "
            f"terminal with:\n  " + apply_command(server.http_url, settings.db_url, ADVISED_MODEL),
            flush=True,
        )
        stop.wait(duration_s)
    finally:
        stop.set()
        with stopping.step("UI and collector"):
            service.close()
        # The load stops first, so Triton has no requests in flight to wait for.
        with stopping.step("load"):
            driver.join(timeout=_LOAD_RUN_S + _LOAD_STOP_GRACE_S)


def add_demo_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    demo = sub.add_parser(
        "demo",
        help="start the CPU testbed under a varying load and serve "
        "batchscope on it (UI on http://127.0.0.1:8050)",
    )
    demo.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="stop after S seconds (default: run until Ctrl-C)",
    )
    demo.add_argument("--port", type=int, default=8050, help="UI port (default 8050)")
    demo.add_argument(
        "--db",
        dest="db_url",
        default="sqlite:///batchscope.db",
        metavar="URL",
        help="store to collect into (any SQLAlchemy URL; default sqlite:///batchscope.db)",
    )
    demo.set_defaults(func=lambda a: run_demo(duration_s=a.duration, db_url=a.db_url, port=a.port))
