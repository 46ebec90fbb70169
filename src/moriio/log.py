"""structlog loggers that write through stdlib ``logging``.

moriio never configures logging globally (no ``structlog.configure()``, no
``logging.basicConfig()``): records go to the stdlib logger of the same name, so whoever
owns the process (vLLM, an application) decides where they end up. The one style
everywhere, the domain included: a short event plus key/value fields, with ``transfer_id``,
``request_id`` and ``peer`` bound or passed wherever they are known::

    log = get_logger("moriio.consumer")
    log.warning("read failed", transfer_id=tid, request_id=rid, peer=str(peer), reason=msg)

Events below the stdlib logger's level cost no formatting; ``exc_info`` (and
``log.exception``) reach the stdlib record, so handlers print the traceback.

Each record names the line that logged it, not structlog's: ``pathname``, ``module``,
``lineno`` and ``funcName`` are the caller's, and ``filename`` is the caller's dotted module
(``moriio.domain.worker.poster``), so a handler formatting ``[%(filename)s:%(lineno)d]``, as
vLLM's does, shows which part of moriio wrote the line.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from types import FrameType
from typing import Any, cast

import structlog
from structlog.typing import FilteringBoundLogger

_RECORD_KEYS = ("exc_info", "stack_info")  # passed to the stdlib record, not rendered
_CALLER = "moriio_caller"  # the record attribute carrying the caller's place


def _render(_: Any, __: str, event: MutableMapping[str, Any]) -> tuple[tuple[str], dict[str, Any]]:
    """``event key=value ...``: one line a stdlib handler can format (no %-args)."""
    record = {key: event.pop(key) for key in _RECORD_KEYS if key in event}
    message = str(event.pop("event", ""))
    fields = " ".join(f"{key}={value!r}" for key, value in event.items())
    caller = _caller(sys._getframe(1))
    if caller is not None:
        record["extra"] = {_CALLER: caller}
    return (f"{message} {fields}" if fields else message,), record


def _caller(frame: FrameType | None) -> tuple[str, int, str, str] | None:
    """Path, line, function and module of the first frame outside structlog and this module."""
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module != __name__ and module.split(".", 1)[0] != "structlog":
            code = frame.f_code
            return code.co_filename, frame.f_lineno, code.co_name, module
        frame = frame.f_back
    return None


class _CallerFilter(logging.Filter):
    """Puts the caller's place, carried by :func:`_render`, on the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        caller = record.__dict__.pop(_CALLER, None)
        if caller is not None:
            record.pathname, record.lineno, record.funcName, record.filename = caller
            record.module = os.path.splitext(os.path.basename(record.pathname))[0]
        return True


_CALLER_FILTER = _CallerFilter()


def get_logger(name: str, **context: Any) -> FilteringBoundLogger:
    """A structlog logger bound to ``context`` that logs through ``logging.getLogger(name)``."""
    stdlib_logger = logging.getLogger(name)
    stdlib_logger.addFilter(_CALLER_FILTER)  # once: addFilter skips a filter already there
    logger = structlog.wrap_logger(
        stdlib_logger,
        processors=[structlog.stdlib.filter_by_level, _render],
        wrapper_class=structlog.stdlib.BoundLogger,
        context_class=dict,
    )
    return cast(FilteringBoundLogger, logger.bind(**context) if context else logger)
