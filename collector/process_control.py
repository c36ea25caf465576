"""What batchscope starts dies with it; its long-running commands stop on SIGINT and SIGTERM.

Two pieces, used by the testbed server and the commands that run until stopped:

* :func:`die_with_parent` gives ``subprocess.Popen`` a ``preexec_fn`` that asks Linux to
  SIGKILL the child when batchscope dies, however it dies (a SIGKILL included, which no
  handler of ours can see).  A normal stop still signals the child's process group
  itself; this is the net for the abnormal one.
* :func:`stop_on_signals` turns SIGINT and SIGTERM into a :class:`threading.Event`, so
  a command stops the same orderly way on Ctrl-C, ``kill``, ``docker stop`` or systemd,
  also when started in the background, where the shell has it ignore SIGINT.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any, TextIO

__all__ = ["die_with_parent", "stop_on_signals"]

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _libc_function(name: str) -> Callable[..., int] | None:
    """The C library's function ``name``, looked up now (a forked child must not load
    anything); None off Linux or where this C library lacks it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function: Callable[..., int] = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    return function


_PRCTL = _libc_function("prctl")


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` after which the child is SIGKILLed when this process dies.

    ``None`` where that cannot be had (not Linux), and when called off the main thread:
    Linux sends the signal when the *thread* that started the child ends, and a worker
    thread may end long before the process does.  Without it the caller's process-group
    stop is what remains.  The setting survives ``exec`` (not for set-user-ID programs).
    """
    prctl = _PRCTL
    if prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()
    death_signal = int(signal.SIGKILL)

    def set_parent_death_signal() -> None:
        # Runs in the forked child before exec: nothing here may take a lock.
        prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
        # Should the parent have died before prctl took effect, the child has already
        # been handed to another parent and would never get the signal.
        if os.getppid() != parent:
            os._exit(1)

    return set_parent_death_signal


@contextlib.contextmanager
def stop_on_signals(
    stop: threading.Event | None = None,
    signals: Sequence[signal.Signals] = (signal.SIGINT, signal.SIGTERM),
) -> Iterator[threading.Event]:
    """Within the block, ``signals`` set ``stop`` (a new event when none is given).

    Handlers can only be installed on the main thread; elsewhere the event is returned
    and nothing else changes.  The previous handlers come back on exit.  Do the cleanup
    inside the block: a signal arriving during it then only sets the event again
    instead of cutting the cleanup short and leaving processes or folders behind.
    A SIGINT that the shell had ignored (a background job) is handled too: stopping is
    what a user sending it wants.
    """
    event = stop if stop is not None else threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        event.set()

    previous: dict[signal.Signals, Any] = {s: signal.signal(s, on_signal) for s in signals}
    try:
        yield event
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def dump_stacks_on_sigusr1() -> None:
    """``kill -USR1 <pid>`` prints every thread's stack to stderr, and the command goes
    on: what a command that does not stop, or a stalled collector, is doing.

    faulthandler writes to a file descriptor from the signal handler; a stderr without
    one (captured in-process) falls back to the process's own, else nothing is set.
    """
    stream = _stream_with_a_descriptor(sys.stderr, sys.__stderr__)
    if stream is not None and hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True)


def _stream_with_a_descriptor(*streams: TextIO | None) -> TextIO | None:
    for stream in streams:
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return None


# A scrape allocates thousands of short-lived objects (records, rows) and keeps large
# long-lived ones (per-target parser caches): at the default threshold of 700 the
# young generation is collected several times a scrape and the whole heap often,
# about a sixth of a collector's CPU on a 20-target fleet. The objects that die are
# acyclic and freed by reference counting; collecting rarely costs little memory.
SERVICE_GC_THRESHOLDS = (20_000, 50, 100)
# With those thresholds the oldest generation is almost never collected, yet some
# reads leave cycles behind (SQLAlchemy statements, each a few KB): a full collection
# once a minute, a few tens of ms, keeps them from piling up over days.
FULL_COLLECTION_EVERY_S = 60.0
# glibc's malloc gives each thread that allocates an arena of its own (up to 8 per
# core); a service's pool, server and job threads then each keep a fragmented heap,
# and RSS crept up about 1.5 MiB a minute in a 15-minute soak of serve while Python's
# live memory (tracemalloc) stayed flat. Two arenas, as MALLOC_ARENA_MAX=2 gives
# (unless that variable is set), and the free pages handed back to the system after
# each full collection.
SERVICE_MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # from <malloc.h>
# Python's own thresholds, which ``untune_gc`` puts back.
_DEFAULT_GC_THRESHOLDS = gc.get_threshold()
_sweeper: threading.Thread | None = None
_sweeper_stop = threading.Event()


# glibc's; None on another C library.
_MALLOPT = _libc_function("mallopt")
_MALLOC_TRIM = _libc_function("malloc_trim")


def _collect_fully_forever(stop: threading.Event) -> None:
    while not stop.wait(FULL_COLLECTION_EVERY_S):
        gc.collect()
        if _MALLOC_TRIM is not None:
            _MALLOC_TRIM(0)


def tune_gc_for_service() -> None:
    """Collect cyclic garbage rarely, as a long-running collector or server should,
    and all of it once a minute (a daemon thread), handing freed memory back; cap
    glibc's malloc arenas (before the service's threads start)."""
    global _sweeper
    gc.set_threshold(*SERVICE_GC_THRESHOLDS)
    if _MALLOPT is not None and "MALLOC_ARENA_MAX" not in os.environ:
        _MALLOPT(_M_ARENA_MAX, SERVICE_MALLOC_ARENAS)
    if _sweeper is None:
        _sweeper_stop.clear()
        _sweeper = threading.Thread(
            target=_collect_fully_forever, args=(_sweeper_stop,), name="gc-sweep", daemon=True
        )
        _sweeper.start()


def untune_gc() -> None:
    """Undo ``tune_gc_for_service``'s collection settings: Python's thresholds, and no
    full collection once a minute. For a process that ran a command in-process and
    goes on with other work (the test suite), whose timings the sweeper's pauses would
    otherwise disturb."""
    global _sweeper
    gc.set_threshold(*_DEFAULT_GC_THRESHOLDS)
    if _sweeper is not None:
        _sweeper_stop.set()
        _sweeper.join(timeout=5.0)
        _sweeper = None
