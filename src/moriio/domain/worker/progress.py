"""Worker progress that does not depend on the engine stepping.

An engine stops calling the connector's hooks when it has nothing to schedule, yet its
peer may still be waiting on it: a READ to serve (a polled transport moves only when
driven), a deferred WRITE to post, a ``release`` or ``write_done`` to take in, a deadline to
expire. :class:`WorkerProgress` runs :meth:`WorkerService.pump` from its own thread:

* while transfers are live, every ``busy_interval`` seconds;
* otherwise it blocks on the control channel for up to ``idle_wait`` seconds and handles
  whatever arrives at once.

Every hook and the thread take :attr:`WorkerProgress.lock`, so the service is only ever
driven by one thread at a time. What the thread observes (finished sends, landed loads,
load errors) accumulates in the services and is reported to vLLM at its next step, as
vLLM's connector contract requires. An exception inside the loop is logged and counted; the
thread keeps running. The thread binds the worker's device (``ctx.bind_device``) before it
touches the transfer engine; the handshake threads never touch the engine (they only ask
peers over the control channel, and the answers are applied here).
"""

from __future__ import annotations

import threading

from moriio.domain.worker.service import WorkerService
from moriio.log import get_logger

log = get_logger("moriio.worker")

DEFAULT_BUSY_INTERVAL = 0.001
DEFAULT_IDLE_WAIT = 0.05


class WorkerProgress:
    """A daemon thread that pumps one :class:`WorkerService`."""

    def __init__(
        self,
        service: WorkerService,
        *,
        busy_interval: float = DEFAULT_BUSY_INTERVAL,
        idle_wait: float = DEFAULT_IDLE_WAIT,
    ) -> None:
        if not busy_interval > 0 or not idle_wait > 0:
            raise ValueError(
                f"busy_interval and idle_wait must be > 0, got {busy_interval}, {idle_wait}"
            )
        self.lock = threading.RLock()
        # Set once a round leaves something for the next step's report; the step that takes
        # the report clears it under the lock (see WorkerSide.finish_step).
        self.news = threading.Event()
        self._service = service
        self._log = log.bind(worker=str(service.ctx.control), tp_rank=service.ctx.tp_rank)
        self._busy_interval = busy_interval
        self._idle_wait = idle_wait
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="moriio-progress", daemon=True)
        self.pumps = 0
        self.errors = 0

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for it (bounded by ``timeout``)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        bind_device = self._service.ctx.bind_device
        if bind_device is not None:
            # First, before any engine call: handshakes it settles (peers, regions) and the
            # posts it makes must use the rank's device, not device 0.
            bind_device()
        while not self._stop.is_set():
            try:
                busy = self._pump()
                if busy:
                    self._stop.wait(self._busy_interval)
                else:
                    self._wait_for_messages()
            except Exception:  # one bad round must not end progress for good
                self.errors += 1
                self._log.exception("worker progress round failed; continuing")
                self._stop.wait(self._idle_wait)

    def _pump(self) -> bool:
        with self.lock:
            self._service.pump()
            self.pumps += 1
            self._tell_news()
            return self._service.needs_progress()

    def _tell_news(self) -> None:
        if self._service.has_news():
            self.news.set()

    def _wait_for_messages(self) -> None:
        clock = self._service.ctx.clock
        started = clock.now()
        inbound = self._service.ctx.channel.drain(self._idle_wait)
        if inbound:
            with self.lock:
                self._service.dispatch(inbound)
                self._tell_news()
            return
        left = self._idle_wait - (clock.now() - started)
        if left > 0:  # a channel whose drain does not block
            self._stop.wait(left)
