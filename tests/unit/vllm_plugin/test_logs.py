"""moriio's lines inside vLLM: through vLLM's own handler, naming the moriio module."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm.logging_utils.formatter import NewLineFormatter

from moriio.log import get_logger
from moriio.vllm_plugin.logs import route_logs_to_vllm

VLLM_FORMAT = "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"  # vLLM 0.32's


@pytest.fixture
def vllm_output() -> Iterator[io.StringIO]:
    """vLLM's handler and format on the ``vllm`` logger; ``moriio`` restored afterwards."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(NewLineFormatter(VLLM_FORMAT, "%m-%d %H:%M:%S"))
    vllm_logger, ours = logging.getLogger("vllm"), logging.getLogger("moriio")
    saved = (vllm_logger.handlers[:], ours.handlers[:], ours.level, ours.propagate)
    vllm_logger.handlers[:] = [handler]
    ours.handlers.clear()
    ours.setLevel(logging.NOTSET)  # as in a fresh process: an earlier test may have set it
    try:
        yield out
    finally:
        vllm_logger.handlers[:] = saved[0]
        ours.handlers[:] = saved[1]
        ours.setLevel(saved[2])
        ours.propagate = saved[3]


def test_a_moriio_line_in_vllms_log_names_its_module_and_line(vllm_output: io.StringIO) -> None:
    route_logs_to_vllm()
    get_logger("moriio.consumer").warning("read failed", transfer_id="t")  # the logging line
    lines = Path(__file__).read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if "# the logging line" in text)
    written = vllm_output.getvalue()
    assert f"[{__name__}:{line}] read failed transfer_id='t'" in written
    assert written.startswith("WARNING ")
    assert "_base.py" not in written
