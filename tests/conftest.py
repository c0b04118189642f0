"""Shared test set-up: offline, quiet, deterministic, and the tiny-model fixtures."""

from __future__ import annotations

import os
import warnings

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))
warnings.filterwarnings("ignore", module="transformers")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """Save a tiny model of an architecture once per session; returns a factory ``arch -> Path``."""
    from moescope.zoo import tiny

    cache: dict[tuple[str, bool], object] = {}

    def make(arch: str, *, fused: bool = False):
        key = (arch, fused)
        if key not in cache:
            path = tmp_path_factory.mktemp(f"{arch}{'-fused' if fused else ''}")
            tiny(arch).save_pretrained(path, save_original_format=not fused)
            cache[key] = path
        return cache[key]

    return make


CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, driven by Playwright (never a downloaded browser)."""
    from pathlib import Path

    if not Path(CHROMIUM).is_file():
        pytest.fail(f"browser tests need {CHROMIUM}: apt-get install chromium (.ci/run does)")
    return CHROMIUM
