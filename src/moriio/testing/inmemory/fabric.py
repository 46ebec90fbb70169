"""What joins in-memory engines: the fabric they find each other on, and the post records."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from moriio.ports import PeerId, TransferHandle, TransferOp, TransferState
from moriio.ports.batch import Int64s

if TYPE_CHECKING:
    from moriio.testing.inmemory.engine import InMemoryTransferEngine


class InMemoryFabric:
    """The 'network' joining in-memory engines of one process, keyed by engine name."""

    def __init__(self) -> None:
        self._engines: dict[str, InMemoryTransferEngine] = {}
        self.lock = threading.RLock()
        """One lock for every engine on the fabric: a copy touches two engines at once."""

    def attach(self, engine: InMemoryTransferEngine) -> None:
        with self.lock:
            if engine.name in self._engines:
                raise ValueError(f"an engine named {engine.name!r} is already on this fabric")
            self._engines[engine.name] = engine

    def detach(self, name: str) -> None:
        with self.lock:
            self._engines.pop(name, None)

    def find(self, name: str) -> InMemoryTransferEngine | None:
        with self.lock:
            return self._engines.get(name)


@dataclass(frozen=True, slots=True, eq=False)
class PostRecord:
    """One call to ``post`` as the engine saw it (arrays are read-only copies)."""

    handle: TransferHandle
    op: TransferOp
    local_region: int
    peer: PeerId
    remote_region: int
    local_offsets: Int64s
    remote_offsets: Int64s
    sizes: Int64s
    tag: str
    outcome: TransferState  # IN_PROGRESS when accepted, else the state decided at post time


def decode_fields(raw: bytes, what: str) -> dict[str, str | int]:
    try:
        fields = json.loads(raw)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"malformed {what}: {exc}") from None
    if not isinstance(fields, dict) or not isinstance(fields.get("engine"), str):
        raise ValueError(f"malformed {what}: {raw[:64]!r}")
    return fields
