"""``python -m tools.kind up|down``: see :mod:`tools.kind.cli`."""

from tools.kind.cli import main

main()
