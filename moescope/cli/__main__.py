"""``python -m moescope.cli``, the same as ``python -m moescope``."""

from moescope.cli import script

script()
