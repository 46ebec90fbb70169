"""The requests a role sees, the tiny model, its vLLM config and Scheduler, the worker's output."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.config.kv_transfer import KVRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import BlockHash, get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from moriio.domain.params.handoff_tags import new_handoff_key
from moriio.domain.params.request_ids import request_id_with_addresses
from moriio.domain.values.addresses import ControlAddress
from moriio.testing.handoffs import signed_params
from moriio.vllm_plugin.prompt_binding import PromptBinder
from moriio_tools.bench.scheduler_harness.connectors import (
    BLOCK_SIZE,
    CONNECTORS,
    CONSUMER_OUTPUT_TOKENS,
    MAX_MODEL_LEN,
    PROMPT_TOKENS,
    VOCAB,
    split_role,
)


@dataclass(frozen=True, slots=True)
class PeerPorts:
    """Control addresses embedded in request ids (the prefill notify port is a live ROUTER)."""

    prefill_handshake: int
    prefill_notify: int
    decode_handshake: int
    decode_notify: int

    def request_id(self, suffix: str) -> str:
        prefill = ControlAddress("127.0.0.1", self.prefill_handshake, self.prefill_notify)
        decode = ControlAddress("127.0.0.1", self.decode_handshake, self.decode_notify)
        return request_id_with_addresses(prefill, decode, suffix)


def residual_output_tokens(rng: np.random.Generator) -> int:
    """Tokens a steadily decoding request still has to generate (length-biased residual).

    Output lengths are uniform on [lo, hi]; the residual of a request caught mid-decode has
    density proportional to P(length > r): flat on [1, lo], then falling linearly to hi.
    """
    lo, hi = CONSUMER_OUTPUT_TOKENS
    flat = lo / (lo + (hi - lo) / 2)
    if rng.random() < flat:
        return int(rng.integers(1, lo + 1))
    return round(rng.triangular(lo, lo, hi))


class Workload:
    """The same seeded request sequence for every connector: prompts, lengths, params."""

    def __init__(self, role: str, seed: int, ports: PeerPorts) -> None:
        self._kv_role, self._read = split_role(role)
        self._rng = np.random.default_rng(seed)
        self._ports = ports
        self._remote_blocks = 1 << 20
        self.hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
        # READ consumers load hand-offs a prefill signed: its key, and its prompt bindings.
        self._handoff_key = new_handoff_key()
        self._binder = PromptBinder("sha256", BLOCK_SIZE)

    def next_request(self, *, initial: bool = False) -> Request:
        """The next request; ``initial`` requests fill an empty scheduler at once and
        stand in for a steady population: a consumer's output length is drawn from the
        remaining-length distribution of requests already decoding."""
        rng = self._rng
        prompt_len = int(rng.integers(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1))
        prompt = rng.integers(0, VOCAB, size=prompt_len).tolist()
        request_id = self._ports.request_id(rng.bytes(16).hex())
        transfer_id = f"tx-{rng.bytes(16).hex()}"
        if self._kv_role == "kv_producer":
            max_tokens = 1
            params: dict[str, Any] = {
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "transfer_id": transfer_id,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_dp_size": 1,
                "remote_tp_size": 1,
            }
        else:
            lo, hi = CONSUMER_OUTPUT_TOKENS
            max_tokens = residual_output_tokens(rng) if initial else int(rng.integers(lo, hi + 1))
            params = {
                "do_remote_decode": False,
                "do_remote_prefill": True,
                "transfer_id": transfer_id,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_dp_size": 1,
                "remote_tp_size": 1,
            }
            if self._read:  # what the proxy copies from the prefill's returned params
                num_blocks = -(-prompt_len // BLOCK_SIZE)
                remote = rng.choice(self._remote_blocks, size=num_blocks, replace=False)
                params["remote_engine_id"] = f"127.0.0.1:{self._ports.prefill_handshake}"
                params["remote_block_ids"] = [remote.tolist()]
        request = make_request(request_id, prompt, max_tokens, params, self.hasher)
        if self._read and self._kv_role == "kv_consumer":
            self._sign(request, params)
        return request

    def _sign(self, request: Request, params: dict[str, Any]) -> None:
        """Sign ``params`` (the request's own dict) as the prefill of its prompt would."""
        binding = self._binder.bind(request, request.num_prompt_tokens)
        assert binding is not None
        engine_id = str(params["remote_engine_id"])
        params.update(
            signed_params(params, self._handoff_key, "bench-prefill", binding, engine_id=engine_id)
        )


def make_request(
    request_id: str,
    prompt: list[int],
    max_tokens: int,
    kv_transfer_params: dict[str, Any] | None,
    block_hasher: Callable[[Request], list[BlockHash]] | None = None,
) -> Request:
    """A greedy request of ``max_tokens`` tokens (EOS ignored) carrying ``kv_transfer_params``."""
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
        block_hasher=block_hasher or get_request_block_hasher(BLOCK_SIZE, sha256),
    )


# -- vLLM objects --------------------------------------------------------------------------


_model_dirs: list[tempfile.TemporaryDirectory[str]] = []  # removed at interpreter exit


@cache
def tiny_model_dir() -> str:
    """A tiny local Llama config (the scheduler never runs the model: no weights)."""
    from transformers import LlamaConfig

    holder = tempfile.TemporaryDirectory(prefix="moriio-bench-llama-")
    _model_dirs.append(holder)
    path = Path(holder.name)
    LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_MODEL_LEN,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(path)
    init_none_hash(sha256)
    return str(path)


def num_blocks_for(live: int) -> int:
    """Enough blocks that ``live`` requests of the longest shape never preempt."""
    per_request = -(-(PROMPT_TOKENS[1] + CONSUMER_OUTPUT_TOKENS[1]) // BLOCK_SIZE) + 1
    return live * per_request + 256


def make_vllm_config(
    kv_role: KVRole,
    extra: Mapping[str, Any],
    *,
    connector: str,
    module: str | None,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int = MAX_MODEL_LEN,
) -> VllmConfig:
    """The tiny model on CPU (block size 16, prefix caching on) with ``connector`` from
    ``module`` (None: vLLM's registry) as its KV connector."""
    return VllmConfig(
        model_config=ModelConfig(
            model=tiny_model_dir(),
            skip_tokenizer_init=True,
            dtype="float32",
            max_model_len=max_model_len,
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
    """``num_blocks`` blocks shared by the tiny model's two attention layers."""
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


def build_scheduler(vllm_config: VllmConfig, num_blocks: int) -> Scheduler:
    """vLLM's v1 Scheduler over ``num_blocks`` blocks, its connector built from the config."""
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=make_kv_cache_config(num_blocks),
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
    )


def make_scheduler(kind: str, role: str, live: int, ports: PeerPorts) -> Scheduler:
    """The benchmark's Scheduler for one connector ``kind`` in one ``role``."""
    kv_role, read_mode = split_role(role)
    connector, module = CONNECTORS[kind]
    extra = {
        "read_mode": read_mode,
        "host_ip": "127.0.0.1",
        "handshake_port": ports.prefill_handshake
        if kv_role == "kv_producer"
        else ports.decode_handshake,
        "notify_port": ports.prefill_notify if kv_role == "kv_producer" else ports.decode_notify,
    }
    if read_mode and kv_role == "kv_consumer":
        # Like for like: the in-tree connector loads READ synchronously, in the forward pass.
        extra["load_mode"] = "layerwise"
    vllm_config = make_vllm_config(
        kv_role,
        extra,
        connector=connector,
        module=module,
        max_num_seqs=1024,
        max_num_batched_tokens=max(live, 1) * PROMPT_TOKENS[1],
    )
    return build_scheduler(vllm_config, num_blocks_for(live))


def model_output(
    scheduler: Scheduler, out: SchedulerOutput, connector_output: KVConnectorOutput
) -> ModelRunnerOutput:
    """One sampled token for every scheduled request whose prompt is complete."""
    req_ids = list(out.num_scheduled_tokens)
    requests = scheduler.requests
    sampled = [
        [7] if requests[rid].num_computed_tokens >= requests[rid].num_tokens else []
        for rid in req_ids
    ]
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=sampled,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
        kv_connector_output=connector_output,
    )
