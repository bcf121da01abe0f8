"""Bounds of the masked rounds' messages over the network, derived from the config.

Under ``federation.aggregation: masking`` a participant answers each stage of its session
(:data:`lensemble.federation.secagg.driver.STAGES`) with one upload (``AnswerStage``). Every
answer's size is bounded before a byte of it is buffered: the masked vector is exactly
``8 * (d + 2)`` bytes plus its framing (:class:`~lensemble.federation.secagg.messages.MaskedInput`),
every other answer grows with the size of the group only. The statistics a participant reports
with its masked vector are a few short strings (:data:`REPORT_ENTRIES`, :data:`REPORT_CHARS`),
and the text fields of both masking RPCs are capped like those of ``Join`` and ``Abstain``.
"""

from __future__ import annotations

from collections.abc import Mapping

from lensemble.config import LensembleConfig
from lensemble.federation.masking import dimension
from lensemble.federation.payload import TensorSpec
from lensemble.federation.secagg.driver import STAGES

#: Room (bytes) for an answer's framing: magic, kind, the context digest, the sender's id and
#: the length prefixes, with room to spare.
FRAME_ROOM = 4096
#: Room (bytes) per group member in the answers that carry one item per peer (encrypted shares,
#: unmasking shares, signatures): an id, a ciphertext of two 32-byte secrets' shares, a tag.
PER_PEER_ROOM = 2048
#: Most statistics reported with a masked vector, and the longest key or value (characters).
REPORT_ENTRIES = 8
REPORT_CHARS = 64
#: Bounds of the masking RPCs' text fields (characters), as ``ABSTAIN_LIMITS``.
MASKING_TEXT_LIMITS: dict[str, int] = {"participant_id": 64, "session": 64, "stage": 32}
#: The longest certificate (PEM bytes) relayed to a participant.
MAX_CERTIFICATE_BYTES = 16 * 1024


def answer_limits(
    config: LensembleConfig, architecture: Mapping[str, TensorSpec]
) -> dict[str, int]:
    """The largest answer (bytes) each stage may receive in a run of ``architecture``.

    Args:
        config: The run's config (its participant count bounds a group's size).
        architecture: The global model's tensor specs (d).

    Returns:
        Stage name -> bound in bytes, for every stage of ``STAGES``.
    """
    peers = len(config.participant_ids)
    small = FRAME_ROOM + PER_PEER_ROOM * peers
    limits = dict.fromkeys(STAGES, small)
    limits["mask"] = FRAME_ROOM + 8 * (dimension(architecture) + 2)
    return limits


def bad_report(report: Mapping[str, str]) -> str | None:
    """Why a masked upload's reported statistics are refused, or None when they are fine."""
    if len(report) > REPORT_ENTRIES:
        return f"the report has {len(report)} entries; at most {REPORT_ENTRIES} are accepted."
    for key, value in report.items():
        if len(key) > REPORT_CHARS or len(value) > REPORT_CHARS:
            return f"a report entry is longer than {REPORT_CHARS} characters."
    return None
