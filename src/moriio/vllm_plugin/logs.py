"""Send moriio's log records to wherever vLLM sends its own."""

from __future__ import annotations

import logging


def route_logs_to_vllm() -> None:
    """Attach vLLM's handlers to the ``moriio`` logger once (vLLM configures only ``vllm``)."""
    ours = logging.getLogger("moriio")
    if ours.handlers:
        return
    vllm_logger = logging.getLogger("vllm")
    for handler in vllm_logger.handlers:
        ours.addHandler(handler)
    if ours.level == logging.NOTSET:
        ours.setLevel(vllm_logger.level or logging.INFO)
    ours.propagate = False if ours.handlers else ours.propagate
