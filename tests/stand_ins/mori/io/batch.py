"""How mori's RDMA backend turns a batch into work requests and post chains.

From ``RdmaBatchReadWrite`` (``src/io/rdma/common.cpp``): descriptors are sorted by remote
offset and merged while the remote side is contiguous (the local side extends the last
scatter/gather entry when contiguous, else adds one up to ``max_sge``). A merged work request
longer than the device's ``max_msg_sz`` fails the batch with ``ERR_INVALID_ARGS`` unless
chunking is on (then it is split as ``PlanChunkGeometry`` does). The work requests are posted
as chains of ``post_batch_size`` (auto: an even share per QP, capped by the send-queue depth);
chain ``i`` goes to QP ``(i + uid) % qps``. The multithread executor instead splits the
*descriptors* evenly over ``min(qps, workers)`` workers, each merging and posting its share on
one QP of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Piece = tuple[int, int, int]  # (local offset, remote offset, bytes)


@dataclass
class WorkRequest:
    remote: int  # remote offset of its first byte
    pieces: list[Piece] = field(default_factory=list)
    sges: int = 0

    @property
    def length(self) -> int:
        return sum(n for _, _, n in self.pieces)


def merge(descriptors: list[Piece], max_sge: int) -> list[WorkRequest]:
    """mori's sort-by-remote-offset and merge of one batch."""
    wrs: list[WorkRequest] = []
    for lo, ro, n in sorted(descriptors, key=lambda d: d[1]):
        last = wrs[-1] if wrs else None
        if last is not None and last.remote + last.length == ro:
            llo, _, ln = last.pieces[-1]
            if llo + ln == lo:
                last.pieces.append((lo, ro, n))
                continue
            if last.sges < max_sge:
                last.pieces.append((lo, ro, n))
                last.sges += 1
                continue
        wrs.append(WorkRequest(ro, [(lo, ro, n)], 1))
    return wrs


def too_long(wrs: list[WorkRequest], max_msg_sz: int) -> str | None:
    """mori's refusal of a merged work request the NIC cannot carry, if any."""
    for index, wr in enumerate(wrs):
        if wr.length > max_msg_sz:
            return (
                f"merged RDMA WR {index} length {wr.length} exceeds local max_msg_sz "
                f"{max_msg_sz}; enable RDMA transfer chunking or reduce batch size"
            )
    return None


def chunk(
    wrs: list[WorkRequest], chunk_bytes: int, max_chunks: int, max_msg_sz: int
) -> list[WorkRequest]:
    """Split each work request as ``PlanChunkGeometry`` / ``PlanSgeStreamChunks`` do."""
    out: list[WorkRequest] = []
    for wr in wrs:
        length = wr.length
        soft = min(-(-length // chunk_bytes), max_chunks) if length > chunk_bytes else 1
        count = max(soft, -(-length // max_msg_sz), 1)
        if count == 1 and all(n <= chunk_bytes for _, _, n in wr.pieces):
            out.append(wr)
            continue
        target = -(-length // count)
        current = WorkRequest(wr.remote)
        for piece in wr.pieces:
            lo, ro, n = piece
            while n > 0:
                take = min(target - current.length, n)
                current.pieces.append((lo, ro, take))
                current.sges += 1
                lo, ro, n = lo + take, ro + take, n - take
                if current.length == target:
                    out.append(current)
                    current = WorkRequest(ro)
        if current.pieces:
            out.append(current)
    return out


def chains(
    wrs: list[WorkRequest], qps: int, post_batch_size: int, depth: int
) -> list[list[WorkRequest]]:
    """The post chains of an inline post (chain ``i`` on QP ``(i + uid) % qps``)."""
    size = -(-len(wrs) // qps) if post_batch_size == -1 else post_batch_size
    size = max(1, min(size, depth))
    return [wrs[i : i + size] for i in range(0, len(wrs), size)]


def worker_splits(count: int, qps: int, workers: int) -> list[tuple[int, int]]:
    """``MultithreadExecutor::SplitWork``: descriptor ranges, one per active worker."""
    active = min(qps, workers)
    per = -(-count // active)
    splits = []
    for i in range(active):
        begin, end = i * per, min((i + 1) * per, count)
        splits.append((begin, end))
        if end >= count:
            break
    return splits
