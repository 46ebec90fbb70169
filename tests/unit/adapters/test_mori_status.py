"""mori status classification: SQ full is backpressure, every other failure is terminal."""

from __future__ import annotations

import pytest

from moriio.adapters.mori import MoriStatusCode, classify_status
from moriio.ports import TransferState

SQ_FULL = (
    "SQ full (batch): ep=3 depth=8192 requested=64 max=8192 Hint: try increasing "
    "MORI_IO_QP_MAX_SEND_WR, reducing RdmaBackendConfig::postBatchSize (current effective "
    "value 32), or increasing RdmaBackendConfig::qpPerTransfer (current 1). Current per-QP "
    "send WR limit is 8192."
)


@pytest.mark.parametrize(
    ("code", "message", "state"),
    [
        (MoriStatusCode.SUCCESS, "", TransferState.SUCCEEDED),
        (MoriStatusCode.INIT, "", TransferState.IN_PROGRESS),
        (MoriStatusCode.IN_PROGRESS, "", TransferState.IN_PROGRESS),
        (MoriStatusCode.ERR_RDMA_OP, SQ_FULL, TransferState.BACKPRESSURE),
        (MoriStatusCode.ERR_RDMA_OP, "SQ full (notify): ep=0 depth=1", TransferState.BACKPRESSURE),
        (
            MoriStatusCode.ERR_RDMA_OP,
            "SQ request exceeds capacity (batch): n=9000",
            TransferState.FAILED,
        ),
        (
            MoriStatusCode.ERR_RDMA_OP,
            "EP is degraded, rejecting new submissions",
            TransferState.BACKPRESSURE,  # until its orphaned WRs are released
        ),
        (
            MoriStatusCode.ERR_RDMA_OP,
            "endpoint was failed by a fatal verbs async event; submission rejected",
            TransferState.FAILED,
        ),
        (MoriStatusCode.ERR_RDMA_OP, "transport retry counter exceeded", TransferState.FAILED),
        (MoriStatusCode.ERR_RDMA_OP, "", TransferState.FAILED),
        (MoriStatusCode.ERR_INVALID_ARGS, "SQ full", TransferState.FAILED),
        (MoriStatusCode.ERR_BAD_STATE, "No available backend found", TransferState.FAILED),
        (MoriStatusCode.ERR_NOT_FOUND, "", TransferState.FAILED),
        (MoriStatusCode.ERR_GPU_OP, "hipMemcpy failed", TransferState.FAILED),
        (99, "", TransferState.FAILED),
        (5, "", TransferState.FAILED),
    ],
)
def test_classification(code: int, message: str, state: TransferState) -> None:
    assert classify_status(int(code), message).state is state


def test_failures_carry_the_code_name_and_message() -> None:
    status = classify_status(MoriStatusCode.ERR_BAD_STATE, "No available backend found")
    assert status.message == "mori ERR_BAD_STATE: No available backend found"
    assert classify_status(99, "").message == "mori code 99"


def test_backpressure_keeps_mori_message() -> None:
    status = classify_status(MoriStatusCode.ERR_RDMA_OP, SQ_FULL)
    assert status.message.endswith(SQ_FULL)
    assert not status.state.is_terminal


def test_success_has_no_message() -> None:
    assert classify_status(0, "").message == ""


def test_codes_mirror_mori(mori_stand_in: object) -> None:
    from mori.cpp import StatusCode

    assert {c.name: int(c) for c in StatusCode} == {c.name: int(c) for c in MoriStatusCode}
