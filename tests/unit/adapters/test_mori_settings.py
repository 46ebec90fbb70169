"""mori settings as mori applies them, and the host-memory check (pure, no mori needed)."""

from __future__ import annotations

import pytest

from moriio.adapters.mori.memory import unmapped_gap
from moriio.adapters.mori.settings import (
    DEFAULT_SQ_BACKOFF_US,
    RdmaTuning,
    check_advertised_host,
    effective_tuning,
    sq_backoff_us,
)

MAPS = """\
00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/python
10000-20000 rw-p 00000000 00:00 0
20000-30000 rw-p 00000000 00:00 0
40000-50000 r--p 00000000 00:00 0
"""


def test_environment_wins_over_the_config_like_mori() -> None:
    env = {
        "MORI_IO_QP_PER_TRANSFER": "4",
        "MORI_IO_ENABLE_NOTIFICATION": "on",
        "MORI_IO_POLL_CQ_MODE": "event",
        "MORI_IO_POST_BATCH_SIZE": "-1",  # equal to the config: not an override
    }
    tuning, overrides = effective_tuning(RdmaTuning(), env)
    assert (tuning.qp_per_transfer, tuning.enable_notification) == (4, True)
    assert tuning.poll_cq_event_mode
    assert {o.variable for o in overrides} == {
        "MORI_IO_QP_PER_TRANSFER",
        "MORI_IO_ENABLE_NOTIFICATION",
        "MORI_IO_POLL_CQ_MODE",
    }


@pytest.mark.parametrize(
    ("tuning", "descriptors", "single"),
    [
        (RdmaTuning(), 8192, True),
        (RdmaTuning(), 8193, False),  # more WRs than one send queue holds
        (RdmaTuning(qp_per_transfer=2), 1, False),
        (RdmaTuning(post_batch_size=32), 1, False),
        (RdmaTuning(enable_transfer_chunking=True), 1, False),
        (RdmaTuning(max_send_wr=100), 101, False),
    ],
)
def test_single_chain_only_when_mori_cannot_split_the_batch(
    tuning: RdmaTuning, descriptors: int, single: bool
) -> None:
    assert tuning.single_chain(descriptors) is single


def test_unparsable_override_is_assumed_to_split_batches() -> None:
    tuning, _ = effective_tuning(RdmaTuning(), {"MORI_IO_QP_PER_TRANSFER": "lots"})
    assert not tuning.single_chain(1)


def test_sq_backoff_reads_the_variable() -> None:
    assert sq_backoff_us({}) == DEFAULT_SQ_BACKOFF_US
    assert sq_backoff_us({"MORI_IO_SQ_BACKOFF_TIMEOUT_US": "1000"}) == 1000


def test_advertised_host_accepts_ipv4_literals_only() -> None:
    assert check_advertised_host("10.1.2.3") == "10.1.2.3"
    with pytest.raises(ValueError, match="IPv4 address literal"):
        check_advertised_host("localhost")


@pytest.mark.parametrize(
    ("addr", "length", "gap"),
    [
        (0x10000, 0x20000, None),  # spans two adjacent read-write mappings
        (0x1F000, 0x2000, None),
        (0x28000, 0x10000, 0x30000),  # runs past the end
        (0x40000, 0x10, 0x40000),  # read-only
        (0x8000, 0x10, 0x8000),  # not mapped at all
    ],
)
def test_unmapped_gap_names_the_first_bad_address(addr: int, length: int, gap: int | None) -> None:
    assert unmapped_gap(addr, length, MAPS) == gap
