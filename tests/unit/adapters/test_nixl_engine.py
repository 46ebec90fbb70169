"""NIXL adapter specifics: descriptors, environment defaults, loading, notifications."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from pytest_mock import MockerFixture

from moriio.adapters.nixl import _loader
from moriio.adapters.nixl._loader import INSTALL_HINT, apply_env_defaults, load_nixl, rdma_devices
from moriio.adapters.nixl.descriptor import NixlRegionDescriptor
from moriio.domain.kv.descriptors import coalesce, in_remote_order
from moriio.ports import MemoryKind, TransferEngine, TransferEngineError, TransferOp, TransferState

DESCRIPTOR = NixlRegionDescriptor(
    agent="prefill-0",
    region_id=7,
    addr=0x7F12_3456_7000,
    length=1 << 30,
    device_id=3,
    kind=MemoryKind.DEVICE,
    agent_metadata=b"\x01partial-metadata\x00",
)


def test_descriptor_round_trip() -> None:
    assert NixlRegionDescriptor.decode(DESCRIPTOR.encode()) == DESCRIPTOR


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"MIOX", "too short"),
        (b"XXXX" + DESCRIPTOR.encode()[4:], "not a NIXL region descriptor"),
        (DESCRIPTOR.encode()[:35], "truncated inside the agent name"),
        (DESCRIPTOR.encode()[:5] + b"\x09" + DESCRIPTOR.encode()[6:], "unknown memory kind"),
    ],
)
def test_malformed_descriptors_are_rejected(raw: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        NixlRegionDescriptor.decode(raw)


def _i64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def test_coalesce_merges_runs_contiguous_on_both_sides() -> None:
    local = _i64([0, 4096, 8192, 20000, 24096])
    remote = _i64([100, 4196, 9999, 50000, 54096])
    sizes = _i64([4096, 4096, 4096, 4096, 4096])
    merged = coalesce(local, remote, sizes)
    assert [a.tolist() for a in merged] == [
        [0, 8192, 20000],
        [100, 9999, 50000],
        [8192, 4096, 8192],
    ]


def test_remote_order_brings_pairs_posted_apart_together() -> None:
    local = _i64([8192, 0, 20000, 4096])
    remote = _i64([9000, 100, 50000, 4196])
    sizes = _i64([4096, 4096, 4096, 4096])
    ordered = in_remote_order(local, remote, sizes)
    assert [a.tolist() for a in ordered] == [
        [0, 4096, 8192, 20000],
        [100, 4196, 9000, 50000],
        [4096, 4096, 4096, 4096],
    ]
    merged = coalesce(*ordered)
    assert [a.tolist() for a in merged] == [
        [0, 8192, 20000],
        [100, 9000, 50000],
        [8192, 4096, 4096],
    ]


def test_remote_order_leaves_an_ordered_batch_as_it_is() -> None:
    local, remote, sizes = _i64([4096, 0]), _i64([0, 4096]), _i64([4096, 4096])
    ordered = in_remote_order(local, remote, sizes)
    assert all(a is b for a, b in zip(ordered, (local, remote, sizes), strict=True))


def test_coalesce_keeps_permuted_blocks_apart() -> None:
    local, remote, sizes = _i64([0, 4096]), _i64([4096, 0]), _i64([4096, 4096])
    merged = coalesce(local, remote, sizes)
    assert [a.tolist() for a in merged] == [[0, 4096], [4096, 0], [4096, 4096]]


@pytest.fixture
def clean_env(mocker: MockerFixture) -> None:
    """The UCX variables the adapter defaults are unset; the whole environment is restored."""
    mocker.patch.dict(os.environ)
    for name in [k for k in os.environ if k.startswith("UCX_")]:
        os.environ.pop(name)


@pytest.mark.usefixtures("clean_env")
def test_env_defaults_for_loopback_on_a_host_without_rdma() -> None:
    assert apply_env_defaults(loopback=True, rdma=(), gpus=True) == {
        "UCX_MODULES": "^ib",
        "UCX_NET_DEVICES": "lo",
        "UCX_SCOPY_TX_QUOTA": "64",
        "UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y",
    }
    assert os.environ["UCX_NET_DEVICES"] == "lo"
    assert os.environ["UCX_SCOPY_TX_QUOTA"] == "64"


@pytest.mark.usefixtures("clean_env")
def test_env_defaults_leave_user_choices_alone() -> None:
    os.environ["UCX_NET_DEVICES"] = "eth1"
    os.environ["UCX_SCOPY_TX_QUOTA"] = "1"
    os.environ["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] = "auto"
    assert apply_env_defaults(loopback=True, rdma=(), gpus=True) == {"UCX_MODULES": "^ib"}
    assert os.environ["UCX_NET_DEVICES"] == "eth1"
    assert os.environ["UCX_SCOPY_TX_QUOTA"] == "1"
    assert os.environ["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "auto"


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("rdma", [(), ("mlx5_0",)])
@pytest.mark.parametrize("loopback", [True, False])
def test_cuda_ipc_get_zero_copy_is_on_for_every_gpu_engine_unless_the_user_chose(
    loopback: bool, rdma: tuple[str, ...]
) -> None:
    """Without it UCX reads device memory by software emulation over TCP where it finds no
    NVLink (0.45 GB/s on an H200); host memory never takes cuda_ipc."""
    assert apply_env_defaults(loopback, rdma, gpus=True)["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "y"
    assert os.environ["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "y"
    os.environ["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] = "n"
    assert "UCX_CUDA_IPC_ENABLE_GET_ZCOPY" not in apply_env_defaults(loopback, rdma, gpus=True)
    assert os.environ["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "n"


@pytest.mark.usefixtures("clean_env")
def test_a_host_without_nvidia_gpus_gets_no_cuda_ipc_setting() -> None:
    """UCX has no cuda_ipc module there and would warn of an unused variable."""
    assert "UCX_CUDA_IPC_ENABLE_GET_ZCOPY" not in apply_env_defaults(True, (), gpus=False)
    assert "UCX_CUDA_IPC_ENABLE_GET_ZCOPY" not in os.environ


@pytest.mark.usefixtures("clean_env")
def test_env_defaults_off_loopback_keep_all_interfaces() -> None:
    applied = apply_env_defaults(loopback=False, rdma=(), gpus=True)
    assert set(applied) == {"UCX_MODULES", "UCX_SCOPY_TX_QUOTA", "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"}
    assert "UCX_NET_DEVICES" not in os.environ


@pytest.mark.usefixtures("clean_env")
def test_a_host_with_an_rdma_device_keeps_infiniband_modules() -> None:
    """GPUDirect RDMA goes through UCX's IB modules: never switched off where a NIC exists."""
    applied = apply_env_defaults(loopback=False, rdma=("mlx5_0",), gpus=True)
    assert set(applied) == {"UCX_SCOPY_TX_QUOTA", "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"}
    assert "UCX_MODULES" not in os.environ


def test_rdma_devices_are_read_from_the_verbs_class(tmp_path: Path) -> None:
    assert rdma_devices(tmp_path / "absent") == ()  # no rdma-core, no IB driver
    assert rdma_devices(tmp_path) == ()
    (tmp_path / "mlx5_1").mkdir()
    (tmp_path / "mlx5_0").mkdir()
    assert rdma_devices(tmp_path) == ("mlx5_0", "mlx5_1")


@pytest.mark.usefixtures("clean_env")
def test_the_host_decides_by_default(mocker: MockerFixture, tmp_path: Path) -> None:
    (tmp_path / "mlx5_0").mkdir()
    mocker.patch.object(_loader, "VERBS_DEVICES", tmp_path)
    assert "UCX_MODULES" not in apply_env_defaults(loopback=False)
    assert "UCX_MODULES" not in os.environ
    (tmp_path / "mlx5_0").rmdir()
    assert apply_env_defaults(loopback=False)["UCX_MODULES"] == "^ib"


@pytest.mark.usefixtures("clean_env")
def test_the_effective_ucx_environment_is_logged_once(mocker: MockerFixture) -> None:
    log = mocker.patch.object(_loader, "_log")
    mocker.patch.object(_loader, "_logged", False)
    os.environ["UCX_TLS"] = "rc,cuda_copy"
    apply_env_defaults(loopback=False, rdma=("mlx5_0",))
    apply_env_defaults(loopback=False, rdma=("mlx5_0",))
    log.info.assert_called_once()
    assert log.info.call_args.args == ("UCX environment for NIXL",)
    logged = log.info.call_args.kwargs
    assert logged["rdma_devices"] == "mlx5_0"
    assert logged["UCX_MODULES"] == "(unset)"
    assert logged["UCX_TLS"] == "rc,cuda_copy"
    assert logged["UCX_SCOPY_TX_QUOTA"] == "64"


@pytest.mark.usefixtures("clean_env")
def test_the_log_tells_moriio_defaults_from_the_users_settings(mocker: MockerFixture) -> None:
    log = mocker.patch.object(_loader, "_log")
    mocker.patch.object(_loader, "_logged", False)
    os.environ["UCX_PROTO_EMULATION_ENABLE"] = "n"  # not one moriio knows: logged all the same
    os.environ["UCX_SCOPY_TX_QUOTA"] = "8"
    apply_env_defaults(loopback=True, rdma=(), gpus=True)
    logged = log.info.call_args.kwargs
    assert logged["set_by_moriio"] == "UCX_CUDA_IPC_ENABLE_GET_ZCOPY,UCX_MODULES,UCX_NET_DEVICES"
    assert logged["set_by_user"] == "UCX_PROTO_EMULATION_ENABLE,UCX_SCOPY_TX_QUOTA"
    assert logged["UCX_PROTO_EMULATION_ENABLE"] == "n"
    assert logged["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "y"
    assert logged["UCX_TLS"] == "(unset)"


def test_missing_nixl_gives_an_install_hint(mocker: MockerFixture) -> None:
    mocker.patch.dict(sys.modules, {"nixl": None, "nixl_cu12": None, "nixl_cu13": None})
    with pytest.raises(ImportError, match="NIXL is not importable") as info:
        load_nixl(loopback=True)
    assert INSTALL_HINT in str(info.value)


nixl = pytest.mark.integration


@nixl
def test_conforms_to_the_port_and_detects_loopback() -> None:
    pytest.importorskip("nixl_cu12")
    from moriio.adapters.nixl import NixlTransferEngine

    engine: TransferEngine = NixlTransferEngine(host="127.0.0.1")
    try:
        assert isinstance(engine, NixlTransferEngine)
        assert engine.loopback
        assert engine.name.startswith("moriio-")
    finally:
        engine.close()


@nixl
def test_host_memory_claimed_as_device_memory_is_refused() -> None:
    pytest.importorskip("nixl_cu12")
    from moriio.adapters.nixl import NixlTransferEngine

    engine = NixlTransferEngine(loopback=True)
    buf = np.zeros(4096, np.uint8)
    try:
        with pytest.raises(TransferEngineError, match="VRAM"):
            engine.register_region(buf.ctypes.data, buf.nbytes, MemoryKind.DEVICE, 0)
    finally:
        engine.close()


@nixl
def test_tags_travel_as_notifications_when_asked() -> None:
    pytest.importorskip("nixl_cu12")
    from moriio.adapters.nixl import NixlTransferEngine

    a, b = NixlTransferEngine(loopback=True, notify=True), NixlTransferEngine(loopback=True)
    src, dst = np.arange(8192, dtype=np.int64).astype(np.uint8), np.zeros(8192, np.uint8)
    try:
        a_region = a.register_region(dst.ctypes.data, dst.nbytes)
        b_region = b.register_region(src.ctypes.data, src.nbytes)
        b.add_peer(a.metadata())
        remote = a.import_region(a.add_peer(b.metadata()), b_region.descriptor)
        offsets = np.array([0, 4096], np.int64)
        handle = a.post(
            TransferOp.READ,
            a_region,
            remote,
            offsets,
            offsets[::-1].copy(),
            np.full(2, 4096, np.int64),
            "req-9",
        )
        received: list[tuple[str, bytes]] = []
        for _ in range(20_000):
            b.progress()
            state = a.poll(handle).state
            received += b.pop_notifications()
            if state is not TransferState.IN_PROGRESS and received:
                break
        assert state is TransferState.SUCCEEDED
        assert received == [(a.name, b"req-9")]
        np.testing.assert_array_equal(dst[:4096], src[4096:])
        np.testing.assert_array_equal(dst[4096:], src[:4096])
    finally:
        a.close()
        b.close()
