"""What every worker-side service shares: identity, ports, time, policy and counters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from moriio.domain.protocol.messages import Message
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.worker.kv_registry import LocalKV
from moriio.domain.worker.peers import PeerDirectory
from moriio.domain.worker.poster import Poster
from moriio.domain.worker.producer.write_fences import HostFences
from moriio.log import get_logger
from moriio.ports import (
    Clock,
    ControlChannel,
    ControlChannelError,
    FenceSource,
    LayerGates,
    PeerAddress,
)

log = get_logger("moriio.worker")


@dataclass(slots=True)
class WorkerCounters:
    """Monotonic counters of notable events (stats and metrics read them)."""

    transfers_started: int = 0
    transfers_succeeded: int = 0
    transfers_failed: int = 0
    transfers_expired: int = 0
    lease_refusals: int = 0
    messages_refused: int = 0  # sends refused (untrusted host, closed channel)
    messages_ignored: int = 0  # inbound messages for unknown or finished transfers
    releases_refused: int = 0  # releases without the transfer's token (forged or stale)
    # WRITE: verdicts without the consumer's capability for the transfer, and announcements
    # whose capability differs from the one the transfer is bound to (forged or replayed).
    verdicts_refused: int = 0
    announcements_refused: int = 0
    # Hand-offs refused before anything moved: a READ consumer's unsigned, forged or
    # replayed-for-another-prompt params; a WRITE producer's announcement for another prompt.
    handoffs_refused: int = 0
    early_blocks_evicted: int = 0
    # WRITE announcements refused, or writes stopped, because their write-by lease passed.
    late_announcements: int = 0
    # Blocks kept from reuse because bytes may still land in them: a READ whose batch timed
    # out or failed unsettled, a WRITE whose batch did (producer), or a WRITE without a
    # verdict fenced until its lease, in-flight and quarantine times passed (consumer).
    quarantined_blocks: int = 0
    # WRITE consumer: verdicts that came after the fence gave the blocks back (batches the
    # engine reported terminal after their timeout are counted by the poster).
    late_completions: int = 0
    failures_by_kind: dict[str, int] = field(default_factory=dict)
    # Seconds from a load's start (read order, or write expectation) to its success.
    load_seconds: list[float] = field(default_factory=list)

    def failed(self, kind: str) -> None:
        self.failures_by_kind[kind] = self.failures_by_kind.get(kind, 0) + 1

    def take_load_seconds(self) -> tuple[float, ...]:
        """The load durations recorded since the previous take."""
        taken, self.load_seconds = tuple(self.load_seconds), []
        return taken


@dataclass(slots=True)
class WorkerContext:
    poster: Poster
    channel: ControlChannel[Message]
    peers: PeerDirectory
    kv: LocalKV
    clock: Clock
    policy: TransferPolicy
    tp_rank: int
    tp_size: int
    dp_rank: int
    control: PeerAddress
    counters: WorkerCounters = field(default_factory=WorkerCounters)
    # Wall-clock seconds (leases between hosts are wall-clock times); None: ``clock`` is
    # also the wall clock (fakes and simulations).
    wall_clock: Clock | None = None
    # Pipeline stage of this worker (ports are offset by it; peers pair stage by stage).
    pp_rank: int = 0
    pp_size: int = 1
    # Fences on the device streams that compute the KV (WRITE producers post after them).
    fences: FenceSource = field(default_factory=HostFences)
    # Binds a thread to the KV's device before it touches the engine (None: host memory).
    bind_device: Callable[[], None] | None = None
    # Gates a layerwise READ's forward waits on, on the device's stream (None: the forward
    # thread waits for each layer instead).
    layer_gates: LayerGates | None = None

    def wall_now(self) -> float:
        """This host's wall-clock time, in seconds."""
        return (self.wall_clock or self.clock).now()

    def send(self, to: PeerAddress, message: Message, what: str) -> bool:
        """Send without raising: a refused send is logged and counted, never silent."""
        try:
            self.channel.send(to, message)
        except ControlChannelError as exc:
            self.counters.messages_refused += 1
            log.warning("control message refused", what=what, peer=str(to), reason=str(exc))
            return False
        return True
