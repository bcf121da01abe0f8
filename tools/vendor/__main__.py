"""``python -m tools.vendor sync|check``: see :mod:`tools.vendor.cli`."""

from tools.vendor.cli import main

main()
