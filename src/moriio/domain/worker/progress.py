"""Worker progress that does not depend on the engine stepping.

An engine stops calling the connector's hooks when it has nothing to schedule, yet its
peer may still be waiting on it: a READ to serve (a polled transport moves only when
driven), a deferred WRITE to post, a ``release`` or ``write_done`` to take in, a deadline to
expire. :class:`WorkerProgress` runs :meth:`WorkerService.pump` from its own thread, and
between pumps waits as long as what is live allows, so that it costs the engine nothing
while nothing moves:

* while something advances only when polled (batches on the transport, device fences, reads
  waiting for a handshake: :meth:`WorkerService.needs_polling`), every ``busy_interval``
  seconds;
* while transfers are live that wait for a peer's message or a deadline (a hand-off held
  until its release, a push until its destination arrives), it blocks on the control channel
  for up to ``idle_wait`` seconds (deadlines are seconds long) and pumps as soon as a message
  arrives;
* while nothing is live, it blocks on the control channel until a message arrives (at most
  ``idle_block`` seconds, a safety net: nothing is due then).

The engine's hooks call :meth:`WorkerProgress.nudge` after a step made work live: when the
thread waits longer than that work allows, it is woken at once (:meth:`ControlChannel.wake
<moriio.ports.ControlChannel.wake>`).

Every hook and the thread take :attr:`WorkerProgress.lock`, so the service is only ever
driven by one thread at a time. What the thread observes (finished sends, landed loads,
load errors) accumulates in the services and is reported to vLLM at its next step, as
vLLM's connector contract requires. An exception inside the loop is logged and counted; the
thread keeps running. The thread binds the worker's device (``ctx.bind_device``) before it
touches the transfer engine; the handshake threads never touch the engine (they only ask
peers over the control channel, and the answers are applied here).
"""

from __future__ import annotations

import enum
import threading

from moriio.domain.worker.service import WorkerService
from moriio.log import get_logger

log = get_logger("moriio.worker")

DEFAULT_BUSY_INTERVAL = 0.001
DEFAULT_IDLE_WAIT = 0.05
DEFAULT_IDLE_BLOCK = 10.0


class Need(enum.IntEnum):
    """How soon the service must be pumped again (higher: sooner)."""

    NOTHING = 0  # nothing live: the next message
    MESSAGE = 1  # live work waits for a message or a deadline
    POLL = 2  # live work moves only when polled


def need_of(service: WorkerService) -> Need:
    if service.needs_polling():
        return Need.POLL
    return Need.MESSAGE if service.needs_progress() else Need.NOTHING


class WorkerProgress:
    """A daemon thread that pumps one :class:`WorkerService`."""

    def __init__(
        self,
        service: WorkerService,
        *,
        busy_interval: float = DEFAULT_BUSY_INTERVAL,
        idle_wait: float = DEFAULT_IDLE_WAIT,
        idle_block: float = DEFAULT_IDLE_BLOCK,
    ) -> None:
        if not busy_interval > 0 or not idle_wait > 0 or not idle_block > 0:
            raise ValueError(
                "busy_interval, idle_wait and idle_block must be > 0, got "
                f"{busy_interval}, {idle_wait}, {idle_block}"
            )
        self.lock = threading.RLock()
        # Set once a round leaves something for the next step's report; the step that takes
        # the report clears it under the lock (see WorkerSide.finish_step).
        self.news = threading.Event()
        self._service = service
        self._log = log.bind(worker=str(service.ctx.control), tp_rank=service.ctx.tp_rank)
        self._busy_interval = busy_interval
        self._idle_wait = idle_wait
        self._idle_block = idle_block
        self._stop = threading.Event()
        self._woken = threading.Event()  # ends a wait that is not on the channel
        self._waiting: Need | None = None  # what the thread waits for (set under the lock)
        self._thread = threading.Thread(target=self._run, name="moriio-progress", daemon=True)
        self.pumps = 0
        self.errors = 0
        self.wakes = 0

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for it (bounded by ``timeout``)."""
        self._stop.set()
        self._wake()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def nudge(self) -> None:
        """The caller (holding :attr:`lock`) made work live: wake the thread if it waits
        longer than that work allows."""
        waiting = self._waiting
        if waiting is not None and waiting < Need.POLL and need_of(self._service) > waiting:
            self._waiting = None
            self.wakes += 1
            self._wake()

    def _wake(self) -> None:
        self._woken.set()
        self._service.ctx.channel.wake()

    def _run(self) -> None:
        bind_device = self._service.ctx.bind_device
        if bind_device is not None:
            # First, before any engine call: handshakes it settles (peers, regions) and the
            # posts it makes must use the rank's device, not device 0.
            bind_device()
        while not self._stop.is_set():
            try:
                need = self._pump()
                if need is Need.POLL:
                    self._woken.wait(self._busy_interval)
                    self._woken.clear()
                else:
                    bound = self._idle_wait if need is Need.MESSAGE else self._idle_block
                    self._wait_for_messages(bound)
            except Exception:  # one bad round must not end progress for good
                self.errors += 1
                self._log.exception("worker progress round failed; continuing")
                self._stop.wait(self._idle_wait)

    def _pump(self) -> Need:
        with self.lock:
            self._service.pump()
            self.pumps += 1
            self._tell_news()
            self._waiting = need = need_of(self._service)
            return need

    def _tell_news(self) -> None:
        if self._service.has_news():
            self.news.set()

    def _wait_for_messages(self, bound: float) -> None:
        clock = self._service.ctx.clock
        started = clock.now()
        inbound = self._service.ctx.channel.drain(bound)
        if inbound:
            with self.lock:
                self._service.dispatch(inbound)
                self._tell_news()
            return
        left = bound - (clock.now() - started)
        if left > 0 and not self._stop.is_set():  # a channel whose drain does not block
            self._woken.wait(left)
        self._woken.clear()
