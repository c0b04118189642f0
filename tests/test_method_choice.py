"""``--method auto``: each candidate's proxy measured, the one keeping more skill kept and recorded."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.explore.clustering import select_experts
from moescope.export.fidelity.records import Check
from moescope.export.fidelity.validity import CAPABILITY
from moescope.export.manifest import read_manifest
from moescope.export.method_choice import AUTO_CANDIDATES, MethodChoices, choosing_selector
from moescope.export.surgery import build_proxy
from moescope.models.zoo import tiny

FIDELITY = ["--n-tokens", "1000", "--min-capability", "0", "--prompts", "add2,add3"]


def test_auto_keeps_the_candidate_that_keeps_more_skill_and_says_so(tmp_path: Path, capsys) -> None:
    out = tmp_path / "proxy"
    assert main(["export", "toy", "--keep", "1/4", *FIDELITY, "--out", str(out)]) == 0
    printed, manifest = capsys.readouterr().out, read_manifest(out)
    (choice,) = manifest["method_choice"]["choices"]
    ratios = choice["ratios"]
    assert list(ratios) == list(AUTO_CANDIDATES) and choice["keep"] == manifest["keep"] == 8
    assert choice["chosen"] == max(ratios, key=ratios.get) == manifest["method"]
    assert manifest["config"]["method"] == "auto"
    shown = ", ".join(f"{m} {r:.2f}" for m, r in ratios.items())
    assert f"method auto, keep 8: accuracy ratio {shown} -> {choice['chosen']}" in printed
    capability = next(c for c in manifest["checklist"] if c["name"] == CAPABILITY)
    assert capability["details"]["ratio"] == ratios[choice["chosen"]]  # measured as the checklist does

    # the same experts as the chosen method alone, from the same calibration pass
    same, alone = tmp_path / "same", ["--method", choice["chosen"], "--no-fidelity"]
    assert main(["export", "toy", "--keep", "1/4", *FIDELITY, *alone, "--out", str(same)]) == 0
    assert read_manifest(same)["layers"] == manifest["layers"]


class _Probe:
    """Ratios handed out in order, one per proxy measured."""

    def __init__(self, *ratios: float) -> None:
        self.ratios, self.measured = list(ratios), 0

    def check(self, proxy) -> Check:
        self.measured += 1
        return Check(CAPABILITY, False, "", {"ratio": self.ratios.pop(0)})


@pytest.mark.parametrize(
    ("ratios", "chosen"),
    [
        ((math.nan, 0.3, 0.1), "reap"),
        ((0.5, 0.5, 0.5), "paper"),
        ((0.7, 0.2, 0.7), "paper"),
        ((0.2, 0.3, 0.6), "taylor"),
        ((math.nan, math.nan, math.nan), "paper"),
    ],
)
def test_an_unmeasurable_candidate_never_wins_and_a_tie_keeps_the_first(ratios, chosen: str) -> None:
    model = tiny("mixtral")
    selectors = {m: (lambda keep, seed=seed: select_experts(model, keep, method="random", seed=seed))
                 for seed, m in enumerate(AUTO_CANDIDATES)}  # fmt: skip
    record, probe = MethodChoices(), _Probe(*ratios)
    picked = choosing_selector(lambda s: build_proxy(model, s), selectors, probe, record)(4)
    assert picked.layers == selectors[chosen](4).layers and probe.measured == len(AUTO_CANDIDATES)
    assert record.choices[0].chosen == chosen and record.choices[0].keep == 4
    saved = record.to_dict()["choices"][0]["ratios"]
    assert [None if math.isnan(r) else r for r in ratios] == list(saved.values())  # NaN as JSON null
