"""What a participant signed under masking: the latest survivor set, kept across restarts.

Once a participant has signed a session's survivor set, its masked input may be unmasked in that
session, so it takes part in no later attempt of that round and in no earlier round index
(docs/security.md, *one sum per update*). :class:`SignedRounds` is that record. With a file it
outlives the process: the session is written there (atomically, fsync'd) before the signature
leaves, so a participant restarted in the middle of a run still refuses to put a round's update
into a second sum. The file sits beside the participant's inner-state snapshots
(``participants/<id>/state/``, :class:`~lensemble.federation.checkpoint.InnerStateStore`), on
the volume that keeps them in Compose and on Kubernetes.

A new run in a folder that already holds a record is refused those rounds too: the participant
cannot tell it from a coordinator rerunning them, so starting over is the operator's choice to
make (a new ``run.output_dir``, or deleting the file; the refusal names both).
"""

from __future__ import annotations

import json
from pathlib import Path

from lensemble.durable import atomic_write
from lensemble.errors import IntegrityError
from lensemble.federation.masking import SessionKey

#: The record's file name inside a participant's state folder.
FILE_NAME = "masking-signed.json"
#: The longest record file read (bytes): three small integers in JSON.
MAX_BYTES = 4096


class SignedRounds:
    """The latest survivor set a participant signed: one round's, by its session.

    Shared by every :class:`~lensemble.federation.masking_client.MaskingClient` of one
    participant (over the network each attempt gets a client of its own).

    Args:
        path: The record file; None keeps it in memory only (a restarted process forgets it).

    Raises:
        IntegrityError: ``path`` exists but does not hold a record (names the file and the fix).
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.latest: SessionKey | None = _read(path) if path is not None else None

    def record(self, key: SessionKey) -> None:
        """Remember that ``key``'s survivor set is signed, durably when there is a file.

        Called before the signature leaves the participant.

        Raises:
            DiskFull, DiskError: The file cannot be written (the signature then never leaves).
        """
        if self.path is not None:
            body = {"round": key.round_index, "attempt": key.attempt, "group": key.group}
            atomic_write(self.path, json.dumps(body, sort_keys=True).encode() + b"\n")
        self.latest = key

    def at_or_after(self, round_index: int) -> SessionKey | None:
        """The signed session of ``round_index`` or of a later round, or None.

        A later one counts too: a coordinator that goes back to an earlier round index has the
        participant retrain a round it already trained (same batches, a model the coordinator
        chooses), close to an update already in an unmasked sum.
        """
        latest = self.latest
        return latest if latest is not None and latest.round_index >= round_index else None

    def where(self) -> str:
        """Where the record is kept, for messages: the file, or this process's memory."""
        return str(self.path) if self.path is not None else "this process's memory"


def record_path(state_folder: Path | None) -> Path | None:
    """The record file in a participant's state folder (None without one)."""
    return state_folder / FILE_NAME if state_folder is not None else None


def _read(path: Path) -> SessionKey | None:
    """The session recorded in ``path``; None when there is no file."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _unusable(path, exc.strerror or str(exc)) from None
    try:
        if len(raw) > MAX_BYTES:
            raise ValueError(f"longer than {MAX_BYTES} bytes")
        body = json.loads(raw)
        values = [body[k] for k in ("round", "attempt", "group")]
        if not all(type(v) is int and 0 <= v < 2**31 for v in values):
            raise ValueError("round, attempt and group must be integers in [0, 2^31)")
    except (ValueError, TypeError, KeyError) as exc:
        raise _unusable(path, str(exc)) from None
    return SessionKey(*values)


def _unusable(path: Path, why: str) -> IntegrityError:
    return IntegrityError(
        f"the record of the survivor sets this participant signed, {path}, cannot be read "
        f"({why.rstrip('.')});",
        remediation=f"restore it from a backup; deleting {path} lets this participant mask "
        "again in rounds it already signed, so that a coordinator could sum one of its updates "
        "twice: do it only for a new run.",
    )
