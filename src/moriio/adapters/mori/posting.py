"""Whether a post mori refused left any of its batch posted.

``RdmaBatchReadWrite`` (``src/io/rdma/common.cpp``) posts a batch inline as chains: at most
``post_batch_size`` work requests each (auto: an even share per queue pair), never more than
the send queue holds, chain ``i`` on queue pair ``(i + uid) % qps``. Each chain reserves room in
its queue before it is posted, so a refusal ("SQ full (batch): ep=E ...", "EP is degraded")
leaves the earlier chains posted. When there are no more chains than queue pairs, each queue
pair gets at most one chain, and the one named ``ep=E`` is the first exactly when
``E == uid % qps``: nothing was posted then. mori's worker pool (``num_worker_threads`` > 1)
posts each worker's share in parallel on its own queue pair (its messages always say
``ep=0``): only a batch that is one share is known to be untouched.

Work requests are counted before merging (mori only ever merges descriptors into fewer), plus
the extra ones chunking may split off (one per ``chunk_bytes`` of the batch at most).
"""

from __future__ import annotations

import re

from moriio.adapters.mori.settings import RdmaTuning
from moriio.ports import MemoryKind

_EP = re.compile(r"\bep=(\d+)")
_POSTED = re.compile(r"\(posted (\d+)/\d+ WRs\)")


def max_work_requests(tuning: RdmaTuning, descriptors: int, total_bytes: int) -> int:
    """An upper bound of the work requests mori turns a batch into."""
    extra = total_bytes // tuning.chunk_bytes if tuning.enable_transfer_chunking else 0
    return descriptors + extra


def one_chain(tuning: RdmaTuning, kind: MemoryKind, descriptors: int, total_bytes: int) -> bool:
    """Whether mori posts the whole batch as one chain on one queue pair."""
    if not tuning.inline_posting(kind):
        return descriptors <= 1 or min(tuning.qp_per_transfer, tuning.num_worker_threads) == 1
    wrs = max_work_requests(tuning, descriptors, total_bytes)
    cap = tuning.send_queue_depth
    if tuning.post_batch_size > 0:
        cap = min(cap, tuning.post_batch_size)
    return wrs <= cap and (tuning.qp_per_transfer == 1 or wrs <= 1)


def refused_before_posting(
    tuning: RdmaTuning,
    kind: MemoryKind,
    message: str,
    uid: int,
    descriptors: int,
    total_bytes: int,
) -> bool:
    """Whether mori's refusal ``message`` of the batch posted as ``uid`` came before any of
    its work requests reached a send queue (a re-post then cannot duplicate work). A failed
    ``ibv_post_send`` says how much of its own chain went out ("(posted k/n WRs)")."""
    if "ibv_post_send" in message:
        posted = _POSTED.search(message)
        if posted is None or int(posted.group(1)) > 0:
            return False
    if one_chain(tuning, kind, descriptors, total_bytes):
        return True
    if not tuning.inline_posting(kind):
        return False
    qps = tuning.qp_per_transfer
    cap = tuning.send_queue_depth
    if tuning.post_batch_size > 0:
        cap = min(cap, tuning.post_batch_size)
    if max_work_requests(tuning, descriptors, total_bytes) > qps * cap:
        return False  # more chains than queue pairs: ep=E no longer names one chain
    found = _EP.search(message)
    return found is not None and int(found.group(1)) == uid % qps
