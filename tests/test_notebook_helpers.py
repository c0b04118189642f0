"""The small decisions notebooks used to make in cells: which proxy a parameter names, and what
an export shows when it did not heal or had no task to measure."""

from __future__ import annotations

import pytest

from moescope.export.manifest import find_proxy
from moescope.export.pipeline import export_proxy


def test_find_proxy_resolves_auto_none_and_paths(tmp_path):
    default = tmp_path / "out" / "proxy"
    with pytest.warns(UserWarning, match="no proxy checkpoint at .*export one first"):
        assert find_proxy("auto", default) is None
    assert find_proxy("", default) is None
    default.mkdir(parents=True)
    (default / "config.json").write_text("{}")
    assert find_proxy("auto", default) == default
    elsewhere = tmp_path / "mine"
    with pytest.warns(UserWarning, match=str(elsewhere.name)):
        assert find_proxy(str(elsewhere), default) is None


def test_export_frames_say_what_was_not_done(tmp_path):
    bare = export_proxy("toy", tmp_path / "bare", keep="1/2", method="random", fidelity=False, progress=False)
    assert bare.healing_frame()["note"].item().startswith("not healed")
    assert "fidelity was not measured" in bare.accuracy_frame()["note"].item()
    measured = export_proxy(
        "toy",
        tmp_path / "measured",
        keep="1/2",
        method="random",
        tasks=(),
        fidelity={"n_tokens": 256},
        progress=False,
    )
    assert "no tasks for this model" in measured.accuracy_frame()["note"].item()
    healed = export_proxy(
        "toy",
        tmp_path / "healed",
        keep="1/2",
        method="random",
        heal_steps=2,
        min_capability=0,
        tasks=("add2",),
        fidelity={"n_tokens": 256},
        progress=False,
    )
    assert healed.healing_frame().equals(healed.healing.to_frame())
    assert set(healed.accuracy_frame()["task"]) == {"add2"}
