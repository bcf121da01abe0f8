"""The ready line: the one JSON line each process prints first on stdout when it is ready.

Contract (``docs/architecture.md``, "Start-up and shutdown"): exactly one line,
``{"event": "ready", "role": ..., "participant_id": ..., "endpoint": ..., "config_hash": ...,
"version": ...}``, before anything else on stdout. Logs go to stderr.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from lensemble.errors import IntegrityError
from lensemble.stack import StackFailed

ROLES = ("coordinator", "participant")


@dataclass(frozen=True)
class ReadyLine:
    """What a process announced when it became ready.

    Attributes:
        role: ``coordinator`` or ``participant``.
        participant_id: The participant's id; None for the coordinator.
        endpoint: Where the process serves (``host:port``).
        config_hash: Hash of the config the process read (``sha256-canon-v1:<hex>``).
        version: Lensemble version of the process.
    """

    role: str
    participant_id: str | None
    endpoint: str
    config_hash: str
    version: str


def _preview(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_ready_line(line: str, *, service: str) -> ReadyLine:
    """Parse one ready line.

    Args:
        line: One line of the process's stdout, without its newline.
        service: Service the line came from, named in errors.

    Returns:
        The parsed ready line.

    Raises:
        StackFailed: The line is not a JSON object with ``"event": "ready"``, or a field is
            missing or has the wrong type.
    """
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        record = None
    if not isinstance(record, dict) or record.get("event") != "ready":
        raise StackFailed(
            f"{service} printed {_preview(line)!r} where its ready line belongs (the first line "
            'on stdout must be JSON with "event": "ready").',
            remediation="Check that the image runs `lensemble serve` and that nothing else "
            "writes to stdout before it is ready.",
        )
    role = record.get("role")
    participant_id = record.get("participant_id")
    fields = {k: record.get(k) for k in ("endpoint", "config_hash", "version")}
    wrong = [k for k, v in fields.items() if not isinstance(v, str) or not v]
    if role not in ROLES:
        wrong.insert(0, "role")
    if participant_id is not None and not isinstance(participant_id, str):
        wrong.append("participant_id")
    if wrong:
        raise StackFailed(
            f"{service} printed a ready line with missing or invalid {', '.join(wrong)}: "
            f"{_preview(line)!r}.",
            remediation="The image and this lensemble are probably different versions; "
            "rebuild the image from this checkout.",
        )
    return ReadyLine(
        role=str(role),
        participant_id=participant_id,
        endpoint=str(fields["endpoint"]),
        config_hash=str(fields["config_hash"]),
        version=str(fields["version"]),
    )


def first_ready_line(stdout: str, *, service: str) -> ReadyLine | None:
    """The ready line at the start of a process's stdout, or None while it is not complete.

    Args:
        stdout: Everything the process has written to stdout so far.
        service: Service the output came from, named in errors.

    Raises:
        StackFailed: The first complete line is not a valid ready line.
    """
    line, newline, _ = stdout.partition("\n")
    if not newline:
        return None
    return parse_ready_line(line.rstrip("\r"), service=service)


def check_ready_line(
    ready: ReadyLine,
    *,
    service: str,
    role: str,
    participant_id: str | None,
    config_hash: str,
) -> None:
    """Check that a ready line comes from the process the stack expected, on the same config.

    Args:
        ready: The parsed ready line.
        service: Service it came from, named in errors.
        role: The role the service was rendered for.
        participant_id: The participant the service was rendered for (None: coordinator).
        config_hash: Hash of the source config the stack was rendered from.

    Raises:
        StackFailed: Role or participant id differ from what the service was rendered for.
        IntegrityError: The process read a config with another hash (fails closed: it would
            train something else than the config says).
    """
    if ready.role != role or (role == "participant" and ready.participant_id != participant_id):
        who = role if participant_id is None else f"participant '{participant_id}'"
        got = (
            ready.role if ready.participant_id is None else f"{ready.role} '{ready.participant_id}'"
        )
        raise StackFailed(
            f"{service} announced itself as {got} but was rendered as {who}.",
            remediation="Check LENSEMBLE_ROLE and LENSEMBLE_PARTICIPANT_ID in the Compose file.",
        )
    if ready.config_hash != config_hash:
        raise IntegrityError(
            f"{service} runs on config hash {ready.config_hash}, but the stack was rendered "
            f"from {config_hash}.",
            remediation="Render again and restart the stack; `lensemble config diff` names "
            "the fields that differ.",
        )
