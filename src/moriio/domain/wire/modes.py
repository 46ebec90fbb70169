"""The two ways KV moves between a producer (prefill) and a consumer (decode)."""

from __future__ import annotations

import enum


class TransferMode(enum.Enum):
    READ = "read"  # decode pulls
    WRITE = "write"  # prefill pushes
