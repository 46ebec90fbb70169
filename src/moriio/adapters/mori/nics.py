"""RDMA NIC families and the send-queue settings moriio chooses for each.

mori's RDMA backend posts a batch inline on the caller's thread, as post chains spread over
``qp_per_transfer`` queue pairs, unless ``num_worker_threads`` > 1 starts its worker pool
(each worker posts its share of the batch on its own queue pair, in parallel). What AMD
documents (ROCm/mori ``docs/MORI-IO-BENCHMARK.md`` and the 1.2.4 backend's warnings):

* ionic (AMD Pollara 400, MI355X systems): one QP per transfer "is prone to SQ full under
  load; consider increasing qpPerTransfer (e.g. 4)"; the send queue may be raised to the
  device maximum (``max_qp_wr``, 32,767 on ionic).
* bnxt_re (Broadcom Thor2): AMD's published write figures (48 GB/s at 1 MB, 29 GB/s at 16 KB,
  batch 128) use 4 QPs posted inline by one thread.
* mlx5 (NVIDIA ConnectX-7): AMD publishes mori's defaults (1 QP) only.

moriio keeps posting inline (one worker thread): then mori's "SQ full" names the queue pair
whose chain found no room, and when that is the first chain of the batch nothing was posted,
so the batch is safely re-posted (backpressure). With the worker pool the other workers may
already have posted their shares, so "SQ full" must fail the batch. Chunking is on with
1 GiB chunks: a merged work request longer than the NIC's ``max_msg_sz`` (2 GiB on mlx5 and
bnxt_re) is split instead of refused with ``ERR_INVALID_ARGS``, and shorter ones are left
whole.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

IB_CLASS = Path("/sys/class/infiniband")
DEFAULT_SEND_WR = 8192  # mori's send-queue depth when neither the config nor the env sets one
CHUNK_BYTES = 1 << 30  # chunking splits only work requests longer than this


class NicFamily(enum.Enum):
    IONIC = "ionic"
    BNXT_RE = "bnxt_re"
    MLX5 = "mlx5"
    OTHER = "other"  # an RDMA device of another kind, or none found


@dataclass(frozen=True, slots=True)
class SendQueueDefaults:
    """What moriio configures for a family when the connector's settings leave it open."""

    qp_per_transfer: int
    num_worker_threads: int
    max_send_wr: int
    send_wr_floor: int  # a floor of the family's max_qp_wr (mori never goes deeper than it)
    why: str


DEFAULTS = {
    NicFamily.IONIC: SendQueueDefaults(
        4, 1, 32767, 32767, "mori warns that 1 QP on ionic is prone to SQ full; SQ at max_qp_wr"
    ),
    NicFamily.BNXT_RE: SendQueueDefaults(
        4, 1, DEFAULT_SEND_WR, DEFAULT_SEND_WR, "AMD's Thor2 figures: 4 QPs posted inline"
    ),
    NicFamily.MLX5: SendQueueDefaults(
        1, 1, DEFAULT_SEND_WR, 32768, "mori's defaults (AMD's ConnectX-7 figures)"
    ),
    NicFamily.OTHER: SendQueueDefaults(
        1, 1, DEFAULT_SEND_WR, DEFAULT_SEND_WR, "mori's defaults (unknown NIC)"
    ),
}


def family_of(name: str) -> NicFamily:
    """The family of an RDMA device named ``name`` (``ionic_0``, ``bnxt_re1``, ``mlx5_2``)."""
    for family in (NicFamily.IONIC, NicFamily.BNXT_RE, NicFamily.MLX5):
        if name.startswith(family.value):
            return family
    return NicFamily.OTHER


def host_family(ib_class: Path = IB_CLASS) -> NicFamily:
    """The family of this host's RDMA devices (the first known one, in name order)."""
    try:
        names = sorted(p.name for p in ib_class.iterdir())
    except OSError:
        return NicFamily.OTHER
    families = [family_of(name) for name in names]
    known = [f for f in families if f is not NicFamily.OTHER]
    return known[0] if known else NicFamily.OTHER
