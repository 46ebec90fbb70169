"""vLLM 0.33's Model Runner V2 with a speculator drives the worker connector in another order:
the transfer results are taken before the save is awaited, the drafter's layer is computed
and saved after them, and ``finalize_step`` awaits the save (``v1/worker/gpu/kv_connector.py``
``post_forward(defer_finalize=True)`` then ``finalize_step``). Real schedulers for P and D,
in-memory transport; every loaded block is checked byte for byte.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.v1.engine import FinishReason

from support.pd.sim_proxy import PDProxy, build_pd, drive, random_workload
from support.pd.worlds import InMemoryWorld

pytestmark = pytest.mark.vllm

MODES = [
    pytest.param(True, {}, id="read-async"),
    pytest.param(True, {"load_mode": "layerwise"}, id="read-layerwise"),
    pytest.param(False, {}, id="write"),
]


def _proxy(read_mode: bool, extra: dict[str, str], runner_v2: bool) -> PDProxy:
    proxy = build_pd(InMemoryWorld(), read_mode, num_blocks=512, extra=extra)
    proxy.prefill.model_runner_v2 = proxy.decode.model_runner_v2 = runner_v2
    return proxy


@pytest.mark.parametrize(("read_mode", "extra"), MODES)
def test_the_model_runner_v2_order_moves_identical_kv_and_frees_every_block(
    read_mode: bool, extra: dict[str, str]
) -> None:
    proxy = _proxy(read_mode, extra, runner_v2=True)
    workload = random_workload(seed=41, count=60, max_len=200)
    drive(proxy, workload, concurrency=16)
    assert len(proxy.done) == 60
    assert {o.finish_reason for o in proxy.done.values()} == {FinishReason.LENGTH}
    assert proxy.decode.stats.verified_blocks > 0
    assert proxy.decode.stats.mismatched_blocks == 0
    assert not proxy.decode.stats.load_errors
    assert proxy.leftovers() == []  # every block free, nothing reported twice
    proxy.close()
