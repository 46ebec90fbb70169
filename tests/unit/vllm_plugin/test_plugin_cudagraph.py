"""The connector never overrides the user's CUDA-graph mode, and vLLM's call that asks
checks the settings before any engine starts."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.config import (
    CacheConfig,
    CompilationConfig,
    CUDAGraphMode,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.platforms import current_platform

from moriio.vllm_plugin import MoriioKVConnector
from moriio_tools.vllm_harness import tiny_model_dir

pytestmark = pytest.mark.vllm

CONTROL_MODULE = "moriio_piecewise_control"


class PiecewiseControlConnector(MoriioKVConnector):
    """Negative control: a connector that does ask for piecewise graphs."""

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return True


def _config(
    connector: str, module: str, mode: CUDAGraphMode, extra: dict[str, Any] | None = None
) -> VllmConfig:
    model = tiny_model_dir()
    return VllmConfig(
        model_config=ModelConfig(
            model=model, skip_tokenizer_init=True, dtype="float32", max_model_len=2048
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=16,
            max_num_batched_tokens=64,
            max_model_len=2048,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(block_size=16),
        kv_transfer_config=KVTransferConfig(
            kv_connector=connector,
            kv_connector_module_path=module,
            kv_role="kv_consumer",
            kv_connector_extra_config={"read_mode": True} if extra is None else extra,
        ),
        compilation_config=CompilationConfig(cudagraph_mode=mode),
        device_config=DeviceConfig("cpu"),
    )


@pytest.fixture
def graph_capable_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM only finalises CUDA-graph modes on platforms with static graphs."""
    monkeypatch.setattr(
        type(current_platform), "support_static_graph_mode", classmethod(lambda cls: True)
    )
    control = types.ModuleType(CONTROL_MODULE)
    control.PiecewiseControlConnector = PiecewiseControlConnector  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, CONTROL_MODULE, control)


def test_requires_piecewise_for_cudagraph_is_false() -> None:
    assert MoriioKVConnector.requires_piecewise_for_cudagraph({}) is False
    assert MoriioKVConnector.requires_piecewise_for_cudagraph({"read_mode": True}) is False


@pytest.mark.usefixtures("graph_capable_platform")
@pytest.mark.parametrize("mode", [CUDAGraphMode.FULL, CUDAGraphMode.FULL_AND_PIECEWISE])
def test_users_full_graph_mode_is_kept(mode: CUDAGraphMode) -> None:
    config = _config("MoriioKVConnector", "moriio.vllm_plugin", mode)
    assert config.compilation_config.cudagraph_mode == mode


@pytest.mark.usefixtures("graph_capable_platform")
def test_control_connector_asking_for_piecewise_is_downgraded() -> None:
    """The check above is sensitive: vLLM does downgrade a connector that asks."""
    config = _config("PiecewiseControlConnector", CONTROL_MODULE, CUDAGraphMode.FULL)
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE


@pytest.mark.usefixtures("graph_capable_platform")
def test_a_typo_stops_vllm_while_it_finalises_its_config() -> None:
    """No engine process, no weights: the error comes from building vLLM's config."""
    with pytest.raises(Exception, match=r"read_mod \(did you mean read_mode\?\)"):
        _config("MoriioKVConnector", "moriio.vllm_plugin", CUDAGraphMode.FULL, {"read_mod": True})
