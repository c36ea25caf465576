"""Counters that jump between two long-running servers, against one real
``batchscope collect`` process: the address of a target reaches, ``FLIP_S`` seconds each
in turn, two servers under the same load, one up half an hour longer (a load balancer,
a DNS name that moves), so its counters jump up and fall part-way back again and
again while the true rates never change. Every rate the collector stores stays
between zero and 1.5 times the true rate, and so does the window across the jumps."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from pathlib import Path

from collector.analysis.rates import window_rates
from collector.records import ModelSample
from collector.store import Store
from collector.testbed.fleet_documents import BATCH_PROFILE, ModelLoad
from tests.reliability import fault_server as fs
from tests.reliability.conftest import FaultLedger
from tests.reliability.test_target_faults import _settings
from tests.support import running_collector, wait_until

NAME = "flip"
FLIPS = 5  # moves from one server to the other while flipping
BOUND = 1.5  # a stored rate at most this many times the true one ...
# ... plus, per pair, what rounding each batch size's executions down to whole ones
# may add at most: one execution of each size (requests per pair).
ROUNDING = sum(size for size, *_ in BATCH_PROFILE)


def _true_requests_per_s(model_index: int) -> float:
    """The load of the fault server's first target's model ``model_index`` (both of
    its servers run it): executions per second per batch size, times the size."""
    load = ModelLoad.for_model(0, model_index)
    return sum(r * size for r, (size, *_) in zip(load.exec_rates, BATCH_PROFILE, strict=True))


def _series(store: Store) -> dict[tuple[str, str], list[ModelSample]]:
    out: dict[tuple[str, str], list[ModelSample]] = defaultdict(list)
    for s in store.model_samples(target=NAME):
        out[(s.model, s.version)].append(s)
    return {k: sorted(v, key=lambda s: s.collected_at) for k, v in out.items()}


def _moves(samples: list[ModelSample]) -> int:
    """How often a series' request counter jumped (from one server to the other)."""
    requests = [s.metrics.request_success for s in samples]
    return sum(1 for a, b in zip(requests, requests[1:], strict=False) if abs(b - a) > 10_000)


def test_counters_moving_between_two_servers_store_no_spike(
    tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    db_url = f"sqlite:///{tmp_path / 'faults.db'}"
    with contextlib.ExitStack() as cleanup:
        server = cleanup.enter_context(fs.FaultServer([NAME]))
        target = {"name": NAME, "url": server.url(NAME), "metrics_url": server.metrics_url(NAME)}
        collect = cleanup.enter_context(
            running_collector(tmp_path, settings=_settings(db_url, [target]))
        )
        store = cleanup.enter_context(contextlib.closing(Store(db_url)))
        wait_until(
            lambda: bool(series := _series(store)) and all(len(v) >= 4 for v in series.values()),
            30,
            "four scrapes of each model",
        )
        flip_at = time.time()
        server.set_fault(NAME, fs.FLIP)
        wait_until(
            lambda: all(_moves(v) >= FLIPS for v in _series(store).values()),
            2 * FLIPS * fs.FLIP_S + 10,
            f"{FLIPS} moves of every series between the servers",
            every_s=0.5,
        )
        server.set_fault(NAME, fs.OK)
        assert collect.stop(timeout_s=30) == 0, collect.log()
        series = _series(store)

    models = list(server.models)
    stored = moves = counted = breaks = 0
    worst = 0.0
    windows = []
    for key, samples in series.items():
        before = [s for s in samples if s.collected_at < flip_at and s.rates is not None]
        during = [s for s in samples if s.collected_at >= flip_at and s.rates is not None]
        # The true rate: both servers serve the same load.
        true = _true_requests_per_s(models.index(key[0]))
        assert true > 0
        moves += _moves(samples)  # at least FLIPS: waited for above
        for s in before + during:
            r = s.rates
            assert r is not None
            for value in (r.requests_per_s, r.inferences_per_s, r.executions_per_s, r.fail_per_s):
                assert value >= 0, (key, s.collected_at, r)
            bound = BOUND * true + ROUNDING / r.window_s
            assert r.requests_per_s <= bound, (key, s.collected_at, r, true)
            assert r.inferences_per_s <= bound, (key, s.collected_at, r, true)
            worst = max(worst, r.requests_per_s / true)
        stored += len(during)
        breaks += sum(1 for s in during if s.rates is not None and s.rates.resets)
        counted += sum(1 for s in during if s.rates is not None and not s.rates.resets)
        # The window across the flips: the true rate less the pairs at the jumps.
        whole = window_rates(samples)
        assert whole is not None
        assert 0.3 * true <= whole.requests_per_s <= BOUND * true, (key, whole, true)
        windows.append(whole.requests_per_s / true)
    # Between two breaks a series stays FLIP_S on one server, over two or more 1 s
    # scrapes: at least one pair there is counted, however the scrapes fall.
    assert counted >= max(1, breaks - len(series)), (counted, breaks, stored)

    fault_ledger.record(
        area="targets",
        fault=(
            f"counters moving between two long-running servers every {fs.FLIP_S:.1f} s "
            "(one up 30 min longer: jumps up and part-way down)"
        ),
        tries=moves,
        outcome=(
            f"{moves} jumps over {len(series)} series; {stored} rates stored during the "
            f"flips: {counted} counted, {breaks} counted as a new baseline (0), none "
            f"negative, highest {worst:.2f}x the true rate (bound {BOUND}x plus "
            f"{ROUNDING} requests of rounding a pair; a jump would be ~"
            f"{fs.FLIP_AHEAD_S:.0f}x); window rates across the run {min(windows):.2f}x to "
            f"{max(windows):.2f}x the true rate"
        ),
        lost=f"{breaks} scrape intervals counted as 0 at the jumps",
    )
