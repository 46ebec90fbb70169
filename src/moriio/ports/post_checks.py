"""Checks every TransferEngine makes on what it is handed: imports, posts and batch handles.

Pure functions shared by the engines, so that each refuses the same misuse with the same
:class:`~moriio.ports.TransferEngineError` before any byte moves. A post is valid when its
local region is one the engine registered, its remote region one it imported, and every
descriptor lies inside both (:func:`moriio.ports.batch.check_batch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeVar

from moriio.ports.batch import Int64s, check_batch
from moriio.ports.transfer_engine import (
    LocalRegion,
    PeerId,
    RemoteRegion,
    TransferEngineError,
    TransferHandle,
)

Region_co = TypeVar("Region_co", covariant=True)
Batch = TypeVar("Batch")


class Holding(Protocol[Region_co]):
    """An engine's record of one region it registered or imported."""

    @property
    def region(self) -> Region_co: ...


Mine = TypeVar("Mine", bound=Holding[LocalRegion])
Theirs = TypeVar("Theirs", bound=Holding[RemoteRegion])


def check_import(peer: PeerId, known: bool, owner: object, owner_kind: str = "engine") -> None:
    """Refuse a region descriptor unless ``peer`` was added (``known``) and owns it.

    ``owner`` is the engine (of kind ``owner_kind``) the descriptor names.
    """
    if not known:
        raise TransferEngineError(f"unknown peer {peer!r}: call add_peer first")
    if owner != peer:
        raise TransferEngineError(
            f"descriptor belongs to {owner_kind} {owner!r}, not to peer {peer!r}"
        )


def check_post(
    local: LocalRegion,
    registered: LocalRegion | None,
    remote: RemoteRegion,
    imported: RemoteRegion | None,
    local_offsets: object,
    remote_offsets: object,
    sizes: object,
) -> tuple[Int64s, Int64s, Int64s]:
    """The batch's offsets and sizes as 1-D int64 arrays, once the post is valid.

    ``registered`` is the region the engine holds under ``local.region_id`` and ``imported``
    the one it holds under ``remote``'s peer and region id (None: nothing). Raises
    TransferEngineError for a region the engine does not hold or a descriptor outside either
    region, ValueError for malformed arrays.
    """
    if registered != local:
        raise _not_registered(local)
    if imported != remote:
        raise _not_imported(remote)
    return check_batch(local_offsets, remote_offsets, sizes, local.length, remote.length)


def check_held_post(
    local: LocalRegion,
    mine: Mine | None,
    remote: RemoteRegion,
    theirs: Theirs | None,
    local_offsets: object,
    remote_offsets: object,
    sizes: object,
) -> tuple[Mine, Theirs, Int64s, Int64s, Int64s]:
    """:func:`check_post` for an engine that keeps a record around each region.

    ``mine`` and ``theirs`` are its records under the ids of ``local`` and ``remote``; they
    come back with the batch's arrays once the post is valid.
    """
    if mine is None or mine.region != local:
        raise _not_registered(local)
    if theirs is None or theirs.region != remote:
        raise _not_imported(remote)
    lo, ro, sz = check_batch(local_offsets, remote_offsets, sizes, local.length, remote.length)
    return mine, theirs, lo, ro, sz


def known_batch(batches: Mapping[TransferHandle, Batch], handle: TransferHandle) -> Batch:
    """The batch posted under ``handle``; TransferEngineError if it is unknown or released."""
    batch = batches.get(handle)
    if batch is None:
        raise TransferEngineError(f"unknown or released transfer handle {handle}")
    return batch


def _not_registered(local: LocalRegion) -> TransferEngineError:
    return TransferEngineError(f"local region {local.region_id} is not registered")


def _not_imported(remote: RemoteRegion) -> TransferEngineError:
    return TransferEngineError(
        f"remote region {remote.region_id} of peer {remote.peer!r} is not imported"
    )
