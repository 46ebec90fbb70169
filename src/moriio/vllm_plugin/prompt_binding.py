"""Prompt bindings of vLLM requests: what ties a hand-off's KV to the tokens it was computed for.

vLLM already hashes every request's prompt for its prefix cache, one chained hash per full
block of ``hash_block_size`` tokens (``Request.block_hashes``, computed whenever a KV
connector is configured). With a collision-resistant algorithm (``sha256``, ``sha256_cbor``)
and a seed every engine derives alike, the hash of the last full block covers every token
before it (and LoRA, multimodal inputs and prompt embeddings, which vLLM hashes with them).
So the binding of a request's first ``n`` tokens is that hash plus the tokens of the partial
block after it (and their extra keys where the request has any): a few dozen bytes, whatever
the prompt's length, on the scheduler's hot path.

Where the chain cannot be used (a non-cryptographic or per-process-seeded hash, or a request
without block hashes) the binding is the SHA-256 of the first ``n`` token ids, and a request
whose tokens are not its whole content (multimodal, prompt embeddings, LoRA) has none.

The scheme is part of every binding: ``<algorithm>-<hash block size>-<seed id>`` for the
chain, ``tokens`` otherwise. Two engines compare bindings of one scheme only.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from moriio.domain.params.handoff_tags import PromptBinding, u32_array
from moriio.log import get_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = get_logger("moriio.scheduler")

TOKENS_SCHEME = "tokens"
CHAIN_ALGORITHMS = frozenset({"sha256", "sha256_cbor"})  # collision resistant


class PromptBinder:
    """Binds requests' prompts for one engine (its prefix-cache hash and block size)."""

    def __init__(self, hash_algorithm: str, hash_block_size: int) -> None:
        if hash_block_size <= 0:
            raise ValueError(f"hash_block_size must be positive, got {hash_block_size}")
        self._algorithm = hash_algorithm
        self._block = hash_block_size
        # Resolved at first use: vLLM seeds its block hashes after the scheduler is built.
        self._scheme: str | None = None
        self._hash: Callable[[Any], bytes] | None = None

    @classmethod
    def from_config(
        cls, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig | None
    ) -> PromptBinder:
        """This engine's binder: its prefix-caching hash and the block size it hashes by."""
        cache = vllm_config.cache_config
        block = getattr(kv_cache_config, "hash_block_size", None) or cache.block_size
        return cls(str(cache.prefix_caching_hash_algo), int(block))

    @property
    def scheme(self) -> str:
        """How this engine binds prompts."""
        if self._scheme is None:
            self._scheme = self._resolve()
        return self._scheme

    def bind(self, request: Request, num_tokens: int) -> PromptBinding | None:
        """This engine's binding of the request's first ``num_tokens`` tokens (None: none)."""
        scheme = self._scheme or self.scheme
        if scheme != TOKENS_SCHEME:
            value = self._chain(request, num_tokens)
            if value is not None:
                return PromptBinding(scheme, num_tokens, value)
        value = _tokens(request, num_tokens)
        return None if value is None else PromptBinding(TOKENS_SCHEME, num_tokens, value)

    def bind_as(self, request: Request, num_tokens: int, scheme: str) -> PromptBinding:
        """The binding under a peer's ``scheme``; its value is empty where this engine
        cannot compute it (and its scheme this engine's where the schemes differ)."""
        if scheme == TOKENS_SCHEME:
            value = _tokens(request, num_tokens)
        elif scheme == self.scheme:
            value = self._chain(request, num_tokens)
        else:
            return PromptBinding(self.scheme, num_tokens, b"")
        return PromptBinding(scheme, num_tokens, value or b"")

    def _chain(self, request: Request, num_tokens: int) -> bytes | None:
        """The last full block's chained hash, then the partial block's tokens (and their
        extra keys) up to ``num_tokens``; None where the request lacks them."""
        block = self._block
        full = num_tokens // block
        hashes = request.block_hashes
        tokens = request.prompt_token_ids
        if tokens is None:
            tokens = list(request.all_token_ids)  # placeholders: embeddings are hashed apart
        if num_tokens <= 0 or len(hashes) < full or len(tokens) < num_tokens:
            return None
        start = full * block
        try:
            tail = u32_array(tokens[start:num_tokens]).tobytes() if start < num_tokens else b""
        except (OverflowError, TypeError):
            return None
        last = hashes[full - 1] if full else b""  # vLLM's BlockHash: bytes
        if (
            not request.mm_features
            and request.lora_request is None
            and request.prompt_embeds is None
            and (full or not request.cache_salt)
        ):
            return last + tail + b"\x00"
        from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys

        keys, _ = generate_block_hash_extra_keys(request, start, num_tokens, 0)
        assert self._hash is not None
        return last + tail + b"\x01" + (self._hash(keys) if keys else b"")

    def _resolve(self) -> str:
        if self._algorithm not in CHAIN_ALGORITHMS:
            log.info(
                "prompts bound by their token ids: the prefix-caching hash is not collision "
                "resistant",
                algorithm=self._algorithm,
            )
            return TOKENS_SCHEME
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils

        hash_fn = get_hash_fn_by_name(self._algorithm)
        none_hash = getattr(kv_cache_utils, "NONE_HASH", None)
        resolve_seed = getattr(kv_cache_utils, "resolve_none_hash_seed", None)
        if none_hash is None or resolve_seed is None or hash_fn(resolve_seed(hash_fn)) != none_hash:
            log.info("prompts bound by their token ids: vLLM's block hashes are seeded per process")
            return TOKENS_SCHEME
        self._hash = hash_fn
        seed_id = hashlib.sha256(bytes(none_hash)).hexdigest()[:8]
        return f"{self._algorithm}-{self._block}-{seed_id}"


def _tokens(request: Request, num_tokens: int) -> bytes | None:
    """SHA-256 of the first ``num_tokens`` token ids; None for a request whose content is
    more than its token ids (the scheme cannot bind it) or that is shorter."""
    tokens = request.prompt_token_ids
    if (
        tokens is None
        or num_tokens <= 0
        or len(tokens) < num_tokens
        or request.mm_features
        or request.lora_request is not None
        or request.prompt_embeds is not None
    ):
        return None
    try:
        ids = array("I", tokens if len(tokens) == num_tokens else tokens[:num_tokens])
    except OverflowError:
        return None
    return hashlib.sha256(ids).digest()
