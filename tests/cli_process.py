"""Run the installed ``moescope`` console script in a subprocess (offline), for CLI tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def moescope_process(*args: str, **kwargs) -> subprocess.Popen:
    """Start ``moescope ARGS`` with text pipes; the caller communicates and checks the exit status."""
    script = Path(sys.executable).with_name("moescope")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [str(script), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )
