"""The load generator driven as the demo drives it, from many threads at once, against a
real Triton: every run measures, and nothing is logged or printed on the side (gRPC's
asyncio layer once closed its notification socket under a loop of another thread:
``Exception in callback PollerCompletionQueue._handle_events ... Bad file descriptor``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest

from collector.testbed.load import LoadResult, run_load
from collector.testbed.models import BATCHED_AND_UNBATCHED
from collector.testbed.server import TritonServer

pytestmark = pytest.mark.integration

# Runs end together, and some fail on every request (a model that is not there, as
# while a model reloads): the moments when a run's channel goes away under the others.
_MODELS = ("batched", "unbatched", "nosuchmodel")
_NOISE = ("Bad file descriptor", "Traceback", "Exception in callback", "was never retrieved")


def _round(server: TritonServer, threads: int, seconds: float) -> list[tuple[str, LoadResult]]:
    results: list[tuple[str, LoadResult]] = []
    lock = threading.Lock()

    def one(model: str, run_s: float) -> None:
        result = run_load(server.grpc_url, model, concurrency=4, duration_s=run_s)
        with lock:
            results.append((model, result))

    runs = [
        threading.Thread(target=one, args=(_MODELS[i % len(_MODELS)], seconds * (1 + i % 2) / 2))
        for i in range(threads)
    ]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    return results


def test_many_threads_of_load_leave_nothing_in_the_log(
    triton_factory: Callable[..., TritonServer],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    server = triton_factory(BATCHED_AND_UNBATCHED)
    caplog.set_level(logging.DEBUG, logger="asyncio")
    caplog.set_level(logging.WARNING)
    deadline = time.monotonic() + 16.0
    rounds = 0
    while rounds < 3 or time.monotonic() < deadline:
        results = _round(server, threads=6, seconds=1.0 if rounds % 2 else 0.4)
        rounds += 1
        assert len(results) == 6
        for model, result in results:
            if model == "nosuchmodel":
                assert result.requests == 0 and result.errors > 0
            else:
                assert result.errors == 0 and result.requests > 0, (model, result)
        logged = caplog.text
        out, err = capfd.readouterr()
        for noise in _NOISE:
            assert noise not in logged + err, f"round {rounds}: {noise!r} in\n{logged}{err}"
