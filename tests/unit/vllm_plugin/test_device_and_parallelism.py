"""What the connector supports of a deployment: pipeline stages, context parallelism,
``kv_buffer_device``, the device its threads and fences use, and the FULL-graph warning."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm")

import torch
from vllm.config import CUDAGraphMode
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from moriio.adapters.device.streams import TorchFences
from moriio.config.settings import ConnectorSettings
from moriio.domain.params.transfer_params import port_offset
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.values.modes import TransferMode
from moriio.vllm_plugin import connector as connector_module
from moriio.vllm_plugin import worker_side as worker_side_module
from moriio.vllm_plugin.connector import MoriioKVConnector
from moriio.vllm_plugin.identity import worker_identity
from moriio.vllm_plugin.support import UnsupportedConfigError, check_supported
from moriio.vllm_plugin.worker_side import WorkerSide
from support.vllm_scheduler import make_vllm_config

pytestmark = pytest.mark.vllm

FINGERPRINT = Fingerprint("m", "float32", 16, ("separated",), 1, TransferMode.READ, 1, False)
SETTINGS = ConnectorSettings(host_ip="127.0.0.1")


def test_pipeline_stages_of_one_engine_get_their_own_ports_and_names() -> None:
    config = make_vllm_config("kv_producer", {})
    config.parallel_config.pipeline_parallel_size = 2
    stages = [
        worker_identity(SETTINGS, config, tp_rank=0, fingerprint=FINGERPRINT, pp_rank=pp)
        for pp in (0, 1)
    ]
    assert len({s.handshake_port for s in stages}) == 2
    assert len({s.notify_port for s in stages}) == 2
    assert len({s.engine_name for s in stages}) == 2
    assert stages[1].engine_name.endswith(":pp1")
    assert (stages[1].pp_rank, stages[1].pp_size) == (1, 2)


def test_port_offsets_of_every_dp_pp_tp_rank_are_distinct_and_unchanged_without_pp() -> None:
    offsets = [
        port_offset(dp, tp, 2, pp, 3) for dp in range(2) for pp in range(3) for tp in range(2)
    ]
    assert sorted(offsets) == list(range(12))
    assert [port_offset(dp, tp, 4) for dp in range(2) for tp in range(4)] == list(range(8))


@pytest.mark.parametrize("key", ["decode_context_parallel_size", "prefill_context_parallel_size"])
def test_context_parallelism_is_refused_at_start_up_naming_the_key(key: str) -> None:
    config = make_vllm_config("kv_consumer", {"read_mode": True})
    setattr(config.parallel_config, key, 2)
    with pytest.raises(UnsupportedConfigError, match=f"{key}=2"):
        check_supported(config)
    with pytest.raises(UnsupportedConfigError, match="context parallelism"):
        MoriioKVConnector(config, KVConnectorRole.SCHEDULER, None)  # type: ignore[arg-type]


def test_host_staging_of_a_gpu_kv_cache_is_refused() -> None:
    config = make_vllm_config("kv_producer", {})
    assert config.kv_transfer_config is not None
    config.kv_transfer_config.kv_buffer_device = "cpu"
    with pytest.raises(UnsupportedConfigError, match="kv_buffer_device='cpu'"):
        check_supported(config, platform_device="cuda")
    check_supported(config, platform_device="cpu")  # a CPU engine's KV is in host memory
    config.kv_transfer_config.kv_buffer_device = "xpu"
    with pytest.raises(UnsupportedConfigError, match="does not match"):
        check_supported(config, platform_device="cuda")
    config.kv_transfer_config.kv_buffer_device = "cuda"
    check_supported(config, platform_device="cuda")


def test_device_kv_gets_fences_and_bound_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_side_module, "current_device", lambda: torch.device("cuda", 3))
    side = WorkerSide(SETTINGS, None, None, tp_rank=0)  # type: ignore[arg-type]
    identity = worker_identity(
        SETTINGS, make_vllm_config("kv_producer", {}), tp_rank=0, fingerprint=FINGERPRINT
    )
    host = side._device_adapters(SETTINGS, identity, None)
    assert host.fences().record() is None  # type: ignore[attr-defined]
    assert host.bind_device() is None  # type: ignore[attr-defined]
    side._on_device = True
    device = side._device_adapters(SETTINGS, identity, None)
    assert isinstance(device.fences(), TorchFences)  # type: ignore[attr-defined]
    assert callable(device.bind_device())  # type: ignore[attr-defined]


@pytest.fixture
def warnings_seen(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    logger = logging.getLogger("moriio.vllm")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING, logger="moriio.vllm")
    yield caplog
    logger.removeHandler(caplog.handler)


@pytest.mark.parametrize(
    ("role", "barrier", "warned"),
    [("kv_consumer", "host", True), ("kv_producer", "host", False), ("kv_consumer", "auto", False)],
)
def test_the_full_graph_warning_is_for_host_barrier_layerwise_consumers_only_and_once(
    role: str,
    barrier: str,
    warned: bool,
    monkeypatch: pytest.MonkeyPatch,
    warnings_seen: pytest.LogCaptureFixture,
) -> None:
    """With the device barrier (``auto``) the worker says at registration which it uses."""
    monkeypatch.setattr(connector_module, "_warned_full_graphs", False)
    extra = {"read_mode": True, "load_mode": "layerwise", "layer_barrier": barrier}
    config = make_vllm_config(role, extra)
    config.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    config.model_config.enforce_eager = False
    for _ in range(2):
        MoriioKVConnector(config, KVConnectorRole.WORKER, None)  # type: ignore[arg-type]
    seen = {id(r) for r in warnings_seen.records if "FULL CUDA graphs" in r.getMessage()}
    assert len(seen) == (1 if warned else 0)
