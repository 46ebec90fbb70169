"""The scheduler benchmark on vLLM's real Scheduler, tiny sizes: result shape, not timings."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

pytest.importorskip("vllm")

from moriio_tools.harness import SCHEDULER_ROLES, measure_scheduler

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

LIVE = 16
STEPS = 3


def _positive(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    return measure_scheduler(live=LIVE, steps=STEPS, series_live=(8,))


def test_headline_figures_are_positive_numbers(result: dict[str, Any]) -> None:
    for key in ("us_per_step", "vllm_us_per_step", "ratio", "noop_us_per_step"):
        assert _positive(result[key]), (key, result[key])
        assert f"{key}_reason" not in result
    for key in ("sum_us_per_step", "vllm_sum_us_per_step", "sum_ratio"):
        assert _positive(result[key]), (key, result[key])
    assert result["headline_role"] in SCHEDULER_ROLES
    headline = result["per_role"][result["headline_role"]]
    assert result["ratio"] == max(r["ratio"] for r in result["per_role"].values())
    assert result["us_per_step"] == headline["us_per_step"]
    assert result["live_requests"] == LIVE
    assert isinstance(result["meets_target"], bool)


def test_every_role_has_positive_figures_for_every_connector(result: dict[str, Any]) -> None:
    assert set(result["per_role"]) == set(SCHEDULER_ROLES)
    for role, figures in result["per_role"].items():
        for key in (
            "us_per_step",
            "vllm_us_per_step",
            "noop_us_per_step",
            "ratio",
            "us_per_live_request",
            "metadata_bytes_per_step",
            "vllm_metadata_bytes_per_step",
        ):
            assert _positive(figures[key]), (role, key, figures[key])
        assert set(figures["connectors"]) == {"moriio", "vllm", "noop"}
        for kind, detail in figures["connectors"].items():
            assert detail["preempted"] == 0, (role, kind)
            assert detail["live_requests"] == LIVE, (role, kind)
            for key in ("us_per_step", "step_us", "metadata_bytes", "scheduler_output_bytes"):
                assert _positive(detail[key]), (role, kind, key, detail[key])
            assert all(_positive(m["calls_per_step"]) for m in detail["methods"].values())


def test_every_connector_sees_the_same_workload_shape(result: dict[str, Any]) -> None:
    for role, figures in result["per_role"].items():
        admitted = {kind: d["new_requests_per_step"] for kind, d in figures["connectors"].items()}
        assert len(set(admitted.values())) == 1, (role, admitted)


def test_producers_admit_a_fifth_of_live_requests_per_step(result: dict[str, Any]) -> None:
    for role in ("producer_read", "producer_write"):
        assert result["per_role"][role]["new_requests_per_step"] == pytest.approx(LIVE / 5, rel=0.3)


def test_series_has_one_row_per_live_count(result: dict[str, Any]) -> None:
    rows = result["series"]
    assert [row["live_requests"] for row in rows] == [8, LIVE]
    for row in rows:
        for key in ("us_per_step", "vllm_us_per_step", "noop_us_per_step"):
            assert _positive(row[key]), (row["live_requests"], key)
        assert set(row["per_role"]) == set(SCHEDULER_ROLES)


def test_result_is_plain_json(result: dict[str, Any]) -> None:
    assert json.loads(json.dumps(result, allow_nan=False)) == result


def test_without_the_in_tree_reference_its_figures_are_null_with_reasons() -> None:
    result = measure_scheduler(live=4, steps=2, roles=("consumer_read",), use_vllm=False)
    assert _positive(result["us_per_step"])
    assert result["vllm_us_per_step"] is None
    assert "use_vllm=False" in result["vllm_us_per_step_reason"]
    assert result["ratio"] is None
    assert result["ratio_reason"]
    assert result["meets_target"] is None
