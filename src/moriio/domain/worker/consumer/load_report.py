"""What the decode worker tells vLLM after a step about its loads."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class LoadReport:
    """Loads finished (asynchronous ones), failed, and the blocks whose KV did not land."""

    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    invalid_block_ids: set[int] = field(default_factory=set)
