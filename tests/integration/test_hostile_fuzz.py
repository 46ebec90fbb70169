"""Property fuzz at the public boundaries, through the real vLLM scheduler with the connector
and real workers over ZMQ + NIXL on 127.0.0.1 (derandomized: the same examples every run).

* ``kv_transfer_params``: whatever a client sends, no exception escapes a connector method
  (every engine step runs them) and both engines end with nothing held; also when the params
  name the live, trusted prefill with a signature of the right shape (the decode handshakes
  and verifies them for hostile block lists, leases, transfer ids and tokens): none of
  them is read.
* Frames carrying a transfer's valid capability but hostile fields: nothing crashes, the
  held blocks are not freed early, and the genuine transfer still moves the right bytes.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm")

from moriio.adapters.nixl._loader import load_nixl

try:
    load_nixl(loopback=True)
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.skip(f"NIXL is not installed: {exc}", allow_module_level=True)

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm.v1.engine import FinishReason

from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.messages import Release, RemoteBlocks
from moriio.ports import PeerAddress
from support.hostile import nixl_pd, send_raw
from support.pd.routing import HOST, Address, new_transfer_id, prefill_params
from support.pd.sim_proxy import PDProxy
from support.pd.worlds import free_tcp_port

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(600)]

PROMPT = list(range(1, 70))
FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DEAD_PORT = free_tcp_port()
_ids = itertools.count()


# Fuzzed prefills handed off to no decode are freed by their lease: keep it short, but
# leave the held transfer's read (posted after ~300 fuzzed frames) well inside it.
PD_EXTRA = {"handshake_timeout": 0.5, "transfer_timeout": 2.0, "defer_timeout": 8.0}


@pytest.fixture(scope="module")
def read_pd() -> Iterator[PDProxy]:
    yield from nixl_pd(True, num_blocks=1024, extra=PD_EXTRA)


@pytest.fixture(scope="module")
def write_pd() -> Iterator[PDProxy]:
    yield from nixl_pd(False, num_blocks=1024, extra=PD_EXTRA)


# -- kv_transfer_params -------------------------------------------------------------------

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
hosts = st.sampled_from(
    ["127.0.0.1 ", "127.0.0.1\n", "", "::1", "[::1]", "0.0.0.0", "192.0.2.7", "a b", "h\x00"]
)
ports = st.one_of(st.sampled_from([DEAD_PORT, 0, -1, 65536, "6301", "\uff16\uff13"]), junk)
block_ids = st.one_of(
    st.lists(st.lists(st.integers(-2, 1 << 41), max_size=4), max_size=2),
    st.lists(st.integers(0, 8), max_size=4),
    st.just([[True, False]]),
    junk,
)
values: dict[str, st.SearchStrategy[Any]] = {
    "do_remote_prefill": st.one_of(st.booleans(), junk),
    "do_remote_decode": st.one_of(st.booleans(), junk),
    "transfer_id": st.one_of(st.text(max_size=20), st.just("x" * 5000), junk),
    "remote_engine_id": st.one_of(st.text(max_size=40), st.just("e#" + "a" * 32), junk),
    "remote_block_ids": block_ids,
    "remote_host": st.one_of(hosts, junk),
    "remote_handshake_port": ports,
    "remote_notify_port": ports,
    "remote_tp_size": st.one_of(st.integers(-1, 1 << 31), junk),
    "remote_dp_size": st.one_of(st.integers(-1, 1 << 20), junk),
    "remote_dp_rank": st.one_of(st.integers(-1, 1 << 20), junk),
    "tp_size": st.one_of(st.integers(-1, 4096), junk),
    "lease_expires_at": st.one_of(st.floats(), junk),
    "remote_instance_id": st.one_of(st.text(max_size=300), junk),
}
params_strategy = st.fixed_dictionaries({}, optional={**values, "unexpected": junk}).filter(
    lambda p: p.get("remote_host", "127.0.0.1") != "127.0.0.1"
)


@settings(FUZZ, max_examples=2000)
@given(params=params_strategy, producer=st.booleans())
def test_no_params_escape_a_connector_method(
    read_pd: PDProxy, params: dict[str, Any], producer: bool
) -> None:
    engine = read_pd.prefill if producer else read_pd.decode
    request_id = f"fuzz-{next(_ids)}"
    engine.add(request_id, PROMPT[: 5 + len(params)], 1, params)
    engine.step()  # matched tokens, allocation, metadata, worker hooks
    engine.abort([request_id])  # request_finished with the same params
    engine.step()


# Params aimed at the live, trusted prefill: its real address, valid values but for one key
# (or none) drawn hostile, so that the decode handshakes and plans and posts reads (or
# refuses them by name) for hostile block lists, leases, transfer ids and tokens.
AIMED_HOSTILE = (
    "transfer_id",
    "remote_engine_id",
    "remote_block_ids",
    "remote_tp_size",
    "lease_expires_at",
    "remote_instance_id",
)


def aimed_params(prefill: Address) -> st.SearchStrategy[dict[str, Any]]:
    hex32 = st.text("0123456789abcdef", min_size=32, max_size=32)
    valid: dict[str, st.SearchStrategy[Any]] = {
        "do_remote_prefill": st.just(True),
        "do_remote_decode": st.just(False),
        "transfer_id": st.uuids().map(str),
        # A signature of the right shape that no key made: the decode handshakes to verify it.
        "remote_engine_id": st.tuples(hex32, hex32).map(
            lambda t: f"e#{t[0]}.{int((time.time() + 6) * 1000)}.64.tokens.{t[1]}"
        ),
        "remote_block_ids": st.lists(st.integers(0, 63), max_size=4),
        "remote_host": st.just(HOST),
        "remote_handshake_port": st.just(prefill.handshake_port),
        "remote_notify_port": st.just(prefill.notify_port),
        "remote_tp_size": st.just(1),
        "remote_dp_size": st.just(1),
        "remote_dp_rank": st.just(0),
        "lease_expires_at": st.floats(5, 7).map(lambda ahead: time.time() + ahead),
    }

    def with_hostile(key: str | None) -> st.SearchStrategy[dict[str, Any]]:
        chosen = valid if key is None else {**valid, key: values[key]}
        return st.fixed_dictionaries(chosen, optional={"unexpected": junk})

    return st.sampled_from([None, *AIMED_HOSTILE]).flatmap(with_hostile)


@settings(FUZZ, max_examples=300)
@given(data=st.data())
def test_params_aimed_at_the_live_prefill_escape_no_connector_method(
    read_pd: PDProxy, data: st.DataObject
) -> None:
    params = data.draw(aimed_params(read_pd.prefill_address))
    n = next(_ids)
    # A prompt of its own: one the decode computed before would be a local prefix-cache hit.
    read_pd.decode.add(f"aimed-{n}", [1000 + n, *PROMPT[1:]], 1, params)
    read_pd.decode.step()  # matched tokens, allocation, read orders, worker hooks
    read_pd.prefill.step()
    read_pd.decode.abort([f"aimed-{n}"])
    read_pd.decode.step()


def test_after_the_params_fuzz_both_engines_are_idle_and_still_move_bytes(
    read_pd: PDProxy,
) -> None:
    read_pd.run(max_steps=20_000, pause=0.001)
    decode, stats = read_pd.decode.service.ctx, read_pd.decode.stats
    # The aimed params reached the prefill's handshake, and no forged hand-off was read: a
    # forged list of the prefill's blocks would fill the request's own blocks with their
    # bytes (READ is one-sided), which the harness would count as mismatched.
    assert decode.peers.handshakes >= 1
    assert decode.counters.transfers_started > 0
    assert decode.counters.handoffs_refused > 0
    assert decode.counters.failures_by_kind.get("bad_tag", 0) > 0
    assert stats.mismatched_blocks == 0
    verified = stats.verified_blocks
    read_pd.submit("after-fuzz", PROMPT, 2)
    read_pd.run(max_steps=3000, pause=0.001)
    assert read_pd.done["after-fuzz"].finish_reason == FinishReason.LENGTH
    assert stats.mismatched_blocks == 0  # the genuine transfer's blocks are right
    assert stats.verified_blocks > verified
    assert read_pd.leftovers() == []


# -- frames with a valid capability --------------------------------------------------------

# What msgpack can carry (frames are packed before any check of ours sees them).
wire_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 63), (1 << 64) - 1),
    st.floats(),
    st.text(max_size=12),
    st.binary(max_size=8),
    st.lists(st.integers(-9, 9), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(-9, 9), max_size=2),
)


def _release_bodies(tid: str, token: str) -> st.SearchStrategy[dict[str, Any]]:
    """Releases with the right token whose other fields are hostile (never a genuine one)."""
    genuine = dict(WIRE_CODEC.encode(Release(tid, 1, 0, token)))
    hostile_field = st.one_of(
        st.tuples(st.just("consumer_tp_size"), st.one_of(st.integers(-5, 0), st.just(1 << 40))),
        st.tuples(
            st.just("consumer_tp_rank"), st.one_of(st.integers(1, 5000), st.integers(-9, -1))
        ),
        st.tuples(st.just("transfer_id"), st.one_of(st.text(max_size=8), st.just(tid + " "))),
        st.tuples(
            st.sampled_from(["consumer_tp_size", "consumer_tp_rank", "v", "type"]), wire_junk
        ),
        st.tuples(st.just("extra"), wire_junk),
    )
    body = st.builds(
        lambda field: {**genuine, "consumer_tp_size": 1, "consumer_tp_rank": 0, field[0]: field[1]},
        hostile_field,
    )
    return body.filter(lambda b: not _is_genuine(b, genuine))


def _is_genuine(body: dict[str, Any], genuine: dict[str, Any]) -> bool:
    """A release the consumer itself could send (TP 1, rank 0): it may free the blocks."""
    exact = {**genuine, "consumer_tp_size": 1, "consumer_tp_rank": 0}
    return body.keys() == exact.keys() and all(
        type(body[k]) is type(v) and body[k] == v for k, v in exact.items()
    )


def _refused(proxy: PDProxy) -> int:
    """Frames the prefill's listener or worker refused so far."""
    ctx = proxy.prefill.service.ctx
    rejected = getattr(ctx.channel, "rejected", {})
    counters = ctx.counters
    refused = counters.releases_refused + counters.announcements_refused
    return sum(rejected.values()) + counters.messages_ignored + refused


def test_hostile_releases_with_the_valid_capability_free_nothing(read_pd: PDProxy) -> None:
    tid = new_transfer_id()
    p_id = "p-fuzz-held"
    read_pd.prefill.add(p_id, PROMPT, 1, prefill_params(tid))
    returned: dict[str, Any] = {}
    for _ in range(50):
        for output in read_pd.prefill.step():
            if output.request_id == p_id:
                returned = dict(output.kv_transfer_params or {})
        if returned:
            break
    token = returned["remote_engine_id"].rpartition("#")[2]
    read_pd.prefill.step()  # the worker applies the hold
    notify = PeerAddress(HOST, read_pd.prefill_address.notify_port)

    @settings(FUZZ, max_examples=300)
    @given(body=_release_bodies(tid, token))
    def send(body: dict[str, Any]) -> None:
        send_raw(notify, body)
        read_pd.prefill.step()
        assert read_pd.prefill.finished_sending[p_id] == 0

    refused_before = _refused(read_pd)
    send()
    for _ in range(20):
        read_pd.prefill.step()
    assert read_pd.prefill.finished_sending[p_id] == 0  # still held: no early free
    assert _refused(read_pd) > refused_before
    key = "fuzz-held"
    read_pd.decode_ids[key], read_pd.transfer_ids[key] = f"d-{key}", tid
    read_pd._key_of[f"d-{key}"] = key
    stats = read_pd.decode.stats
    verified, mismatched = stats.verified_blocks, stats.mismatched_blocks
    read_pd.decode.add(f"d-{key}", PROMPT, 2, returned)
    read_pd.run(max_steps=3000, pause=0.001)
    assert read_pd.done[key].finish_reason == FinishReason.LENGTH
    assert stats.verified_blocks > verified
    assert stats.mismatched_blocks == mismatched  # (the aimed params fuzz's own are counted)
    assert read_pd.prefill.finished_sending[p_id] == 1
    assert read_pd.leftovers() == []


def test_hostile_announcements_with_the_bound_capability_redirect_nothing(
    write_pd: PDProxy,
) -> None:
    key = "fuzz-push"
    tid = write_pd.submit(key, PROMPT, 2, to_prefill=False)
    write_pd.step_decode()  # the genuine announcement binds the transfer
    p_notify = PeerAddress(HOST, write_pd.prefill_address.notify_port)
    pusher = write_pd.prefill.service.producer
    assert pusher is not None
    token = None
    for _ in range(500):  # until the announcement arrived (buffered until the prefill runs)
        write_pd.prefill.step()
        token = pusher._bound_token(tid)  # type: ignore[attr-defined]
        if token is not None:
            break
        time.sleep(0.002)
    assert token is not None
    genuine = dict(
        WIRE_CODEC.encode(
            RemoteBlocks(tid, "r", (1, 2), 0, 0, 0, 1, PeerAddress(HOST, 9), "i", 4e9, token)
        )
    )
    fields = st.sampled_from(sorted(set(genuine) - {"type", "v", "token", "transfer_id"}))

    @settings(FUZZ, max_examples=300)
    @given(field=fields, value=st.one_of(wire_junk, st.integers(-3, 1 << 41), hosts))
    def send(field: str, value: Any) -> None:
        send_raw(p_notify, {**genuine, field: value})
        write_pd.prefill.step()

    refused_before = _refused(write_pd)
    send()
    for _ in range(20):
        write_pd.prefill.step()
    assert _refused(write_pd) > refused_before
    d_id = write_pd.decode_ids[key]
    assert write_pd.decode.finished_recving[d_id] == 0
    p_id = write_pd.prefill_ids[key]
    write_pd.prefill.add(p_id, PROMPT, 1, prefill_params(tid, write_pd.decode_address))
    write_pd.pending[p_id] = (key, PROMPT, 2)
    before = write_pd.decode.stats.verified_blocks
    write_pd.run(max_steps=3000, pause=0.001)
    assert write_pd.done[key].finish_reason == FinishReason.LENGTH
    assert write_pd.decode.stats.verified_blocks > before
    assert write_pd.decode.stats.mismatched_blocks == 0
    assert write_pd.leftovers() == []
