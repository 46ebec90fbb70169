"""The fence invariant: no byte lands in memory its owner has given back.

Every batch whose bytes move is checked at the moment they land (the chaos engine's
``on_land``), whichever side posted it and whenever it lands (late completions included):
each destination block must belong to the request the transfer is for, on a live node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from moriio.adapters.chaos.batches import Post
from moriio.ports import TransferOp
from moriio.testing.stacks.memory import HEAD_SIZE, HEADS, KVMemory
from moriio_tools.sim.invariants import BlockPool, Violation, violated

ITEMSIZE = 4  # int32


def landed_blocks(memory: KVMemory, offsets: Iterable[int], sizes: Iterable[int]) -> set[int]:
    """The blocks of one layer region that the descriptors touch (K and V alike)."""
    block_bytes = memory.block_size * HEADS * HEAD_SIZE * ITEMSIZE
    blocks: set[int] = set()
    for offset, size in zip(offsets, sizes, strict=True):
        first, last = offset // block_bytes, (offset + size - 1) // block_bytes
        blocks.update(b % memory.num_blocks for b in range(first, last + 1))
    return blocks


def request_id(tag: str, role: str) -> str:
    """The owner request of a batch tagged ``tx-<seed>-<uid>/<layer>`` on ``role``'s node."""
    transfer_id = tag.split("/", 1)[0]
    prefix = "p" if role == "producer" else "d"
    return f"{prefix}-{transfer_id.rsplit('-', 1)[1]}"


Owner = tuple[str, KVMemory, BlockPool]  # (role, memory, pool) of a live node


def fence_check(engine: str, find: Callable[[str], Owner | None]) -> Callable[[Post], None]:
    """An ``on_land`` hook for ``engine``'s batches; ``find`` maps a live engine name to its
    node (None: that incarnation is gone, so its memory is nobody's)."""

    def check(post: Post) -> None:
        if post.op is TransferOp.READ:
            target, offsets = engine, post.local_offsets
        else:
            target, offsets = str(post.remote.peer), post.remote_offsets
        owner = find(target)
        if owner is None:
            return
        role, memory, pool = owner
        rid = request_id(post.tag, role)
        written = landed_blocks(memory, offsets.tolist(), post.sizes.tolist())
        held = set(pool.owner_blocks(rid) or ())
        stray = sorted(written - held)
        if stray:
            raise violated(
                Violation.STRAY_WRITE,
                f"{role}: a {post.op.value} of {post.tag} landed in blocks {stray[:8]}, which "
                f"{rid} does not hold (given back, or given to another request)",
            )

    return check
