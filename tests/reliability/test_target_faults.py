"""Scrape targets that misbehave, against one real ``batchscope collect`` process.

Twelve Triton look-alikes (``tests/reliability/fault_server.py``) are scraped every
second by one collector: three keep behaving, and each of the nine others turns to one
fault at the same moment and holds it for ``HOLD_S``: a connection that never answers,
an answer at one byte a second, 50 MB, HTML, a truncated exposition, a body cut short,
binary garbage, duplicated series, counters that jump back to zero. Then every target
behaves again. Measured, from the store the collector writes and from outside:

- each failing scrape ends within its timeout (2 s) and the target's state in the
  store says why (``last_error_kind``, ``last_error``);
- the three good targets keep their 1 s interval throughout (their stored scrapes);
- the collector's resident memory stays bounded while the 50 MB and slow targets are
  scraped again and again;
- no negative or spiking rate is stored for the target whose counters went back;
- every faulty target is up again on its own within seconds of behaving.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import requests

from collector.analysis.rates import window_rates
from collector.errors import TargetTimeout
from collector.sources.http_fetch import HttpFetcher
from collector.store import Store
from collector.store.rows import TargetState
from collector.testbed.models import BATCHED_AND_UNBATCHED
from collector.testbed.server import TestbedError, TritonServer
from tests.reliability import fault_server as fs
from tests.reliability.conftest import FaultLedger
from tests.support import running_collector, wait_until

GOOD = ("good-a", "good-b", "good-c")
INTERVAL_S = 1.0
TIMEOUT_S = 2.0
HOLD_S = 6.0
MIB = 1024 * 1024
CAP_BYTES = 16 * MIB  # max_response_bytes: the default
RSS_BOUND_BYTES = 48 * MIB

# What a scrape of each failing fault must end with.
FAILS_AS = {
    fs.HANG: "timeout",
    fs.DRIP: "timeout",
    fs.HUGE: "too_large",
    fs.HTML: "parse",
    fs.TRUNCATED: "parse",
    fs.CUT: "down",
    fs.GARBAGE: "parse",
    fs.DUPLICATED: "parse",
}
FAULT_WORDS = {
    fs.HANG: "target accepts the connection and never answers",
    fs.DRIP: "target answers at 1 byte/s (status line and headers too)",
    fs.HUGE: "target answers 50 MB without a Content-Length",
    fs.HTML: "target answers an HTML page on every path",
    fs.TRUNCATED: "metrics page truncated mid-line",
    fs.CUT: "connection closed halfway through the declared body",
    fs.GARBAGE: "target answers binary garbage",
    fs.DUPLICATED: "every model series of the metrics page twice",
    fs.BACKWARDS: "counters jump back to zero with no outage (a restart look-alike)",
}


@dataclass
class FaultRun:
    """What one run measured."""

    store: Store
    fault_at: float  # Unix time the faults began
    ok_at: float  # ... and ended
    held: dict[str, TargetState]  # each target's state at the end of the hold
    requests: dict[str, int]  # requests each faulty target read during the hold
    recovered_after: dict[str, float]  # s from ok_at to the target's first good scrape
    rss_before: int
    rss_peak: int  # the collector's highest resident memory up to the hold's end
    rss_after: int
    collector_exit: int | None
    log: str
    good_scrapes: dict[str, list[float]] = field(default_factory=dict)  # during the hold


def _scrape_times(store: Store, target: str, since: float, until: float) -> list[float]:
    return sorted(
        {s.collected_at for s in store.model_samples(target=target, since=since, until=until)}
    )


def _peak_rss(pid: int) -> int:
    """The process's resident memory at its highest so far (the kernel's VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


def _states(store: Store) -> dict[str, TargetState]:
    return {t.name: t for t in store.targets()}


def _settings(db_url: str, targets: list[dict[str, str]]) -> dict[str, object]:
    """``batchscope collect`` of ``targets`` every second into the store at ``db_url``."""
    return {
        "targets": targets,
        "db_url": db_url,
        "interval_s": INTERVAL_S,
        "timeout_s": TIMEOUT_S,
        "max_response_bytes": CAP_BYTES,
        "backoff_max_s": INTERVAL_S,
        "jitter_s": 0,
        "duration_s": 300,
        "sources": ["triton"],
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultRun]:
    tmp = tmp_path_factory.mktemp("target-faults")
    names = (*GOOD, *fs.FAULTS)
    db_url = f"sqlite:///{tmp / 'faults.db'}"
    with contextlib.ExitStack() as cleanup:
        server = cleanup.enter_context(fs.FaultServer(names))
        targets = [
            {"name": n, "url": server.url(n), "metrics_url": server.metrics_url(n)} for n in names
        ]
        collect = cleanup.enter_context(running_collector(tmp, settings=_settings(db_url, targets)))
        store = Store(db_url)
        cleanup.callback(store.close)
        started = time.time()
        wait_until(
            lambda: all(len(_scrape_times(store, n, started - 5, time.time())) >= 2 for n in names),
            30,
            "two scrapes of every target",
        )
        collector = psutil.Process(collect.proc.pid)
        rss_before = collector.memory_info().rss

        fault_at = time.time()
        counted = {n: server.requests(n) for n in fs.FAULTS}
        for fault in fs.FAULTS:
            server.set_fault(fault, fault)
        time.sleep(max(0.0, fault_at + HOLD_S - time.time()))
        rss_peak = _peak_rss(collect.proc.pid)  # the most it held, the faults included
        held = _states(store)
        requests = {n: server.requests(n) - counted[n] for n in fs.FAULTS}
        rss_after = collector.memory_info().rss
        good = {n: _scrape_times(store, n, fault_at, fault_at + HOLD_S) for n in GOOD}

        ok_at = time.time()
        for fault in fs.FAULTS:
            server.set_fault(fault, fs.OK)
        recovered: dict[str, float] = {}

        def all_back() -> bool:
            for name in fs.FAULTS:
                if name in recovered:
                    continue
                times = _scrape_times(store, name, ok_at, time.time())
                if times:
                    recovered[name] = times[0] - ok_at
            return len(recovered) == len(fs.FAULTS)

        wait_until(all_back, 20, "every faulty target to be scraped again")
        wait_until(
            lambda: all(_states(store)[n].up for n in fs.FAULTS), 10, "every target up again"
        )
        collector_exit = collect.stop(timeout_s=30)
        yield FaultRun(
            store=store,
            fault_at=fault_at,
            ok_at=ok_at,
            held=held,
            requests=requests,
            recovered_after=recovered,
            rss_before=rss_before,
            rss_peak=rss_peak,
            rss_after=rss_after,
            collector_exit=collector_exit,
            log=collect.log_path.read_text(errors="replace"),
            good_scrapes=good,
        )


def _good_figures(run: FaultRun) -> str:
    counts = [len(t) for t in run.good_scrapes.values()]
    shown = "/".join(map(str, counts))
    return (
        f"{len(GOOD)} other targets kept their {INTERVAL_S:g} s interval "
        f"({shown} scrapes in {HOLD_S:g} s)"
    )


@pytest.mark.parametrize("fault", sorted(FAILS_AS))
def test_a_faulty_target_fails_fast_with_its_reason_and_recovers(
    run: FaultRun, fault: str, fault_ledger: FaultLedger
) -> None:
    state = run.held[fault]
    assert state.up is False, state
    assert state.last_error_kind == FAILS_AS[fault], state
    assert state.last_error and fault_server_port(state) in state.last_error, state
    assert state.consecutive_failures >= 2, state  # retried every interval meanwhile
    # Failed fast: a slow target within its timeout (and scheduling slack), the others at once.
    assert state.last_duration_s is not None
    bound = TIMEOUT_S + 0.5 if FAILS_AS[fault] == "timeout" else 1.0
    assert state.last_duration_s <= bound, state
    assert run.recovered_after[fault] <= TIMEOUT_S + 2 * INTERVAL_S + 1.0, run.recovered_after
    fault_ledger.record(
        area="targets",
        fault=FAULT_WORDS[fault],
        tries=state.consecutive_failures,
        outcome=(
            f"each scrape failed in {state.last_duration_s:.2f} s (timeout {TIMEOUT_S:g} s) with "
            f"'{state.last_error_kind}' recorded on the target ({state.last_error[:90]}...); "
            f"{_good_figures(run)}; scraped again {run.recovered_after[fault]:.1f} s after "
            "it behaved"
        ),
    )


def fault_server_port(state: TargetState) -> str:
    """The target's address, which its recorded error names."""
    assert state.url is not None
    return state.url.removeprefix("http://")


def test_the_other_targets_keep_their_interval(run: FaultRun, fault_ledger: FaultLedger) -> None:
    for name, times in run.good_scrapes.items():
        assert len(times) >= HOLD_S / INTERVAL_S - 1, (name, times)
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert max(gaps) <= 2 * INTERVAL_S, (name, gaps)
        assert run.held[name].up is True and run.held[name].consecutive_failures == 0
    gaps = [
        b - a for times in run.good_scrapes.values() for a, b in zip(times, times[1:], strict=False)
    ]
    assert run.collector_exit == 0, run.log[-3000:]
    fault_ledger.record(
        area="targets",
        fault=f"{len(fs.FAULTS)} faulty targets at once beside {len(GOOD)} good ones",
        tries=1,
        outcome=(
            f"{_good_figures(run)}; largest gap between two scrapes of a good target "
            f"{max(gaps):.2f} s; collector exited {run.collector_exit} at SIGTERM"
        ),
    )


def test_memory_stays_bounded(run: FaultRun, fault_ledger: FaultLedger) -> None:
    growth = run.rss_after - run.rss_before
    peak = run.rss_peak - run.rss_before
    assert peak <= RSS_BOUND_BYTES, (run.rss_before, run.rss_peak, run.rss_after)
    assert growth <= RSS_BOUND_BYTES, (run.rss_before, run.rss_peak, run.rss_after)
    huge = run.held[fs.HUGE].consecutive_failures
    slow = run.held[fs.HANG].consecutive_failures + run.held[fs.DRIP].consecutive_failures
    fault_ledger.record(
        area="targets",
        fault="memory of the collector while a 50 MB target and two slow targets are scraped",
        tries=huge + slow,
        outcome=(
            f"collector RSS {run.rss_before / MIB:.0f} MiB before, peak (VmHWM) "
            f"{run.rss_peak / MIB:.0f} MiB (+{peak / MIB:.0f}), {run.rss_after / MIB:.0f} MiB "
            f"after {huge} scrapes of the 50 MB target (cap {CAP_BYTES // MIB} MiB) and "
            f"{slow} of the slow ones: growth under the stated bound of "
            f"{RSS_BOUND_BYTES // MIB} MiB"
        ),
    )


def test_counters_going_back_store_no_negative_or_spiking_rate(
    run: FaultRun, fault_ledger: FaultLedger
) -> None:
    name = fs.BACKWARDS
    assert run.held[name].up is True and run.held[name].consecutive_failures == 0
    samples = run.store.model_samples(target=name)
    before = [s for s in samples if s.collected_at < run.fault_at and s.rates is not None]
    after = [s for s in samples if s.collected_at >= run.fault_at and s.rates is not None]
    assert before and len(after) >= HOLD_S / INTERVAL_S - 1
    usual = max(s.rates.requests_per_s for s in before if s.rates is not None)
    assert usual > 0
    for s in after:
        r = s.rates
        assert r is not None
        for value in (r.requests_per_s, r.inferences_per_s, r.executions_per_s, r.fail_per_s):
            assert value >= 0, (s.model, s.collected_at, r)
        assert r.requests_per_s <= usual * 1.5, (s.model, s.collected_at, r, usual)
    models = sorted({s.model for s in samples})
    resets = sum(s.rates.resets for s in after if s.rates is not None)
    assert resets >= len(models), [s.rates for s in after]  # each model's jump, once
    # The window across the jump, through the analysis' own reader.
    across = [window_rates([s for s in samples if s.model == m]) for m in models]
    assert all(w is not None and 0 <= w.requests_per_s <= usual * 1.5 for w in across), across
    peak = max(s.rates.requests_per_s for s in after if s.rates is not None)
    windows = ", ".join(f"{w.requests_per_s:.0f}" for w in across if w is not None)
    fault_ledger.record(
        area="targets",
        fault=FAULT_WORDS[name],
        tries=len({s.collected_at for s in after}),
        outcome=(
            f"{resets} reset(s) counted; stored rates after the jump between "
            f"{min(s.rates.requests_per_s for s in after if s.rates is not None):.0f} and "
            f"{peak:.0f} req/s against {usual:.0f} req/s before (no negative, none above "
            f"1.5x); window rates across it {windows} req/s; target stayed up"
        ),
    )


# --------------------------------------------------------------------------- a real Triton


@pytest.mark.long
def test_a_real_triton_paused_resumed_killed_and_restarted_mid_collection(
    tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    """The CPU testbed's Triton beside two good look-alikes in one collector: SIGSTOP
    (it holds every connection and answers nothing), SIGCONT, SIGKILL, and a start
    again on the same ports."""
    pause_s, outage_s = 5.0, 4.0
    # Triton exits within 3 s at the end, not waiting out a collector's idle connection.
    triton = TritonServer(BATCHED_AND_UNBATCHED[:1], workdir=tmp_path / "triton", exit_timeout_s=3)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(_close_triton, triton)
        triton.start()
        good = cleanup.enter_context(fs.FaultServer(GOOD[:2]))
        targets = [
            {"name": "triton", "url": triton.http_url, "metrics_url": triton.metrics_url},
            *(
                {"name": n, "url": good.url(n), "metrics_url": good.metrics_url(n)}
                for n in GOOD[:2]
            ),
        ]
        db_url = f"sqlite:///{tmp_path / 'faults.db'}"
        collect = cleanup.enter_context(
            running_collector(tmp_path, settings=_settings(db_url, targets))
        )
        store = Store(db_url)
        try:
            began = time.time()
            wait_until(
                lambda: len(_scrape_times(store, "triton", began - 5, time.time())) >= 2,
                30,
                "two scrapes of the Triton",
            )

            # Paused: connections are accepted by the kernel, nothing answers.
            paused_at = time.time()
            os.kill(triton.pid, signal.SIGSTOP)
            try:
                wait_until(
                    lambda: _states(store)["triton"].last_error_kind == "timeout",
                    TIMEOUT_S + 5,
                    "the paused Triton's timeout",
                )
                time.sleep(max(0.0, paused_at + pause_s - time.time()))
                paused = _states(store)["triton"]
            finally:
                os.kill(triton.pid, signal.SIGCONT)
            resumed_at = time.time()
            wait_until(
                lambda: bool(_scrape_times(store, "triton", resumed_at, time.time())),
                TIMEOUT_S + 10,
                "a scrape of the resumed Triton",
            )
            resumed_after = _scrape_times(store, "triton", resumed_at, time.time())[0] - resumed_at
            good_paused = [len(_scrape_times(store, n, paused_at, resumed_at)) for n in GOOD[:2]]
            assert paused.up is False and paused.last_duration_s is not None
            assert paused.last_duration_s <= TIMEOUT_S + 0.5, paused
            assert paused.last_error and "timed out" in paused.last_error, paused
            assert min(good_paused) >= (resumed_at - paused_at) / INTERVAL_S - 1.5, good_paused

            # Killed, then started again on the same ports.
            killed_at = time.time()
            triton.kill()
            wait_until(
                lambda: _states(store)["triton"].last_error_kind == "down",
                TIMEOUT_S + 5,
                "the killed Triton down",
            )
            down = _states(store)["triton"]
            time.sleep(max(0.0, killed_at + outage_s - time.time()))
            triton.start()
            restarted_at = time.time()
            wait_until(
                lambda: bool(_scrape_times(store, "triton", restarted_at, time.time())),
                TIMEOUT_S + 10,
                "a scrape of the restarted Triton",
            )
            back_after = _scrape_times(store, "triton", restarted_at, time.time())[0] - restarted_at
            good_out = [len(_scrape_times(store, n, killed_at, restarted_at)) for n in GOOD[:2]]
            assert down.up is False and down.last_duration_s is not None
            assert down.last_duration_s <= 1.0, down
            assert min(good_out) >= (restarted_at - killed_at) / INTERVAL_S - 1.5, good_out
            wait_until(lambda: bool(_states(store)["triton"].up), 10, "the Triton up again")
            # No load ran: every stored rate is zero or near it, across both outages.
            rates = [s.rates for s in store.model_samples(target="triton") if s.rates]
            assert rates
            for r in rates:
                for value in (r.requests_per_s, r.inferences_per_s, r.executions_per_s):
                    assert 0 <= value <= 5, r
            assert collect.proc.poll() is None, collect.log()
        finally:
            store.close()
            collect.stop()
    assert collect.proc.returncode == 0, collect.log()
    fault_ledger.record(
        area="targets",
        fault="real Triton paused with SIGSTOP mid-collection, then SIGCONT",
        tries=1,
        outcome=(
            f"scrapes failed in {paused.last_duration_s:.2f} s with 'timeout' "
            f"(timeout {TIMEOUT_S:g} s) over {pause_s:g} s; 2 other targets kept their "
            f"{INTERVAL_S:g} s interval ({'/'.join(map(str, good_paused))} scrapes); scraped "
            f"again {resumed_after:.1f} s after SIGCONT"
        ),
    )
    fault_ledger.record(
        area="targets",
        fault="real Triton killed (SIGKILL) mid-collection, then started again",
        tries=1,
        outcome=(
            f"scrapes failed in {down.last_duration_s:.2f} s with 'down'; 2 other targets kept "
            f"their interval ({'/'.join(map(str, good_out))} scrapes in "
            f"{restarted_at - killed_at:.1f} s of outage and restart); scraped again "
            f"{back_after:.1f} s after the server was ready; {len(rates)} stored rates all "
            "between 0 and 5 req/s (no load ran)"
        ),
    )


def _close_triton(triton: TritonServer) -> None:
    """Stop the server (resumed first: a stopped process cannot exit on SIGTERM) and
    fail when any of its processes survived."""
    with contextlib.suppress(ProcessLookupError, TestbedError):
        os.kill(triton.pid, signal.SIGCONT)
    triton.close()
    survivors = triton.leftover_processes()
    for p in survivors:
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert not survivors, f"processes left after stop: {[p.pid for p in survivors]}"


# --------------------------------------------------------------------------- one fetch


@pytest.mark.parametrize("with_session", [False, True], ids=["libcurl", "requests-session"])
def test_dripped_headers_end_at_the_deadline_on_either_path(
    with_session: bool, fault_ledger: FaultLedger
) -> None:
    """A GET that a target answers a byte a second ends at its deadline, whether it goes
    through libcurl (scrapes) or a ``requests`` session (``batchscope apply``)."""
    timeout_s = 0.5
    with fs.FaultServer(["drip"]) as server:
        server.set_fault("drip", fs.DRIP)
        fetcher = HttpFetcher(
            timeout_s=timeout_s,
            max_response_bytes=MIB,
            session=requests.Session() if with_session else None,
        )
        started = time.monotonic()
        try:
            with pytest.raises(TargetTimeout) as caught:
                fetcher.get(server.metrics_url("drip"), "target 'drip'")
        finally:
            fetcher.close()
        took = time.monotonic() - started
    assert took <= timeout_s + 0.3, took
    path = "a requests session" if with_session else "libcurl"
    fault_ledger.record(
        area="targets",
        fault=f"status line and headers dripped at 1 byte/s, one GET through {path}",
        tries=1,
        outcome=f"TargetTimeout after {took:.2f} s (timeout {timeout_s:g} s): {caught.value}",
    )
