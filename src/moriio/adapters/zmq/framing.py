"""Wire framing for the ZMQ control channel: msgpack envelopes with an optional HMAC tag.

A message on the wire is one or two ZMQ frames::

    [payload]          no shared secret configured
    [payload, tag]     tag = HMAC-SHA256(secret, payload), 32 bytes

``payload`` is a msgpack map, the *envelope*::

    {"v": 2, "k": "m" | "q" | "r" | "e", "c": <correlation id>, "f": [host, port] | nil,
     "n": <16 random bytes>, "t": <send time, Unix seconds>, "b": <body>}

``k`` is the kind (one-way message, request, reply, error reply), ``c`` pairs a reply with
its request (0 for one-way messages), ``f`` is the address the sender says it listens on,
``n`` and ``t`` make every envelope unique (with a secret, a :class:`ReplayGuard` refuses
one seen before or sent outside its window), and ``b`` is what the message codec produced
(for an error reply: a short text).

Decoding is defensive: the frame size is checked before anything is parsed, the tag is
verified before the payload is unpacked, and msgpack runs with explicit container and
string limits, so a few bytes declaring a four-billion-element array cannot allocate.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import math
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgpack

from moriio.ports import PeerAddress

WIRE_VERSION: Final = 2
TAG_BYTES: Final = hashlib.sha256().digest_size
MIN_SECRET_BYTES: Final = 16
MAX_CORRELATION_ID: Final = 2**63 - 1
MAX_HOST_CHARS: Final = 255
MAX_ERROR_CHARS: Final = 500
NONCE_BYTES: Final = 16
DEFAULT_REPLAY_WINDOW_S: Final = 120.0
DEFAULT_REPLAY_CAPACITY: Final = 1 << 20


class Reason(enum.StrEnum):
    """Why an inbound frame was dropped; the keys of a channel's ``rejected`` counts."""

    OVERSIZE = "oversize"
    BAD_FRAMES = "bad_frames"
    MISSING_HMAC = "missing_hmac"
    UNEXPECTED_HMAC = "unexpected_hmac"
    BAD_HMAC = "bad_hmac"
    BAD_MSGPACK = "bad_msgpack"
    BAD_ENVELOPE = "bad_envelope"
    INVALID_MESSAGE = "invalid_message"
    INBOX_OVERFLOW = "inbox_overflow"
    UNSERVED_REQUEST = "unserved_request"
    RESPONDER_ERROR = "responder_error"
    UNDELIVERABLE_REPLY = "undeliverable_reply"
    STALE_REPLY = "stale_reply"
    LISTENER_ERROR = "listener_error"
    REPLAYED = "replayed"
    STALE_FRAME = "stale_frame"


class Kind(enum.StrEnum):
    """What an envelope carries."""

    MESSAGE = "m"
    REQUEST = "q"
    REPLY = "r"
    ERROR = "e"


_ENVELOPE_KEYS: Final = frozenset({"v", "k", "c", "f", "n", "t", "b"})
_KINDS: Final = frozenset(kind.value for kind in Kind)


class FrameRejectedError(Exception):
    """An inbound frame failed a check; ``reason`` says which."""

    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """Bounds applied to every inbound frame before and while it is unpacked."""

    max_frame_bytes: int = 1 << 20
    max_str_len: int = 1 << 16
    max_bin_len: int = 1 << 20
    max_array_len: int = 1 << 17
    max_map_len: int = 1 << 12

    def __post_init__(self) -> None:
        for name in ("max_frame_bytes", "max_str_len", "max_bin_len", "max_array_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"FrameLimits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_map_len < 5:
            raise ValueError(f"FrameLimits.max_map_len must be >= 5, got {self.max_map_len}")


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded, structurally valid envelope; ``body`` is not yet validated by a codec."""

    kind: Kind
    correlation: int
    sender: PeerAddress | None
    body: object
    nonce: bytes = b""  # filled in by encode() when empty
    sent_at: float = 0.0  # Unix seconds; encode() stamps the current time when 0


def check_secret(secret: bytes | None) -> bytes | None:
    """Validate a shared secret: ``None`` (no authentication) or at least 16 bytes."""
    if secret is None:
        return None
    if not isinstance(secret, bytes):
        raise TypeError(f"secret must be bytes, got {type(secret).__name__}")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)} bytes"
        )
    return secret


def sign(secret: bytes, payload: bytes) -> bytes:
    """The HMAC-SHA256 tag of ``payload``."""
    return hmac.new(secret, payload, hashlib.sha256).digest()


def encode(envelope: Envelope, secret: bytes | None) -> list[bytes]:
    """The ZMQ frames carrying ``envelope`` (payload, plus a tag when ``secret`` is set)."""
    sender = None if envelope.sender is None else [envelope.sender.host, envelope.sender.port]
    payload = msgpack.packb(
        {
            "v": WIRE_VERSION,
            "k": envelope.kind.value,
            "c": envelope.correlation,
            "f": sender,
            "n": envelope.nonce or os.urandom(NONCE_BYTES),
            "t": envelope.sent_at or time.time(),
            "b": envelope.body,
        },
        use_bin_type=True,
    )
    return [payload] if secret is None else [payload, sign(secret, payload)]


def _reject_ext(code: int, data: bytes) -> object:
    raise ValueError(f"msgpack extension type {code} is not accepted")


def unpack(payload: bytes, limits: FrameLimits) -> object:
    """Unpack one msgpack object within ``limits``; raises :class:`FrameRejectedError`."""
    size = len(payload)
    if size > limits.max_frame_bytes:
        raise FrameRejectedError(Reason.OVERSIZE, f"{size} bytes > {limits.max_frame_bytes}")
    try:
        return msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_reject_ext,
            max_str_len=min(limits.max_str_len, size),
            max_bin_len=min(limits.max_bin_len, size),
            max_array_len=min(limits.max_array_len, size),
            max_map_len=min(limits.max_map_len, size),
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises ValueError, TypeError, StackError, ...
        raise FrameRejectedError(Reason.BAD_MSGPACK, f"{type(exc).__name__}: {exc}") from None


def decode(frames: Sequence[bytes], secret: bytes | None, limits: FrameLimits) -> Envelope:
    """Check size and tag, unpack and validate the envelope of one inbound message.

    ``frames`` excludes any routing identity. Raises :class:`FrameRejectedError`.
    """
    if not frames or len(frames) > 2:
        raise FrameRejectedError(Reason.BAD_FRAMES, f"{len(frames)} frames, expected 1 or 2")
    payload = frames[0]
    if len(payload) > limits.max_frame_bytes:
        raise FrameRejectedError(
            Reason.OVERSIZE, f"{len(payload)} bytes > {limits.max_frame_bytes}"
        )
    if secret is not None:
        if len(frames) != 2:
            raise FrameRejectedError(Reason.MISSING_HMAC, "message carries no HMAC tag")
        if not hmac.compare_digest(sign(secret, payload), frames[1]):
            raise FrameRejectedError(Reason.BAD_HMAC, "HMAC tag does not match")
    elif len(frames) != 1:
        raise FrameRejectedError(Reason.UNEXPECTED_HMAC, "tagged message but no secret configured")
    return parse_envelope(unpack(payload, limits))


def parse_envelope(raw: object) -> Envelope:
    """Validate the envelope fields of an unpacked payload."""
    if not isinstance(raw, dict):
        raise FrameRejectedError(Reason.BAD_ENVELOPE, f"expected a map, got {type(raw).__name__}")
    if raw.keys() != _ENVELOPE_KEYS:
        keys = sorted(map(str, raw))[:8]
        raise FrameRejectedError(
            Reason.BAD_ENVELOPE, f"expected keys v,k,c,f,n,t,b; got {keys!r:.120}"
        )
    version = raw["v"]
    if type(version) is not int or version != WIRE_VERSION:
        raise FrameRejectedError(Reason.BAD_ENVELOPE, f"unsupported wire version {version!r:.40}")
    kind_raw = raw["k"]
    if not isinstance(kind_raw, str) or kind_raw not in _KINDS:
        raise FrameRejectedError(Reason.BAD_ENVELOPE, f"unknown kind {kind_raw!r:.40}")
    kind = Kind(kind_raw)
    correlation = raw["c"]
    if (
        not isinstance(correlation, int)
        or isinstance(correlation, bool)
        or not 0 <= correlation <= MAX_CORRELATION_ID
    ):
        raise FrameRejectedError(Reason.BAD_ENVELOPE, f"bad correlation id {correlation!r:.40}")
    if kind is Kind.ERROR and not (isinstance(raw["b"], str) and len(raw["b"]) <= MAX_ERROR_CHARS):
        raise FrameRejectedError(
            Reason.BAD_ENVELOPE, f"error reply body must be text of <= {MAX_ERROR_CHARS} chars"
        )
    nonce, sent_at = raw["n"], raw["t"]
    if type(nonce) is not bytes or len(nonce) != NONCE_BYTES:
        raise FrameRejectedError(Reason.BAD_ENVELOPE, f"nonce must be {NONCE_BYTES} bytes")
    if type(sent_at) is not float or not math.isfinite(sent_at):
        raise FrameRejectedError(Reason.BAD_ENVELOPE, f"bad send time {sent_at!r:.40}")
    return Envelope(kind, correlation, _parse_sender(raw["f"]), raw["b"], nonce, sent_at)


def _parse_sender(raw: object) -> PeerAddress | None:
    if raw is None:
        return None
    if isinstance(raw, list) and len(raw) == 2:
        host, port = raw
        if (
            isinstance(host, str)
            and 0 < len(host) <= MAX_HOST_CHARS
            and isinstance(port, int)
            and not isinstance(port, bool)
            and 0 < port < 65536
        ):
            return PeerAddress(host, port)
    raise FrameRejectedError(Reason.BAD_ENVELOPE, f"bad sender address {raw!r:.80}")


class ReplayGuard:
    """Refuses authenticated envelopes seen before or sent outside a time window.

    Only meaningful with a shared secret (the tag covers ``n`` and ``t``, so neither can be
    changed). An envelope is accepted once, and only if its send time lies within
    ``window`` seconds of the receiver's clock (this bounds clock skew between hosts, too).
    Nonces are remembered while a copy could still pass the time check; when more than
    ``capacity`` are remembered the oldest is forgotten and envelopes sent before it are
    refused from then on, so memory stays bounded and nothing replays. Used by one thread.
    """

    def __init__(
        self, window: float = DEFAULT_REPLAY_WINDOW_S, capacity: int = DEFAULT_REPLAY_CAPACITY
    ) -> None:
        if not math.isfinite(window) or window <= 0:
            raise ValueError(f"replay window must be a positive number of seconds, got {window}")
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self._window = window
        self._capacity = capacity
        self._seen: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # -> (arrival, t)
        self._floor = -math.inf  # envelopes sent at or before this time are refused

    def __len__(self) -> int:
        return len(self._seen)

    def check(self, envelope: Envelope, now: float) -> None:
        """Record ``envelope``; raise :class:`FrameRejectedError` if it is stale or a replay."""
        self._forget(now)
        sent_at = envelope.sent_at
        if abs(now - sent_at) > self._window or sent_at <= self._floor:
            raise FrameRejectedError(
                Reason.STALE_FRAME,
                f"sent {now - sent_at:+.1f} s from now, outside the {self._window:g} s window",
            )
        if envelope.nonce in self._seen:
            raise FrameRejectedError(Reason.REPLAYED, "envelope nonce seen before")
        self._seen[envelope.nonce] = (now, sent_at)
        if len(self._seen) > self._capacity:
            _, (_, oldest_sent) = self._seen.popitem(last=False)
            self._floor = max(self._floor, oldest_sent)

    def _forget(self, now: float) -> None:
        # A copy passes the time check only until sent_at + window <= arrival + 2 * window.
        seen = self._seen
        while seen:
            arrival, _ = next(iter(seen.values()))
            if now - arrival <= 2 * self._window:
                return
            seen.popitem(last=False)
