"""``python -m moescope`` runs the command line."""

import sys

from moescope.cli import main

sys.exit(main())
