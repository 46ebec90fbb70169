"""Local regions of the NIXL adapter: one NIXL registration per allocation.

vLLM views every layer's KV cache in one buffer, and moriio registers that buffer once more
whole (the span a request's batch moves against). A region registered with an
``allocation`` becomes a view of it: the allocation is registered with NIXL once, whatever
the number of its views (as vLLM's NixlConnector registers each storage once), and each
view's descriptor carries the allocation's metadata, so a peer may address any range of the
view. A region registered alone is its own registration. A registration goes back to NIXL
with the last region that uses it. Call with the engine's lock held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moriio.adapters.nixl.batches import MEM_TYPES, Local
from moriio.adapters.nixl.descriptor import NixlRegionDescriptor
from moriio.log import get_logger
from moriio.ports import Allocation, LocalRegion, MemoryKind, TransferEngineError

_log = get_logger(__name__)

SharedKey = tuple[int, int, MemoryKind, int]  # allocation address, length, kind, NIXL device


@dataclass(slots=True, eq=False)
class Registration:
    reg_descs: Any  # nixlRegDList returned by register_memory
    partial: bytes  # NIXL's partial agent metadata of it
    shared: SharedKey | None  # set for an allocation its regions are views of
    users: int = 0


class LocalRegions:
    """The engine's registered regions and the NIXL registrations they lie in."""

    def __init__(self, agent: Any, errors: tuple[type[Exception], ...], name: str) -> None:
        self._agent = agent
        self._errors = errors
        self._name = name
        self._regions: dict[int, tuple[Local, Registration]] = {}
        self._shared: dict[SharedKey, Registration] = {}
        self._next_region = 1

    def get(self, region_id: int) -> Local | None:
        entry = self._regions.get(region_id)
        return None if entry is None else entry[0]

    def register(
        self,
        addr: int,
        length: int,
        kind: MemoryKind,
        device_id: int,
        allocation: Allocation | None,
    ) -> LocalRegion:
        nixl_device = device_id if kind is MemoryKind.DEVICE else 0
        whole = allocation or Allocation(addr, length)
        shared = None if allocation is None else (whole.addr, whole.length, kind, nixl_device)
        registration = None if shared is None else self._shared.get(shared)
        if registration is None:
            registration = self._register(whole, kind, nixl_device, shared)
        region_id, self._next_region = self._next_region, self._next_region + 1
        descriptor = NixlRegionDescriptor(
            self._name, region_id, addr, length, nixl_device, kind, registration.partial
        ).encode()
        region = LocalRegion(region_id, addr, length, kind, device_id, descriptor)
        registration.users += 1
        local = Local(region, registration.reg_descs, nixl_device)
        self._regions[region_id] = (local, registration)
        return region

    def deregister(self, region: LocalRegion) -> None:
        entry = self._regions.get(region.region_id)
        if entry is None or entry[0].region != region:
            raise TransferEngineError(f"region {region.region_id} is not registered here")
        del self._regions[region.region_id]
        registration = entry[1]
        registration.users -= 1
        if registration.users == 0:
            if registration.shared is not None:
                del self._shared[registration.shared]
            self._agent.deregister_memory(registration.reg_descs)

    def close(self) -> None:
        """Give every registration back (the engine closes)."""
        registrations = {id(r): r for _, r in self._regions.values()}
        self._regions.clear()
        self._shared.clear()
        for registration in registrations.values():
            try:
                self._agent.deregister_memory(registration.reg_descs)
            except self._errors as exc:
                _log.warning("NIXL could not deregister region", error=str(exc))

    def _register(
        self, whole: Allocation, kind: MemoryKind, nixl_device: int, shared: SharedKey | None
    ) -> Registration:
        mem_type = MEM_TYPES[kind]
        reg = None
        try:
            reg = self._agent.register_memory(
                [(whole.addr, whole.length, nixl_device, "")], mem_type
            )
            partial = self._agent.get_partial_agent_metadata(reg, inc_conn_info=False)
        except self._errors as exc:
            if reg is not None:
                self._agent.deregister_memory(reg)
            raise TransferEngineError(
                f"NIXL cannot register {whole.length} bytes of {mem_type} at {whole.addr:#x}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        registration = Registration(reg, bytes(partial), shared)
        if shared is not None:
            self._shared[shared] = registration
        return registration
