"""The mori adapter's connection builder: one thread of its own that builds sessions.

mori's set-up calls hold the interpreter lock for their whole run (their bindings have no
``gil_scoped_release``): ``CreateSession`` dials the peer's control plane and exchanges queue
pairs (each socket call bounded by ``MORI_IO_CP_TIMEOUT_MS``, 5 s by default) and registers
memory with the NIC; building a lane runs the ``IOEngine`` constructor and ``CreateBackend``.
Whichever Python thread makes such a call stops every other one meanwhile, so none of them runs
on the thread that asks for the connection: not in ``import_region`` (a handshake applied by
the worker, under its lock) nor in ``post`` (the forward thread). They run here, holding no
lock of the adapter's or the worker's, one at a time; a batch posted before its connection
exists waits (IN_PROGRESS, nothing posted) and is posted from here once it does.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable

from moriio.adapters.mori.connections import SessionKey
from moriio.log import get_logger

_log = get_logger("moriio.adapters.mori.engine")

Build = Callable[[SessionKey], None]
"""Builds one session (and posts what waits for it); must not raise."""


class Connector:
    """Runs ``build(key)`` for each requested session key on its own thread, in order.

    ``build`` is a method of the adapter, held weakly: an adapter dropped without ``close()``
    is collected, and its finalizer ends this thread.
    """

    def __init__(self, build: Build, name: str) -> None:
        self._build = weakref.WeakMethod(build)
        self._name = name
        self._cond = threading.Condition()
        self._queue: list[SessionKey] = []
        self._running: SessionKey | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self.builds = 0  # sessions built or failed so far

    def request(self, keys: Iterable[SessionKey]) -> None:
        """Build each of ``keys`` not queued or running already (the thread starts on first
        use and sleeps while nothing is asked)."""
        with self._cond:
            if self._closed:
                return
            for key in keys:
                if key != self._running and key not in self._queue:
                    self._queue.append(key)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"moriio-mori-connect-{self._name}", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def pending(self) -> set[SessionKey]:
        """Keys queued or being built."""
        with self._cond:
            running = set() if self._running is None else {self._running}
            return set(self._queue) | running

    def forget(self, doomed: Callable[[SessionKey], bool]) -> None:
        """Drop queued keys ``doomed`` selects (one being built finishes)."""
        with self._cond:
            self._queue = [k for k in self._queue if not doomed(k)]

    def wait_idle(self, timeout: float) -> bool:
        """Block until nothing is queued or running (tests); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and self._running is None, timeout)

    def close(self) -> None:
        """Stop after the build running now; queued keys are dropped."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._running = None
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
                key = self._running = self._queue.pop(0)
            build = self._build()
            if build is None:  # the adapter is gone
                return
            try:
                build(key)
            except Exception:  # a build reports its own failures; this keeps the thread alive
                _log.exception("mori: building a connection failed unexpectedly", key=str(key))
            del build
            self.builds += 1
