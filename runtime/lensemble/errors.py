"""Typed errors shared by every layer of Lensemble.

Every error that can reach a user carries a stable ``code`` (callers branch on the class or the
code, never on message text), a one-sentence ``remediation``, and the process ``exit_code`` that
the CLI uses. The taxonomy follows the upstream Lensemble error specification (spec 04); the
exit-code bands are ours:

====  ==========================================================
code  meaning
====  ==========================================================
0     success
1     the run failed (quorum lost, a round could not commit)
2     the input is wrong (config, flag, file) — fix it and rerun
3     a security or integrity check failed closed
4     an external tool or dependency is missing or failed
130   interrupted
====  ==========================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_FAIL_CLOSED = 3
EXIT_TOOL = 4
EXIT_INTERRUPTED = 130


class LensembleError(Exception):
    """Base class of every error Lensemble raises on purpose.

    Args:
        message: One sentence saying what went wrong, naming the field, file or participant.
        remediation: One sentence saying how to fix it.

    Attributes:
        code: Stable machine-readable error code.
        exit_code: Process exit code the CLI uses for this error.
    """

    code = "internal"
    exit_code = EXIT_RUN_FAILED

    def __init__(self, message: str, *, remediation: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.remediation = remediation

    def __str__(self) -> str:
        if self.remediation and self.remediation not in self.message:
            return f"{self.message} {self.remediation}"
        return self.message


@dataclass(frozen=True)
class ConfigProblem:
    """One problem found in a config: where it is, and what to do about it.

    Attributes:
        path: Dotted field path, e.g. ``federation.quorum`` or ``federation.participants[2].id``;
            empty for problems with the file as a whole.
        message: One sentence naming the value, what is expected and the fix.
        source: File the value came from, or ``--set`` when it came from an override.
        line: 1-based line in ``source`` when known.
        column: 1-based column in ``source`` when known.
    """

    path: str
    message: str
    source: str = ""
    line: int | None = None
    column: int | None = None

    def render(self) -> str:
        """Format as ``file:line:col: path: message`` for one line of CLI output."""
        where = self.source
        if where and self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        # A --set flag that set exactly this field already names its path.
        path = "" if where.startswith(f"--set {self.path}=") else self.path
        parts = [p for p in (where, path) if p]
        return ": ".join([*parts, self.message])


class ConfigError(LensembleError):
    """A config (file, ``--set`` override or flag) is invalid.

    Attributes:
        problems: Every problem found, in file order; the CLI prints one line per problem.
        rules_checked: False when fields were invalid, so the rules between fields (which
            pydantic runs only on valid fields) have not been checked yet.
    """

    code = "config_invalid"
    exit_code = EXIT_BAD_INPUT

    def __init__(
        self,
        problems: Sequence[ConfigProblem] | str,
        *,
        remediation: str = "",
        rules_checked: bool = True,
    ) -> None:
        if isinstance(problems, str):
            problems = [ConfigProblem(path="", message=problems)]
        self.problems = list(problems)
        self.rules_checked = rules_checked
        super().__init__("; ".join(p.render() for p in self.problems), remediation=remediation)


class Interrupted(LensembleError):
    """The user interrupted a command (Ctrl-C) or a signal stopped it."""

    code = "interrupted"
    exit_code = EXIT_INTERRUPTED


class UsageError(LensembleError):
    """A command-line flag or argument is wrong."""

    code = "usage"
    exit_code = EXIT_BAD_INPUT


class ToolMissing(LensembleError):
    """An external tool (kubectl, helm library, docker) is missing or failed."""

    code = "tool_missing"
    exit_code = EXIT_TOOL


class ResidencyViolation(LensembleError):
    """Data tried to leave its participant's trust domain; fails closed.

    The residency invariant: docs/concepts.md#residency.

    Never swallowed or retried. Carries only names, shapes and ids, never tensors.
    """

    code = "residency_violation"
    exit_code = EXIT_FAIL_CLOSED


class IntegrityError(LensembleError):
    """A hash, checkpoint or ledger check failed; fails closed.

    The checkpoint-integrity invariant: docs/concepts.md#checkpoint-integrity.
    """

    code = "checkpoint_integrity"
    exit_code = EXIT_FAIL_CLOSED


def unreplayable(exc: ValueError) -> IntegrityError:
    """A resume's refusal of a ledger whose recorded decision its own inputs do not give.

    Args:
        exc: The replay's sentence (a guard verdict, a best reported version, ...).
    """
    return IntegrityError(f"{exc};", remediation="run `lensemble verify` on the folder.")


class NonDeterministicAggregation(LensembleError):
    """The outer step did not reproduce bit for bit; fails closed.

    The deterministic-aggregation invariant: docs/concepts.md#deterministic-aggregation.
    """

    code = "agg_nondeterministic"
    exit_code = EXIT_FAIL_CLOSED


class PayloadError(LensembleError):
    """A pseudo-gradient or model payload is corrupt: bad header, truncated, or hash mismatch."""

    code = "payload_invalid"
    exit_code = EXIT_BAD_INPUT


class ArchitectureMismatch(PayloadError):
    """A payload's tensor names, shapes or dtypes differ from the global model's."""

    code = "architecture_mismatch"


class ScaleOutOfRange(PayloadError):
    """An int8 scale is finite and positive but above ``federation.robustness.max_int8_scale``."""

    code = "scale_out_of_range"


class RoundError(LensembleError):
    """A round could not proceed (illegal transition, stale or duplicate submission)."""

    code = "round_failed"
    exit_code = EXIT_RUN_FAILED


class QuorumNotReached(RoundError):
    """A round ended with fewer contributors than ``federation.quorum`` after every retry."""

    code = "fault_tolerance_exceeded"


class PrecommitCheckFailed(RoundError):
    """The new global model failed the pre-commit check in every attempt of a round; fails closed.

    The check (non-finite values, or a norm change above
    ``federation.robustness.max_relative_change``) aborts an attempt instead of committing it.
    """

    code = "precommit_check_failed"
    exit_code = EXIT_FAIL_CLOSED


class RankFailure(LensembleError):
    """A rank of a participant's group died during a round: that round's update is lost.

    The participant sits the round out (the ledger names it ``rank_failure``) and its rank group
    is started again for the next round, within ``max_restarts`` of its rank layout.
    """

    code = "rank_failure"
    exit_code = EXIT_RUN_FAILED


class PrivacyBudgetExhausted(LensembleError):
    """A participant's next round would spend more than its differential-privacy budget.

    The participant trains and sends nothing for that round or any later one; the coordinator
    records it absent with the reason ``privacy_budget``.
    """

    code = "privacy_budget"
    exit_code = EXIT_RUN_FAILED


class OverlapBaseMissing(LensembleError):
    """An overlapped round trains from a model this participant does not hold.

    Under ``federation.overlap.mode: one_round`` (:mod:`lensemble.federation.overlap`) a round
    trains from the model the previous round announced; a participant that missed that round,
    or restarted since, sits the round out (the ledger names it ``no_base_model``).
    """

    code = "no_base_model"
    exit_code = EXIT_RUN_FAILED


class RankGroupExhausted(LensembleError):
    """A participant's rank group failed more often than its layout's ``max_restarts`` allows."""

    code = "rank_restarts_exhausted"
    exit_code = EXIT_RUN_FAILED
