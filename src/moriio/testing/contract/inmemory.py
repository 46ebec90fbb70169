"""The contract harness of the in-memory engine (the reference every other engine matches)."""

from __future__ import annotations

from moriio.ports import RemoteRegion, TransferEngine
from moriio.testing.contract.harness import EngineHarness, pattern, share_region
from moriio.testing.inmemory import InMemoryFabric, InMemoryTransferEngine


class InMemoryHarness(EngineHarness):
    kind = "inmemory"

    def __init__(self) -> None:
        super().__init__()
        self.fabric = InMemoryFabric()

    def create(self, name: str) -> TransferEngine:
        return InMemoryTransferEngine(name, self.fabric, complete_after_polls=2)

    def inject_backpressure(self, engine: TransferEngine, count: int) -> None:
        if not isinstance(engine, InMemoryTransferEngine):
            raise TypeError(f"expected an InMemoryTransferEngine, got {type(engine).__name__}")
        engine.inject_backpressure(count)

    def hold_completion(self, engine: TransferEngine, hold: bool) -> bool:
        if not isinstance(engine, InMemoryTransferEngine):
            raise TypeError(f"expected an InMemoryTransferEngine, got {type(engine).__name__}")
        engine.hang = hold
        return True

    def dead_peer(self, initiator: TransferEngine) -> RemoteRegion:
        doomed = self.engine("doomed")
        remote = share_region(self, doomed, initiator, pattern(99))
        doomed.close()
        return remote
