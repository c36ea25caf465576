"""CPU per target-scrape of the ``triton`` source's whole cycle, in steady state.

Starts a small Triton-like HTTP server in a child process (the recorded CPU testbed's
metrics page scaled to ``--models`` models, its statistics and config JSON, counters
advancing on every request), then runs ``CollectorService.run_source`` on one
``TritonSource`` over a real store: fetch, parse, rates and the store write. Only this
process's CPU is counted (``time.process_time``), after ``--warmup`` scrapes.

    .venv/bin/python bench/scrape_cycle.py --models 20 --scrapes 300
    .venv/bin/python bench/scrape_cycle.py --db postgresql+psycopg://postgres@127.0.0.1:5432/test
    .venv/bin/python bench/scrape_cycle.py --profile 25   # cProfile (CPU time), top 25 by own time
    .venv/bin/python bench/scrape_cycle.py --statistics-every 5   # as collect at a 1 s interval
    .venv/bin/python bench/scrape_cycle.py --collector-root ../other-checkout
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import itertools
import json
import pstats
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures" / "triton"
_VALUE = re.compile(r"^(\S+\{[^}]*\}) (\S+)$")


# --------------------------------------------------------------------------- server


def _metrics_lines(n_models: int) -> list[str]:
    """The CPU exposition with the ``batched`` model's series repeated ``n_models``
    times (as m0, m1, ...) and the other model dropped."""
    out: list[str] = []
    for line in (FIXTURES / "metrics_cpu.txt").read_text().splitlines():
        if 'model="batched"' in line:
            out.extend(line.replace('model="batched"', f'model="m{i}"') for i in range(n_models))
        elif 'model="unbatched"' not in line:
            out.append(line)
    return out


class _Metrics:
    """The metrics page, its per-model values advancing by 7 on each request."""

    def __init__(self, lines: list[str]) -> None:
        self._parts: list[tuple[str, float | None]] = []
        for line in lines:
            match = _VALUE.match(line)
            advancing = match and "model=" in line and "quantile" not in line
            value = float(match.group(2)) if match and advancing else None
            if match and value is not None and value == value:
                self._parts.append((match.group(1) + " ", value))
            else:
                self._parts.append((line, None))
        self._tick = 0

    def body(self) -> bytes:
        self._tick += 1
        step = self._tick * 7
        return "".join(
            f"{text}{value + step:g}\n" if value is not None else text + "\n"
            for text, value in self._parts
        ).encode()


class _Stats:
    """The statistics document, counters advancing on each request; only some batch
    sizes see executions in one interval, as on a live server."""

    def __init__(self, template: dict[str, Any], n_models: int) -> None:
        self._entries = [
            {**json.loads(json.dumps(template)), "name": f"m{i}"} for i in range(n_models)
        ]
        self._tick = 0

    def body(self) -> bytes:
        self._tick += 1
        for entry in self._entries:
            entry["inference_count"] += 7
            entry["execution_count"] += 2
            for d in entry["inference_stats"].values():
                d["count"] += 7
                d["ns"] += 7_000_000
            for b in entry["batch_stats"][: 1 + self._tick % 3]:
                for k in ("compute_input", "compute_infer", "compute_output"):
                    b[k]["count"] += 1
                    b[k]["ns"] += 1_000_000
        return json.dumps({"model_stats": self._entries}).encode()


def serve(port: int, n_models: int) -> None:
    lines = _metrics_lines(n_models)
    stats = json.loads((FIXTURES / "stats.json").read_text())["model_stats"][0]
    config = json.loads((FIXTURES / "config_batched.json").read_text())
    metadata = (FIXTURES / "server_metadata.json").read_bytes()
    metrics, stats_doc = _Metrics(lines), _Stats(stats, n_models)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_GET(self) -> None:  # noqa: N802
            path = self.path
            if path == "/metrics":
                body = metrics.body()
            elif path == "/v2/models/stats":
                body = stats_doc.body()
            elif path == "/v2":
                body = metadata
            elif path.startswith("/v2/models/") and path.endswith("/config"):
                body = json.dumps({**config, "name": path.split("/")[3]}).encode()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- bench


def run(args: argparse.Namespace) -> None:
    if args.collector_root:
        # Another checkout's collector (the bench's own code stays this tree's).
        sys.path.insert(0, str(Path(args.collector_root).resolve()))
    from collector.config import Settings, TargetSettings
    from collector.scheduler import CollectorService
    from collector.sources.triton import TritonSource
    from collector.store import Store

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--models", str(args.models)]
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        target = TargetSettings(url=url, metrics_url=f"{url}/metrics", name="bench")
        with tempfile.TemporaryDirectory() as tmp, _scratch(args.db) as scratch:
            db = scratch or f"sqlite:///{tmp}/bench.db"
            store = Store(db)
            settings = Settings(targets=[target], interval_s=1.0)
            source = TritonSource(target, statistics_interval_s=args.statistics_every - 0.5)
            tick = itertools.count(1_000_000)
            service = CollectorService(settings, store, [source], clock=lambda: float(next(tick)))
            # The source's own clock advances one second a scrape, so the statistics
            # are read every ``--statistics-every`` scrapes, as ``collect`` reads them
            # every ``statistics_interval_s`` at its interval.
            scrapes = itertools.count(1_000_000)
            source._clock = lambda: float(next(scrapes))  # noqa: SLF001
            source_collect = source.collect

            def collect() -> list[Any]:
                at = next(scrapes)
                source._clock = lambda: float(at)  # noqa: SLF001
                return source_collect()

            source.collect = collect  # type: ignore[method-assign]
            for _ in range(args.warmup):
                assert service.run_source(source), service.health(source)
            part = _count_part(args.part, service, store)
            # The profile counts CPU time, as the figure does: with cProfile's default
            # wall clock, the GETs' waits on the server would be charged to libcurl.
            profiler = cProfile.Profile(time.process_time) if args.profile else None
            wall0, cpu0 = time.perf_counter(), time.process_time()
            if profiler:
                profiler.enable()
            # Inside one C call, functools.reduce, so that callgrind can count these
            # scrapes alone (``bench.scrape_instructions``: --toggle-collect); with
            # --part, only that part's calls are inside one.
            scrape = functools.partial(service.run_source, source)
            if part is None:
                failed = functools.reduce(
                    lambda failed, _: failed or not scrape(), range(args.scrapes), False
                )
            else:
                failed = not all([scrape() for _ in range(args.scrapes)])
            if profiler:
                profiler.disable()
            assert not failed, service.health(source)
            cpu = time.process_time() - cpu0
            wall = time.perf_counter() - wall0
            backend = db.split(":")[0].split("+")[0]
            print(
                f"{args.models} models, {args.scrapes} scrapes, statistics every"
                f" {args.statistics_every}, {backend}:"
                f" {cpu / args.scrapes * 1e3:.2f} ms CPU per target-scrape"
                f" ({wall / args.scrapes * 1e3:.2f} ms wall)"
            )
            if profiler:
                stats = pstats.Stats(profiler)
                stats.sort_stats("tottime").print_stats(args.profile)
                stats.sort_stats("cumulative").print_stats(args.profile)
            source.close()
            store.close()
    finally:
        server.terminate()
        server.wait()


# The parts of the cycle ``--part`` counts alone (``_count_part``).
PARTS = ("cycle", "fetch", "page", "statistics", "rates", "store")


def _count_part(part: str, service: Any, store: Any) -> str | None:
    """Wrap ``part``'s function so that each call runs inside one ``functools.reduce``
    call (what callgrind toggles on), the measured loop then running outside one; None
    for the whole cycle. Done after the warm-up, so only the measured calls count."""
    if part == "cycle":
        return None
    from collector.sources.http_fetch import HttpFetcher
    from collector.sources.triton_json import ModelStatsParser
    from collector.sources.triton_metrics import TritonMetricsParser

    owner, name = {
        "fetch": (HttpFetcher, "get"),
        "page": (TritonMetricsParser, "parse"),
        "statistics": (ModelStatsParser, "parse"),
        "rates": (service, "_rates_for"),
        "store": (store, "write_scrape"),
    }[part]
    function = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        return functools.reduce(lambda _, __: function(*args, **kwargs), (0,), None)

    setattr(owner, name, counted)
    return part


@contextlib.contextmanager
def _scratch(url: str) -> Iterator[str]:
    """``url`` as given, or for PostgreSQL one whose connections see only a fresh
    schema, dropped afterwards."""
    if not url.startswith("postgresql"):
        yield url
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    schema = f"bs_scrape_cycle_{uuid.uuid4().hex}"
    admin = create_engine(url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        scoped = make_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
        yield scoped.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument(
        "--statistics-every",
        type=int,
        default=1,
        help="read the statistics every N scrapes (collect's default: 5 at a 1 s interval)",
    )
    parser.add_argument("--db", default="", help="store URL (default: a temporary SQLite)")
    parser.add_argument("--profile", type=int, default=0, help="top N functions, CPU time")
    parser.add_argument(
        "--part",
        choices=PARTS,
        default="cycle",
        help="what runs inside functools.reduce, for callgrind (bench.scrape_instructions)",
    )
    parser.add_argument(
        "--collector-root", default="", help="the checkout whose collector runs (default: this)"
    )
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.models)
    else:
        run(args)


if __name__ == "__main__":
    main()
