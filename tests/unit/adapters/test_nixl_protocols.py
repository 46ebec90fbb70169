"""UCX's protocol tables for device memory, read where users run: the probe captures them
while one block moves each way, a READ by software emulation is a warning with the fix, a
refused READ under a forbidden emulation says so, and other lines are not lost."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from moriio.adapters.nixl.protocols import (
    DirectionProtocols,
    parse_protocol_tables,
    probe_device_protocols,
    protocol_advice,
)
from moriio.ports import TransferOp
from moriio.testing.inmemory import InMemoryFabric, InMemoryTransferEngine

# As UCX 1.18 prints them (nixl-cu13 1.5.1 on an H200 without NVLink, 2026-12-04).
_STAMP, _PAD = "[1733301234.5] ", " " * 32
EMULATED = "\n".join(
    [
        _STAMP + "ucp_context_0 intra-node cfg#2 | remote memory read by ucp_get*(multi) "
        "into cuda/GPU0 from cuda/dev[1] |",
        _STAMP + _PAD + "|   0..inf | software emulation | tcp/lo |",
        _STAMP + "ucp_context_0 intra-node cfg#2 | remote memory write by ucp_put*(multi) "
        "from cuda/GPU0 to cuda/dev[1] |",
        _STAMP + _PAD + "|  0..8191 | short | cuda_ipc/cuda |",
        _STAMP + _PAD + "| 8192..inf | zero-copy | cuda_ipc/cuda |",
        "not a table line",
    ]
)


def test_the_tables_give_each_direction_s_protocols() -> None:
    chosen, other = parse_protocol_tables(EMULATED)
    assert chosen == {
        "read": {"software emulation (tcp/lo)"},
        "write": {"short (cuda_ipc/cuda)", "zero-copy (cuda_ipc/cuda)"},
    }
    assert other == ["not a table line"]


def test_a_read_by_emulation_is_a_warning_with_the_fix() -> None:
    found = DirectionProtocols("read", ("software emulation (tcp/lo)",))
    level, message = protocol_advice(found, {})
    assert level == "warning"
    assert "software emulation" in message
    assert "set UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y" in message
    write = DirectionProtocols("write", ("zero-copy (cuda_ipc/cuda)",))
    assert protocol_advice(write, {}) == ("info", "device WRITEs: zero-copy (cuda_ipc/cuda)")


def test_a_refused_read_under_forbidden_emulation_says_so() -> None:
    found = DirectionProtocols("read", (), "NIXL posting failed: NIXL_ERR_REMOTE_DISCONNECT")
    level, message = protocol_advice(found, {"UCX_PROTO_EMULATION_ENABLE": "n"})
    assert level == "warning"
    assert "UCX_PROTO_EMULATION_ENABLE=n forbids" in message
    assert "REMOTE_DISCONNECT" in message


class PrintingEngine(InMemoryTransferEngine):
    """Prints UCX's tables on its first post of each direction, as UCX does, when
    ``UCX_PROTO_INFO`` was set while it started; refuses READs when told to."""

    def __init__(self, name: str, fabric: InMemoryFabric, refuse_reads: bool) -> None:
        super().__init__(name, fabric)
        self._tables = os.environ.get("UCX_PROTO_INFO") == "y"
        self._refuse_reads = refuse_reads

    def post(self, op: TransferOp, *args: Any) -> Any:
        if self._tables:
            lines = EMULATED.splitlines()
            os.write(
                1, ("\n".join(lines[:2] if op is TransferOp.READ else lines[2:5]) + "\n").encode()
            )
        if op is TransferOp.READ and self._refuse_reads:
            self.inject_failures(1, "NIXL posting failed: NIXL_ERR_REMOTE_DISCONNECT")
        return super().post(op, *args)


@pytest.mark.parametrize("refuse_reads", [False, True])
def test_the_probe_captures_the_tables_while_one_block_moves_each_way(
    refuse_reads: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    fabric = InMemoryFabric()
    names = iter(("a", "b"))
    keep: list[np.ndarray] = []

    def scratch(nbytes: int) -> tuple[int, int, object]:
        keep.append(np.zeros(nbytes, np.uint8))
        return keep[-1].ctypes.data, 0, keep[-1]

    found = probe_device_protocols(
        scratch, lambda: PrintingEngine(next(names), fabric, refuse_reads), timeout=1.0
    )
    assert [f.direction for f in found] == ["read", "write"]
    assert found[0].protocols == ("software emulation (tcp/lo)",)
    assert found[1].protocols == ("short (cuda_ipc/cuda)", "zero-copy (cuda_ipc/cuda)")
    assert bool(found[0].failure) is refuse_reads
    assert found[1].failure == ""
    assert "UCX_PROTO_INFO" not in os.environ
    assert "software emulation" not in capfd.readouterr().out  # captured, not printed
