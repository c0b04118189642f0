"""``python -m moescope`` runs the command line."""

from moescope.cli import script

script()
