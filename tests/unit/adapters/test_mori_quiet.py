"""When no byte can land any more ("quiet"), and how long mori's statuses are kept.

The settle time after a failure that may leave work posted comes from mori's own queue-pair
settings (``MORI_IO_QP_TIMEOUT``, ``MORI_IO_QP_RETRY_CNT``): 4.096 us * 2**timeout *
(retries + 1), up to four times that, plus a margin; ``MORI_IO_QP_TIMEOUT=0`` disables the
timeout, and such work is quiet only once the engine holding its queue pairs is destroyed.
``TransferStatus::Update`` stores the code, unlocks, then calls ``notify_all()``: a status is
kept after it reported its final code (the stand-in counts a notify that finds it freed).
"""

from __future__ import annotations

from types import ModuleType

import pytest

from moriio.ports import TransferState
from support.mori_pair import Pair, eventually


class Clock:
    """The adapter's clock, moved by hand (mori's own threads still run in real time)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _partly_posted(pair: Pair, mori_stand_in: ModuleType, lane: int = 0) -> object:
    """A batch whose second chain found the send queue full after the first was posted (on
    ``lane``'s engine)."""
    control = mori_stand_in.control(pair.a._lanes.get(lane).key)
    control.hold = True
    control.sq_full_burst, control.sq_full_chain = 1, 1
    handle = pair.read(pieces=2, gap=8)
    failed = pair.a.poll(handle)
    assert failed.state is TransferState.FAILED
    assert "partly posted" in failed.message
    control.hold = False
    return handle


@pytest.mark.parametrize(("qp_timeout", "quiet_after"), [("14", 2.25), ("18", 34.5)])
def test_a_partly_posted_batch_is_quiet_after_mori_s_retry_budget(
    mori_stand_in: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    qp_timeout: str,
    quiet_after: float,
) -> None:
    monkeypatch.setenv("MORI_IO_QP_TIMEOUT", qp_timeout)
    clock = Clock()
    pair = Pair(qp_per_transfer=2, clock=clock)
    handle = _partly_posted(pair, mori_stand_in)

    clock.now += quiet_after - 0.05
    assert not pair.a.settled(handle)  # the posted chain may still be retrying
    clock.now += 0.1
    eventually(lambda: pair.a.settled(handle), "quiet once the retry budget ran out")


def test_a_disabled_ack_timeout_is_quiet_only_once_its_connection_closes(
    mori_stand_in: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MORI_IO_QP_TIMEOUT", "0")
    clock = Clock()
    pair = Pair(qp_per_transfer=2, clock=clock)
    lane = pair.a._lanes.get(0)
    mori_stand_in.fatal_event(lane.key, "LOCAL_QP_ERROR", peer=pair.b.name)
    assert pair.finish(pair.read()).state is TransferState.SUCCEEDED  # now on lane 1
    handle = _partly_posted(pair, mori_stand_in, lane=1)

    clock.now += 3600.0
    assert not pair.a.settled(handle), "no retry timeout: the posted chain may land any time"
    new = pair.a._lanes.get(1)
    mori_stand_in.fatal_event(new.key, "LOCAL_QP_ERROR", peer=pair.b.name)
    del lane, new
    assert pair.finish(pair.read()).state is TransferState.SUCCEEDED  # lane 2: 1 is unused
    pair.a.progress()  # the worker's next progress round destroys the unused engine
    eventually(lambda: pair.a.settled(handle), "quiet once lane 1's engine was destroyed")
    assert pair.a._lanes.indices == [0, 2]


def test_a_status_is_kept_until_mori_can_no_longer_touch_it(mori_stand_in: ModuleType) -> None:
    pair = Pair()
    control = mori_stand_in.control(pair.a.name)
    for _ in range(5):
        handle = pair.read()
        assert pair.finish(handle).state is TransferState.SUCCEEDED
        pair.a.release(handle)
    eventually(lambda: control.notified == 5, "every completion notified its status")
    assert control.dangling_writes == 0
    assert len(pair.a._completions.kept) == 5  # held for the grace after their final code
