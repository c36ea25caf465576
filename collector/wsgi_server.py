"""A waitress server on a thread of its own, stopped cleanly from any thread.

``waitress.create_server(...).run()`` polls its sockets until one of them is closed
under it: closing the server from another thread while the loop polls raised in the
loop (``EBADF``), and connections left open kept the loop alive. Here the loop runs a
pass at a time, checks a stop flag between passes, and closes every socket and the
task threads from its own thread.
"""

from __future__ import annotations

import threading
from typing import Any

import waitress
from waitress import wasyncore

__all__ = ["BackgroundWsgiServer"]

_POLL_S = 0.1  # how long a stop waits at most for the loop to notice it


class BackgroundWsgiServer:
    """Serves ``app`` on ``host``:``port`` (0: any free port) with ``threads`` worker
    threads; ``options`` go to waitress (``ident``, proxy headers, …)."""

    def __init__(
        self,
        app: Any,
        *,
        host: str,
        port: int,
        threads: int,
        name: str,
        **options: Any,
    ) -> None:
        self._sockets: dict[int, Any] = {}
        self._server = waitress.create_server(
            app, host=host, port=port, threads=threads, map=self._sockets, **options
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    @property
    def port(self) -> int:
        """The port it listens on (the one picked when asked for 0)."""
        return int(self._server.effective_port)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        use_poll = self._server.adj.asyncore_use_poll
        try:
            while not self._stop.is_set():
                wasyncore.loop(timeout=_POLL_S, map=self._sockets, use_poll=use_poll, count=1)
        finally:
            self._server.task_dispatcher.shutdown(timeout=5)
            wasyncore.close_all(self._sockets)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and wait (at most ``timeout_s``) until every socket is closed."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)
        else:  # never started: close what create_server opened
            wasyncore.close_all(self._sockets)
