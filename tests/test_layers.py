"""The stages import one way (the import-linter contracts in pyproject.toml), replay needs no
clustering library, and ``make test`` names a missing system prerequisite before anything else."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, **kw)


def test_imports_keep_the_contracts() -> None:
    """Layers in journey order, display free of model code, no cycle (pyproject.toml)."""
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "lint-imports is missing: install the test extra (pip install -e '.[test]')"
    result = _run(lint, "--no-logo", "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


BLOCKED = """
import importlib.abc, json, sys, tempfile
from pathlib import Path

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("sklearn", "umap"):
            raise ImportError(f"{name} is not installed", name=name)

sys.meta_path.insert(0, Absent())
import moescope.replay
from moescope.export.manifest import MANIFEST, MANIFEST_KIND, read_manifest
from moescope.replay import replay  # the run: trainer, rollout, the proxy's manifest

assert callable(replay) and "moescope.replay.trainer" in sys.modules

proxy = Path(tempfile.mkdtemp())
(proxy / MANIFEST).write_text(json.dumps({"kind": MANIFEST_KIND, "method": "random"}))
assert read_manifest(proxy)["method"] == "random"
assert moescope.replay.ReplayConfig().steps > 0
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ("sklearn", "umap"))
assert not loaded, loaded
"""


def test_replay_imports_without_scikit_learn_or_umap() -> None:
    """Replay reads a proxy's manifest; clustering libraries belong to explore and export."""
    result = _run(sys.executable, "-c", BLOCKED, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr


# --- the newcomer path -------------------------------------------------------------------------------


def test_make_test_says_first_how_to_install_a_missing_chromium() -> None:
    start = time.monotonic()
    result = _run("make", "-s", "check-prereqs", "CHROMIUM=")
    assert time.monotonic() - start < 1.0
    assert result.returncode != 0
    assert "sudo apt-get install chromium" in result.stderr
    assert _run("make", "-s", "check-prereqs", f"CHROMIUM={sys.executable}").returncode == 0


def test_make_test_checks_before_it_installs_and_lint_runs_the_contracts() -> None:
    planned = _run("make", "-n", "-B", "test", f"CHROMIUM={sys.executable}").stdout
    order = [planned.find(step) for step in ("apt-get install chromium", "pip install", "-m pytest")]
    assert -1 not in order and order == sorted(order), planned
    assert "lint-imports" in _run("make", "-n", "lint").stdout
