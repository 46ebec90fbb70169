"""Classification of mori ``TransferStatus`` codes into the port's transfer states.

Pure: works on the integer code and the message, so it is testable without mori. Code values
mirror ``mori.cpp.StatusCode`` (``include/mori/io/enum.hpp``).
"""

from __future__ import annotations

import enum

from moriio.ports import TransferState, TransferStatus


class MoriStatusCode(enum.IntEnum):
    SUCCESS = 0
    INIT = 1
    IN_PROGRESS = 2
    ERR_INVALID_ARGS = 11
    ERR_NOT_FOUND = 12
    ERR_RDMA_OP = 13
    ERR_BAD_STATE = 14
    ERR_GPU_OP = 15


ERR_BEGIN = 10
"""mori's ``Failed()`` is ``code > ERR_BEGIN``."""

SQ_FULL_MARKER = "SQ full"
"""What mori's RDMA backend writes when a post found the send queue full (after backing off)."""
DEGRADED_MARKER = "EP is degraded"
"""mori's refusal while an endpoint's orphaned work requests (left by a partial
``ibv_post_send``) are not released yet: temporary ("recovered degraded EP ... by releasing
orphaned WRs")."""
LANE_LOST_MARKERS = (
    "ibv_post_send",  # the provider refused a post: the endpoint is degraded or broken
    "fatal verbs async event",  # 1.2.4: "endpoint was failed by a fatal verbs async event"
    "retired by a fatal async event",  # 1.2.4: "endpoint retired by a fatal async event"
)
"""Messages after which mori never uses the endpoint again: transfers need new queue pairs."""


def lane_lost(message: str) -> bool:
    """Whether mori's ``message`` says the connection's endpoints are retired or broken."""
    return any(marker in message for marker in LANE_LOST_MARKERS)


_IN_PROGRESS = TransferStatus(TransferState.IN_PROGRESS)
_SUCCEEDED = TransferStatus(TransferState.SUCCEEDED)


def _code_name(code: int) -> str:
    try:
        return MoriStatusCode(code).name
    except ValueError:
        return f"code {code}"


def classify_status(code: int, message: str) -> TransferStatus:
    """Map a mori status to the port's state.

    ``ERR_RDMA_OP`` with "SQ full" in its message (the send queue had no room for the post)
    or "EP is degraded" (the endpoint refuses submissions until its orphaned work requests
    are released) is BACKPRESSURE (re-post later); every other failure is terminal. INIT and
    IN_PROGRESS are both IN_PROGRESS.
    """
    if code == MoriStatusCode.SUCCESS:
        return _SUCCEEDED
    if code in (MoriStatusCode.INIT, MoriStatusCode.IN_PROGRESS):
        return _IN_PROGRESS
    detail = f"mori {_code_name(code)}: {message}" if message else f"mori {_code_name(code)}"
    transient = SQ_FULL_MARKER in message or DEGRADED_MARKER in message
    if code == MoriStatusCode.ERR_RDMA_OP and transient:
        return TransferStatus(TransferState.BACKPRESSURE, detail)
    return TransferStatus(TransferState.FAILED, detail)
