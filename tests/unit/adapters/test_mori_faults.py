"""A NIC fault never strands a peer: mori 1.2.4's retired endpoints, degraded endpoints,
peer-failure events and dead queue pairs move transfers to a new connection.

mori 1.2.4 (``MORI_IO_FAIL_ON_ASYNC_EVENT`` on by default) fails in-flight work on a fatal
verbs async event and retires the endpoint: later posts are rejected ("endpoint was failed by
a fatal verbs async event; submission rejected"), ``IOEngineSession.alive()`` turns False and
``pop_peer_failure()`` reports the failure. A degraded endpoint ("EP is degraded, rejecting
new submissions") recovers once its orphaned work requests are released.
"""

from __future__ import annotations

import gc
from types import ModuleType

import numpy as np
import pytest

from moriio.ports import TransferState
from support.mori_pair import Pair, eventually, finish


@pytest.fixture
def pair(mori_stand_in: ModuleType) -> Pair:
    return Pair()


def test_a_retired_endpoint_moves_the_peer_to_a_new_connection(
    pair: Pair, mori_stand_in: ModuleType
) -> None:
    control = mori_stand_in.control(pair.a.name)
    control.hold = True
    in_flight = pair.read()
    mori_stand_in.fatal_event(pair.a.name, "LOCAL_QP_ERROR", peer=pair.b.name)

    failed = pair.finish(in_flight)
    assert failed.state is TransferState.FAILED
    assert "retired by a fatal async event" in failed.message
    control.hold = False

    pair.a_buf[:] = 0
    status = pair.finish(pair.read())  # the same peer, the same metadata: no restart

    assert status.state is TransferState.SUCCEEDED, status.message
    np.testing.assert_array_equal(pair.a_buf, pair.b_buf)


def test_a_post_rejected_by_a_retired_endpoint_is_re_posted_on_a_new_connection(
    pair: Pair, mori_stand_in: ModuleType
) -> None:
    """The event is not drained yet and ``alive()`` is absent (mori 1.2.2/1.2.3): only the
    post's refusal tells. Nothing was posted, so it is backpressure, not a failure."""
    session_type = type(next(iter(pair.a._connections._sessions.values())))
    alive = session_type.alive
    del session_type.alive  # an older mori: no IOEngineSession.alive()
    try:
        mori_stand_in.fatal_event(pair.a.name, "LOCAL_QP_ERROR", peer=pair.b.name)
        refused = pair.a.poll(pair.read())
        assert refused.state is TransferState.BACKPRESSURE, refused.message
        assert "submission rejected" in refused.message
        status = pair.finish(pair.read())
    finally:
        session_type.alive = alive
    assert status.state is TransferState.SUCCEEDED, status.message


def test_a_dead_session_is_not_posted_to(pair: Pair, mori_stand_in: ModuleType) -> None:
    mori_stand_in.fatal_event(pair.a.name, "LOCAL_QP_ERROR", peer=pair.b.name)
    posts_before = len(mori_stand_in.control(pair.a.name).posts)

    status = pair.finish(pair.read())

    assert status.state is TransferState.SUCCEEDED, status.message
    assert len(mori_stand_in.control(pair.a.name).posts) == posts_before, "posted to a dead QP"


def test_peer_failure_events_fail_in_flight_work_at_the_next_progress_round(
    pair: Pair, mori_stand_in: ModuleType
) -> None:
    """A port that went down is reported without a key: every peer behind it is failed at
    once (not after the transfer timeout), and reached again once the port is back."""
    control = mori_stand_in.control(pair.a.name)
    control.hold = True
    handle = pair.read()
    engine = mori_stand_in.find(pair.a.name)
    engine.rdma.failures.append(
        mori_stand_in_event(mori_stand_in, "", "LOCAL_PORT_DOWN", "IBV_EVENT_PORT_ERR")
    )
    assert pair.a.poll(handle).state is TransferState.IN_PROGRESS

    pair.a.progress()

    failed = pair.a.poll(handle)
    assert failed.state is TransferState.FAILED
    assert "LOCAL_PORT_DOWN" in failed.message
    assert "new connection" in failed.message
    control.hold = False
    assert pair.finish(pair.read()).state is TransferState.SUCCEEDED


def test_a_nic_that_went_down_and_came_back_is_reached_without_a_restart(
    pair: Pair, mori_stand_in: ModuleType
) -> None:
    mori_stand_in.fatal_event(pair.a.name, "LOCAL_PORT_DOWN")
    pair.a.progress()  # drains LOCAL_PORT_DOWN: the peer moves to a new connection
    down = pair.finish(pair.read())  # new QPs on a port that is down do not reach the peer
    assert down.state is TransferState.FAILED

    mori_stand_in.port_up()
    pair.a.progress()
    pair.a_buf[:] = 0
    eventually(
        lambda: pair.finish(pair.read()).state is TransferState.SUCCEEDED,
        "the peer is reached again once the port is up",
    )
    np.testing.assert_array_equal(pair.a_buf, pair.b_buf)


def test_a_degraded_endpoint_is_backpressure_until_it_recovers(
    pair: Pair, mori_stand_in: ModuleType
) -> None:
    mori_stand_in.degrade(pair.a.name, pair.b.name, passes=50)
    refused = pair.a.poll(pair.read())
    assert refused.state is TransferState.BACKPRESSURE, refused.message
    assert "degraded" in refused.message
    eventually(
        lambda: pair.finish(pair.read()).state is TransferState.SUCCEEDED,
        "a re-post succeeds once the orphaned work requests are released",
    )
    assert pair.a._peers.lane(pair.peer) == 0, "a degraded endpoint is not a lost connection"


def test_older_mori_without_peer_failure_events_still_works(
    pair: Pair, mori_stand_in: ModuleType
) -> None:
    engine_type = type(mori_stand_in.find(pair.a.name))
    pop = engine_type.pop_peer_failure
    del engine_type.pop_peer_failure  # mori before 1.2.4
    try:
        pair.a.progress()
        status = pair.finish(pair.read())
    finally:
        engine_type.pop_peer_failure = pop
    assert status.state is TransferState.SUCCEEDED


def test_unused_connections_are_destroyed_once_their_peers_moved_on(
    pair: Pair, mori_stand_in: ModuleType
) -> None:
    for _ in range(3):  # each fault retires the connection the peer is on now
        lane = pair.a._lanes.get(pair.a._peers.lane(pair.peer))
        mori_stand_in.fatal_event(lane.key, "LOCAL_QP_ERROR", peer=pair.b.name)
        assert pair.finish(pair.read()).state is TransferState.SUCCEEDED
    del lane
    pair.a.progress()
    gc.collect()

    assert pair.a._peers.lane(pair.peer) == 3
    assert pair.a._lanes.indices == [0, 3], "the lanes the peer left were destroyed"
    assert [k for k in mori_stand_in._ENGINES if k.startswith(pair.a.name)] == [
        pair.a.name,
        pair.a._lanes.get(3).key,
    ]
    assert finish(pair.a, pair.read()).state is TransferState.SUCCEEDED


def mori_stand_in_event(stand_in: ModuleType, key: str, reason: str, detail: str) -> object:
    from mori.cpp import PeerFailureEvent, PeerFailureReason

    return PeerFailureEvent(key, PeerFailureReason[reason], 0, 1, "mlx5_0", detail)
