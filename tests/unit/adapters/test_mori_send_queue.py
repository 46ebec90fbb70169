"""The send queue as AMD recommends: settings per NIC family, and "SQ full" under several
queue pairs as backpressure whenever nothing of the batch was posted.

mori posts a batch inline as chains, chain ``i`` on queue pair ``(i + uid) % qps``
(``RdmaBatchReadWrite``, ``src/io/rdma/common.cpp``), so "SQ full (batch): ep=E" names the
first chain, and nothing was posted, exactly when ``E == uid % qps`` (with no more chains than
queue pairs). The stand-in posts the same way and merges contiguous descriptors as mori does.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from moriio.adapters.mori.nics import CHUNK_BYTES, NicFamily, family_of, host_family
from moriio.adapters.mori.posting import one_chain, refused_before_posting
from moriio.adapters.mori.settings import RdmaTuning, configured_tuning
from moriio.ports import MemoryKind, TransferOp, TransferState
from support.mori_pair import SIZE, Pair

HOST = MemoryKind.HOST
SQ_FULL = "SQ full (batch): ep={ep} depth=8192 requested=2 max=8192 Hint: ..."


def test_nic_families_are_told_by_device_name(tmp_path: Path) -> None:
    assert [family_of(n) for n in ("ionic_0", "bnxt_re3", "mlx5_1", "irdma0")] == [
        NicFamily.IONIC,
        NicFamily.BNXT_RE,
        NicFamily.MLX5,
        NicFamily.OTHER,
    ]
    for name in ("mlx5_0", "ionic_1"):
        (tmp_path / name).mkdir()
    assert host_family(tmp_path) is NicFamily.IONIC
    assert host_family(tmp_path / "absent") is NicFamily.OTHER


@pytest.mark.parametrize(
    ("family", "qps", "depth"),
    [
        (NicFamily.IONIC, 4, 32767),  # mori: 1 QP on ionic "is prone to SQ full"
        (NicFamily.BNXT_RE, 4, 8192),  # AMD's Thor2 figures: 4 QPs, one posting thread
        (NicFamily.MLX5, 1, 8192),
        (NicFamily.OTHER, 1, 8192),
    ],
)
def test_each_nic_family_gets_its_send_queue_defaults(
    family: NicFamily, qps: int, depth: int
) -> None:
    tuning = configured_tuning(family)
    assert (tuning.qp_per_transfer, tuning.max_send_wr) == (qps, depth)
    assert tuning.num_worker_threads == 1, "inline posting keeps SQ full re-postable"
    assert tuning.enable_transfer_chunking, "merged requests beyond max_msg_sz are split"
    assert tuning.chunk_bytes == CHUNK_BYTES
    explicit = configured_tuning(family, qp_per_transfer=2, num_worker_threads=4)
    assert (explicit.qp_per_transfer, explicit.num_worker_threads) == (2, 4)
    assert not explicit.enable_transfer_chunking, "mori's worker pool splits batches itself"


def test_sq_full_on_the_first_chain_of_several_queue_pairs_posted_nothing() -> None:
    tuning = RdmaTuning(qp_per_transfer=4, num_worker_threads=1)
    for uid in range(8):
        first = uid % 4
        for ep in range(4):
            message = SQ_FULL.format(ep=ep)
            assert refused_before_posting(tuning, HOST, message, uid, 4, 4096) == (ep == first)


def test_a_partly_posted_chain_is_never_taken_for_nothing_posted() -> None:
    """``ibv_post_send`` may post part of a chain before it fails (mori then degrades the
    endpoint): "(posted k/n WRs)" with k > 0 means work is out, even on one chain."""
    tuning = RdmaTuning()
    partly = "ibv_post_send failed with 12: Cannot allocate memory (posted 3/8 WRs) Hint: ..."
    nothing = "ibv_post_send failed with 12: Cannot allocate memory (posted 0/8 WRs) Hint: ..."
    assert not refused_before_posting(tuning, HOST, partly, 0, 8, 8)
    assert refused_before_posting(tuning, HOST, nothing, 0, 8, 8)
    assert not refused_before_posting(tuning, HOST, "ibv_post_send failed with 22", 0, 8, 8)


def test_chains_beyond_the_queue_pairs_or_a_worker_pool_make_sq_full_ambiguous() -> None:
    many = RdmaTuning(qp_per_transfer=2, post_batch_size=1)  # 3 chains on 2 QPs
    assert not refused_before_posting(many, HOST, SQ_FULL.format(ep=0), 0, 3, 3)
    pool = RdmaTuning(qp_per_transfer=4, num_worker_threads=4, enable_transfer_chunking=False)
    assert not refused_before_posting(pool, HOST, SQ_FULL.format(ep=0), 0, 8, 8)
    assert refused_before_posting(pool, HOST, SQ_FULL.format(ep=0), 0, 1, 8), "one share"
    assert one_chain(RdmaTuning(), HOST, 8192, 8192)
    assert not one_chain(RdmaTuning(), HOST, 8193, 8193)
    assert not one_chain(RdmaTuning(qp_per_transfer=2), HOST, 2, 2)


def test_sq_full_under_several_queue_pairs_is_backpressure_when_nothing_was_posted(
    mori_stand_in: ModuleType,
) -> None:
    pair = Pair(qp_per_transfer=4)
    control = mori_stand_in.control(pair.a.name)
    control.hold = True  # an accepted chain would stay in flight
    control.sq_full_burst, control.sq_full_chain = 1, 0  # the first chain finds no room

    status = pair.a.poll(pair.read(pieces=4, gap=16))

    assert status.state is TransferState.BACKPRESSURE, status.message
    assert control.work_requests == [4]  # four chains would have gone to four QPs
    assert not pair.a_buf.any()
    control.hold = False
    again = pair.finish(pair.read(pieces=4, gap=16))
    assert again.state is TransferState.SUCCEEDED, again.message


def test_sq_full_after_the_first_chain_fails_the_batch(mori_stand_in: ModuleType) -> None:
    pair = Pair(qp_per_transfer=4)
    control = mori_stand_in.control(pair.a.name)
    control.sq_full_burst, control.sq_full_chain = 1, 2

    status = pair.finish(pair.read(pieces=4, gap=16))

    assert status.state is TransferState.FAILED
    assert "partly posted" in status.message


def test_a_full_send_queue_of_the_device_depth_backpressures(
    mori_stand_in: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real full queue, not an injected one: the device caps the depth mori asks for."""
    mori_stand_in.DEVICE = mori_stand_in.Device(max_qp_wr=4)
    monkeypatch.setenv("MORI_IO_SQ_BACKOFF_TIMEOUT_US", "2000")
    pair = Pair(qp_per_transfer=1, max_send_wr=64)
    control = mori_stand_in.control(pair.a.name)
    control.hold = True
    held = pair.read(pieces=4, gap=16)  # four WRs fill the four slots the device allows

    refused = pair.a.poll(pair.read(pieces=2, gap=16))

    assert refused.state is TransferState.BACKPRESSURE, refused.message
    assert "max=4" in refused.message
    control.hold = False
    assert pair.finish(held).state is TransferState.SUCCEEDED


def test_mori_merges_contiguous_descriptors_sorted_by_remote_offset(
    mori_stand_in: ModuleType,
) -> None:
    pair = Pair()
    quarter = SIZE // 4
    order = np.array([2, 0, 3, 1], np.int64)  # contiguous on both sides once sorted
    offsets = order * quarter
    handle = pair.a.post(
        TransferOp.READ,
        pair.a_region,
        pair.remote,
        offsets,
        offsets.copy(),
        np.full(4, quarter, np.int64),
        "merge",
    )
    assert pair.finish(handle).state is TransferState.SUCCEEDED
    assert mori_stand_in.control(pair.a.name).work_requests == [1]
    np.testing.assert_array_equal(pair.a_buf, pair.b_buf)


def test_a_merged_request_beyond_max_msg_sz_is_split_with_chunking_on(
    mori_stand_in: ModuleType,
) -> None:
    mori_stand_in.DEVICE = mori_stand_in.Device(max_msg_sz=SIZE // 4)
    refused = Pair(transfer_chunking=False)
    status = refused.finish(refused.read(pieces=4))  # merges into one WR of SIZE bytes
    assert status.state is TransferState.FAILED
    assert "exceeds local max_msg_sz" in status.message

    chunked = Pair()  # moriio's default: chunking on, 1 GiB chunks
    assert chunked.finish(chunked.read(pieces=4)).state is TransferState.SUCCEEDED
    assert mori_stand_in.control(chunked.a.name).work_requests == [4]
    np.testing.assert_array_equal(chunked.a_buf, chunked.b_buf)


def test_mori_is_given_the_family_s_settings_unless_the_connector_sets_them(
    mori_stand_in: ModuleType,
) -> None:
    from mori.io import BackendType

    from moriio.adapters.mori import MoriTransferEngine
    from moriio.config.settings import parse_settings

    settings = parse_settings({"transport": "nixl"})
    assert (settings.qp_per_transfer, settings.num_workers) == (None, None)
    mori_stand_in.DEVICE = mori_stand_in.Device("ionic_0", max_qp_wr=32767, max_sge=2)
    engine = MoriTransferEngine(
        "k",
        nic_family=NicFamily.IONIC,
        qp_per_transfer=settings.qp_per_transfer,
        num_worker_threads=settings.num_workers,
    )
    config = mori_stand_in.control(engine.name).backends[BackendType.RDMA]
    assert (config.qp_per_transfer, config.num_worker_threads, config.max_send_wr) == (4, 1, 32767)
    assert config.enable_transfer_chunking
    assert config.chunk_bytes == CHUNK_BYTES
    assert not mori_stand_in.control(engine.name).warnings, "no 'prone to SQ full' warning"
