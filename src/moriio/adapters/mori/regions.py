"""Local regions of the mori adapter: one mori registration per allocation.

vLLM views every layer's KV cache in one shared buffer (padded to 4 KiB on ROCm so that it
can be registered whole). A region registered with an ``allocation`` becomes a view of that
allocation, which is registered with mori once, whatever the number of its views; a region
registered alone is its own memory. The memory goes back to mori once its last region was
deregistered and no transfer can land in it any more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from moriio.adapters.mori.lanes import Lanes
from moriio.adapters.mori.memory import unmapped_gap
from moriio.adapters.mori.views import VIEW_IDS, View, encode_view
from moriio.ports import Allocation, LocalRegion, MemoryKind, TransferEngineError

SharedKey = tuple[int, int, MemoryKind, int]  # allocation address, length, kind, device


@dataclass(slots=True, eq=False)
class Memory:
    """One registration with mori: a whole allocation, or a region registered alone."""

    mem_id: int  # the lane 0 MemoryDesc id
    addr: int
    length: int
    kind: MemoryKind
    device_id: int
    desc: Any  # lane 0 MemoryDesc
    shared: SharedKey | None = None  # set for an allocation regions are views of
    regions: set[int] = field(default_factory=set)  # live regions lying in it


@dataclass(frozen=True, slots=True)
class Local:
    """A registered region and the mori memory it lies in."""

    region: LocalRegion
    memory: Memory
    base: int  # byte offset of the region inside its memory


class LocalRegions:
    """The adapter's registered regions and the mori memories they lie in.

    Call with the adapter lock held. A memory left without regions is *doomed*: it goes back
    to mori, on every lane, once :meth:`release_doomed` learns that no transfer uses it.
    """

    def __init__(self, lanes: Lanes) -> None:
        self.memories: dict[int, Memory] = {}  # live registrations by memory id
        self._lanes = lanes
        self._regions: dict[int, Local] = {}
        self._shared: dict[SharedKey, Memory] = {}  # live allocations regions are views of
        self._memory_of: dict[int, int] = {}  # region id -> memory id, kept after deregistration
        self._next_view = VIEW_IDS
        self._doomed: dict[int, Memory] = {}  # no region left, waiting for quiet transfers

    def get(self, region_id: int) -> Local | None:
        return self._regions.get(region_id)

    def register(
        self,
        addr: int,
        length: int,
        kind: MemoryKind,
        device_id: int,
        allocation: Allocation | None,
    ) -> LocalRegion:
        """Register a region; inside ``allocation``, a view of it (registered once)."""
        whole = allocation or Allocation(addr, length)
        shared = None if allocation is None else (whole.addr, whole.length, kind, device_id)
        memory = None if shared is None else self._shared.get(shared)
        if memory is None:
            memory = self._register_memory(whole, kind, device_id, shared)
        packed = bytes(memory.desc.pack())
        if shared is None:
            region = LocalRegion(memory.mem_id, addr, length, kind, device_id, packed)
        else:
            view = View(self._next_view, addr - whole.addr, length, packed)
            self._next_view += 1
            descriptor = encode_view(view)
            region = LocalRegion(view.region_id, addr, length, kind, device_id, descriptor)
        memory.regions.add(region.region_id)
        self._regions[region.region_id] = Local(region, memory, addr - memory.addr)
        self._memory_of[region.region_id] = memory.mem_id
        return region

    def deregister(self, region: LocalRegion) -> Memory | None:
        """Refuse new posts on ``region``; the memory it lay in, if that holds no region any
        more (doomed from now on: its sessions are stale)."""
        local = self._regions.get(region.region_id)
        if local is None or local.region != region:
            raise TransferEngineError(f"region {region.region_id} is not registered here")
        del self._regions[region.region_id]
        memory = local.memory
        memory.regions.discard(region.region_id)
        if memory.regions:
            return None
        del self.memories[memory.mem_id]
        if memory.shared is not None:
            del self._shared[memory.shared]
        self._doomed[memory.mem_id] = memory
        return memory

    def memory(self, mem_id: int) -> Memory | None:
        """Memory ``mem_id``, live or doomed (batches posted before its last region went may
        still be posted into it)."""
        return self.memories.get(mem_id) or self._doomed.get(mem_id)

    @property
    def has_doomed(self) -> bool:
        return bool(self._doomed)

    def is_doomed(self, region: LocalRegion) -> bool:
        """Whether the memory ``region`` lay in still waits to go back to mori."""
        return self._memory_of.get(region.region_id) in self._doomed

    def release_doomed(self, busy: set[int]) -> None:
        """Hand back to mori each doomed memory whose id is not in ``busy``."""
        for mem_id in [m for m in self._doomed if m not in busy]:
            del self._doomed[mem_id]
            self._lanes.deregister_memory(mem_id)

    def clear(self) -> None:
        self._regions.clear()
        self.memories.clear()
        self._shared.clear()
        self._memory_of.clear()
        self._doomed.clear()

    def _register_memory(
        self, whole: Allocation, kind: MemoryKind, device_id: int, shared: SharedKey | None
    ) -> Memory:
        if kind is MemoryKind.HOST and (gap := unmapped_gap(whole.addr, whole.length)) is not None:
            raise ValueError(
                f"cannot register {whole.length} bytes at {whole.addr:#x}: {gap:#x} is not "
                "mapped read-write in this process (mori would abort when the NIC "
                "registration fails)"
            )
        lane = self._lanes.first
        desc = self._lanes.register_memory(lane, whole.addr, whole.length, kind, device_id)
        memory = Memory(int(desc.id), whole.addr, whole.length, kind, device_id, desc, shared)
        lane.locals[memory.mem_id] = desc
        self.memories[memory.mem_id] = memory
        if shared is not None:
            self._shared[shared] = memory
        return memory
