"""Region descriptor exchanged between NIXL engines.

It carries what the importer needs to address the region (agent name, region id, absolute
address, length, device id, memory kind) plus the owner's *partial* NIXL metadata for that
region, so a region registered after the peers exchanged agent metadata is still reachable.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from moriio.ports import MemoryKind

_MAGIC = b"MIOX"
_VERSION = 1
_HEADER = struct.Struct("<4sBBiIQQH")  # magic, version, kind, device id, region id, addr, len, name
_KINDS = (MemoryKind.HOST, MemoryKind.DEVICE)


@dataclass(frozen=True, slots=True)
class NixlRegionDescriptor:
    agent: str
    region_id: int
    addr: int
    length: int
    device_id: int
    kind: MemoryKind
    agent_metadata: bytes  # NIXL partial metadata describing this region

    def encode(self) -> bytes:
        name = self.agent.encode()
        header = _HEADER.pack(
            _MAGIC,
            _VERSION,
            _KINDS.index(self.kind),
            self.device_id,
            self.region_id,
            self.addr,
            self.length,
            len(name),
        )
        return header + name + self.agent_metadata

    @classmethod
    def decode(cls, raw: bytes) -> NixlRegionDescriptor:
        """Parse ``raw``; ValueError naming the defect when it is not a descriptor."""
        if len(raw) < _HEADER.size:
            raise ValueError(f"NIXL region descriptor too short ({len(raw)} bytes)")
        magic, version, kind, device_id, region_id, addr, length, name_len = _HEADER.unpack_from(
            raw
        )
        if magic != _MAGIC or version != _VERSION:
            raise ValueError(f"not a NIXL region descriptor (magic {magic!r}, version {version})")
        if kind >= len(_KINDS):
            raise ValueError(f"NIXL region descriptor has unknown memory kind {kind}")
        end = _HEADER.size + name_len
        if len(raw) < end:
            raise ValueError("NIXL region descriptor truncated inside the agent name")
        return cls(
            agent=raw[_HEADER.size : end].decode(),
            region_id=region_id,
            addr=addr,
            length=length,
            device_id=device_id,
            kind=_KINDS[kind],
            agent_metadata=bytes(raw[end:]),
        )
