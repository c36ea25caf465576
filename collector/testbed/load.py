"""A small load generator for Triton over gRPC (``tritonclient.grpc.aio``).

``perf_analyzer`` does not start on these machines (it needs a newer glibc), so the
testbed brings its own.  Two modes:

* closed loop, ``concurrency=N``: N clients each send a request, wait for its answer and
  send the next, so the offered load adapts to the server;
* open loop, ``rate=R``: requests arrive at R per second (Poisson or evenly spaced)
  whatever the server does, which is what exposes queueing; the number in flight is
  capped, and an arrival that finds the cap reached is counted as an error rather than
  silently delayed, so the reported QPS never hides an overload.

Every run ends by itself: no request is sent after ``duration_s``, each request has a
deadline, and the whole run has a hard bound.  Request failures (a dead server
included) are counted and sampled, never raised.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import importlib
import json
import random
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal, ParamSpec, TypeVar

import numpy as np

from collector.testbed.models import INPUT_DIM, INPUT_NAME, OUTPUT_NAME

__all__ = ["LoadResult", "load_in_background", "run_load", "run_load_async", "start_load_loop"]

Arrivals = Literal["poisson", "constant"]
_P = ParamSpec("_P")
_T = TypeVar("_T")

# Distinct error messages kept in a result: enough to diagnose, small enough to print.
_MAX_ERROR_SAMPLES = 5
# Set while the shared load loop closes (at exit): runs stop sending and return what
# they measured, so a thread still waiting on one gets its result, not an error.
_STOPPING = threading.Event()
# How long a closing load loop waits for its runs' last requests before cancelling them.
_DRAIN_S = 12.0
# After a failure a closed-loop client pauses this long, so a dead server produces a
# steady trickle of errors instead of a busy loop that starves the event loop.
_ERROR_BACKOFF_S = 0.01


@dataclass(frozen=True)
class LoadResult:
    """What one run measured.  Latencies are client-side, over successful requests."""

    requests: int  # successful requests
    errors: int  # failed requests, including open-loop arrivals dropped at the in-flight cap
    duration_s: float  # from the first send to the last answer
    qps: float  # requests / duration_s
    p50_ms: float | None  # None when no request succeeded
    p95_ms: float | None
    p99_ms: float | None
    error_samples: tuple[str, ...] = ()

    def to_json(self) -> str:
        data: dict[str, Any] = asdict(self)
        data["error_samples"] = list(self.error_samples)
        return json.dumps(data, sort_keys=True)


class _Recorder:
    """Collects latencies and errors from the concurrent tasks of one run."""

    def __init__(self) -> None:
        self.latencies_s: list[float] = []
        self.errors = 0
        self.error_samples: list[str] = []
        self.first_send: float | None = None
        self.last_done: float | None = None

    def sent(self, at: float) -> None:
        if self.first_send is None:
            self.first_send = at

    def ok(self, started: float, done: float) -> None:
        self.latencies_s.append(done - started)
        self.last_done = done

    def error(self, message: str, done: float) -> None:
        self.errors += 1
        self.last_done = done
        message = " ".join(message.split())[:300]
        if len(self.error_samples) < _MAX_ERROR_SAMPLES and message not in self.error_samples:
            self.error_samples.append(message)

    def result(self, fallback_duration_s: float) -> LoadResult:
        if self.first_send is not None and self.last_done is not None:
            duration = max(self.last_done - self.first_send, 1e-9)
        else:
            duration = fallback_duration_s
        n = len(self.latencies_s)
        p50: float | None = None
        p95: float | None = None
        p99: float | None = None
        if n:
            p50, p95, p99 = (
                float(v) * 1e3 for v in np.percentile(np.asarray(self.latencies_s), [50, 95, 99])
            )
        return LoadResult(
            requests=n,
            errors=self.errors,
            duration_s=duration,
            qps=n / duration if duration > 0 else 0.0,
            p50_ms=p50,
            p95_ms=p95,
            p99_ms=p99,
            error_samples=tuple(self.error_samples),
        )


def _channel_args() -> list[tuple[str, int]]:
    """tritonclient's default channel options, plus two that matter for a testbed.

    gRPC shares connections ("subchannels") across all channels of a process, with
    their reconnect backoff: after a run against a dead server, the next run would
    inherit seconds of backoff and fail against a server that is already back.  A
    private subchannel pool and a short backoff make each run see the server as it is.
    """
    from tritonclient.grpc import KeepAliveOptions

    keepalive = KeepAliveOptions()
    max_message = 2**31 - 1  # tritonclient's own limit (INT32_MAX)
    return [
        ("grpc.max_send_message_length", max_message),
        ("grpc.max_receive_message_length", max_message),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(keepalive.keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


async def run_load_async(
    grpc_url: str,
    model: str,
    *,
    concurrency: int | None = None,
    rate: float | None = None,
    duration_s: float,
    batch: int = 1,
    arrivals: Arrivals = "poisson",
    max_in_flight: int = 256,
    request_timeout_s: float = 10.0,
    seed: int | None = None,
    stop: threading.Event | None = None,
) -> LoadResult:
    """Drive ``model`` at ``grpc_url`` (``host:port``) for ``duration_s`` seconds, or
    until ``stop`` is set (from any thread), whichever comes first.

    Closed loop with ``concurrency`` clients, or open loop at ``rate`` requests/s with
    ``arrivals`` spaced as a Poisson process or evenly; each request carries ``batch``
    samples.  Exactly one of ``concurrency`` and ``rate`` must be given.
    """
    _check_options(concurrency, rate, duration_s, batch, max_in_flight, arrivals)
    # Imported here so that importing batchscope does not need the testbed extra.
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url=grpc_url, channel_args=_channel_args())
    data = np.random.default_rng(seed).standard_normal((batch, INPUT_DIM)).astype(np.float32)
    inputs = [grpcclient.InferInput(INPUT_NAME, [batch, INPUT_DIM], "FP32")]
    inputs[0].set_data_from_numpy(data)
    requests = _Requests(
        client,
        model,
        inputs,
        [grpcclient.InferRequestedOutput(OUTPUT_NAME)],
        request_timeout_s,
        stop,
    )
    start = requests.loop.time()
    stop_at = start + duration_s
    work: asyncio.Future[Any]
    if concurrency is not None:
        work = asyncio.gather(*(requests.closed_client(stop_at) for _ in range(concurrency)))
    else:
        assert rate is not None  # _check_options: exactly one of the two
        gaps = _arrival_gaps(rate, arrivals, seed)
        work = asyncio.ensure_future(requests.open_arrivals(start, stop_at, gaps, max_in_flight))
    try:
        # The hard bound: sending stops at duration_s and each request has a deadline,
        # so this only fires if the client library itself hangs.
        await asyncio.wait_for(work, timeout=duration_s + request_timeout_s + 5.0)
    except TimeoutError:
        requests.recorder.error(
            "load run exceeded its time bound; outstanding requests cancelled",
            requests.loop.time(),
        )
    finally:
        # Closing a broken channel must not mask the result.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), timeout=5.0)
    return requests.recorder.result(duration_s)


def _check_options(
    concurrency: int | None,
    rate: float | None,
    duration_s: float,
    batch: int,
    max_in_flight: int,
    arrivals: str,
) -> None:
    if (concurrency is None) == (rate is None):
        raise ValueError("give exactly one of concurrency (closed loop) or rate (open loop)")
    if concurrency is not None and concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if rate is not None and rate <= 0:
        raise ValueError("rate must be > 0")
    if duration_s <= 0:
        raise ValueError("duration_s must be > 0")
    if batch < 1:
        raise ValueError("batch must be >= 1")
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be >= 1")
    if arrivals not in ("poisson", "constant"):
        raise ValueError("arrivals must be 'poisson' or 'constant'")


def _arrival_gaps(rate: float, arrivals: Arrivals, seed: int | None) -> Iterator[float]:
    """Seconds between consecutive open-loop arrivals."""
    rng = random.Random(seed)
    while True:
        yield rng.expovariate(rate) if arrivals == "poisson" else 1.0 / rate


class _Requests:
    """The requests of one run: one client, one prepared input, one recorder."""

    def __init__(
        self,
        client: Any,
        model: str,
        inputs: list[Any],
        outputs: list[Any],
        timeout_s: float,
        stop: threading.Event | None,
    ) -> None:
        self._stop = stop
        self._client = client
        self._model = model
        self._inputs = inputs
        self._outputs = outputs
        self._timeout_s = timeout_s
        self.loop = asyncio.get_running_loop()
        self.recorder = _Recorder()

    def stopped(self) -> bool:
        """The run's own stop, or every run's (the process is stopping)."""
        return _STOPPING.is_set() or (self._stop is not None and self._stop.is_set())

    async def one(self) -> bool:
        """Send one request and record its outcome; True when it succeeded."""
        sent = self.loop.time()
        self.recorder.sent(sent)
        try:
            # gRPC's deadline ends the request; wait_for is the backstop should the
            # client library not honour it, so no request outlives the run for long.
            await asyncio.wait_for(
                self._client.infer(
                    self._model,
                    self._inputs,
                    outputs=self._outputs,
                    client_timeout=self._timeout_s,
                ),
                timeout=self._timeout_s + 1.0,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every request failure is data here, not a crash
            self.recorder.error(f"{type(exc).__name__}: {exc}", self.loop.time())
            return False
        self.recorder.ok(sent, self.loop.time())
        return True

    async def closed_client(self, stop_at: float) -> None:
        """One closed-loop client: the next request when the last one returned."""
        while self.loop.time() < stop_at and not self.stopped():
            if not await self.one():
                await asyncio.sleep(_ERROR_BACKOFF_S)

    async def open_arrivals(
        self, start: float, stop_at: float, gaps: Iterator[float], max_in_flight: int
    ) -> None:
        """Open loop: a request at each arrival from ``start`` until ``stop_at``, whatever
        the server does; an arrival that finds ``max_in_flight`` requests outstanding is
        an error."""
        in_flight: set[asyncio.Task[bool]] = set()
        next_at = start
        try:
            while next_at < stop_at and not self.stopped():
                now = self.loop.time()
                if next_at > now:
                    await asyncio.sleep(next_at - now)
                if len(in_flight) >= max_in_flight:
                    self.recorder.error(
                        f"dropped: {max_in_flight} requests already in flight", self.loop.time()
                    )
                else:
                    task = asyncio.create_task(self.one())
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                # Schedule from the previous arrival, not from now, so that a late
                # wake-up does not lower the offered rate.
                next_at += next(gaps)
            if in_flight:
                await asyncio.gather(*in_flight, return_exceptions=True)
        finally:
            for task in in_flight:
                task.cancel()


def _grpc_aio() -> Any:
    # Imported when first used, so that importing batchscope needs no testbed extra.
    return importlib.import_module("grpc.aio")


class _LoadLoop:
    """The one event loop, in a thread of its own, that runs every blocking ``run_load``
    of the process.

    gRPC's asyncio layer keeps one completion queue per process, with one notification
    socket that every event loop using it watches; it tears the queue down (closing the
    socket) whenever its count of live channels drops to zero, from whichever thread
    frees the last channel. With a loop per run and runs in several threads, as the
    demo drives its models, one run's teardown closed the socket under a loop still
    running in another thread: ``OSError: [Errno 9] Bad file descriptor`` from
    ``PollerCompletionQueue._handle_events`` in the log. So every run shares this loop,
    which holds gRPC's asyncio state (``init_grpc_aio``) for as long as it runs; each
    run still opens and closes its own channel; and the state is released once the loop
    has stopped, at exit (or ``close()``), when no loop is left to watch the socket.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def running(self) -> asyncio.AbstractEventLoop:
        """The loop, started (gRPC imported and bound to it) if it was not running."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()
                thread = threading.Thread(
                    target=self._serve, args=(loop, ready), name="load-loop", daemon=True
                )
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
                atexit.register(self.close)
            return self._loop

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        _grpc_aio().init_grpc_aio()  # binds this loop; released in close()
        loop.call_soon(ready.set)
        loop.run_forever()

    def run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """``coroutine``'s result, run on the shared loop; a caller interrupted while
        waiting (Ctrl-C) cancels it."""
        loop = self.running()
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("run_load called from the load loop: await run_load_async")
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        """Stop the loop, then release gRPC's asyncio state (its socket is closed with
        no loop running). Runs in flight stop sending and return what they measured
        (their last requests get ``_DRAIN_S``). A later run starts anew."""
        # Bounded: a loop still starting holds the lock, and an exit must not wait on it.
        if not self._lock.acquire(timeout=5.0):
            return
        try:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        finally:
            self._lock.release()
        if loop is None or thread is None:
            return
        atexit.unregister(self.close)
        _STOPPING.set()
        try:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_drain(), loop).result(timeout=_DRAIN_S + 5)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=15.0)
            if thread.is_alive():  # the loop is stuck: leave it to the interpreter's exit
                return
            _grpc_aio().shutdown_grpc_aio()
            loop.close()
        finally:
            _STOPPING.clear()


async def _drain() -> None:
    """Wait for the loop's runs to end (they have stopped sending), cancelling what is
    left after ``_DRAIN_S``."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    if not tasks:
        return
    _done, pending = await asyncio.wait(tasks, timeout=_DRAIN_S)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


_LOAD_LOOP = _LoadLoop()


def start_load_loop() -> None:
    """Import gRPC and start the shared load loop now rather than at the first run.

    The import takes a second, and far longer on a busy machine, and cannot be
    interrupted: a caller that must stop at once (the demo, on SIGTERM) calls this before
    its first run, so that no run is ever waiting on it when the stop comes.
    """
    _LOAD_LOOP.running()
    # The client library too, which each run's first line would import otherwise.
    importlib.import_module("tritonclient.grpc.aio")


def _blocking(coroutine_fn: Callable[_P, Coroutine[Any, Any, _T]]) -> Callable[_P, _T]:
    """``coroutine_fn`` run to completion on the shared load loop, with its signature."""

    @functools.wraps(coroutine_fn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        return _LOAD_LOOP.run(coroutine_fn(*args, **kwargs))

    return run


# The same run for callers outside an event loop: one signature, kept in one place.
# Any number of threads may call it at once: their runs share one event loop.
run_load = _blocking(run_load_async)
run_load.__name__ = run_load.__qualname__ = "run_load"


@contextlib.contextmanager
def load_in_background(grpc_url: str, model: str, **options: Any) -> Iterator[list[LoadResult]]:
    """``run_load(grpc_url, model, **options)`` on a thread of its own while the block
    runs: for at most ``duration_s``, stopped when the block ends (its ``stop``),
    joined before the block's exit returns. Yields a list that holds the run's result
    once the block has ended (empty if the run raised)."""
    stop = threading.Event()
    results: list[LoadResult] = []
    thread = threading.Thread(
        target=lambda: results.append(run_load(grpc_url, model, stop=stop, **options)),
        name=f"load-{model}",
        daemon=True,
    )
    thread.start()
    try:
        yield results
    finally:
        stop.set()
        thread.join()
