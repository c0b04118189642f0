"""Leaving a process: a distributed worker skips the interpreter's teardown.

A finished ``torchrun`` / ``accelerate launch`` worker has written and flushed its work. Left to
the interpreter's teardown, torch's gloo backend can still stop it: the process group's
destructor aborts it now and then ("terminate called without an active exception", SIGABRT), and
a DDP ``Reducer`` freed while gloo's run loop frees a finished all-reduce deadlocks the two
threads (the loop waits for the GIL, the main thread for the loop's lock; seen with TRL under
``accelerate launch``). A worker therefore leaves through ``os._exit`` once its output is flushed.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def leave(status: int) -> NoReturn:
    """Exit with ``status``; in a distributed worker (``WORLD_SIZE`` > 1) without teardown."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)
