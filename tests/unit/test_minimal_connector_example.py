"""The worked example of a second connector on ``moriio.core`` moves real bytes, once."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

from moriio.core import AckResult, Outcome, TransferEngine
from moriio.testing.contract import ENGINE_CHECKS, EngineHarness, run_engine_contract

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minimal_connector.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("minimal_connector", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def test_the_consumer_gets_the_producers_blocks_and_the_ledger_releases_once() -> None:
    example = _example()
    sent, got = (3, 4, 5, 20), (0, 1, 2, 9)
    report = example.run(producer_blocks=sent, consumer_blocks=got)

    assert report.read.outcome is Outcome.SUCCEEDED
    for name, kv in report.consumer.layers.items():
        source = report.producer.layers[name]
        assert np.any(source[:, list(sent)])  # the prefill wrote something to move
        assert np.array_equal(kv[:, list(got)], source[:, list(sent)])
        untouched = [b for b in range(kv.shape[1]) if b not in got]
        assert not np.any(kv[:, untouched])  # nothing landed outside the target blocks
    block_bytes = report.producer.layers["layers.0"][0, 0].nbytes
    assert report.bytes_moved == example.NUM_LAYERS * 2 * len(sent) * block_bytes
    assert report.plans_computed == 1  # every layer shares one geometry

    assert [r.request_id for r in report.released] == ["prefill-req"]
    ledger = report.ledger
    assert ledger.ack("tx-1", 0.0) is AckResult.DUPLICATE  # a second release changes nothing
    assert ledger.pop_released() == []
    assert ledger.stats.succeeded == 1


def test_the_examples_engine_passes_the_engine_contract() -> None:
    example = _example()

    class LoopbackHarness(EngineHarness):
        kind = "loopback"

        def __init__(self) -> None:
            super().__init__()
            self.fabric: dict[str, object] = {}

        def create(self, name: str) -> TransferEngine:
            engine: TransferEngine = example.LoopbackEngine(name, self.fabric)
            return engine

    report = run_engine_contract(LoopbackHarness)
    # The loopback harness can neither refuse a post, crash a peer nor hold a completion:
    # the checks that need those are skipped by name, never passed.
    assert set(report.unsupported) == {
        "backpressure_then_success",
        "dead_peer_gives_a_sticky_terminal_failure",
        "remove_peer_fails_in_flight_work",
        "batches_to_a_removed_peer_settle",
    }
    assert len(report.passed) == len(ENGINE_CHECKS) - 4


def test_the_example_runs_as_a_script() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE)], check=True, capture_output=True, text=True, timeout=120
    )
    assert "read succeeded: 16384 bytes over 4 layers, 1 plan computed" in out.stdout
    assert "released ['prefill-req']" in out.stdout
