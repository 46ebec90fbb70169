"""Clock port: the only way the domain learns the time."""

from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds. Fakes advance it by hand so timeout tests are instant."""

    def now(self) -> float:
        """Current monotonic time in seconds."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` (a fake clock advances instead)."""
        ...
