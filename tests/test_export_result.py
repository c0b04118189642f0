"""What an export says of itself: :meth:`ExportResult.text`, the lines ``moescope export`` prints."""

from __future__ import annotations

from dataclasses import replace

import pytest

from moescope.export.pipeline import export_proxy
from moescope.export.result import ExportResult
from moescope.export.targeting import Attempt, Targeting


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint) -> ExportResult:
    out = tmp_path_factory.mktemp("export") / "proxy"
    return export_proxy(
        tiny_checkpoint("qwen3_moe"), out, keep=4, method="frequency", fidelity=False, progress=False
    )


def test_the_text_names_the_proxy_how_it_was_cut_and_why_nothing_was_measured(exported: ExportResult) -> None:
    m, lines = exported.manifest, exported.text().splitlines()
    kept = f"4 of {m['source']['num_experts']} routed experts per layer, {m['keep_ratio']:.1%}"
    assert lines[0] == f"proxy: {exported.path} ({kept}, method frequency)"
    assert lines[1].startswith("original: read in memory (the original and a proxy (")
    assert lines[2].startswith("compute: cpu, float32 (")
    assert lines[3].startswith("calibration: rl (token tensors (")
    assert lines[-1] == "capability: not measured: fidelity is off, so nothing is measured"


def test_a_missed_capability_target_is_said_last_after_the_rounds(exported: ExportResult) -> None:
    attempt = Attempt(4, 0.5, ((0, 0.4), (10, 0.6)), False)
    missed = replace(exported, targeting=Targeting(0.8, 10, 10, 1e-3, "fixed", (attempt,), 4, "0.60 < 0.8"))
    lines = missed.text().splitlines()
    target = lines.index("capability target 0.8 (healing up to 10 steps, 10 per round):")
    assert lines[target + 1].startswith("  keep 4 of ") and lines[target + 1].endswith(
        "(steps: ratio 0: 0.40, 10: 0.60)"
    )
    assert lines[-1] == "FAIL: the proxy misses its capability target: 0.60 < 0.8"
