"""Hand-off signatures: a tag over everything that gives a hand-off's KV its meaning, verified
with the prefill's key and the loading request's own prompt."""

from __future__ import annotations

from typing import Any

import pytest

from moriio.domain.params.handoff_tags import (
    HandoffCheck,
    HandoffRefusal,
    HandoffSignature,
    PromptBinding,
    encode_blocks,
    new_handoff_key,
    parse_signed_token,
    scheme_refusal,
    sign_handoff,
    verify,
)
from moriio.domain.params.transfer_params import (
    MAX_ENGINE_ID_LEN,
    TransferParamsError,
    parse_transfer_params,
)
from moriio.domain.scheduler.consumer.book import ConsumerBook
from moriio.domain.scheduler.producer.book import LocalEndpoint
from moriio.domain.scheduler.producer.read_book import ReadProducerBook
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.values.capability import new_token
from moriio.domain.values.modes import TransferMode
from moriio.testing.handoffs import prompt_binding

KEY = new_handoff_key()
INSTANCE = "1700000000123"
V = prompt_binding("prompt V", 40)
X = prompt_binding("prompt X", 40)
GROUPS = ((4, 5, 6), (0, 7, 8))
ENDPOINT = LocalEndpoint("10.1.0.5:6301", "10.1.0.5", 6301, 61005, 1, 1, 0, INSTANCE)
SIGNED: dict[str, Any] = {
    "transfer_id": "tx-1",
    "engine_id": "10.1.0.5:6301",
    "lease_ms": 1_800_000_000_123,
}


def _signature(key: bytes = KEY, **changes: Any) -> HandoffSignature:
    values = {**SIGNED, "instance_id": INSTANCE, **changes}
    blocks = encode_blocks(values.pop("groups", GROUPS))
    assert blocks is not None
    return sign_handoff(key, blocks=blocks, prompt=values.pop("prompt", V), **values)


def _check(signature: HandoffSignature, **changes: Any) -> HandoffCheck:
    values = {
        "transfer_id": SIGNED["transfer_id"],
        "engine_id": SIGNED["engine_id"],
        "signature": signature,
        "groups": GROUPS,
        "prompt": V,
        **changes,
    }
    return HandoffCheck(**values)


def test_a_genuine_hand_off_verifies_for_its_own_prompt() -> None:
    assert verify(KEY, INSTANCE, _check(_signature())) is None


@pytest.mark.parametrize(
    "changed",
    [
        {"transfer_id": "tx-2"},
        {"engine_id": "10.1.0.6:6301"},
        {"groups": ((4, 5, 9), (0, 7, 8))},  # any block of any group
        {"groups": ((4, 5, 6), (0, 7, 8, 9))},
        {"groups": ((4, 5, 6),)},
    ],
)
def test_any_altered_value_fails_the_tag(changed: dict[str, Any]) -> None:
    refusal = verify(KEY, INSTANCE, _check(_signature(), **changed))
    assert refusal is not None
    assert refusal[0] is HandoffRefusal.BAD_TAG


@pytest.mark.parametrize("field", ["lease_ms", "num_tokens", "scheme", "check", "tag"])
def test_an_altered_signature_fails_the_tag(field: str) -> None:
    signature = _signature()
    altered = {
        "lease_ms": signature.lease_ms + 1,
        "num_tokens": signature.num_tokens - 1,
        "scheme": "other",
        "check": "0" * 32,
        "tag": "0" * 32,
    }[field]
    refusal = verify(KEY, INSTANCE, _check(signature._replace(**{field: altered})))
    assert refusal is not None
    kind = HandoffRefusal.PROMPT_MISMATCH if field == "tag" else HandoffRefusal.BAD_TAG
    assert refusal[0] is kind


def test_another_key_or_instance_fails_the_tag_a_restart_rotates_both() -> None:
    signature = _signature()
    assert verify(new_handoff_key(), INSTANCE, _check(signature))[0] is HandoffRefusal.BAD_TAG  # type: ignore[index]
    assert verify(KEY, "1700000000999", _check(signature))[0] is HandoffRefusal.BAD_TAG  # type: ignore[index]
    assert new_handoff_key() != new_handoff_key()
    assert len(new_handoff_key()) == 32


def test_genuine_params_replayed_for_another_prompt_are_named_so() -> None:
    refusal = verify(KEY, INSTANCE, _check(_signature(), prompt=X))
    assert refusal is not None
    assert refusal[0] is HandoffRefusal.PROMPT_MISMATCH
    assert "another prompt" in refusal[1]
    # A request that cannot be bound (too short, or content the scheme cannot cover).
    empty = V._replace(value=b"")
    assert verify(KEY, INSTANCE, _check(_signature(), prompt=empty))[0] is (  # type: ignore[index]
        HandoffRefusal.PROMPT_MISMATCH
    )


def test_engines_that_bind_prompts_differently_are_named_so() -> None:
    ours = PromptBinding("sha256-16-0badf00d", 40, b"\x00" * 40)
    refusal = verify(KEY, INSTANCE, _check(_signature(), prompt=ours))
    assert refusal is not None
    assert refusal[0] is HandoffRefusal.PROMPT_SCHEME
    assert "PYTHONHASHSEED" in refusal[1]
    assert f"prefill={V.scheme}, decode=sha256-16-0badf00d" in refusal[1]


def test_a_scheme_refusal_names_each_part_that_differs_with_both_values() -> None:
    pages = scheme_refusal("sha256-32-1c593e81", "sha256-64-1c593e81")
    assert "hash_block_size differs (prefill=32, decode=64)" in pages
    assert "prefix_caching_hash_algo differs" not in pages
    assert "hash seed" not in pages
    two = scheme_refusal("sha256-16-1c593e81", "sha256_cbor-16-0badf00d")
    assert "prefix_caching_hash_algo differs (prefill=sha256, decode=sha256_cbor)" in two
    assert "hash seed (PYTHONHASHSEED) differs (prefill=1c593e81, decode=0badf00d)" in two
    assert "hash_block_size" not in two
    assert "the prompt binding differs (prefill=tokens, decode=sha256-16-1c593e81)" in (
        scheme_refusal("tokens", "sha256-16-1c593e81")
    )


def test_a_binding_matches_only_the_same_scheme_length_and_value() -> None:
    assert V.matches(V)
    assert not V.matches(X)
    assert not V.matches(V._replace(num_tokens=39))
    assert not V.matches(V._replace(scheme="other"))
    assert not V.matches(None)
    assert not V._replace(value=b"").matches(V._replace(value=b""))


def test_the_signed_token_parses_back_and_malformed_ones_are_refused() -> None:
    signature = _signature()
    text = signature.text()
    assert parse_signed_token(text) == (signature.check, signature)  # the check is the token
    token = new_token()
    assert parse_signed_token(token) == (token, None)  # a bare token carries no signature
    for bad in ("x" * 32, token + ".1", text + ".", text[:-1], text + ".0" * 16):
        assert parse_signed_token(bad) is None


def _handed_off(book: ReadProducerBook, prompt: PromptBinding | None = V) -> dict[str, Any]:
    params = parse_transfer_params(
        {"do_remote_decode": True, "transfer_id": "tx-1"}, "p-1", producer_peer=False
    )
    decision = book.on_finished(
        "p-1",
        length_capped=True,
        block_ids=[[4, 5, 6], [0, 7, 8]],
        wall_now=1000.0,
        now=0.0,
        params=params,
        prompt=prompt,
    )
    assert decision.params is not None
    return decision.params


def _book() -> ReadProducerBook:
    return ReadProducerBook(ENDPOINT, TransferPolicy(transfer_timeout=10.0, defer_timeout=30.0))


def test_the_prefill_signs_what_it_returns_and_the_decode_checks_what_it_parses() -> None:
    book = _book()
    returned = _handed_off(book)
    assert returned["lease_expires_at"] == 1030.0
    # A router that copies only the engine id, the block ids and the transfer id (vLLM's
    # toy proxy) still carries the whole signature, the lease with it.
    copied = {k: returned[k] for k in ("remote_engine_id", "remote_block_ids", "transfer_id")}
    copied |= {"do_remote_prefill": True, "remote_host": "10.1.0.5"}
    copied |= {"remote_handshake_port": 6301, "remote_notify_port": 61005}
    params = parse_transfer_params(copied, "d-1")
    assert params is not None
    assert params.signature is not None
    assert params.lease_expires_at == 1030.0
    decode = ConsumerBook(TransferMode.READ, 16)
    decode.match("d-1", params, 40, 0)
    decode.on_allocated("d-1", params, [9, 10, 11], 40, V)
    (order,) = decode.take_orders().reads
    assert order.handoff is not None
    assert verify(book.handoff_key, INSTANCE, order.handoff) is None
    # The same params, loaded by a request for another prompt.
    decode.match("d-2", params, 40, 0)
    decode.on_allocated("d-2", params, [12, 13, 14], 40, X)
    (replayed,) = decode.take_orders().reads
    assert replayed.handoff is not None
    assert verify(book.handoff_key, INSTANCE, replayed.handoff)[0] is (  # type: ignore[index]
        HandoffRefusal.PROMPT_MISMATCH
    )
    # Params without the signature carry nothing to verify: the worker refuses them.
    bare = {**copied, "remote_engine_id": "10.1.0.5:6301"}
    unsigned = parse_transfer_params(bare, "d-3")
    assert unsigned is not None
    decode.match("d-3", unsigned, 40, 0)
    decode.on_allocated("d-3", unsigned, [15, 16, 17], 40, V)
    assert decode.take_orders().reads[0].handoff is None


def test_a_decode_loads_no_more_tokens_than_the_prefill_signed() -> None:
    returned = _handed_off(_book(), V._replace(num_tokens=20))
    params = parse_transfer_params(returned, "d-1")
    assert params is not None
    decode = ConsumerBook(TransferMode.READ, 16)
    assert decode.match("d-1", params, 40, 0).num_tokens == 20


def test_a_prompt_without_a_binding_is_not_handed_off() -> None:
    book = _book()
    for prompt in (None, V._replace(value=b"")):
        params = parse_transfer_params(
            {"do_remote_decode": True, "transfer_id": "tx-1"}, "p-1", producer_peer=False
        )
        decision = book.on_finished(
            "p-1",
            length_capped=True,
            block_ids=[4, 5],
            wall_now=1000.0,
            now=0.0,
            params=params,
            prompt=prompt,
        )
        assert decision.params is None
        assert not decision.delay_free
    assert not book.take_orders().holds


def test_each_prefill_book_draws_its_own_key() -> None:
    first, second = _book(), _book()
    assert first.handoff_key != second.handoff_key
    returned = _handed_off(first)
    params = parse_transfer_params(returned, "d-1")
    assert params is not None
    assert params.signature is not None
    check = HandoffCheck("tx-1", "10.1.0.5:6301", params.signature, GROUPS, V)
    assert verify(first.handoff_key, INSTANCE, check) is None
    assert verify(second.handoff_key, INSTANCE, check)[0] is HandoffRefusal.BAD_TAG  # type: ignore[index]


def test_a_long_engine_id_with_its_signature_fits_the_params_caps() -> None:
    engine_id = "e" * MAX_ENGINE_ID_LEN
    signature = _signature(engine_id=engine_id)
    value = f"{engine_id}#{signature.text()}"
    params = parse_transfer_params(
        {
            "do_remote_prefill": True,
            "transfer_id": "tx-1",
            "remote_engine_id": value,
            "remote_host": "10.1.0.5",
            "remote_handshake_port": 6301,
            "remote_notify_port": 61005,
            "remote_block_ids": [[4, 5, 6], [0, 7, 8]],
        },
        "d-1",
    )
    assert params is not None
    assert params.signature == signature
    assert params.peer is not None
    assert params.peer.engine_id == engine_id
    for bad in (f"{engine_id}e#{signature.text()}", value + "0", "e" * 257):
        with pytest.raises(TransferParamsError, match="remote_engine_id"):
            parse_transfer_params(
                {"do_remote_prefill": True, "transfer_id": "t", "remote_engine_id": bad}, "d"
            )
