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
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any, cast

import structlog
from structlog.typing import FilteringBoundLogger

_RECORD_KEYS = ("exc_info", "stack_info")  # passed to the stdlib record, not rendered


def _render(_: Any, __: str, event: MutableMapping[str, Any]) -> tuple[tuple[str], dict[str, Any]]:
    """``event key=value ...``: one line a stdlib handler can format (no %-args)."""
    record = {key: event.pop(key) for key in _RECORD_KEYS if key in event}
    message = str(event.pop("event", ""))
    fields = " ".join(f"{key}={value!r}" for key, value in event.items())
    return (f"{message} {fields}" if fields else message,), record


def get_logger(name: str, **context: Any) -> FilteringBoundLogger:
    """A structlog logger bound to ``context`` that logs through ``logging.getLogger(name)``."""
    logger = structlog.wrap_logger(
        logging.getLogger(name),
        processors=[structlog.stdlib.filter_by_level, _render],
        wrapper_class=structlog.stdlib.BoundLogger,
        context_class=dict,
    )
    return cast(FilteringBoundLogger, logger.bind(**context) if context else logger)
