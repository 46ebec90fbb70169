"""The one definition of 'the decode's prompt KV came over the wire'."""

from __future__ import annotations

from moriio_tools.serve.metrics import CACHED, COMPUTED, LOADED, prompt_kv_shortfall


def test_every_prompt_token_loaded_or_cached_passes() -> None:
    assert prompt_kv_shortfall({LOADED: 90, CACHED: 10, COMPUTED: 0}, 100) is None


def test_a_recompute_or_a_missing_token_is_named() -> None:
    assert "computed" in str(prompt_kv_shortfall({LOADED: 90, COMPUTED: 10}, 100))
    assert "over the wire" in str(prompt_kv_shortfall({CACHED: 100}, 100))
    assert "add up" in str(prompt_kv_shortfall({LOADED: 90}, 100))


def test_tokens_the_decode_computes_by_design_are_counted_apart() -> None:
    """A model with recurrent state computes one token per request; hostile requests that
    load nothing are computed whole: ``prompt_tokens`` are those that must come over the
    wire or from the prefix cache, ``computed`` the others."""
    sources = {LOADED: 586, CACHED: 64, COMPUTED: 8}
    assert prompt_kv_shortfall(sources, 650, computed=8) is None
    assert "computed" in str(prompt_kv_shortfall(sources, 650))
    assert "add up" in str(prompt_kv_shortfall(sources, 658, computed=8))
