"""Which optional extra provides which import, and the error when one is missing.

The base install (``pip install lensemble``) serves configuration, rendering and infrastructure;
training and running a federation need the ``[train]`` extra. Modules import these libraries
lazily, inside the code that needs them, so a missing extra surfaces as a ``ModuleNotFoundError``
at the moment a command needs it. :func:`missing_extra` turns that into one sentence naming the
extra to install; the CLI prints it and exits 4 (missing tool).
"""

from __future__ import annotations

from lensemble.errors import ToolMissing

#: Top-level import name -> (the package pip installs, the extra that brings it). Keep in step
#: with the extras of pyproject.toml.
EXTRA_OF_IMPORT: dict[str, tuple[str, str]] = {
    "torch": ("torch", "train"),
    "numpy": ("numpy", "train"),
    "safetensors": ("safetensors", "train"),
    "gymnasium": ("gymnasium", "train"),
    "matplotlib": ("matplotlib", "train"),
    "grpc": ("grpcio", "train"),
    "grpc_health": ("grpcio-health-checking", "train"),
    "google": ("protobuf", "train"),  # google.protobuf
    "prometheus_client": ("prometheus-client", "train"),
    "pythonjsonlogger": ("python-json-logger", "train"),
    "opacus": ("opacus", "dp"),
    "pulumi": ("pulumi", "infra"),
    "pulumi_aws": ("pulumi-aws", "infra"),
    "pulumi_kubernetes": ("pulumi-kubernetes", "infra"),
}

#: What each extra is for, completing "needs the [X] extra (...)".
PURPOSE: dict[str, str] = {
    "train": "training and running a federation",
    "infra": "the Pulumi programs",
    "dp": "differential privacy (a participant's DP-SGD, central DP-FedAvg)",
}


class MissingExtra(ToolMissing):
    """A command needs a library of an optional extra that is not installed.

    Attributes:
        package: The missing package as pip names it, e.g. ``torch`` or ``grpcio``.
        extra: The extra that installs it, e.g. ``train``.
    """

    code = "extra_missing"

    def __init__(self, package: str, extra: str) -> None:
        self.package = package
        self.extra = extra
        super().__init__(
            f"this command needs {package}, which the [{extra}] extra installs "
            f"({PURPOSE[extra]}) and this environment lacks;",
            remediation=f"install it with pip install 'lensemble[{extra}]' (in a checkout: "
            f"pip install -c constraints.txt '.[{extra}]').",
        )


def missing_extra(exc: ImportError) -> MissingExtra | None:
    """The :class:`MissingExtra` behind an import failure, or None when no extra explains it.

    Args:
        exc: The error an ``import`` raised. Only a ``ModuleNotFoundError`` for a library an
            extra installs qualifies; anything else (our own module missing, a broken install
            of a present library) is a bug to report with its traceback.
    """
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    provided = EXTRA_OF_IMPORT.get(exc.name.split(".")[0])
    if provided is None:
        return None
    return MissingExtra(*provided)
