"""ExportConfig: defaults, validation in one sentence, the JSON round trip, and what stays beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from moescope.errors import MoescopeError
from moescope.explore.clustering import select_experts
from moescope.export.config import ExportConfig, configure
from moescope.models.zoo import tiny


def test_the_dict_is_json_and_reads_back() -> None:
    config = ExportConfig(
        keep="1/4", selection=Path("s.json"), tasks=["add2", "copy"], fidelity={"n_tokens": 64}
    )
    assert (config.selection, config.tasks) == ("s.json", ("add2", "copy"))  # as JSON keeps them
    d = json.loads(json.dumps(config.to_dict()))
    assert d["tasks"] == ["add2", "copy"] and ExportConfig.from_dict(d) == config
    assert ExportConfig.from_dict(ExportConfig().to_dict()) == ExportConfig()


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"heal_steps": -1}, "heal_steps=-1 must be 0 (no healing) or a positive number of steps."),
        (
            {"method": "best"},
            "unknown selection method 'best'; choose one of auto, cluster, paper, frequency, reap, taylor, "
            "random.",
        ),
        ({"nope": 1}, "Unknown export config field(s) nope;"),
        ({"min_capability": 1.5}, "min_capability=1.5 is no accuracy ratio; give one from 0"),
        ({"heal_budget": 0}, "heal_budget=0 leaves no healing to reach min_capability=0.8;"),
        ({"heal_round": 0}, "heal_round=0 leaves no healing to reach min_capability=0.8;"),
        ({"keep": "auto", "tasks": []}, "keep=auto needs a task to measure;"),
        ({"keep": "auto", "min_capability": 0}, "keep=auto needs a capability target;"),
        ({"keep": "auto", "selection": "s.json"}, "keep=auto needs to choose the experts;"),
        ({"keep": "auto", "fidelity": False}, "keep=auto needs the fidelity measurement;"),
        ({"heal_steps": "3"}, "Export config has a field of the wrong type"),
    ],
)
def test_an_impossible_setting_is_one_sentence(fields: dict, says: str) -> None:
    with pytest.raises(MoescopeError) as caught:
        ExportConfig.from_dict(fields)
    assert str(caught.value).startswith(says) and str(caught.value).endswith(".")


def test_objects_stay_beside_the_config_and_keywords_override_it() -> None:
    selection = select_experts(tiny("mixtral"), 4, method="random")
    ids = torch.randint(3, 100, (2, 16))
    base = ExportConfig(keep=4, selection="old.json", seed=3)
    config, inputs = configure(base, {"selection": selection, "calibration": ids, "method": "random"})
    assert config == ExportConfig(keep=4, method="random", seed=3)
    assert inputs.selection is selection and inputs.calibration is ids
    assert inputs.record == {**config.to_dict(), "calibration": "token ids (2 rows)"}
    assert inputs.objects() == {"selection": selection, "calibration": ids}
    config, inputs = configure(None, {"selection": Path("s.json")})
    assert inputs.selection == config.selection == "s.json" and inputs.objects() == {}
    with pytest.raises(TypeError, match="keap"):
        configure(None, {"keap": 4})
