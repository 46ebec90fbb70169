"""Typed control-plane messages between producer and consumer ranks.

Messages are plain frozen values. They are validated when decoded from the wire (see
:mod:`moriio.domain.protocol.codec`), against the limits defined here; code that builds them
locally is trusted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from moriio.domain.params.handoff_tags import PromptBinding
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.protocol.handshake import LayerRegions
from moriio.ports import PeerAddress

# 2: ``remote_blocks`` carries ``write_by`` and the consumer's capability ``token``, which
# ``write_done``/``write_failed`` echo. 3: the fingerprint carries the engine's page order,
# cache dtype, backend, platform, groups and per-layer facts; layers carry their block
# stride. 4: liveness probes (``probe``/``probe_reply``). 5: handshakes carry the
# registration ``generation`` and ``spans`` (the whole allocations the layers' regions lie
# in), each layer its span and offset, and a reply the engine's hand-off key;
# ``remote_blocks`` carries the consumer's generation and the prompt binding; ``retired`` /
# ``retired_ack`` tell peers a registration is given back (sleep mode). Peers of
# another version are refused at the handshake.
PROTOCOL_VERSION = 5

# Wire limits: anything beyond them is rejected as out of range.
MAX_STR_LEN = 4096  # any text field, in characters
MAX_HOST_LEN = 255
MAX_KIND_LEN = 64  # one layout kind name in a fingerprint
MAX_GROUP_LEN = 512  # one KV-cache group's description in a fingerprint
MAX_BLOCK_IDS = 1 << 20  # block ids in one message
MAX_BLOCK_ID = (1 << 40) - 1  # block ids, block counts, block lengths
MAX_TP_SIZE = 1024
MAX_DP_SIZE = 1 << 16
MAX_PORT = 65535
MAX_LAYERS = 1 << 14
MAX_DESCRIPTORS_PER_LAYER = 64
MAX_SPANS = 64  # whole allocations named in one handshake
MAX_SPAN_OFFSET = (1 << 62) - 1  # a layer region's byte offset in its span
MAX_DESCRIPTOR_BYTES = 1 << 16
MAX_ENGINE_METADATA_BYTES = 1 << 24
MAX_BLOCK_SIZE = 1 << 20  # tokens per block
MAX_KV_HEADS = 1 << 16
MAX_TOKEN_LEN = 128  # a transfer capability token
MAX_WALL_TIME = 4102444800.0  # 2100-01-01 UTC: later wall-clock times are refused
MAX_PROBE_CLAIMS = 1 << 14  # transfers one liveness probe may name
MAX_HANDOFF_KEY_BYTES = 64  # a hand-off signing key (moriio draws 32 bytes)
MAX_PROMPT_BINDING_BYTES = 1024  # a prompt binding's value
MAX_PROMPT_TOKENS = (1 << 32) - 1
# Instance ids: transfer_params.MAX_INSTANCE_ID_LEN (kv_transfer_params share it).


@dataclass(frozen=True, slots=True)
class RemoteBlocks:
    """WRITE mode, consumer -> each producer rank: where to write a transfer's KV.

    ``block_ids`` are the consumer's destination blocks (empty: nothing to write, the
    producer only releases). ``reply_to`` is the control address of the consumer rank that
    owns those blocks: ``write_done``/``write_failed`` go there, and it is also where that
    rank answers handshakes. ``request_id`` is the consumer's own id, for logs only.
    ``first_block``: index, in the producer's block list, of the block written into
    ``block_ids[0]`` (the consumer's leading blocks were local prefix-cache hits).
    ``consumer_instance_id``: the instance of the consumer rank that owns ``block_ids``; the
    producer writes only into that instance (a restarted consumer is another instance).
    ``write_by``: the write-by lease, wall-clock seconds on the consumer's host. The producer
    posts no write at or after it (less its clock-skew allowance) and answers ``write_failed``
    instead; the consumer keeps the blocks until it, plus one transfer timeout and its
    allowance, has passed, unless a verdict arrived first.
    ``token``: the transfer's capability, minted by the consumer (whose memory is written):
    the producer echoes it in the verdict and in nothing else, and the consumer accepts only
    verdicts that carry it. The producer binds a transfer to its first announcement.
    ``consumer_generation``: the registration generation ``block_ids`` belong to (see
    :class:`Retired`; 0: not stated); the producer writes only into that generation.
    verdicts that carry it. The producer binds a transfer to its first announcement whose
    ``prompt`` matches the binding of the prompt it computed; one that does not match is
    refused with ``write_failed`` and binds nothing (None: the consumer has no binding).
    """

    transfer_id: str
    request_id: str
    block_ids: tuple[int, ...]
    first_block: int
    consumer_dp_rank: int
    consumer_tp_rank: int
    consumer_tp_size: int
    reply_to: PeerAddress
    consumer_instance_id: str
    write_by: float
    token: str = ""
    consumer_generation: int = 0
    prompt: PromptBinding | None = None


@dataclass(frozen=True, slots=True)
class WriteDone:
    """WRITE mode, producer -> consumer: every sealed write of the transfer succeeded.

    ``token``: the capability of the announcement the writes followed (see RemoteBlocks).
    """

    transfer_id: str
    token: str = ""


@dataclass(frozen=True, slots=True)
class WriteFailed:
    """WRITE mode, producer -> consumer: the transfer failed; its blocks hold no valid KV.

    ``token``: the capability of the announcement it answers ("" when none arrived).
    """

    transfer_id: str
    reason: str
    token: str = ""


@dataclass(frozen=True, slots=True)
class Release:
    """Consumer -> producer: the consumer is done with the producer's blocks.

    One per consumer rank that releases this producer rank; ``consumer_tp_size`` sets the
    fan-in (see :func:`moriio.domain.kv.tp.expected_ack_count`) and the producer counts each
    ``consumer_tp_rank`` once. A consumer that aborts a request before any rank transferred
    sends it with ``consumer_tp_size=1``. ``token``: the transfer's capability, minted by the
    producer and handed out only in the transfer's ``kv_transfer_params``; a producer that
    minted one frees blocks only for a release that carries it. In WRITE mode it is the
    consumer's capability of the announcement (see RemoteBlocks).
    """

    transfer_id: str
    consumer_tp_size: int = 1
    consumer_tp_rank: int = 0
    token: str = ""


@dataclass(frozen=True, slots=True)
class HandshakeRequest:
    """Request for a peer's engine metadata and regions, carrying our own.

    ``control`` is where this rank's control channel listens; ``engine_metadata`` is what
    the peer passes to its transfer engine's ``add_peer``. ``instance_id`` names this
    process's incarnation: it differs after every restart on the same address.
    ``generation``: the registration generation of ``layers`` (1 at start, one more after
    every wake from sleep mode, see :class:`Retired`). ``spans``: region descriptors of the
    whole allocations layers lie in (see :class:`LayerRegions`).
    """

    fingerprint: Fingerprint
    engine_metadata: bytes
    layers: tuple[LayerRegions, ...]
    control: PeerAddress
    dp_rank: int
    tp_rank: int
    instance_id: str
    generation: int = 1
    spans: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class HandshakeReply:
    """Answer to a compatible :class:`HandshakeRequest`: the responder's own details.

    ``handoff_key``: the key the responder's engine signs its READ hand-offs with, for the
    asker to verify them (empty: it signs none). Only handshake replies carry it, and with a
    shared secret only to holders of the secret.
    """

    fingerprint: Fingerprint
    engine_metadata: bytes
    layers: tuple[LayerRegions, ...]
    control: PeerAddress
    dp_rank: int
    tp_rank: int
    instance_id: str
    generation: int = 1
    spans: tuple[bytes, ...] = ()
    handoff_key: bytes = b""


@dataclass(frozen=True, slots=True)
class HandshakeRejected:
    """Answer to an incompatible :class:`HandshakeRequest`; ``reason`` names the fields."""

    reason: str


@dataclass(frozen=True, slots=True)
class Probe:
    """Liveness request, consumer -> each producer rank it awaits, while transfers are live.

    ``claims``: ``(transfer_id, token)`` of the sender's live transfers with the receiver,
    each with the transfer's capability. The producer binds them to the sender (``control``,
    ``instance_id``) and gives them up once the sender's probes stop (see
    :mod:`moriio.domain.worker.liveness`); a claim without the capability is ignored.
    """

    instance_id: str
    control: PeerAddress
    claims: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ProbeReply:
    """Answer to a :class:`Probe`: the instance that answers at the address now."""

    instance_id: str


@dataclass(frozen=True, slots=True)
class Retired:
    """A worker going to sleep -> every peer that handshaked with it: registration
    ``generation`` of instance ``instance_id`` is retired, its KV memory is about to be
    released. The peer drops its connection (its in-flight transfers with the worker fail),
    refuses transfers of that generation, and answers :class:`RetiredAck` to ``control``
    once none of its batches with the worker can still move a byte."""

    instance_id: str
    generation: int
    control: PeerAddress


@dataclass(frozen=True, slots=True)
class RetiredAck:
    """Answer to :class:`Retired`: the peer at ``control`` no longer touches registration
    ``generation`` of instance ``instance_id``."""

    instance_id: str
    generation: int
    control: PeerAddress


Message: TypeAlias = (
    RemoteBlocks
    | WriteDone
    | WriteFailed
    | Release
    | HandshakeRequest
    | HandshakeReply
    | HandshakeRejected
    | Probe
    | ProbeReply
    | Retired
    | RetiredAck
)
