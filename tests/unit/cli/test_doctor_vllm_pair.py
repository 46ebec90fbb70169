"""``moriio doctor``'s vLLM check: both supported releases, each with its own torch."""

from __future__ import annotations

import pytest

from moriio.config.vllm_releases import VLLM_TORCH_PAIRS
from moriio.doctor.checks import Status, vllm_check, vllm_pair_check


@pytest.mark.parametrize(
    ("vllm", "torch"),
    [("0.32.0", "2.13.0"), ("0.33.0", "2.14.0"), ("0.32.0+cpu", "2.13.0+cpu")],
)
def test_a_supported_release_with_its_torch_passes_and_names_the_pair(
    vllm: str, torch: str
) -> None:
    check = vllm_pair_check(vllm, torch)
    assert check.status is Status.PASS
    assert check.detail == f"vllm {vllm} with torch {torch}"


def test_both_releases_are_supported() -> None:
    assert VLLM_TORCH_PAIRS == {"0.32.0": "2.13.0", "0.33.0": "2.14.0"}


@pytest.mark.parametrize(
    ("vllm", "torch", "wanted"),
    [("0.33.0", "2.13.0", "2.14.0"), ("0.32.0", "2.14.0", "2.13.0"), ("0.33.0", None, "2.14.0")],
)
def test_a_release_beside_another_torch_warns_with_the_torch_it_needs(
    vllm: str, torch: str | None, wanted: str
) -> None:
    check = vllm_pair_check(vllm, torch)
    assert check.status is Status.WARN
    assert f"vLLM {vllm} runs with torch {wanted}" in check.detail


def test_an_unsupported_release_warns_naming_the_supported_pairs() -> None:
    check = vllm_pair_check("0.34.0", "2.15.0")
    assert check.status is Status.WARN
    assert "0.34.0 installed" in check.detail
    assert "0.32.0 (torch 2.13.0), 0.33.0 (torch 2.14.0)" in check.detail


def test_the_installed_pair_is_judged() -> None:
    """This environment's own pair: a supported release is named with its torch."""
    pytest.importorskip("vllm")
    check = vllm_check()
    assert check.detail.startswith("vllm 0.3")
    assert "torch 2.1" in check.detail
