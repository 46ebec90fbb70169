"""Transfer ids of the shares of one WRITE transfer between different TP sizes.

A producer rank that writes into several consumer ranks (the consumer's TP size is larger)
pushes each its own share, as a transfer of its own: the consumer rank announces, and is
answered, under the share's id, so the producer keeps each share's capability, lease and
verdict apart. Share ``k`` of ``count`` is the transfer id itself when there is one share.
"""

from __future__ import annotations

from moriio.domain.params.transfer_params import MAX_TRANSFER_ID_LEN

SHARE_MARK = "#share"
SHARE_SUFFIX_LEN = len(SHARE_MARK) + 5  # a share index of up to 5 digits (MAX_TP_SIZE 1024)


def share_transfer_id(transfer_id: str, index: int, count: int) -> str:
    """The id of share ``index`` of ``count`` of ``transfer_id`` (the id itself for one)."""
    if not 0 <= index < count:
        raise ValueError(f"share index must be in [0, {count}), got {index}")
    if count == 1:
        return transfer_id
    return f"{transfer_id[: MAX_TRANSFER_ID_LEN - SHARE_SUFFIX_LEN]}{SHARE_MARK}{index}"
