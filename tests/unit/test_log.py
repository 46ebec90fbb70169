"""``moriio.log``: key/value events written through stdlib ``logging``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from moriio.log import get_logger


def test_events_reach_the_stdlib_logger_as_key_value_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = get_logger("moriio.test_log", peer="10.0.0.2:7000")
    with caplog.at_level(logging.INFO, logger="moriio.test_log"):
        log.bind(transfer_id="tx-1").warning("read failed", request_id="r-1", reason="100% off")
    [record] = caplog.records
    assert record.name == "moriio.test_log"
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "read failed peer='10.0.0.2:7000' transfer_id='tx-1' request_id='r-1' reason='100% off'"
    )


def test_events_below_the_level_are_dropped_before_rendering(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rendered: list[str] = []

    class Spy:
        def __repr__(self) -> str:
            rendered.append("x")
            return "spy"

    log = get_logger("moriio.test_log")
    with caplog.at_level(logging.WARNING, logger="moriio.test_log"):
        log.info("quiet", value=Spy())
        log.warning("loud", value=Spy())
    assert [r.getMessage() for r in caplog.records] == ["loud value=spy"]
    assert rendered == ["x"]


def test_exceptions_keep_their_traceback(caplog: pytest.LogCaptureFixture) -> None:
    log = get_logger("moriio.test_log")
    with caplog.at_level(logging.ERROR, logger="moriio.test_log"):
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("round failed", transfer_id="tx-2")
    [record] = caplog.records
    assert record.getMessage() == "round failed transfer_id='tx-2'"
    assert record.exc_info is not None
    assert record.exc_info[0] is RuntimeError
    assert "RuntimeError: boom" in caplog.text


def _line_of(marker: str) -> int:
    """The line of this file holding ``marker``."""
    lines = Path(__file__).read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if marker in text)


def test_records_name_the_module_and_line_that_logged_not_structlogs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = get_logger("moriio.test_log").bind(transfer_id="tx-3")
    with caplog.at_level(logging.DEBUG, logger="moriio.test_log"):
        log.info("landed")  # marker: info call
        log.log(logging.WARNING, "slow")  # marker: log call
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("failed")  # marker: exception call
    places = [(r.filename, r.lineno, r.funcName, r.pathname, r.module) for r in caplog.records]
    here = (__name__, __file__, Path(__file__).stem)
    name = "test_records_name_the_module_and_line_that_logged_not_structlogs"
    assert places == [
        (here[0], _line_of(f"marker: {call} call"), name, here[1], here[2])
        for call in ("info", "log", "exception")
    ]


def test_vllms_format_shows_the_moriio_module(caplog: pytest.LogCaptureFixture) -> None:
    vllm_style = logging.Formatter("%(levelname)s [%(filename)s:%(lineno)d] %(message)s")
    with caplog.at_level(logging.INFO, logger="moriio.test_log"):
        get_logger("moriio.test_log").warning("read failed", peer="p")  # marker: vllm style
    [record] = caplog.records
    line = vllm_style.format(record)
    assert line == f"WARNING [{__name__}:{_line_of('marker: vllm style')}] read failed peer='p'"
    assert "_base.py" not in line


def test_stdlib_records_of_the_same_logger_keep_their_own_place(
    caplog: pytest.LogCaptureFixture,
) -> None:
    get_logger("moriio.test_log")
    with caplog.at_level(logging.INFO, logger="moriio.test_log"):
        logging.getLogger("moriio.test_log").info("plain")  # marker: stdlib call
    [record] = caplog.records
    assert (record.filename, record.lineno) == ("test_log.py", _line_of("marker: stdlib call"))
