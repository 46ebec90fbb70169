"""Workers built like production ones on in-memory ports, chaos wrappers and a fake clock."""

from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST, Endpoint, Stack, Timing, build_stack

__all__ = ["HOST", "Endpoint", "KVMemory", "Stack", "Timing", "build_stack"]
