"""Composition of one worker from its ports: the one wiring production, tests and simulation share.

:func:`bootstrap` is plain code (no container, no adapter imports): the production container
calls it with the transport's adapters, the test kit with in-memory ones, the simulation with
chaos-wrapped ones, so all three build the same object graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.protocol.messages import Message
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.kv_registry import LayerTensor, LocalKV
from moriio.domain.worker.peers import PeerDirectory
from moriio.domain.worker.poster import Poster
from moriio.domain.worker.producer.write_fences import HostFences
from moriio.domain.worker.service import WorkerService
from moriio.ports import Clock, ControlChannel, FenceSource, LayerGates, TransferEngine


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Who this worker is and where it listens (ports already offset for its rank).

    ``instance_id`` names this incarnation of the worker: it must differ after every restart
    on the same address (peers use it to tell a restarted process from its predecessor).
    """

    engine_name: str
    host: str
    bind_host: str
    handshake_port: int
    notify_port: int
    tp_rank: int
    tp_size: int
    dp_rank: int
    is_producer: bool
    is_consumer: bool
    fingerprint: Fingerprint
    instance_id: str
    pp_rank: int = 0
    pp_size: int = 1


@dataclass(frozen=True, slots=True)
class WorkerPorts:
    """The adapters one worker runs on, already open.

    ``notify`` carries releases, orders and probes (the service drains and sends on it);
    ``handshake`` only answers handshakes. ``wall_clock`` None: ``clock`` is also the wall
    clock (fakes). ``fences``/``bind_device``: the KV's device (host memory by default);
    ``layer_gates``: gates a layerwise READ's forward waits on, on the device (None: none).
    ``background_handshakes``: run handshakes on threads (real channels) or inline (a fake
    clock that only moves when told).
    """

    engine: TransferEngine
    notify: ControlChannel[Message]
    handshake: ControlChannel[Message]
    clock: Clock
    wall_clock: Clock | None = None
    fences: FenceSource = field(default_factory=HostFences)
    bind_device: Callable[[], None] | None = None
    layer_gates: LayerGates | None = None
    background_handshakes: bool = True


@dataclass(frozen=True, slots=True)
class HandshakeTiming:
    """How long a handshake may take, and how soon a refused or failed one is retried."""

    timeout: float
    retry_after: float = 1.0
    max_retry_after: float = 30.0


@dataclass(frozen=True, slots=True)
class Worker:
    """One wired worker: its registered KV, peers, poster, context and service."""

    kv: LocalKV
    peers: PeerDirectory
    poster: Poster
    context: WorkerContext
    service: WorkerService

    def close(self, engine: TransferEngine) -> None:
        """Stop the service, then give the KV's regions back to ``engine`` (before it closes)."""
        self.service.close()
        self.context.kv.deregister(engine)  # the registration of now (a wake makes a new one)


def bootstrap(
    ports: WorkerPorts,
    identity: WorkerIdentity,
    tensors: Sequence[LayerTensor],
    *,
    mode: TransferMode,
    policy: TransferPolicy,
    handshakes: HandshakeTiming,
    poll_interval: float | None = None,
) -> Worker:
    """Register ``tensors`` with the engine and wire the worker's services on ``ports``.

    The peer directory answers handshakes on both channels from here on. ``poll_interval``:
    the service's completion-polling period (None: the service's default).
    """
    kv = LocalKV.register(ports.engine, tensors)
    try:
        control = ports.notify.address
        peers = PeerDirectory(
            engine=ports.engine,
            channel=ports.notify,
            local=kv,
            fingerprint=identity.fingerprint,
            control=control,
            dp_rank=identity.dp_rank,
            tp_rank=identity.tp_rank,
            instance_id=identity.instance_id,
            clock=ports.clock,
            handshake_timeout=handshakes.timeout,
            retry_after=handshakes.retry_after,
            max_retry_after=handshakes.max_retry_after,
            background=ports.background_handshakes,
            suspect_timeout=policy.liveness_timeout,
            # READ hand-offs are signed by the producer's key, which its consumers verify.
            signs_handoffs=mode is TransferMode.READ and identity.is_producer,
            requires_handoff_key=mode is TransferMode.READ and identity.is_consumer,
        )
        ports.notify.serve(peers.respond)
        ports.handshake.serve(peers.respond)
        poster = Poster(ports.engine, ports.clock, policy)
        context = WorkerContext(
            poster=poster,
            channel=ports.notify,
            peers=peers,
            kv=kv,
            clock=ports.clock,
            wall_clock=ports.wall_clock,
            policy=policy,
            tp_rank=identity.tp_rank,
            tp_size=identity.tp_size,
            dp_rank=identity.dp_rank,
            control=control,
            pp_rank=identity.pp_rank,
            pp_size=identity.pp_size,
            fences=ports.fences,
            bind_device=ports.bind_device,
            layer_gates=ports.layer_gates,
        )
        polling = {} if poll_interval is None else {"poll_interval": poll_interval}
        service = WorkerService(
            context,
            mode,
            is_producer=identity.is_producer,
            is_consumer=identity.is_consumer,
            **polling,
        )
    except BaseException:
        kv.deregister(ports.engine)
        raise
    return Worker(kv, peers, poster, context, service)


__all__ = ["HandshakeTiming", "Worker", "WorkerIdentity", "WorkerPorts", "bootstrap"]
