"""Terminal outcomes of transfers: failures are data, never exceptions."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Outcome(enum.Enum):
    """How a transfer ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a transfer failed, or a peer reported failure
    EXPIRED = "expired"  # its deadline passed first

    @property
    def ok(self) -> bool:
        return self is Outcome.SUCCEEDED


@dataclass(frozen=True, slots=True)
class TransferResult:
    """The single terminal record of one transfer.

    ``request_id`` is the local request id where the ledger knows it. ``unfinished_layers``
    lists layers whose transfer was still outstanding when the transfer ended early (failure
    or expiry): their buffers may still be in use by the transport.
    """

    transfer_id: str
    outcome: Outcome
    message: str = ""
    request_id: str | None = None
    unfinished_layers: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.outcome.ok
