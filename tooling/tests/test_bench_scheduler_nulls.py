"""The scheduler benchmark without vLLM: every figure null with the reason beside it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from moriio_tools.bench.scheduler import ROLES, measure_scheduler

WITHOUT_VLLM = (
    "import json, sys\n"
    "sys.modules['vllm'] = None  # as if vLLM were not installed\n"
    "from moriio_tools.bench.scheduler import measure_scheduler\n"
    "print(json.dumps(measure_scheduler(live=8, steps=1)))\n"
)


def test_without_vllm_every_headline_figure_is_null_with_a_reason() -> None:
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_VLLM], check=True, capture_output=True, text=True
    )
    result = json.loads(out.stdout)
    for key in ("us_per_step", "vllm_us_per_step", "ratio", "metadata_bytes_per_step"):
        assert result[key] is None
        assert result[f"{key}_reason"].startswith("vllm is not importable")
    assert result["live_requests"] == 8
    assert result["roles"] == list(ROLES)
    assert result["per_role"] == {}
    assert result["series"] == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"roles": ("decoder",)}, "unknown roles"),
        ({"roles": ()}, "at least one role"),
        ({"live": 0}, "live must be at least 1"),
        ({"steps": 0}, "steps must be at least 1"),
        ({"warmup_steps": 2}, "warmup_steps"),
        ({"series_live": (0,)}, "live must be at least 1"),
    ],
)
def test_bad_arguments_are_refused_before_measuring(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        measure_scheduler(**kwargs)  # type: ignore[arg-type]
