"""Process logs on stderr, as JSON lines or text (``observability.log_format``).

Stdout carries exactly one line, the ready line (:mod:`lensemble.network.ready_announce`);
everything else goes to stderr. Structured events (``round_opened``, ``verdict``,
``round_closed``, ...) carry their fields, so launchers and tests follow a run by reading JSON
lines.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from lensemble.config import LensembleConfig
from lensemble.network.peer_text import one_line

ROOT_LOGGER = "lensemble"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, role, event and its fields."""

    def __init__(self, static: dict[str, Any]) -> None:
        super().__init__()
        self.static = static

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as one compact JSON line."""
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **self.static,
        }
        event = getattr(record, "event", None)
        if event:
            line["event"] = event
            line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``time level [identity] message``, the message always on one line."""

    def __init__(self, identity: str) -> None:
        super().__init__(f"%(asctime)s %(levelname)s [{identity}] %(message)s", "%H:%M:%S")

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The line, with control characters of the message escaped (no forged lines)."""
        record.message = one_line(record.message)
        return super().formatMessage(record)


def configure(config: LensembleConfig, role: str, participant_id: str | None = None) -> None:
    """Send the ``lensemble`` loggers to stderr in the configured format and level."""
    identity = participant_id or role
    handler = logging.StreamHandler(sys.stderr)
    if config.observability.log_format == "json":
        static = {"role": role, **({"participant_id": participant_id} if participant_id else {})}
        handler.setFormatter(JsonFormatter(static))
    else:
        handler.setFormatter(TextFormatter(identity))
    root = logging.getLogger(ROOT_LOGGER)
    root.handlers[:] = [handler]
    root.setLevel(config.observability.log_level)
    root.propagate = False


def event(
    logger: logging.Logger, name: str, message: str, level: int = logging.INFO, **fields: Any
) -> None:
    """Log a structured event: ``message`` for people, ``name`` and ``fields`` for machines."""
    logger.log(level, message, extra={"event": name, "fields": fields})
