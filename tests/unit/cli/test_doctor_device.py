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


def test_the_doctor_says_which_protocol_each_direction_of_device_memory_takes() -> None:
    from moriio.adapters.nixl.protocols import DirectionProtocols
    from moriio.doctor.device import ucx_protocol_checks

    found = [
        DirectionProtocols("read", ("software emulation (tcp/lo)",)),
        DirectionProtocols("write", ("zero-copy (cuda_ipc/cuda)",)),
    ]
    read, write = ucx_protocol_checks(lambda: found)
    assert (read.name, read.status) == ("UCX device read", Status.WARN)
    assert "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y" in read.detail
    assert (write.status, write.detail) == (Status.PASS, "device WRITEs: zero-copy (cuda_ipc/cuda)")
    (nothing,) = ucx_protocol_checks(None)
    assert nothing.status is Status.PASS


def test_a_failing_protocol_probe_is_a_warning_not_a_crash() -> None:
    from moriio.doctor.device import ucx_protocol_checks

    def broken() -> list[object]:
        raise RuntimeError("cannot create NIXL agent")

    (check,) = ucx_protocol_checks(broken)  # type: ignore[arg-type]
    assert check.status is Status.WARN
    assert "cannot create NIXL agent" in check.detail
