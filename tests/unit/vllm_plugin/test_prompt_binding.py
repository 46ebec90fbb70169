"""Prompt bindings of real vLLM requests: vLLM's own prefix-cache hash chain, completed by the
partial block's tokens, ties a hand-off to the exact tokens (and inputs) it was computed for."""

from __future__ import annotations

import hashlib
from array import array

import pytest

pytest.importorskip("vllm")

from vllm.lora.request import LoRARequest
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_utils import init_none_hash

from moriio.vllm_plugin.prompt_binding import TOKENS_SCHEME, PromptBinder
from moriio_tools.vllm_harness import make_request

pytestmark = pytest.mark.vllm

BLOCK = 16
PROMPT = list(range(100, 100 + 5 * BLOCK + 7))  # five full blocks and a partial one


@pytest.fixture(autouse=True)
def _seeded() -> None:
    """vLLM's block hashes seeded as an engine seeds them (the default seed)."""
    init_none_hash(sha256)


def _request(tokens: list[int], rid: str = "r", **extra: object) -> object:
    request = make_request(rid, tokens, 4, None)
    for name, value in extra.items():
        setattr(request, name, value)
    return request


def _bind(tokens: list[int], n: int | None = None, **extra: object) -> bytes:
    binder = PromptBinder("sha256", BLOCK)
    binding = binder.bind(_request(tokens, **extra), len(tokens) if n is None else n)  # type: ignore[arg-type]
    assert binding is not None
    assert binding.scheme == binder.scheme
    return binding.value


def test_the_chain_scheme_names_the_algorithm_block_and_seed() -> None:
    scheme = PromptBinder("sha256", BLOCK).scheme
    algorithm, block, seed = scheme.split("-")
    assert (algorithm, block) == ("sha256", "16")
    assert seed == hashlib.sha256(bytes(kv_cache_utils.NONE_HASH)).hexdigest()[:8]
    # Two engines of one deployment agree without talking to each other.
    assert PromptBinder("sha256", BLOCK).scheme == scheme


def test_equal_prompts_bind_equal_and_any_changed_token_changes_the_binding() -> None:
    assert _bind(PROMPT) == _bind(list(PROMPT))
    for index in (0, BLOCK + 3, 5 * BLOCK - 1, 5 * BLOCK, len(PROMPT) - 1):
        other = list(PROMPT)
        other[index] += 1
        assert _bind(other) != _bind(PROMPT), index


def test_a_binding_covers_the_first_n_tokens_only() -> None:
    """What the KV of the first n tokens depends on: a longer prompt with the same first n
    tokens binds the same, one that differs within them does not."""
    n = 3 * BLOCK + 5
    longer = [*PROMPT, 1, 2, 3]
    assert _bind(longer, n) == _bind(PROMPT, n)
    assert _bind(PROMPT, 3 * BLOCK) == _bind(longer, 3 * BLOCK)
    changed = list(PROMPT)
    changed[n - 1] += 1
    assert _bind(changed, n) != _bind(PROMPT, n)
    binder = PromptBinder("sha256", BLOCK)
    assert binder.bind(_request(PROMPT), len(PROMPT) + 1) is None  # type: ignore[arg-type]


def test_what_vllm_hashes_with_the_tokens_is_bound_too() -> None:
    """A LoRA adapter changes the KV of the same tokens: vLLM hashes it into every full
    block's hash, and the partial block's binding carries it too (set after the request's
    block hashes here, so only the partial block's part shows it)."""
    lora = LoRARequest("adapter", 1, "/adapters/a")
    assert _bind(PROMPT, lora_request=lora) != _bind(PROMPT)
    tail_only = PROMPT[:3]  # no full block: the partial block's extra keys carry it
    assert _bind(tail_only, lora_request=lora) != _bind(tail_only)


def test_bindings_under_a_peers_scheme() -> None:
    binder = PromptBinder("sha256", BLOCK)
    request = _request(PROMPT)
    own = binder.bind(request, 40)  # type: ignore[arg-type]
    assert own is not None
    assert binder.bind_as(request, 40, own.scheme) == own  # type: ignore[arg-type]
    tokens = binder.bind_as(request, 40, TOKENS_SCHEME)  # type: ignore[arg-type]
    assert tokens.value == hashlib.sha256(array("I", PROMPT[:40])).digest()
    other = binder.bind_as(request, 40, "sha256-16-0badf00d")  # type: ignore[arg-type]
    assert other.scheme == own.scheme  # this engine's, so the refusal names both
    assert other.value == b""


def test_without_a_usable_chain_prompts_are_bound_by_their_token_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert PromptBinder("xxhash", BLOCK).scheme == TOKENS_SCHEME  # not collision resistant
    monkeypatch.setattr(kv_cache_utils, "NONE_HASH", b"\x00" * 32)  # seeded per process
    assert PromptBinder("sha256", BLOCK).scheme == TOKENS_SCHEME
    monkeypatch.undo()
    binder = PromptBinder("sha256", BLOCK)
    bare = _request(PROMPT)
    bare.block_hashes = []  # type: ignore[attr-defined]
    binding = binder.bind(bare, len(PROMPT))  # type: ignore[arg-type]
    assert binding is not None
    assert binding.scheme == TOKENS_SCHEME
    assert binding.value == hashlib.sha256(array("I", PROMPT)).digest()
    # Token ids alone do not bind what else the request carries: no binding at all.
    lora = LoRARequest("adapter", 1, "/adapters/a")
    bare.lora_request = lora  # type: ignore[attr-defined]
    assert binder.bind(bare, len(PROMPT)) is None  # type: ignore[arg-type]
