"""A load test of the dashboard and the exporter's ``/metrics``, on 127.0.0.1 only.

A store holding a week of 20 models (``bench.dashboard_callbacks.fill``: every model
scraped every ``--step`` seconds for ``--days`` days, rolled up each simulated hour,
with devices, processes, findings and recommendations) is served by ``batchscope
dashboard`` and by ``batchscope exporter`` (on a copy of it), each a process of its
own. ``--users`` threads then each act as a browser for ``--duration`` seconds: a page
view is the page's GET, ``/_dash-layout``, ``/_dash-dependencies`` and the callback
POSTs Dash's renderer makes for that page (the page's content, its data, and what the
data feeds, each posted once its inputs are known), then ``--think`` seconds of
pause; after every round of the six pages a user also reads ``/metrics``.

Prints p50, p95 and max latency, requests and errors (4xx, 5xx, no answer) per
endpoint. Usage: ``python -m bench.load [--users 50] [--duration 120] [--days 7]
[--step 60] [--models 20] [--think 1]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from bench.dashboard_callbacks import fill
from bench.fleet_run import free_port
from collector.process_control import die_with_parent

__all__ = [
    "PAGES",
    "Endpoint",
    "LoadResult",
    "Services",
    "callback_body",
    "callback_outputs",
    "callback_updates",
    "percentile",
    "render",
    "run_load",
    "seed",
    "serve",
]

#: The pages a user cycles through (the model page with one of the seeded models).
PAGES: tuple[str, ...] = (
    "/",
    "/model?target=triton-a&model=model_03",
    "/recommendations",
    "/findings",
    "/alerts",
    "/devices",
)
REQUEST_TIMEOUT_S = 60.0
# Callbacks one page view posts at most (the chain ends well before).
_MAX_CALLBACKS = 40


def percentile(values: Sequence[float], share: float) -> float:
    """The ``share`` quantile by nearest rank (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(int(round(share * len(ordered) + 0.5)) - 1, 0)
    return ordered[min(rank, len(ordered) - 1)]


@dataclass
class Endpoint:
    """What one endpoint got: latencies of its answered requests, and its failures."""

    latencies_s: list[float] = field(default_factory=list)
    status_4xx: int = 0
    status_5xx: int = 0
    no_answer: int = 0
    examples: list[str] = field(default_factory=list)  # the first few failures

    @property
    def requests(self) -> int:
        return len(self.latencies_s) + self.no_answer

    def note(self, failure: str) -> None:
        if len(self.examples) < 3:
            self.examples.append(failure)


@dataclass
class LoadResult:
    users: int
    duration_s: float
    endpoints: dict[str, Endpoint]
    page_views: int

    def total(self, attr: str) -> int:
        return sum(int(getattr(e, attr)) for e in self.endpoints.values())


class _Recorder:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.endpoints: dict[str, Endpoint] = {}
        self.page_views = 0

    def call(
        self, session: requests.Session, label: str, method: str, url: str, **kwargs: Any
    ) -> requests.Response | None:
        started = time.perf_counter()
        try:
            response = session.request(method, url, timeout=REQUEST_TIMEOUT_S, **kwargs)
            _ = response.content  # read the whole body: the time includes it
        except requests.RequestException as exc:
            with self._lock:
                endpoint = self.endpoints.setdefault(label, Endpoint())
                endpoint.no_answer += 1
                endpoint.note(f"{type(exc).__name__}")
            return None
        took = time.perf_counter() - started
        with self._lock:
            endpoint = self.endpoints.setdefault(label, Endpoint())
            endpoint.latencies_s.append(took)
            if response.status_code >= 500:
                endpoint.status_5xx += 1
                endpoint.note(f"HTTP {response.status_code}: {response.text[:120]}")
            elif response.status_code >= 400:
                endpoint.status_4xx += 1
                endpoint.note(f"HTTP {response.status_code}: {response.text[:120]}")
        return response


Prop = tuple[str, str]  # (component id, property)


def callback_outputs(output: str) -> dict[str, Any] | list[dict[str, Any]]:
    """Dash's ``outputs`` for a callback's output key as ``/_dash-dependencies`` names
    it: one ``{"id", "property"}`` for ``id.prop``, a list of them for
    ``..a.p...b.q..`` (several outputs); an id written as JSON (a pattern-matching id)
    is decoded."""
    multi = output.startswith("..") and output.endswith("..")
    specs: list[dict[str, Any]] = []
    for part in output[2:-2].split("...") if multi else [output]:
        ident, _, prop = part.rpartition(".")
        specs.append(
            {"id": json.loads(ident) if ident.startswith("{") else ident, "property": prop}
        )
    return specs if multi else specs[0]


def callback_body(
    output: str,
    inputs: Sequence[dict[str, Any]],
    state: Sequence[dict[str, Any]] = (),
    changed: Sequence[str] = (),
) -> dict[str, Any]:
    """The JSON body Dash's renderer posts to ``/_dash-update-component`` for the
    callback whose output key is ``output``: ``inputs`` and ``state`` as
    ``{"id", "property", "value"}``, ``changed`` the ``id.prop`` that fired it."""
    return {
        "output": output,
        "outputs": callback_outputs(output),
        "inputs": list(inputs),
        "state": list(state),
        "changedPropIds": list(changed),
    }


def callback_updates(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What a callback's 200 answer sets: component id -> {property: value}."""
    updates: dict[str, dict[str, Any]] = answer["response"]
    return updates


@dataclass(frozen=True)
class _Callback:
    output: str  # as /_dash-dependencies names it
    outputs: tuple[Prop, ...]
    inputs: tuple[Prop, ...]
    state: tuple[Prop, ...]
    prevent_initial_call: bool


def _callbacks(dependencies: list[dict[str, Any]]) -> list[_Callback]:
    """The server-side callbacks a page view can post: not clientside, no
    pattern-matching ids, no duplicate outputs (those answer clicks only)."""
    out: list[_Callback] = []
    for d in dependencies:
        if d.get("clientside_function") or "@" in d["output"]:
            continue
        inputs = [(i["id"], i["property"]) for i in d["inputs"]]
        state = [(s["id"], s["property"]) for s in d["state"]]
        if any(not isinstance(i, str) or i.startswith("{") for i, _ in inputs + state):
            continue
        outputs = callback_outputs(d["output"])
        out.append(
            _Callback(
                d["output"],
                tuple(
                    (o["id"], o["property"])
                    for o in (outputs if isinstance(outputs, list) else [outputs])
                ),
                tuple(inputs),
                tuple(state),
                bool(d.get("prevent_initial_call")),
            )
        )
    return out


def _walk(node: Any, known: dict[Prop, Any], present: set[str]) -> None:
    """Every component id under ``node`` with its props."""
    if isinstance(node, list):
        for child in node:
            _walk(child, known, present)
        return
    if not isinstance(node, dict) or "props" not in node:
        return
    props = node["props"]
    cid = props.get("id")
    if isinstance(cid, str):
        present.add(cid)
        for name, value in props.items():
            known[(cid, name)] = value
    for value in props.values():
        if isinstance(value, dict | list):
            _walk(value, known, present)


class _Browser:
    """One user: a session that views pages as Dash's renderer does."""

    def __init__(self, base: str, recorder: _Recorder) -> None:
        self._base = base
        self._rec = recorder
        self.session = requests.Session()
        # What a browser sends with a same-origin fetch.
        self._post_headers = {
            "Content-Type": "application/json",
            "Origin": base,
            "Referer": base + "/",
            "Sec-Fetch-Site": "same-origin",
            "Sec-Fetch-Mode": "cors",
        }

    def view(self, page: str) -> None:
        path, _, query = page.partition("?")
        label = f"GET {path}"
        if self._rec.call(self.session, label, "GET", self._base + page) is None:
            return
        layout = self._rec.call(
            self.session, "GET /_dash-layout", "GET", self._base + "/_dash-layout"
        )
        deps = self._rec.call(
            self.session, "GET /_dash-dependencies", "GET", self._base + "/_dash-dependencies"
        )
        if layout is None or deps is None or layout.status_code != 200 or deps.status_code != 200:
            return
        known: dict[Prop, Any] = {}
        present: set[str] = set()
        _walk(layout.json(), known, present)
        known[("_pages_location", "pathname")] = path
        known[("_pages_location", "search")] = f"?{query}" if query else ""
        changed: set[Prop] = {("_pages_location", "pathname"), ("_pages_location", "search")}
        callbacks = _callbacks(deps.json())
        fired: set[str] = set()
        for _ in range(_MAX_CALLBACKS):
            ready = [
                c
                for c in callbacks
                if c.output not in fired
                and all(i in present for i, _ in c.inputs)
                and all(o in present for o, _ in c.outputs)
                and (not c.prevent_initial_call or any(i in changed for i in c.inputs))
            ]
            if not ready:
                break
            waiting_for = {o for c in ready for o in c.outputs}
            runnable = [c for c in ready if not any(i in waiting_for for i in c.inputs)]
            for c in runnable or ready[:1]:
                fired.add(c.output)
                self._post(c, known, present, changed)
        with self._rec._lock:
            self._rec.page_views += 1

    def _post(
        self, c: _Callback, known: dict[Prop, Any], present: set[str], changed: set[Prop]
    ) -> None:
        def values(props: tuple[Prop, ...]) -> list[dict[str, Any]]:
            return [{"id": i, "property": p, "value": known.get((i, p))} for i, p in props]

        body = callback_body(
            c.output,
            values(c.inputs),
            values(c.state),
            [f"{i}.{p}" for i, p in c.inputs if (i, p) in changed],
        )
        label = f"POST callback {c.outputs[0][0]}"
        response = self._rec.call(
            self.session,
            label,
            "POST",
            self._base + "/_dash-update-component",
            data=json.dumps(body),
            headers=self._post_headers,
        )
        if response is None or response.status_code != 200:
            return  # 204: nothing to update
        for cid, props in callback_updates(response.json()).items():
            for name, value in props.items():
                known[(cid, name)] = value
                changed.add((cid, name))
                if name == "children":
                    _walk(value, known, present)


def run_load(
    dashboard_url: str,
    metrics_url: str | None,
    *,
    users: int,
    duration_s: float,
    think_s: float = 1.0,
    pages: Sequence[str] = PAGES,
) -> LoadResult:
    """``users`` threads viewing ``pages`` in turn (each from its own first page) with
    ``think_s`` between views, and reading ``metrics_url`` (if any) after each round, until
    ``duration_s`` has passed; a view under way when it does is finished."""
    recorder = _Recorder()
    stop = threading.Event()

    def user(n: int) -> None:
        browser = _Browser(dashboard_url, recorder)
        with browser.session:
            i = n
            while not stop.is_set():
                browser.view(pages[i % len(pages)])
                i += 1
                if metrics_url is not None and (i - n) % len(pages) == 0:
                    recorder.call(browser.session, "GET /metrics", "GET", metrics_url)
                stop.wait(think_s)

    threads = [threading.Thread(target=user, args=(n,), daemon=True) for n in range(users)]
    started = time.monotonic()
    for t in threads:
        t.start()
    stop.wait(duration_s)
    stop.set()
    for t in threads:
        t.join(REQUEST_TIMEOUT_S * 3)
    return LoadResult(users, time.monotonic() - started, recorder.endpoints, recorder.page_views)


def render(result: LoadResult) -> str:
    rows = [["ENDPOINT", "REQUESTS", "P50 MS", "P95 MS", "MAX MS", "4XX", "5XX", "NO ANSWER"]]
    for name in sorted(result.endpoints):
        e = result.endpoints[name]
        rows.append(
            [
                name,
                str(e.requests),
                f"{percentile(e.latencies_s, 0.5) * 1000:.0f}",
                f"{percentile(e.latencies_s, 0.95) * 1000:.0f}",
                f"{max(e.latencies_s, default=0.0) * 1000:.0f}",
                str(e.status_4xx),
                str(e.status_5xx),
                str(e.no_answer),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        f"{result.users} users for {result.duration_s:.0f} s: {result.page_views} page views, "
        f"{result.total('requests')} requests"
    ]
    for r in rows:
        lines.append(
            "  ".join(
                c.rjust(w) if j else c.ljust(w)
                for j, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    for name, e in sorted(result.endpoints.items()):
        for example in e.examples:
            lines.append(f"  {name}: {example}")
    return "\n".join(lines)


def seed(url: str, *, days: float = 7, step: float = 60, models: int = 20) -> float:
    """Fill the store at ``url`` with ``days`` of ``models`` ending now; the seconds
    it took."""
    started = time.monotonic()
    fill(url, days=days, step=step, models=models, end=time.time())
    return time.monotonic() - started


def _stop(process: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass(frozen=True)
class Services:
    dashboard_url: str
    metrics_url: str
    dashboard: subprocess.Popen[bytes]
    exporter: subprocess.Popen[bytes]


def _wait_ok(url: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the server exited:\n{log.read_text()[-2000:]}")
        try:
            if requests.get(url, timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url}: not ready after {timeout_s:g} s:\n{log.read_text()[-2000:]}")


@contextmanager
def serve(db_file: Path, workdir: Path, *, timeout_s: float = 60) -> Iterator[Services]:
    """``batchscope dashboard`` over the SQLite store ``db_file`` and ``batchscope
    exporter`` over a copy of it (its own collector writes there; its one Triton target
    is a port nothing listens on), both on 127.0.0.1; both stopped on exit."""
    exporter_db = workdir / "exporter.db"
    shutil.copyfile(db_file, exporter_db)
    ui_port, metrics_port, nobody = free_port(), free_port(), free_port()
    base = [sys.executable, "-m", "collector.cli"]
    ui_log, exporter_log = workdir / "dashboard.log", workdir / "exporter.log"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        with ui_log.open("wb") as out:
            processes.append(
                subprocess.Popen(
                    [*base, "dashboard", "--db", f"sqlite:///{db_file}"]
                    + ["--host", "127.0.0.1", "--port", str(ui_port)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=die_with_parent(),  # gone with the bench, even on SIGKILL
                )
            )
        with exporter_log.open("wb") as out:
            processes.append(
                subprocess.Popen(
                    [*base, "exporter", "--db", f"sqlite:///{exporter_db}"]
                    + ["--listen", f"127.0.0.1:{metrics_port}", "--sources", "triton"]
                    + ["--triton", f"http://127.0.0.1:{nobody}", "--interval", "5"],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=die_with_parent(),  # gone with the bench, even on SIGKILL
                )
            )
        services = Services(
            f"http://127.0.0.1:{ui_port}",
            f"http://127.0.0.1:{metrics_port}/metrics",
            processes[0],
            processes[1],
        )
        _wait_ok(services.dashboard_url + "/", processes[0], ui_log, timeout_s)
        _wait_ok(services.metrics_url, processes[1], exporter_log, timeout_s)
        yield services
    finally:
        for process in processes:
            _stop(process)


def main(argv: Sequence[str] | None = None) -> LoadResult:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of load")
    parser.add_argument("--think", type=float, default=1.0, help="seconds between page views")
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--step", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--models", type=int, default=20)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="batchscope-load-") as tmp:
        workdir = Path(tmp)
        db = workdir / "week.db"
        took = seed(f"sqlite:///{db}", days=args.days, step=args.step, models=args.models)
        print(
            f"store: {args.days:g} days of {args.models} models every {args.step:g} s, "
            f"filled in {took:.1f} s ({db.stat().st_size / 2**20:.0f} MiB)"
        )
        with serve(db, workdir) as services:
            result = run_load(
                services.dashboard_url,
                services.metrics_url,
                users=args.users,
                duration_s=args.duration,
                think_s=args.think,
            )
    print(render(result))
    return result


if __name__ == "__main__":
    outcome = main()
    failed = outcome.total("status_5xx") + outcome.total("no_answer")
    sys.exit(1 if failed else 0)
