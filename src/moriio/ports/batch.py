"""Validation of one posted batch of (local offset, remote offset, size) descriptors.

Shared by every TransferEngine: the contract says out-of-region descriptors are refused
before any byte moves.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from moriio.ports.transfer_engine import Allocation, TransferEngineError

Int64s = npt.NDArray[np.int64]
_INT64 = np.dtype(np.int64)


def _as_offsets(name: str, values: object) -> Int64s:
    if isinstance(values, np.ndarray) and values.dtype == _INT64 and values.ndim == 1:
        return values
    array = np.asarray(values)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise ValueError(
            f"{name} must be a 1-D integer array, got shape {array.shape} dtype {array.dtype}"
        )
    return array.astype(np.int64)


def _first_bad(local: Int64s, remote: Int64s, size: Int64s, lengths: tuple[int, int]) -> str:
    bad = size <= 0
    if bad.any():
        i = int(np.argmax(bad))
        return f"descriptor {i}: size {int(size[i])} is not positive"
    for side, offsets, length in (("local", local, lengths[0]), ("remote", remote, lengths[1])):
        bad = (offsets < 0) | (offsets > length - size)
        if bad.any():
            i = int(np.argmax(bad))
            start, end = int(offsets[i]), int(offsets[i]) + int(size[i])
            return (
                f"descriptor {i}: {side} bytes [{start}, {end}) lie outside the {side} "
                f"region of {length} bytes"
            )
    raise AssertionError("no bad descriptor found")


def check_batch(
    local_offsets: object,
    remote_offsets: object,
    sizes: object,
    local_length: int,
    remote_length: int,
) -> tuple[Int64s, Int64s, Int64s]:
    """Return the three arrays as 1-D int64; refuse any descriptor outside either region.

    Raises ValueError for malformed arrays and TransferEngineError for ranges outside a region.
    """
    local = _as_offsets("local_offsets", local_offsets)
    remote = _as_offsets("remote_offsets", remote_offsets)
    size = _as_offsets("sizes", sizes)
    if not local.shape == remote.shape == size.shape:
        raise ValueError(
            "local_offsets, remote_offsets and sizes differ in length: "
            f"{local.shape[0]}, {remote.shape[0]}, {size.shape[0]}"
        )
    if size.size == 0:
        return local, remote, size
    if size.size == 1:  # the latency path: scalar checks are ~10x cheaper than numpy calls
        lo, ro, n = int(local[0]), int(remote[0]), int(size[0])
        if n > 0 and 0 <= lo <= local_length - n and 0 <= ro <= remote_length - n:
            return local, remote, size
        raise TransferEngineError(_first_bad(local, remote, size, (local_length, remote_length)))
    # One pass; written as offset > length - size so huge values cannot overflow past the test.
    if (
        size.min() <= 0
        or min(local.min(), remote.min()) < 0
        or (local > local_length - size).any()
        or (remote > remote_length - size).any()
    ):
        raise TransferEngineError(_first_bad(local, remote, size, (local_length, remote_length)))
    return local, remote, size


def check_registration(addr: int, length: int, allocation: Allocation | None) -> None:
    """ValueError unless ``addr`` and ``length`` are positive and ``[addr, addr + length)``
    lies in ``allocation`` (None: anywhere): what every engine checks before registering."""
    if addr <= 0 or length <= 0:
        raise ValueError(f"cannot register addr={addr} length={length}: both must be > 0")
    if allocation is not None and not allocation.contains(addr, length):
        raise ValueError(
            f"{length} bytes at {addr:#x} do not lie in the allocation of {allocation.length} "
            f"bytes at {allocation.addr:#x}"
        )
