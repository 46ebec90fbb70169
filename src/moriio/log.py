"""structlog loggers that write through stdlib ``logging``.

moriio never configures logging globally (no ``structlog.configure()``, no
``logging.basicConfig()``): records go to the stdlib logger of the same name, so whoever
owns the process (vLLM, an application) decides where they end up.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any, cast

import structlog
from structlog.typing import FilteringBoundLogger


def _render(_: Any, __: str, event: MutableMapping[str, Any]) -> str:
    """``event key=value ...``: one line a stdlib handler can format."""
    message = str(event.pop("event", ""))
    fields = " ".join(f"{key}={value!r}" for key, value in event.items())
    return f"{message} {fields}" if fields else message


def get_logger(name: str, **context: Any) -> FilteringBoundLogger:
    """A structlog logger bound to ``context`` that logs through ``logging.getLogger(name)``."""
    logger = structlog.wrap_logger(
        logging.getLogger(name),
        processors=[_render],
        wrapper_class=structlog.stdlib.BoundLogger,
        context_class=dict,
    )
    return cast(FilteringBoundLogger, logger.bind(**context) if context else logger)
