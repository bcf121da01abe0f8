"""The byte encoding of every secure-aggregation message: versioned, length-prefixed, bounded.

A message is ``b"LSA"``, a version byte (:data:`VERSION`), a kind byte, then its fields in a
fixed order: unsigned big-endian integers (1, 4 or 8 bytes), and byte strings or UTF-8 text each
preceded by a 4-byte length that is checked against a per-field bound before anything is read.
Lists are a 4-byte count, bounded likewise, then their items. Nothing is ever unpickled; a
message with bytes left over after its last field is refused. Every parser error is a
:class:`~lensemble.federation.secagg.errors.SecAggRefusal` with reason ``bad_message``.
"""

from __future__ import annotations

import struct

from lensemble.federation.secagg.errors import Reason, SecAggRefusal

MAGIC = b"LSA"
VERSION = 1
#: Longest participant id accepted (bytes of UTF-8); config ids are far shorter.
MAX_ID_BYTES = 128
#: Most participants in one session (``federation.participant_count`` is at most 1024).
MAX_PARTICIPANTS = 1024
#: Longest signature accepted (bytes): DER ECDSA P-521 is at most 139, Ed25519 64.
MAX_SIGNATURE_BYTES = 160
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class Writer:
    """Appends fields to one message."""

    def __init__(self, kind: int) -> None:
        self._parts: list[bytes | memoryview] = [MAGIC, bytes((VERSION, kind))]

    def u8(self, value: int) -> Writer:
        """An integer in [0, 255]."""
        self._parts.append(bytes((value,)))
        return self

    def u32(self, value: int) -> Writer:
        """An integer in [0, 2**32)."""
        self._parts.append(_U32.pack(value))
        return self

    def u64(self, value: int) -> Writer:
        """An integer in [0, 2**64)."""
        self._parts.append(_U64.pack(value))
        return self

    def blob(self, value: bytes | memoryview) -> Writer:
        """Bytes, preceded by their length; a view is copied once, by :meth:`finish`."""
        view = memoryview(value).cast("B")
        self._parts.append(_U32.pack(len(view)))
        self._parts.append(view)
        return self

    def text(self, value: str) -> Writer:
        """UTF-8 text, preceded by its length in bytes."""
        return self.blob(value.encode())

    def finish(self) -> bytes:
        """The whole message."""
        return b"".join(self._parts)


class Reader:
    """Reads the fields of one message in order, refusing anything out of bounds.

    Args:
        data: The message.
        kind: The kind byte expected after the magic and version.
        what: The message's name, for errors.
        stage: The protocol stage, for errors.
    """

    def __init__(self, data: bytes | memoryview, kind: int, *, what: str, stage: str) -> None:
        self._data = memoryview(data).cast("B")
        self._pos = 0
        self._what = what
        self._stage = stage
        head = bytes(self._take(len(MAGIC) + 2, "header"))
        if head[: len(MAGIC)] != MAGIC:
            raise self.refuse("it does not start with the secure-aggregation magic")
        if head[len(MAGIC)] != VERSION:
            raise self.refuse(f"its version {head[len(MAGIC)]} is not {VERSION}")
        if head[len(MAGIC) + 1] != kind:
            raise self.refuse(f"its kind {head[len(MAGIC) + 1]} is not {kind}")

    def refuse(self, why: str) -> SecAggRefusal:
        """The refusal of this message, saying why."""
        return SecAggRefusal(
            Reason.BAD_MESSAGE,
            f"a {self._what} message is malformed: {why}.",
            stage=self._stage,
            remediation="The sender runs an incompatible or faulty version; it is left out.",
        )

    def _take(self, count: int, field: str) -> memoryview:
        end = self._pos + count
        if end > len(self._data):
            raise self.refuse(f"it ends inside the field {field}")
        view = self._data[self._pos : end]
        self._pos = end
        return view

    def u8(self, field: str) -> int:
        """An integer in [0, 255]."""
        return int(self._take(1, field)[0])

    def u32(self, field: str, *, maximum: int = 2**32 - 1) -> int:
        """An integer in [0, ``maximum``]."""
        value = int(_U32.unpack(self._take(4, field))[0])
        if value > maximum:
            raise self.refuse(f"{field} is {value}, above {maximum}")
        return value

    def u64(self, field: str, *, maximum: int = 2**64 - 1) -> int:
        """An integer in [0, ``maximum``]."""
        value = int(_U64.unpack(self._take(8, field))[0])
        if value > maximum:
            raise self.refuse(f"{field} is {value}, above {maximum}")
        return value

    def blob_view(self, field: str, *, maximum: int, exact: int | None = None) -> memoryview:
        """A length-prefixed byte string as a view into the message (no copy)."""
        length = self.u32(f"{field} length", maximum=maximum)
        if exact is not None and length != exact:
            raise self.refuse(f"{field} has {length} bytes, not {exact}")
        return self._take(length, field)

    def blob(self, field: str, *, maximum: int, exact: int | None = None) -> bytes:
        """A length-prefixed byte string."""
        return bytes(self.blob_view(field, maximum=maximum, exact=exact))

    def text(self, field: str, *, maximum: int = MAX_ID_BYTES) -> str:
        """Length-prefixed UTF-8 text without control characters."""
        raw = self.blob(field, maximum=maximum)
        try:
            value = raw.decode()
        except UnicodeDecodeError:
            raise self.refuse(f"{field} is not UTF-8") from None
        if not value or not value.isprintable():
            raise self.refuse(f"{field} is empty or has control characters")
        return value

    def count(self, field: str, *, maximum: int = MAX_PARTICIPANTS) -> int:
        """A list's item count."""
        return self.u32(f"{field} count", maximum=maximum)

    def done(self) -> None:
        """Refuse bytes left over after the last field."""
        if self._pos != len(self._data):
            raise self.refuse(f"{len(self._data) - self._pos} bytes follow its last field")
