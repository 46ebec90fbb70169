"""Local regions of the mori adapter: one mori registration per allocation.

vLLM views every layer's KV cache in one shared buffer (padded to 4 KiB on ROCm so that it
can be registered whole). A region registered with an ``allocation`` becomes a view of that
allocation, which is registered with mori once, whatever the number of its views; a region
registered alone is its own memory. The memory goes back to mori once its last region was
deregistered and no transfer can land in it any more.
"""

from __future__ import annotations

from typing import Any

from moriio.adapters.mori.connections import Local, Memory, SharedKey
from moriio.adapters.mori.memory import unmapped_gap
from moriio.adapters.mori.settling import Settling
from moriio.adapters.mori.views import View, decode_view, encode_view
from moriio.ports import (
    Allocation,
    LocalRegion,
    MemoryKind,
    PeerId,
    RemoteRegion,
    TransferEngineError,
)
from moriio.ports.batch import check_registration


class Registry(Settling):
    """The registration half of :class:`~moriio.adapters.mori.MoriTransferEngine`."""

    _shared: dict[SharedKey, Memory]  # live allocations by (address, length, kind, device)
    _mem_of: dict[int, int]  # region id -> memory id, kept after deregistration
    _next_view: int

    def register_region(
        self,
        addr: int,
        length: int,
        kind: MemoryKind = MemoryKind.HOST,
        device_id: int = 0,
        allocation: Allocation | None = None,
    ) -> LocalRegion:
        """Register a region; inside ``allocation``, a view of it (registered once)."""
        check_registration(addr, length, allocation)
        whole = allocation or Allocation(addr, length)
        shared = None if allocation is None else (whole.addr, whole.length, kind, device_id)
        with self._lock:
            self._check_open()
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
            self._mem_of[region.region_id] = memory.mem_id
            return region

    def deregister_region(self, region: LocalRegion) -> None:
        """Refuse new posts on ``region`` now; once its memory holds no region any more, hand
        that memory back to mori when its work is quiet."""
        with self._lock:
            self._check_open()
            local = self._regions.get(region.region_id)
            if local is None or local.region != region:
                raise TransferEngineError(f"region {region.region_id} is not registered here")
            del self._regions[region.region_id]
            memory = local.memory
            memory.regions.discard(region.region_id)
            if not memory.regions:
                del self._memories[memory.mem_id]
                if memory.shared is not None:
                    del self._shared[memory.shared]
                self._drop_sessions(lambda k: k[1] == memory.mem_id)
                self._doomed[memory.mem_id] = memory
            self._reap(self._clock())

    def _register_memory(
        self, whole: Allocation, kind: MemoryKind, device_id: int, shared: SharedKey | None
    ) -> Memory:
        if kind is MemoryKind.HOST and (gap := unmapped_gap(whole.addr, whole.length)) is not None:
            raise ValueError(
                f"cannot register {whole.length} bytes at {whole.addr:#x}: {gap:#x} is not "
                "mapped read-write in this process (mori would abort when the NIC "
                "registration fails)"
            )
        lane = self._lanes[0]
        desc = self._register_on(lane, whole.addr, whole.length, kind, device_id)
        memory = Memory(int(desc.id), whole.addr, whole.length, kind, device_id, desc, shared)
        lane.locals[memory.mem_id] = desc
        self._memories[memory.mem_id] = memory
        if shared is not None:
            self._shared[shared] = memory
        return memory

    def _read_descriptor(self, peer: PeerId, descriptor: bytes) -> tuple[RemoteRegion, int, Any]:
        """(the region, its offset inside the remote memory, that memory's MemoryDesc)."""
        raw = bytes(descriptor)
        view = decode_view(raw)
        try:
            desc = self._io.MemoryDesc.unpack(raw if view is None else view.memory)
        except Exception as exc:  # the binding raises whatever msgpack raised
            raise ValueError(f"malformed mori memory descriptor: {exc}") from exc
        if view is None:
            return RemoteRegion(peer, int(desc.id), int(desc.size)), 0, desc
        if view.base + view.length > int(desc.size):
            raise ValueError(
                f"mori view {view.region_id} reaches past its memory ({view.base} + "
                f"{view.length} > {desc.size} bytes)"
            )
        return RemoteRegion(peer, view.region_id, view.length), view.base, desc
