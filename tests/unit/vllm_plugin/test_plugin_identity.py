"""The engine instance id: shared by the scheduler and the workers, new on every engine start."""

from __future__ import annotations

import pytest

from moriio.config.settings import ConnectorSettings
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.values.modes import TransferMode
from moriio.vllm_plugin.identity import engine_endpoint, engine_instance_id, worker_identity

FINGERPRINT = Fingerprint("m", "float32", 16, ("separated",), 1, TransferMode.READ, 1, False)


def _identity_ids(extra: dict[str, object]) -> tuple[str, str, str]:
    from support.vllm_scheduler import make_vllm_config

    config = make_vllm_config("kv_producer", extra)
    settings = ConnectorSettings(host_ip="127.0.0.1")
    worker = worker_identity(settings, config, tp_rank=0, fingerprint=FINGERPRINT)
    return config.instance_id, engine_endpoint(settings, config).instance_id, worker.instance_id


def test_scheduler_and_workers_share_vllm_s_instance_id_and_a_restart_changes_it() -> None:
    config_id, scheduler_id, worker_id = _identity_ids({"read_mode": True})
    assert config_id
    assert scheduler_id == worker_id == config_id
    _, restarted_id, _ = _identity_ids({"read_mode": True})  # a new engine start
    assert restarted_id != scheduler_id


def test_a_config_without_an_instance_id_falls_back_to_the_engine_address(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from support.vllm_scheduler import make_vllm_config

    config = make_vllm_config("kv_producer", {"read_mode": True})
    config.instance_id = ""
    settings = ConnectorSettings(host_ip="10.0.0.9", handshake_port=6301)
    with caplog.at_level("WARNING", logger="moriio.vllm"):
        assert engine_instance_id(settings, config) == "10.0.0.9:6301:dp0"
    assert "no instance_id" in caplog.text
    endpoint = engine_endpoint(settings, config)
    assert endpoint.instance_id == "10.0.0.9:6301:dp0"


def test_an_independent_dp_rank_of_a_dense_model_listens_and_advertises_as_its_global_rank() -> (
    None
):
    """vLLM resets a dense model's DP rank to 0 and its size to 1 in each DP engine: two
    ranks of one engine would then share ports and both claim rank 0."""
    from support.vllm_scheduler import make_vllm_config

    config = make_vllm_config("kv_producer", {"read_mode": True})
    parallel = config.parallel_config
    parallel.data_parallel_index = 1  # what vLLM sets in the engine of DP rank 1 of 2
    parallel.elastic_ep_max_dp_size = 2
    assert (parallel.data_parallel_rank, parallel.data_parallel_size) == (0, 1)
    settings = ConnectorSettings(host_ip="10.0.0.9", handshake_port=6301, notify_port=7301)
    worker = worker_identity(settings, config, tp_rank=0, fingerprint=FINGERPRINT)
    assert (worker.handshake_port, worker.notify_port, worker.dp_rank) == (6302, 7302, 1)
    endpoint = engine_endpoint(settings, config)
    assert (endpoint.dp_rank, endpoint.dp_size, endpoint.dp_size_local) == (1, 2, 0)


def test_a_single_engine_is_dp_rank_zero_of_one() -> None:
    from support.vllm_scheduler import make_vllm_config

    config = make_vllm_config("kv_producer", {"read_mode": True})
    endpoint = engine_endpoint(ConnectorSettings(host_ip="10.0.0.9"), config)
    assert (endpoint.dp_rank, endpoint.dp_size, endpoint.dp_size_local) == (0, 1, 1)
