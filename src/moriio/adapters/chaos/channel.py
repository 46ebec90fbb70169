"""A ControlChannel wrapper that injects seeded faults into any channel.

One-way messages are faulted on the receiving side, in :meth:`ChaosControlChannel.drain`:
dropped, duplicated, overtaken by later messages, or held back for clock time (possibly past
every deadline that waits for them). Requests (handshakes) are faulted on the requesting
side: lost (the caller waits its whole timeout, as it would for a dead peer) or answered
late. Every random choice comes from the caller's ``random.Random``; the held messages are
bounded by ``plan.max_held`` (overflow drops the oldest, counted in :attr:`overflow`).
Targeted drops (:meth:`ChaosControlChannel.drop_next`) lose this channel's own next outgoing
messages or requests, of one message type if asked: a test loses exactly the message it names.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from random import Random
from typing import TYPE_CHECKING, Any, Generic

from moriio.adapters.chaos.plans import ChannelFault, ChannelFaultPlan
from moriio.ports import Clock, ControlChannel, Inbound, PeerAddress, RequestTimeoutError
from moriio.ports.control_channel import MsgT

_REORDER_MAX_DRAINS = 3
HELD_WAIT_S = 0.01  # the longest a drain waits on the inner channel while messages are held


@dataclass(slots=True)
class _Held(Generic[MsgT]):
    inbound: Inbound[MsgT]
    due: float  # clock time before which it is not delivered
    drains: int  # drain calls it still sits out (reordering)


class ChaosControlChannel(Generic[MsgT]):
    """Wraps ``inner`` and injects the faults of ``plan``; counts them in :attr:`injected`."""

    def __init__(
        self, inner: ControlChannel[MsgT], rng: Random, plan: ChannelFaultPlan, clock: Clock
    ) -> None:
        self._inner = inner
        self._rng = rng
        self._plan = plan
        self._clock = clock
        self._lock = threading.Lock()
        self._held: list[_Held[MsgT]] = []
        self._drop_next: list[type[Any] | None] = []
        self._injected: Counter[str] = Counter()
        self.overflow = 0
        """Held messages dropped because more than ``plan.max_held`` were held."""

    # -- knobs -------------------------------------------------------------------------------

    @property
    def inner(self) -> ControlChannel[MsgT]:
        return self._inner

    @property
    def plan(self) -> ChannelFaultPlan:
        return self._plan

    @plan.setter
    def plan(self, plan: ChannelFaultPlan) -> None:
        with self._lock:
            self._plan = plan

    def drop_next(self, count: int, kind: type[Any] | None = None) -> None:
        """Lose the next ``count`` outgoing messages or requests (of type ``kind`` only, when
        given: background traffic such as liveness probes does not use them up)."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        with self._lock:
            self._drop_next.extend([kind] * count)

    @property
    def injected(self) -> Mapping[str, int]:
        """Faults injected so far, by :class:`ChannelFault` name."""
        with self._lock:
            return dict(self._injected)

    @property
    def num_held(self) -> int:
        """Messages received and held back (delayed or reordered)."""
        with self._lock:
            return len(self._held)

    @property
    def listener_alive(self) -> bool:
        """The inner channel's listener state (True for channels without a listener)."""
        alive = getattr(self._inner, "listener_alive", True)
        return bool(alive)

    # -- ControlChannel ------------------------------------------------------------------------

    @property
    def address(self) -> PeerAddress:
        return self._inner.address

    def serve(self, responder: Callable[[MsgT], MsgT]) -> None:
        self._inner.serve(responder)

    def trust(self, host: str) -> None:
        self._inner.trust(host)

    def send(self, peer: PeerAddress, message: MsgT) -> None:
        """Send through the inner channel, unless a targeted drop takes ``message``."""
        with self._lock:
            if self._take_targeted_drop(message):
                self._injected[ChannelFault.DROPPED] += 1
                return
        self._inner.send(peer, message)

    def is_listening(self, peer: PeerAddress, timeout: float) -> bool | None:
        return self._inner.is_listening(peer, timeout)

    def request(self, peer: PeerAddress, message: MsgT, timeout: float) -> MsgT:
        """Ask ``peer``; a lost request waits ``timeout`` and raises RequestTimeoutError."""
        with self._lock:
            plan = self._plan
            delay = 0.0
            targeted = self._take_targeted_drop(message)
            r = 0.0 if targeted else self._rng.random()
            if r < plan.request_drop or targeted:
                self._injected[ChannelFault.REQUEST_DROPPED] += 1
                delay = timeout
            elif r < plan.request_drop + plan.request_delay:
                self._injected[ChannelFault.REQUEST_DELAYED] += 1
                delay = min(self._rng.uniform(0.0, plan.delay_max), timeout)
        if delay >= timeout:
            self._clock.sleep(timeout)
            raise RequestTimeoutError(f"no reply from {peer} within {timeout:g} s (injected)")
        if delay > 0:
            self._clock.sleep(delay)
        return self._inner.request(peer, message, timeout - delay)

    def drain(self, timeout: float = 0.0) -> list[Inbound[MsgT]]:
        """Due messages in arrival order, after faults; waits only when nothing is due, and
        while messages are held at most :data:`HELD_WAIT_S` (they fall due meanwhile)."""
        with self._lock:
            held = bool(self._held)
            ready = held and self._any_due(self._clock.now())
        wait = 0.0 if ready else min(timeout, HELD_WAIT_S) if held else timeout
        arrived = self._inner.drain(wait)
        if not arrived and not self._held:
            return []
        with self._lock:
            now = self._clock.now()
            for inbound in arrived:
                self._admit(inbound, now)
            return self._release(now)

    def wake(self) -> None:
        self._inner.wake()

    def close(self) -> None:
        """Close the inner channel; held messages are lost with it."""
        with self._lock:
            self._held.clear()
        self._inner.close()

    # -- internals -----------------------------------------------------------------------------

    def _take_targeted_drop(self, message: MsgT) -> bool:
        """Use up the first targeted drop that matches ``message`` (``_lock`` held)."""
        for i, kind in enumerate(self._drop_next):
            if kind is None or isinstance(message, kind):
                del self._drop_next[i]
                return True
        return False

    def _any_due(self, now: float) -> bool:
        return any(h.due <= now and h.drains == 0 for h in self._held)

    def _admit(self, inbound: Inbound[MsgT], now: float) -> None:
        plan = self._plan
        r = self._rng.random()
        if r < plan.drop:
            self._injected[ChannelFault.DROPPED] += 1
            return
        r -= plan.drop
        if r < plan.duplicate:
            self._injected[ChannelFault.DUPLICATED] += 1
            self._hold(_Held(inbound, now, 0))
            self._hold(_Held(inbound, now, 0))
            return
        r -= plan.duplicate
        if r < plan.reorder:
            self._injected[ChannelFault.REORDERED] += 1
            self._hold(_Held(inbound, now, self._rng.randint(1, _REORDER_MAX_DRAINS)))
            return
        r -= plan.reorder
        if r < plan.delay:
            self._injected[ChannelFault.DELAYED] += 1
            self._hold(_Held(inbound, now + self._rng.uniform(0.0, plan.delay_max), 0))
            return
        self._hold(_Held(inbound, now, 0))

    def _hold(self, held: _Held[MsgT]) -> None:
        self._held.append(held)
        if len(self._held) > self._plan.max_held:
            del self._held[0]
            self.overflow += 1

    def _release(self, now: float) -> list[Inbound[MsgT]]:
        out: list[Inbound[MsgT]] = []
        kept: list[_Held[MsgT]] = []
        for held in self._held:
            if held.drains > 0:
                held.drains -= 1
                kept.append(held)
            elif held.due <= now:
                out.append(held.inbound)
            else:
                kept.append(held)
        self._held = kept
        return out


if TYPE_CHECKING:

    def _conforms(channel: ChaosControlChannel[str]) -> ControlChannel[str]:
        return channel
