"""An attempt's present set: the participants its groups are drawn from, as announced and checked.

With several groups, a group of exactly ``group_size`` aborts on one drop-out, and groups drawn
from every configured participant keep putting the absent ones in. So the coordinator draws an
attempt's groups from the participants present when it starts (and, on a retry, without those
that dropped out of the last attempt's sessions), and announces that set with the ``advertise``
stage as a :class:`PresentSet` message. The coordinator may be hostile: a participant takes the
set only after :func:`check_present` (a subset of the configured ids, itself in it, at least
``least`` members), and the set is bound into every session's context digest
(:class:`~lensemble.federation.secagg.context.SessionContext`), so a coordinator that announces
different sets to different participants is caught by the signed keys like any other mismatch.
A participant takes part in one session per attempt at most, so no update is masked into two
sums (:class:`~lensemble.federation.masking_client.MaskingClient`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import ClassVar

from lensemble.federation.secagg.errors import Reason, SecAggRefusal
from lensemble.federation.secagg.wire import Reader, Writer

STAGE = "advertise"


@dataclass(frozen=True)
class PresentSet:
    """The coordinator's announcement of an attempt's present set.

    Attributes:
        members: Participant ids, sorted, without duplicates (at most
            :data:`~lensemble.federation.secagg.wire.MAX_PARTICIPANTS`, each at most
            :data:`~lensemble.federation.secagg.wire.MAX_ID_BYTES` bytes).
    """

    KIND: ClassVar[int] = 10
    members: tuple[str, ...]

    def encode(self) -> bytes:
        """The message's bytes: the framing of :mod:`~lensemble.federation.secagg.wire`."""
        out = Writer(self.KIND).u32(len(self.members))
        for participant in self.members:
            out.text(participant)
        return out.finish()

    @classmethod
    def decode(cls, data: bytes | memoryview) -> PresentSet:
        """Parse a present set, every length bounded before it is read.

        Raises:
            SecAggRefusal: ``bad_message``: malformed, unsorted, duplicated or trailing bytes.
        """
        reader = Reader(data, cls.KIND, what="present set", stage=STAGE)
        members = tuple(reader.text("present set") for _ in range(reader.count("present set")))
        if list(members) != sorted(set(members)):
            raise reader.refuse("present set is not sorted without duplicates")
        reader.done()
        return cls(members)


def check_present(
    members: Collection[str], *, configured: Collection[str], me: str, least: int
) -> None:
    """Refuse a present set this participant must not take part under.

    Args:
        members: The announced set.
        configured: Every configured participant id (``federation.participants``).
        me: This participant's id.
        least: Fewest members a present set may have: ``max(quorum, 3, group_size)``, so that
            the attempt can commit and every group is at least ``group_size``.

    Raises:
        SecAggRefusal: ``present_set_refused``, saying which check failed.
    """
    strangers = sorted(set(members) - set(configured))
    if strangers:
        raise _refused(f"it names {', '.join(strangers[:3])}, not configured participants")
    if me not in members:
        raise _refused(f"it leaves {me} out, yet asks {me} into a session")
    if len(members) < least:
        raise _refused(f"it has {len(members)} members, fewer than the {least} needed")


def _refused(why: str) -> SecAggRefusal:
    return SecAggRefusal(
        Reason.PRESENT_SET_REFUSED,
        f"the announced present set is refused: {why}.",
        stage=STAGE,
        remediation="The participant answers nothing in this attempt; the coordinator counts "
        "it as dropped.",
    )
