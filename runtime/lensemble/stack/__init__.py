"""Bring a rendered stack up on a container engine, follow its run, and tear it down once.

The deployment stack, above :mod:`lensemble.render` (``docs/architecture.md``): imports only
:mod:`lensemble.errors`, :mod:`lensemble.config` and :mod:`lensemble.render`, never torch or grpc.
"""

from __future__ import annotations

from lensemble.errors import EXIT_RUN_FAILED, LensembleError


class StackFailed(LensembleError):
    """A stack did not come up, or its run failed.

    Args:
        message: One sentence naming the service and what happened.
        remediation: One sentence saying what to do next.
        exit_code: Process exit code; a failed coordinator's own code (1 run failed, 2 bad
            input, 3 failed closed) is passed through, anything else is 1.
    """

    code = "stack_failed"

    def __init__(
        self, message: str, *, remediation: str = "", exit_code: int = EXIT_RUN_FAILED
    ) -> None:
        super().__init__(message, remediation=remediation)
        self.exit_code = exit_code


__all__ = ["StackFailed"]
