"""Process logs on stderr, as JSON lines or text (``observability.log_format``).

One setup for every process role (coordinator, participant): :func:`configure`.
``auto`` (the default) writes readable text when stderr is a terminal and JSON lines when it is
not (a container, a pipe, a file); ``json`` and ``text`` force one. JSON lines are rendered by
``python-json-logger`` and carry ``ts``, ``level``, ``logger``, ``message``, ``role``, ``run_id``
(``run.name``), ``participant`` in a participant's process, and for structured events
(``round_opened``, ``verdict``, ``round_closed``, ...) ``event`` and its fields (``round``,
``attempt``, ``participant``, ...), so launchers and tests follow a run by reading JSON lines.

Stdout carries exactly one line, the ready line (:mod:`lensemble.network.shared.ready_announce`);
everything else goes to stderr.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import IO, Any

from pythonjsonlogger.json import JsonFormatter as _LibraryJsonFormatter

from lensemble.config import LensembleConfig
from lensemble.network.shared.peer_text import one_line

ROOT_LOGGER = "lensemble"


class JsonFormatter(_LibraryJsonFormatter):
    """One JSON object per line: ts, level, logger, message, the static fields, event fields.

    Args:
        static: Fields every line carries (``role``, ``run_id``, ``participant``).
    """

    def __init__(self, static: dict[str, Any]) -> None:
        super().__init__(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            static_fields=static,
            json_default=str,
            json_indent=None,
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        """Lead with the UTC time in milliseconds; lift an event's fields to the top level."""
        log_data["ts"] = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z"
        )
        super().add_fields(log_data, record, message_dict)
        fields = log_data.pop("fields", None)
        if isinstance(fields, dict) and log_data.get("event"):
            for key, value in fields.items():
                log_data.setdefault(key, value)


class TextFormatter(logging.Formatter):
    """``time level [identity] message``, the message always on one line."""

    def __init__(self, identity: str) -> None:
        super().__init__(f"%(asctime)s %(levelname)s [{identity}] %(message)s", "%H:%M:%S")

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The line, with control characters of the message escaped (no forged lines)."""
        record.message = one_line(record.message)
        return super().formatMessage(record)


def wants_json(log_format: str, stream: IO[str]) -> bool:
    """True when ``log_format`` is ``json``, or ``auto`` and ``stream`` is not a terminal."""
    if log_format == "auto":
        isatty = getattr(stream, "isatty", None)
        return not (callable(isatty) and isatty())
    return log_format == "json"


def configure(config: LensembleConfig, role: str, participant_id: str | None = None) -> None:
    """Send the ``lensemble`` loggers to stderr in the configured format and level.

    Args:
        config: Gives ``observability.log_format``/``log_level`` and ``run.name`` (the run id).
        role: ``coordinator`` or ``participant``.
        participant_id: The participant of this process, if it is one.
    """
    stream = sys.stderr
    handler = logging.StreamHandler(stream)
    if wants_json(config.observability.log_format, stream):
        static: dict[str, Any] = {"role": role, "run_id": config.run.name}
        if participant_id:
            static["participant"] = participant_id
        handler.setFormatter(JsonFormatter(static))
    else:
        handler.setFormatter(TextFormatter(participant_id or role))
    root = logging.getLogger(ROOT_LOGGER)
    root.handlers[:] = [handler]
    root.setLevel(config.observability.log_level)
    root.propagate = False


def event(
    logger: logging.Logger, name: str, message: str, level: int = logging.INFO, **fields: Any
) -> None:
    """Log a structured event: ``message`` for people, ``name`` and ``fields`` for machines."""
    logger.log(level, message, extra={"event": name, "fields": fields})
