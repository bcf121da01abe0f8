"""Errors of the vendoring layer, each with the exit code its failure deserves.

A bad manifest, lock, patch name or DEP-3 header is bad input (exit 2); a SHA-256 mismatch, a
tampered tree or a missing license fails closed (exit 3); an unreachable index or a missing
``git`` is a missing dependency (exit 4).
"""

from __future__ import annotations

from lensemble.errors import EXIT_BAD_INPUT, EXIT_FAIL_CLOSED, IntegrityError, LensembleError


class VendorInputError(LensembleError):
    """A manifest, lock, patch file name or flag under ``third_party/`` is wrong."""

    code = "vendor_input"
    exit_code = EXIT_BAD_INPUT


class Dep3HeaderError(VendorInputError):
    """A patch lacks a DEP-3 header field we require (Description, Origin, Forwarded, ...)."""

    code = "vendor_dep3_header"


class NotSynced(VendorInputError):
    """The vendored tree (or its lock) is missing: ``python -m tools.vendor sync`` has not run."""

    code = "vendor_not_synced"


class PatchFailed(VendorInputError):
    """One or more patches of the series no longer apply to the upstream tree.

    Attributes:
        failures: ``(patch file name, reason)`` for every patch that did not apply, in order.
    """

    code = "vendor_patch_failed"

    def __init__(
        self, message: str, *, failures: list[tuple[str, str]], remediation: str = ""
    ) -> None:
        super().__init__(message, remediation=remediation)
        self.failures = failures


class DistributionMismatch(IntegrityError):
    """A downloaded or cached distribution's SHA-256 differs from the pinned one."""

    code = "vendor_sha256_mismatch"


class TreeDrift(IntegrityError):
    """The vendored tree differs from pristine upstream plus the patch series (the lock).

    Attributes:
        modified: Files whose content differs, sorted.
        added: Files present in the tree but not in the lock, sorted.
        removed: Files in the lock but missing from the tree, sorted.
    """

    code = "vendor_drift"

    def __init__(
        self,
        message: str,
        *,
        modified: list[str] | None = None,
        added: list[str] | None = None,
        removed: list[str] | None = None,
        remediation: str = "",
    ) -> None:
        super().__init__(message, remediation=remediation)
        self.modified = modified or []
        self.added = added or []
        self.removed = removed or []


class LicenseError(LensembleError):
    """The tree has no license file and no recorded exception, or upstream changed license."""

    code = "vendor_license"
    exit_code = EXIT_FAIL_CLOSED
