"""Pulumi entry point (``main: infra/`` in ``Pulumi.yaml``)."""

import sys
from pathlib import Path

# Pulumi runs this directory as a script, so the project root (which holds the ``infra``
# package) is not on the import path yet.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.program import main

main()
