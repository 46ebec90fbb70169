"""``moriio doctor``'s device lines: UCX's device READs and where layer waits run."""

from __future__ import annotations

import pytest

from moriio.doctor.checks import Status
from moriio.doctor.device import get_zcopy_check, layer_barrier_check


@pytest.mark.parametrize(
    ("environ", "status", "words"),
    [
        ({}, Status.PASS, "moriio sets y"),
        ({"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"}, Status.PASS, "zero-copy"),
        ({"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "auto"}, Status.WARN, "software emulation"),
        ({"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "n"}, Status.WARN, "unset it or set y"),
    ],
)
def test_get_zcopy_is_judged_from_the_environment(
    environ: dict[str, str], status: Status, words: str
) -> None:
    check = get_zcopy_check(environ)
    assert check.status is status
    assert words in check.detail


def test_a_host_without_a_device_waits_on_the_host() -> None:
    check = layer_barrier_check(None)
    assert check.status is Status.PASS
    assert "host waits" in check.detail


def test_a_device_without_stream_waits_is_a_warning_naming_why() -> None:
    check = layer_barrier_check(lambda: "DriverError: no stream memory operations")
    assert check.status is Status.WARN
    assert "no stream memory operations" in check.detail


def test_a_device_with_stream_waits_gets_the_device_barrier() -> None:
    assert layer_barrier_check(lambda: None).status is Status.PASS
