"""Sleep mode when a peer holding the worker's regions never confirms: the worker waits the
retire deadline (``liveness_timeout + transfer_timeout + quarantine_timeout``), names the
peer in a warning, and only then deregisters; a second unregister does nothing."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("vllm")

from support.pd.sim_proxy import build_pd
from support.pd.worlds import InMemoryWorld

pytestmark = pytest.mark.vllm

TIMEOUTS = {
    "transfer_timeout": 0.3,
    "quarantine_timeout": 0.3,
    "liveness_timeout": 0.3,
    "defer_timeout": 2.0,
    "clock_skew_allowance": 0.1,
}


def test_a_silent_peer_holds_the_sleep_until_the_retire_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = build_pd(InMemoryWorld(), True, num_blocks=64, extra=TIMEOUTS)
    proxy.submit("0", list(range(40)), 2)
    proxy.run()
    prefill, decode = proxy.prefill, proxy.decode
    assert decode.service.ctx.peers.handshakes == 1  # the decode holds the prefill's regions
    worker_side = decode.worker.worker_side
    assert worker_side is not None
    progress = worker_side.progress
    assert progress is not None
    progress.stop()  # the decode takes no message any more: it never confirms

    started = time.monotonic()
    with caplog.at_level("WARNING"):
        prefill.worker.unregister_kv_caches()
    waited = time.monotonic() - started
    assert waited >= 0.9  # the retire deadline: 0.3 + 0.3 + 0.3 seconds
    assert "sleeping without every peer's confirmation" in caplog.text
    assert str(decode.service.ctx.control) in caplog.text  # the silent peer, by name
    assert not prefill.service.ctx.kv.registered
    prefill.worker.unregister_kv_caches()  # idempotent: nothing more happens
    assert not prefill.service.ctx.kv.registered
    proxy.close()
