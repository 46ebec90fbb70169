"""The stand-in's RDMA backend: queue pairs, posting, mori's completion thread, async events.

As read from mori 1.2.x (``src/io/rdma/{backend_impl,common}.cpp``) and the 1.2.4 wheel:

* Queue pairs are kept per remote engine *key* and never pruned. A post reserves send-queue
  room per chain: a full queue waits up to ``MORI_IO_SQ_BACKOFF_TIMEOUT_US`` (the interpreter
  lock released), then fails the status synchronously after earlier chains were posted.
* Completions come from mori's own thread (the CQ poller), not from ``Code()``. An error
  completion puts the QP into ERROR and flushes every later WR on it; a ``RETRY_EXC`` also
  records ``PEER_UNREACHABLE`` for ``pop_peer_failure()``. A completion stores the code under
  the status's lock and calls ``notify_all()`` *after* releasing it: the notify is modelled
  one pass later, and one that finds the status freed counts in ``dangling_writes``.
* A fatal async event (``MORI_IO_FAIL_ON_ASYNC_EVENT``, default on) fails the in-flight work
  of the endpoints it covers and retires them: later posts are rejected, ``alive()`` is False,
  and the event is queued for ``pop_peer_failure()``. A degraded endpoint (orphaned WRs after
  a partial post) rejects submissions until they are released.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mori import stand_in
from mori.cpp import (
    MemoryDesc,
    PeerFailureEvent,
    PeerFailureReason,
    RdmaBackendConfig,
    StatusCode,
    TransferStatus,
)
from mori.io import batch
from mori.io.env import override, parse_positive_int, send_queue_depth

if TYPE_CHECKING:
    from mori.io.engine import IOEngine

RETRY_EXC = (
    "transport retry counter exceeded (RETRY_EXC) Hint: check that the peer is alive and "
    "MORI_IB_GID_INDEX"
)
RETIRED = "endpoint retired by a fatal async event"
REJECTED = "endpoint was failed by a fatal verbs async event; submission rejected"
DEGRADED = "EP is degraded, rejecting new submissions"
_EVENTS = {
    PeerFailureReason.LOCAL_QP_ERROR: "IBV_EVENT_QP_FATAL",
    PeerFailureReason.LOCAL_PORT_DOWN: "IBV_EVENT_PORT_ERR",
    PeerFailureReason.LOCAL_DEVICE_FATAL: "IBV_EVENT_DEVICE_FATAL",
    PeerFailureReason.LOCAL_CQ_ERROR: "IBV_EVENT_CQ_ERR",
}
_QPNS = itertools.count(0x100)


@dataclass(eq=False)
class Endpoint:
    """One RC queue pair, connected to whatever engine answered when it was built."""

    target: IOEngine
    peer: str
    depth: int  # send-queue depth
    qpn: int = field(default_factory=lambda: next(_QPNS))
    outstanding: int = 0
    error: str | None = None  # in ERROR after an error completion: later WRs are flushed
    retired: bool = False  # failed by a fatal async event
    unreachable: bool = False  # PEER_UNREACHABLE was recorded for it
    dead_port: bool = False  # built while the port was down
    degraded: int = 0  # completion passes until its orphaned WRs are released

    def alive(self) -> bool:
        """``PeerFailureTracker::IsQpAlive``: no failure covering it was observed."""
        return not (self.retired or self.unreachable or self.dead_port)


@dataclass(eq=False)
class Meta:
    """mori's CqCallbackMeta: a raw pointer to the status plus the completion count."""

    status: weakref.ref[TransferStatus]
    total: int  # bytes
    done: int = 0


@dataclass(eq=False)
class Chain:
    endpoint: Endpoint
    meta: Meta
    op: str
    local: MemoryDesc
    remote: MemoryDesc
    pieces: list[batch.Piece]
    polls: int
    fail: str | None
    remote_mr: tuple[int, int]  # (data, size) the cached remote key was issued for


@dataclass
class _Queue:
    """What the completion thread shares with the backend (never the backend itself)."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    chains: list[Chain] = field(default_factory=list)
    notify: list[weakref.ref[TransferStatus]] = field(default_factory=list)
    stopped: bool = False


class RdmaBackend:
    def __init__(self, engine: IOEngine, config: RdmaBackendConfig) -> None:
        self._engine = weakref.ref(engine)
        self.control = engine.stand_in
        self.config = config
        self.depth = send_queue_depth(config, stand_in.DEVICE.max_qp_wr)
        self.endpoints: dict[str, list[Endpoint]] = {}  # remote key -> QPs, never pruned
        self.remote_mrs: dict[tuple[str, int], tuple[int, int]] = {}  # never pruned
        self.failures: deque[PeerFailureEvent] = deque()
        self._queue = _Queue()
        self._thread: threading.Thread | None = None
        weakref.finalize(self, _stop, self._queue)

    # -- set-up ------------------------------------------------------------------------------

    def connect(self, peer: Any, wanted: int, dial: Any) -> list[Endpoint]:
        """``BuildRdmaConn`` until ``wanted`` QPs to ``peer`` exist: TCP connect + exchange."""
        eps = self.endpoints.setdefault(peer.key, [])
        while len(eps) < wanted:
            target = dial(peer)
            eps.append(Endpoint(target, peer.key, self.depth, dead_port=not stand_in.PORT_UP))
            self.control.qps_built += 1
        return eps[:wanted]

    # -- faults ------------------------------------------------------------------------------

    def fatal_event(self, reason_name: str, peer: str | None) -> None:
        reason = PeerFailureReason[reason_name]
        port_scope = reason in (
            PeerFailureReason.LOCAL_PORT_DOWN,
            PeerFailureReason.LOCAL_DEVICE_FATAL,
        )
        hit = [
            ep
            for key, eps in self.endpoints.items()
            for ep in eps
            if (port_scope or key == peer) and not ep.retired
        ]
        event = _EVENTS.get(reason, "IBV_EVENT_QP_FATAL")
        with self._queue.cond:
            for ep in hit:
                ep.retired = True
            doomed = [c for c in self._queue.chains if c.endpoint.retired]
            self._queue.chains = [c for c in self._queue.chains if not c.endpoint.retired]
        for chain in doomed:
            chain.endpoint.outstanding -= len(chain.pieces)
            self._write(chain.meta, StatusCode.ERR_RDMA_OP, f"{RETIRED} ({event})")
        self.control.warnings.append(
            f"async event {event}: failed {len(doomed)} in-flight transfer(s) across "
            f"{len(hit)} endpoint(s); endpoints marked degraded and will reject new "
            "submissions until rebuilt"
        )
        keys = [""] if port_scope else sorted({ep.peer for ep in hit})
        for key in keys:
            qpn = 0 if port_scope or not hit else hit[0].qpn
            self.failures.append(
                PeerFailureEvent(
                    key, reason, qpn, 1, stand_in.DEVICE.name, f"verbs async event {event}"
                )
            )

    def degrade(self, peer: str, passes: int) -> None:
        for ep in self.endpoints.get(peer, []):
            ep.degraded = passes
        self._wake()

    def pop_failure(self) -> PeerFailureEvent | None:
        return self.failures.popleft() if self.failures else None

    # -- posting -----------------------------------------------------------------------------

    def submit(
        self,
        status: TransferStatus,
        op: str,
        session: Any,
        descriptors: list[batch.Piece],
        uid: int,
    ) -> None:
        """Post a validated, non-empty batch; failures land in ``status`` synchronously."""
        config = self.config
        eps: list[Endpoint] = session._endpoints
        local_gpu = int(session._local.loc) == 2
        chunking = bool(config.enable_transfer_chunking)
        executor = (
            config.num_worker_threads > 1
            and config.num_nics_per_transfer == 1
            and (not chunking or local_gpu)
        )
        meta = Meta(weakref.ref(status), sum(n for _, _, n in descriptors))
        status.store(StatusCode.IN_PROGRESS, "")
        if executor:  # each worker merges and posts its share on its own QP, in parallel
            parts = [
                (descriptors[b:e], [eps[(i + uid) % len(eps)]])
                for i, (b, e) in enumerate(
                    batch.worker_splits(len(descriptors), len(eps), config.num_worker_threads)
                )
            ]
        else:
            parts = [(descriptors, eps)]
        first_error: tuple[StatusCode, str] | None = None
        for part, part_eps in parts:
            error = self._post(meta, op, session, part, part_eps, uid, chunking)
            first_error = first_error or error
        if first_error is not None:
            self._write(meta, *first_error, notify=False)

    def _post(
        self,
        meta: Meta,
        op: str,
        session: Any,
        descriptors: list[batch.Piece],
        eps: list[Endpoint],
        uid: int,
        chunking: bool,
    ) -> tuple[StatusCode, str] | None:
        config, device, control = self.config, stand_in.DEVICE, self.control
        wrs = batch.merge(descriptors, device.max_sge)
        if chunking:
            wrs = batch.chunk(
                wrs, config.chunk_bytes, config.max_chunks_per_transfer, device.max_msg_sz
            )
        elif (refusal := batch.too_long(wrs, device.max_msg_sz)) is not None:
            return StatusCode.ERR_INVALID_ARGS, refusal
        control.work_requests.append(len(wrs))
        chains = batch.chains(wrs, len(eps), config.post_batch_size, self.depth)
        for index, chain in enumerate(chains):
            ep_index = (index + uid) % len(eps)
            ep = eps[ep_index]
            refusal = self._admit(ep, ep_index, len(chain), index, len(chains))
            if refusal is not None:
                return StatusCode.ERR_RDMA_OP, refusal
            fail = None
            if control.fail_next > 0:
                control.fail_next -= 1
                fail = control.fail_message
            pieces = [p for wr in chain for p in wr.pieces]
            with self._queue.cond:
                ep.outstanding += len(pieces)
                self._queue.chains.append(
                    Chain(
                        ep,
                        meta,
                        op,
                        session._local,
                        session._remote,
                        pieces,
                        control.polls_to_complete,
                        fail,
                        session._remote_mr,
                    )
                )
                self._queue.cond.notify_all()
        self._start()
        return None

    def _admit(
        self, ep: Endpoint, ep_index: int, wanted: int, index: int, count: int
    ) -> str | None:
        """``TryReserveSqDepth``: why this chain cannot be posted, or None once room is held."""
        control = self.control
        if ep.retired:
            return REJECTED
        if ep.degraded:
            return DEGRADED
        if wanted > ep.depth:
            return (
                f"SQ request exceeds capacity (batch): ep={ep_index} requested={wanted} "
                f"max={ep.depth}"
            )
        injected = control.sq_full_burst > 0 and index == min(control.sq_full_chain, count - 1)
        if injected:
            control.sq_full_burst -= 1
            if control.sq_gate is not None:
                control.sq_gate.wait()  # the back-off releases the interpreter lock
            return _sq_full(ep_index, ep.outstanding, wanted, ep.depth, self.config)
        backoff_us = override("MORI_IO_SQ_BACKOFF_TIMEOUT_US", 5_000_000, parse_positive_int)
        deadline = time.monotonic() + backoff_us / 1e6
        with self._queue.cond:
            while ep.outstanding + wanted > ep.depth:
                left = deadline - time.monotonic()
                if left <= 0:
                    return _sq_full(ep_index, ep.outstanding, wanted, ep.depth, self.config)
                self._queue.cond.wait(left)
        return None

    # -- completions -------------------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=_poll_cq,
                args=(weakref.ref(self), self._queue),
                daemon=True,
                name="mori-stand-in-cq",
            )
            self._thread.start()

    def _wake(self) -> None:
        with self._queue.cond:
            self._queue.cond.notify_all()
        self._start()

    def one_pass(self) -> None:
        """One pass of mori's CQ poller over every posted chain."""
        queue = self._queue
        with queue.cond:
            notify, queue.notify = queue.notify, []
        self.control.dangling_writes += sum(1 for ref in notify if ref() is None)
        self.control.notified += len(notify)
        for eps in self.endpoints.values():
            for ep in eps:
                if ep.degraded > 0:
                    ep.degraded -= 1
                    if not ep.degraded:
                        self.control.warnings.append(
                            f"ProcessOneCqe: recovered degraded EP qpn={ep.qpn} by releasing "
                            "orphaned WRs"
                        )
        if self.control.hold:
            return
        with queue.cond:
            ready = [c for c in queue.chains if c.polls <= 0]
            for chain in queue.chains:
                chain.polls -= 1
            queue.chains = [c for c in queue.chains if c not in ready]
        for chain in ready:
            self._complete(chain)
        with queue.cond:
            queue.cond.notify_all()  # room in the send queues

    def busy(self) -> bool:
        queue = self._queue
        return bool(queue.chains or queue.notify) or any(
            ep.degraded for eps in self.endpoints.values() for ep in eps
        )

    def _complete(self, chain: Chain) -> None:
        ep, engine = chain.endpoint, self._engine()
        with self._queue.cond:
            ep.outstanding -= len(chain.pieces)
        error = ep.error and "work request flushed in error (WR_FLUSH_ERR)"
        target = ep.target
        if error is None and (ep.dead_port or not stand_in.alive(target)):
            error = RETRY_EXC
        if error is None and chain.fail is not None:
            error = chain.fail
        if error is None and (engine is None or engine._memory.get(chain.local.id) != chain.local):
            error = "local protection error (LOC_PROT_ERR)"
        mine = target._memory.get(chain.remote.id)
        if error is None and (mine is None or (mine.data, mine.size) != chain.remote_mr):
            error = "remote access error (REM_ACCESS_ERR)"
        if error is not None:
            if error == RETRY_EXC and not ep.unreachable:
                ep.unreachable = True
                self.failures.append(
                    PeerFailureEvent(
                        ep.peer,
                        PeerFailureReason.PEER_UNREACHABLE,
                        ep.qpn,
                        1,
                        stand_in.DEVICE.name,
                        "IBV_WC_RETRY_EXC_ERR",
                    )
                )
            ep.error = ep.error or error
            self._write(chain.meta, StatusCode.ERR_RDMA_OP, error)
            return
        for lo, ro, n in chain.pieces:
            if chain.op == "read":
                ctypes.memmove(chain.local.data + lo, chain.remote.data + ro, n)
            else:
                ctypes.memmove(chain.remote.data + ro, chain.local.data + lo, n)
        chain.meta.done += sum(n for _, _, n in chain.pieces)
        if chain.meta.done == chain.meta.total:
            self._write(chain.meta, StatusCode.SUCCESS, "")

    def _write(self, meta: Meta, code: StatusCode, message: str, *, notify: bool = True) -> None:
        """``TransferStatus::Update`` through mori's raw pointer: store, then notify later."""
        status = meta.status()
        if status is None:
            self.control.dangling_writes += 1  # a use-after-free in real mori
            return
        status.store(code, message)
        if notify:
            with self._queue.cond:
                self._queue.notify.append(weakref.ref(status))
        del status

    def stop(self) -> None:
        _stop(self._queue)


def _stop(queue: _Queue) -> None:
    with queue.cond:
        queue.stopped = True
        queue.cond.notify_all()


def _poll_cq(backend_ref: weakref.ref[RdmaBackend], queue: _Queue) -> None:
    """mori's CQ poller: a pass every 0.5 ms while work is posted (every 5 ms while the test
    holds completions back), asleep otherwise. Real mori spins; the stand-in leaves the
    interpreter lock to the test's threads."""
    while True:
        with queue.cond:
            while not queue.stopped:
                backend = backend_ref()
                if backend is None:
                    return
                if backend.busy():
                    break
                del backend
                queue.cond.wait(0.05)
            if queue.stopped:
                return
        backend.one_pass()
        held = backend.control.hold
        del backend
        time.sleep(0.005 if held else 0.0005)


def _sq_full(ep: int, depth: int, requested: int, limit: int, config: RdmaBackendConfig) -> str:
    backoff = os.environ.get("MORI_IO_SQ_BACKOFF_TIMEOUT_US") or "5000000"
    return (
        f"SQ full (batch): ep={ep} depth={depth} requested={requested} max={limit} "
        "Hint: if completions should drain soon, try a larger MORI_IO_SQ_BACKOFF_TIMEOUT_US "
        f"(current {backoff} us); otherwise try increasing MORI_IO_QP_MAX_SEND_WR, reducing "
        f"RdmaBackendConfig::postBatchSize (current effective value {config.post_batch_size}), "
        f"or increasing RdmaBackendConfig::qpPerTransfer (current {config.qp_per_transfer}). "
        f"Current per-QP send WR limit is {limit}."
    )
