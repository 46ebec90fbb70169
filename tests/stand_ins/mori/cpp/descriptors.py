"""``EngineDesc`` and ``MemoryDesc`` as mori 1.2.4 packs and unpacks them.

Both are ``MSGPACK_DEFINE`` structs (``include/mori/io/common.hpp``): a msgpack array of their
fields in declaration order. msgpack-c's array unpack is lenient: missing trailing fields keep
their defaults and extra ones are ignored, so ``b"\\x90"`` unpacks to an empty key and a peer
that appends a field (the 1.2.5 nightly's ``backendDescs``) still interoperates. Anything that
is not an array, or a field of the wrong type, throws (pybind: ``RuntimeError``). Read-only,
compared with ``==`` (the C++ ``operator==`` fields), unhashable.
"""

from __future__ import annotations

import enum
import os
import socket
from pathlib import Path
from typing import Any

import msgpack

from mori import stand_in

IPC_HANDLE_SIZE = 64
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class MemoryLocationType(enum.IntEnum):
    Unknown = 0
    CPU = 1
    GPU = 2


def node_id() -> str:
    """``mori::ResolveNodeId``: ``MORI_NODE_ID`` if set, else the kernel boot id, else the
    host name."""
    override = os.environ.get("MORI_NODE_ID")
    if override:
        return override
    try:
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        boot = ""
    return boot or socket.gethostname()


class _Descriptor:
    """Field order, defaults and types of one MSGPACK_DEFINE struct."""

    _FIELDS: tuple[tuple[str, type, object], ...] = ()  # (name, wire type, default)
    _EQ: tuple[str, ...] = ()  # the fields operator== compares

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"can't set attribute {name!r} of {type(self).__name__}")

    def _set(self, **fields: object) -> None:
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def _defaults(self) -> None:
        self._set(**{name: default for name, _, default in self._FIELDS})

    def _wire(self) -> list[object]:
        return [_plain(getattr(self, name)) for name, _, _ in self._FIELDS]

    def pack(self) -> bytes:
        return bytes(msgpack.packb(self._wire(), use_bin_type=True))

    @classmethod
    def _unpack(cls, raw: bytes) -> Any:
        if type(raw) is not bytes:  # pybind's py::bytes accepts bytes only
            raise TypeError(
                f"unpack(): incompatible function arguments: expected bytes, got "
                f"{type(raw).__name__}"
            )
        try:
            values = msgpack.unpackb(raw, raw=False)
        except Exception as exc:  # msgpack-c throws; pybind turns it into RuntimeError
            raise RuntimeError(f"msgpack unpack failed: {exc}") from exc
        if not isinstance(values, list):
            raise RuntimeError("std::bad_cast: msgpack object is not an array")
        obj = cls.__new__(cls)
        obj._defaults()
        for (name, kind, _), value in zip(cls._FIELDS, values, strict=False):
            if not _fits(kind, value):
                raise RuntimeError(f"std::bad_cast: field {name} is {type(value).__name__}")
            obj._set(**{name: value})
        return obj

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return False
        return all(getattr(self, name) == getattr(other, name) for name in self._EQ)

    __hash__ = None  # type: ignore[assignment]


def _fits(kind: type, value: object) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _plain(value: object) -> object:
    return int(value) if isinstance(value, enum.IntEnum) else value


class EngineDesc(_Descriptor):
    _FIELDS = (
        ("key", str, ""),
        ("node_id", str, ""),
        ("hostname", str, ""),
        ("host", str, ""),
        ("port", int, 0),
        ("pid", int, 0),
    )
    _EQ = ("key", "node_id", "hostname", "host", "port", "pid")
    key: str
    node_id: str
    hostname: str
    host: str
    port: int
    pid: int

    def __init__(self, key: str, host: str, port: int) -> None:
        self._set(
            key=key,
            node_id=node_id(),
            hostname=socket.gethostname(),
            host=host,
            port=port,
            pid=os.getpid(),
        )

    def _wire(self) -> list[object]:
        wire = super()._wire()
        if stand_in.NIGHTLY:  # 1.2.5.dev appends the backends' own descriptors
            wire.append({})
        return wire

    @staticmethod
    def unpack(raw: bytes) -> EngineDesc:
        desc: EngineDesc = EngineDesc._unpack(raw)
        return desc


class MemoryDesc(_Descriptor):
    _FIELDS = (
        ("engine_key", str, ""),
        ("id", int, 0),
        ("device_id", int, -1),
        ("device_bus_id", str, ""),
        ("data", int, 0),
        ("size", int, 0),
        ("loc", int, MemoryLocationType.Unknown),
        ("ipc_handle", bytes, bytes(IPC_HANDLE_SIZE)),
        ("numa_node", int, -1),
        ("ipc_offset", int, 0),
        ("fabric_handle", bytes, bytes(IPC_HANDLE_SIZE)),
        ("vpod_id", int, -1),
        ("vpod_ppod_id", str, ""),
        ("fabric_offset", int, 0),
        ("fabric_alloc_size", int, 0),
    )
    _EQ = (
        "engine_key",
        "id",
        "device_id",
        "device_bus_id",
        "data",
        "size",
        "loc",
        "numa_node",
        "ipc_offset",
    )
    engine_key: str
    id: int
    device_id: int
    device_bus_id: str
    data: int
    size: int
    loc: MemoryLocationType
    ipc_handle: bytes
    numa_node: int
    ipc_offset: int

    def __init__(self) -> None:
        self._defaults()

    @staticmethod
    def unpack(raw: bytes) -> MemoryDesc:
        desc: MemoryDesc = MemoryDesc._unpack(raw)
        try:
            desc._set(loc=MemoryLocationType(desc.loc))
        except ValueError as exc:
            raise RuntimeError(f"std::bad_cast: loc {desc.loc}") from exc
        return desc
