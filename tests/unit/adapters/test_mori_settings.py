"""mori settings as mori applies them, and the host-memory check (pure, no mori needed).

mori's parsers (``mori/utils/env_utils.hpp``, ``include/mori/io/env.hpp``): an empty,
non-positive or unparsable ``MORI_IO_*`` value is ignored and the configured value kept.
"""

from __future__ import annotations

import math

import pytest

from moriio.adapters.mori import envparse
from moriio.adapters.mori.memory import unmapped_gap
from moriio.adapters.mori.settings import (
    DEFAULT_SQ_BACKOFF_US,
    RdmaTuning,
    check_advertised_host,
    effective_tuning,
    sq_backoff_us,
)
from moriio.domain.timing.policy import TransferPolicy
from moriio.ports import MemoryKind

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
    tuning, overrides, ignored = effective_tuning(RdmaTuning(), env)
    assert (tuning.qp_per_transfer, tuning.enable_notification) == (4, True)
    assert tuning.poll_cq_event_mode
    assert {o.variable for o in overrides} == {
        "MORI_IO_QP_PER_TRANSFER",
        "MORI_IO_ENABLE_NOTIFICATION",
        "MORI_IO_POLL_CQ_MODE",
    }
    assert ignored == ()


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("MORI_IO_QP_PER_TRANSFER", ""),  # empty: unset
        ("MORI_IO_QP_PER_TRANSFER", "0"),  # ParsePositiveInt rejects 0
        ("MORI_IO_QP_PER_TRANSFER", "-2"),
        ("MORI_IO_QP_PER_TRANSFER", "lots"),
        ("MORI_IO_QP_PER_TRANSFER", "4x"),  # strtol must consume all of it
        ("MORI_IO_POST_BATCH_SIZE", "0"),  # -1 or positive only
        ("MORI_IO_POST_BATCH_SIZE", "-3"),
        ("MORI_IO_QP_MAX_SEND_WR", "0"),  # ParsePositiveU32: 0 keeps the configured depth
        ("MORI_IO_ENABLE_CHUNKING", "maybe"),  # ParseBool knows 1/0/true/false/on/off/yes/no
        ("MORI_IO_ENABLE_NOTIFICATION", "enabled"),
        ("MORI_IO_POLL_CQ_MODE", "epoll"),
        ("MORI_IO_NUM_NICS_PER_TRANSFER", "0"),
    ],
)
def test_values_mori_rejects_keep_the_configured_setting(variable: str, raw: str) -> None:
    configured = RdmaTuning(qp_per_transfer=2, max_send_wr=4096)
    tuning, overrides, ignored = effective_tuning(configured, {variable: raw})
    assert tuning == configured
    assert overrides == ()
    assert [i.variable for i in ignored] == ([variable] if raw else [])


def test_parsers_follow_strtol_and_parse_bool() -> None:
    assert envparse.positive_int(" +7") == 7  # strtol skips blanks and takes a sign
    assert envparse.positive_int("7 ") is None  # ...but must end at the end
    assert envparse.positive_int(str(2**31)) is None
    assert envparse.positive_u32(str(2**31)) == 2**31
    assert [envparse.boolean(v) for v in ("YES", "Off", "1", "0", "2")] == [
        True,
        False,
        True,
        False,
        None,
    ]
    assert envparse.post_batch_size("-1") == -1
    assert envparse.event_poll_mode("POLLING") is False


def test_qp_retry_budget_is_read_with_mori_ranges() -> None:
    assert effective_tuning(RdmaTuning(), {})[0].qp_timeout == 14
    tuning, _, ignored = effective_tuning(
        RdmaTuning(), {"MORI_IO_QP_TIMEOUT": "18", "MORI_IO_QP_RETRY_CNT": "9"}
    )
    assert (tuning.qp_timeout, tuning.qp_retry_count) == (18, 7)  # 9 > 7: ignored
    assert [i.variable for i in ignored] == ["MORI_IO_QP_RETRY_CNT"]
    assert effective_tuning(RdmaTuning(), {"MORI_IO_QP_TIMEOUT": "0"})[0].qp_timeout == 0
    alias = effective_tuning(RdmaTuning(), {"MORI_RDMA_QP_TIMEOUT": "20"})[0]
    assert alias.qp_timeout == 20


@pytest.mark.parametrize(
    ("timeout", "retries", "nominal"),
    [(14, 7, 0.537), (16, 7, 2.147), (18, 3, 4.295), (10, 0, 0.0042)],
)
def test_settle_time_follows_the_queue_pairs_retry_budget(
    timeout: int, retries: int, nominal: float
) -> None:
    """4.096 us * 2**timeout * (retries + 1), up to four times that (the IBA lets a
    transport timer run 4x long), plus a margin."""
    settle = RdmaTuning(qp_timeout=timeout, qp_retry_count=retries).settle_deadline(100.0) - 100
    assert 4 * nominal <= settle <= 4 * nominal * 1.01 + 0.2
    if (timeout, retries) == (16, 7):
        assert settle > 2.0, "the 2 s the adapter used to assume is too short here"


def test_a_disabled_ack_timeout_is_never_quiet() -> None:
    assert math.isinf(RdmaTuning(qp_timeout=0).settle_deadline(5.0))
    assert TransferPolicy.rc_settle_deadline(5.0, 0, 7) == math.inf


def test_nics_per_transfer_is_ignored_for_gpu_memory() -> None:
    tuning = RdmaTuning(num_nics_per_transfer=2)
    assert tuning.nics_for(MemoryKind.DEVICE) == 1  # ResolveRequestedNics: GPU memory -> 1
    assert tuning.nics_for(MemoryKind.HOST) == 2


def test_sq_backoff_reads_the_variable_as_mori_does() -> None:
    assert sq_backoff_us({}) == DEFAULT_SQ_BACKOFF_US
    assert sq_backoff_us({"MORI_IO_SQ_BACKOFF_TIMEOUT_US": "1000"}) == 1000
    assert sq_backoff_us({"MORI_IO_SQ_BACKOFF_TIMEOUT_US": "0"}) == DEFAULT_SQ_BACKOFF_US
    assert sq_backoff_us({"MORI_IO_SQ_BACKOFF_TIMEOUT_US": ""}) == DEFAULT_SQ_BACKOFF_US


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
