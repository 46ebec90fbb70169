"""A hand-driven :class:`~moriio.ports.FenceSource`: fences complete when a test says so.

``stream`` names the stream the next fences are recorded on (as a thread switching to a
micro-batch stream would); every fence recorded is kept in ``recorded``.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class ManualFence:
    stream: Hashable
    label: str
    done: bool = False

    def is_complete(self) -> bool:
        return self.done


@dataclass(slots=True)
class ManualFences:
    stream: Hashable = "main"
    recorded: list[ManualFence] = field(default_factory=list)

    def record(self) -> ManualFence:
        fence = ManualFence(self.stream, f"{self.stream}#{len(self.recorded)}")
        self.recorded.append(fence)
        return fence

    def complete(self, *, stream: Hashable | None = None) -> int:
        """Complete every fence (of ``stream`` only, if given); return how many were open."""
        opened = [f for f in self.recorded if not f.done and stream in (None, f.stream)]
        for fence in opened:
            fence.done = True
        return len(opened)
