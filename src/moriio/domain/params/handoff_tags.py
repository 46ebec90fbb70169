"""Signed hand-offs: a READ prefill's tags over everything that gives a hand-off's KV its
meaning.

A prefill engine draws a key at start-up (:func:`new_handoff_key`), gives it to decode engines
only in its handshake replies, and signs every hand-off it returns: the transfer id, its engine
and instance id, the lease end, every group's block ids, how many prompt tokens the KV covers
and a binding of those tokens (:class:`PromptBinding`). The signature takes the place of the
release token in ``remote_engine_id``, which routers copy:
``<engine id>#<check>.<lease ms>.<tokens>.<scheme>.<tag>``.

Two tags make a refusal precise: ``check`` covers the transfer's values (and is the transfer's
release token: unguessable without the key), ``tag`` those and the prompt binding, so a
genuine hand-off replayed for another prompt is told apart from a forged one.

A decode's scheduler puts what the params say into a :class:`HandoffCheck`, with its own
request's binding; its worker verifies it with the key it learned in the handshake before it
reads anything (:func:`verify`: the block ids are encoded there, off the scheduler's path).

Tags are keyed BLAKE2b (RFC 7693, a MAC), 128 bits, both from one hashing pass: the prefill
signs on its scheduler's hot path (:class:`HandoffSigner`).
"""

from __future__ import annotations

import enum
import hashlib
import re
import secrets
from array import array
from collections.abc import Sequence
from typing import Any, NamedTuple

from moriio.domain.values.capability import is_token

HANDOFF_KEY_BYTES = 32
TAG_BYTES = 16
_PERSON = b"moriio-handoff/1"  # BLAKE2b personalisation: these tags and nothing else
MAX_SCHEME_LEN = 48
MAX_SIGNATURE_LEN = 32 + 1 + 16 + 1 + 10 + 1 + MAX_SCHEME_LEN + 1 + 32
"""The longest ``<check>.<lease ms>.<tokens>.<scheme>.<tag>``."""
_SIGNED = re.compile(
    rf"([0-9a-f]{{32}})\.([0-9]{{1,16}})\.([0-9]{{1,10}})\.([a-z0-9_-]{{1,{MAX_SCHEME_LEN}}})"
    r"\.([0-9a-f]{32})"
)
_SCHEME = re.compile(rf"[a-z0-9_-]{{1,{MAX_SCHEME_LEN}}}")


def new_handoff_key() -> bytes:
    """A fresh signing key from the OS's secure generator (one per prefill engine start)."""
    return secrets.token_bytes(HANDOFF_KEY_BYTES)


class PromptBinding(NamedTuple):
    """A prompt's first ``num_tokens`` tokens (and whatever else gives their KV its meaning),
    bound as ``scheme`` says: two engines compare bindings of one scheme only.

    ``value`` is empty when the request cannot be bound that way (shorter than
    ``num_tokens``, content the scheme cannot cover): it then neither hands off nor loads.
    """

    scheme: str
    num_tokens: int
    value: bytes

    def matches(self, other: PromptBinding | None) -> bool:
        """Whether ``other`` binds the same tokens (an empty binding matches nothing)."""
        return (
            other is not None
            and bool(self.value)
            and self.scheme == other.scheme
            and self.num_tokens == other.num_tokens
            and secrets.compare_digest(self.value, other.value)
        )


class HandoffRefusal(enum.StrEnum):
    """Why a decode refused to load a hand-off (the failure kinds it counts)."""

    UNSIGNED = "unsigned"  # no signature: not a hand-off this prefill returned
    BAD_TAG = "bad_tag"  # forged or altered values, or a tag of another key (a restart)
    PROMPT_SCHEME = "prompt_scheme"  # the engines bind prompts differently
    PROMPT_MISMATCH = "prompt_mismatch"  # a genuine hand-off, for another prompt


class HandoffSignature(NamedTuple):
    """A hand-off's signature: the signed values routers may drop elsewhere (the lease, the
    tokens covered, the binding's scheme) and the two tags; ``check`` is the release token."""

    lease_ms: int  # the lease end, wall-clock milliseconds on the prefill's host
    num_tokens: int  # prompt tokens the KV covers
    scheme: str
    check: str  # 32 hex: the transfer's values
    tag: str  # 32 hex: those and the prompt binding

    def text(self) -> str:
        """``<check>.<lease ms>.<tokens>.<scheme>.<tag>``."""
        return f"{self.check}.{self.lease_ms}.{self.num_tokens}.{self.scheme}.{self.tag}"

    @property
    def lease_expires_at(self) -> float:
        return self.lease_ms / 1000


def parse_signed_token(text: str) -> tuple[str, HandoffSignature | None] | None:
    """``text`` as a release token with its signature (or a bare token, which carries none);
    None when it is neither."""
    if len(text) == 32:
        return (text, None) if is_token(text) else None
    match = _SIGNED.fullmatch(text)
    if match is None:
        return None
    check, lease, tokens, scheme, tag = match.groups()
    return check, HandoffSignature(int(lease), int(tokens), scheme, check, tag)


class HandoffCheck(NamedTuple):
    """What a decode's worker verifies before it reads a hand-off (or frees it): the values
    as the request's params carry them, with this request's own prompt binding."""

    transfer_id: str
    engine_id: str
    signature: HandoffSignature
    groups: Sequence[Sequence[int]]  # the params' block ids, one list per group
    prompt: PromptBinding  # this request's prompt under ``signature.scheme`` where it can


def _lengths(groups: Sequence[Sequence[int]]) -> str:
    if len(groups) == 1:
        return str(len(groups[0]))
    return ",".join([str(len(group)) for group in groups])


_NO_U32 = array("I")


def u32_array(values: Sequence[int]) -> array[int]:
    """``values`` as unsigned 32-bit ints (OverflowError or TypeError: one is not such an
    int). A list is copied in with ``fromlist``, which costs half of ``array("I", values)``
    on this hot path."""
    if type(values) is not list:
        return array("I", values)
    ids = _NO_U32.__copy__()
    ids.fromlist(values)
    return ids


def encode_blocks(groups: Sequence[Sequence[int]]) -> bytes | None:
    """Every group's block ids as signed: the groups' lengths, then each id as 4 bytes (None:
    an id no prefill hands out)."""
    try:
        ids = b"".join([u32_array(group).tobytes() for group in groups])
    except (OverflowError, TypeError):
        return None
    return f"{_lengths(groups)}|".encode() + ids


def _engine_mac(key: bytes, engine_id: str, instance_id: str) -> Any:
    """The keyed MAC with what every hand-off of one engine instance shares (lengths first:
    no two different value lists feed the same bytes)."""
    mac = hashlib.blake2b(key=key, digest_size=TAG_BYTES, person=_PERSON)
    mac.update(f"{len(engine_id)}:{engine_id}{len(instance_id)}:{instance_id}".encode())
    return mac


def _fields(transfer_id: str, lease_ms: int, num_tokens: int, scheme: str) -> str:
    return f"{len(transfer_id)}:{transfer_id}{lease_ms}.{num_tokens}.{scheme}."


class HandoffSigner:
    """Signs one prefill engine instance's hand-offs (its keyed state prepared once: this
    runs on the scheduler's hot path, so it feeds the bytes :func:`sign_handoff` feeds in
    as few calls as it can)."""

    def __init__(self, key: bytes, engine_id: str, instance_id: str) -> None:
        self._engine = _engine_mac(key, engine_id, instance_id)

    def sign(
        self,
        transfer_id: str,
        lease_ms: int,
        groups: Sequence[Sequence[int]],
        prompt: PromptBinding,
    ) -> tuple[str, str]:
        """The release token (``check``) and :meth:`HandoffSignature.text` of one hand-off of
        ``groups`` (every KV-cache group's block ids), whose KV was computed for the prompt
        ``prompt`` binds. OverflowError or TypeError: a block id no engine hands out."""
        scheme, num_tokens, value = prompt
        mac = self._engine.copy()
        mac.update(
            f"{_fields(transfer_id, lease_ms, num_tokens, scheme)}{_lengths(groups)}|".encode()
        )
        for group in groups:
            mac.update(u32_array(group))
        values = mac.copy()
        mac.update(b"\x01")
        mac.update(value)
        tags = (values.digest() + mac.digest()).hex()
        check = tags[:32]
        return check, f"{check}.{lease_ms}.{num_tokens}.{scheme}.{tags[32:]}"


def _tags(mac: Any, fields: str, blocks: bytes, prompt: bytes) -> tuple[str, str]:
    mac.update(fields.encode())
    mac.update(blocks)
    check = mac.copy().hexdigest()
    mac.update(b"\x01" + prompt)
    return check, mac.hexdigest()


def sign_handoff(
    key: bytes,
    *,
    transfer_id: str,
    engine_id: str,
    instance_id: str,
    lease_ms: int,
    blocks: bytes,
    prompt: PromptBinding,
) -> HandoffSignature:
    """The signature of one hand-off (``blocks``: :func:`encode_blocks` of its block ids;
    ``prompt``: the binding of the prompt tokens its KV was computed for)."""
    n, scheme = prompt.num_tokens, prompt.scheme
    check, tag = _tags(
        _engine_mac(key, engine_id, instance_id),
        _fields(transfer_id, lease_ms, n, scheme),
        blocks,
        prompt.value,
    )
    return HandoffSignature(lease_ms, n, scheme, check, tag)


def verify(key: bytes, instance_id: str, check: HandoffCheck) -> tuple[HandoffRefusal, str] | None:
    """Why the hand-off ``check`` describes may not be loaded by this request (None: it may).

    ``key`` and ``instance_id``: the prefill's, from its handshake reply.
    """
    signature = check.signature
    expected_check, expected_tag = _tags(
        _engine_mac(key, check.engine_id, instance_id),
        _fields(check.transfer_id, signature.lease_ms, signature.num_tokens, signature.scheme),
        encode_blocks(check.groups) or b"",  # b"": ids no prefill signs, which fail the tag
        check.prompt.value,
    )
    if not secrets.compare_digest(expected_check, signature.check):
        return HandoffRefusal.BAD_TAG, (
            f"the hand-off's tag does not verify with the key of instance {instance_id!r}: "
            "forged or altered params, or params of an earlier run of the prefill"
        )
    if check.prompt.scheme != signature.scheme:
        return HandoffRefusal.PROMPT_SCHEME, scheme_refusal(signature.scheme, check.prompt.scheme)
    if (
        not check.prompt.value
        or check.prompt.num_tokens != signature.num_tokens
        or not secrets.compare_digest(expected_tag, signature.tag)
    ):
        return HandoffRefusal.PROMPT_MISMATCH, (
            f"the hand-off's KV was computed for another prompt (its first "
            f"{signature.num_tokens} tokens differ from this request's)"
        )
    return None


_CHAIN_PARTS = ("prefix_caching_hash_algo", "hash_block_size", "hash seed (PYTHONHASHSEED)")


def scheme_refusal(prefill: str, decode: str) -> str:
    """Why a prefill binding prompts by the scheme ``prefill`` and a decode binding them by
    ``decode`` cannot share KV, naming what differs and both values.

    Chain schemes (:mod:`moriio.vllm_plugin.prompt_binding`) are
    ``<algorithm>-<hash block size>-<seed id>``; two of them are compared part by part (pages
    of another size show up here first: vLLM hashes prompts per block).
    """
    ours, theirs = prefill.rsplit("-", 2), decode.rsplit("-", 2)
    differences = []
    if len(ours) == len(theirs) == len(_CHAIN_PARTS):
        differences = [
            f"{name} differs (prefill={a}, decode={b})"
            for name, a, b in zip(_CHAIN_PARTS, ours, theirs, strict=True)
            if a != b
        ]
    if not differences:
        differences = [f"the prompt binding differs (prefill={prefill}, decode={decode})"]
    return (
        f"the engines bind prompts differently: {'; '.join(differences)}; both need the same "
        "prefix_caching_hash_algo, block size and PYTHONHASHSEED"
    )


def is_scheme(value: str) -> bool:
    """Whether ``value`` may name a binding scheme (it travels inside a dotted string)."""
    return _SCHEME.fullmatch(value) is not None
