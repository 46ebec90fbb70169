"""Drive vLLM 0.32's real v1 Scheduler on CPU with the moriio connector (no model forward)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from moriio.tools.bench.scheduler_harness import model_output, tiny_model_dir

__all__ = ["model_output", "tiny_model_dir"]  # shared with the scheduler benchmark

BLOCK_SIZE = 16
CONNECTOR_CLASS = "MoriioKVConnector"
CONNECTOR_MODULE = "moriio.vllm_plugin"


def make_vllm_config(
    kv_role: str,
    extra: Mapping[str, Any],
    *,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 1024,
    max_model_len: int = 4096,
    connector: str = CONNECTOR_CLASS,
    module: str | None = CONNECTOR_MODULE,
) -> VllmConfig:
    model = tiny_model_dir()
    return VllmConfig(
        model_config=ModelConfig(
            model=model, skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True),
        kv_transfer_config=KVTransferConfig(
            kv_connector=connector,
            kv_connector_module_path=module,
            kv_role=kv_role,
            kv_connector_extra_config=dict(extra),
        ),
        device_config=DeviceConfig("cpu"),
    )


def make_kv_cache_config(num_blocks: int) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
                FullAttentionSpec(
                    block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )


def make_scheduler(vllm_config: VllmConfig, num_blocks: int) -> Scheduler:
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=make_kv_cache_config(num_blocks),
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
    )


def make_request(
    request_id: str,
    prompt: list[int],
    max_tokens: int,
    kv_transfer_params: dict[str, Any] | None,
) -> Request:
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    sp.update_from_generation_config({}, 2)
    if kv_transfer_params is not None:
        sp.extra_args = {"kv_transfer_params": kv_transfer_params}
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=sp,
        pooling_params=None,
        mm_features=None,
        block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256),
    )
