"""``moriio.log``: key/value events written through stdlib ``logging``."""

from __future__ import annotations

import logging

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
