"""Why a round ended the run: the exception the coordinator raises when no attempt committed."""

from __future__ import annotations

from lensemble.errors import PrecommitCheckFailed, QuorumNotReached
from lensemble.federation.ledger import RoundRecord


def round_failed(
    record: RoundRecord, quorum: int, attempts: int, *, signed_out: bool = False
) -> Exception:
    """Why a round's last attempt ended the run: the pre-commit check, or too few updates.

    ``signed_out``: the round was not retried further because, under masking, too few
    participants had not signed one of its survivor sets (the message says so).
    """
    plural = "attempt" if attempts == 1 else "attempts"
    why = (
        "; it is not retried: under masking, participants that signed a survivor set sit out "
        "the round's retries so that no update is in two sums, and too few others remain"
        if signed_out
        else ""
    )
    if record.defences.get("precommit"):
        return PrecommitCheckFailed(
            f"round {record.round}'s new global model failed the pre-commit check in "
            f"{attempts} {plural}: {record.defences['precommit']}{why}",
            remediation="see the ledger's defences field for the updates' norms; tighten "
            "federation.robustness (norm_bound, median_factor, aggregator) or exclude the "
            "participant.",
        )
    return QuorumNotReached(
        f"round {record.round} reached only {len(record.contributors)} of "
        f"{quorum} required contributors in {attempts} {plural} "
        f"(excluded: {', '.join(f'{k}={v}' for k, v in sorted(record.excluded.items()))}){why}.",
        remediation="check the excluded participants' logs, raise "
        "federation.round_timeout_s, or lower federation.quorum.",
    )
