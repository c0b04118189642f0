"""The selection as plain data: when a saved one may be reused, and how far two selections agree."""

from __future__ import annotations

from dataclasses import replace

import pytest

from moescope.errors import MoescopeError
from moescope.explore.clustering import select_experts
from moescope.explore.selection import (
    Selection,
    kept_table,
    overlap_table,
    reusable_selection,
    selection_overlap,
)
from moescope.models.zoo import tiny


def _with_kept(selection: Selection, *kept: tuple[int, ...]) -> Selection:
    """``selection`` keeping ``kept[i]`` in its i-th MoE layer (labels and scores unchanged)."""
    layers = tuple(replace(entry, kept=ids) for entry, ids in zip(selection.layers, kept, strict=True))
    return replace(selection, layers=layers)


def test_a_saved_selection_is_reused_only_for_its_model_and_keep(tmp_path, tiny_checkpoint) -> None:
    model = tiny("mixtral")
    path = select_experts(model, 4, method="random", seed=1).save(tmp_path / "selection.json")
    assert reusable_selection(path, model, 4) == path
    assert reusable_selection(str(path), model.config, "1/2") == path, "a ratio meaning the same count"
    assert reusable_selection(path, tiny_checkpoint("mixtral"), 0.5) == path, "a checkpoint's config"
    assert reusable_selection(path, model, 6) is None, "another keep: select anew"
    assert reusable_selection(path, tiny("qwen3_moe"), 4) is None, "another model: select anew"
    assert reusable_selection(tmp_path / "missing.json", model, 4) is None
    assert reusable_selection(None, model, 4) is None and reusable_selection("", model, 4) is None


def test_a_damaged_selection_file_or_impossible_keep_still_fails(tmp_path) -> None:
    model = tiny("mixtral")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(MoescopeError, match=r"not a readable selection\.json"):
        reusable_selection(tmp_path / "bad.json", model, 4)
    path = select_experts(model, 4, method="random").save(tmp_path / "selection.json")
    with pytest.raises(MoescopeError, match="keep=9"):
        reusable_selection(path, model, 9)


def test_overlap_is_the_pooled_share_of_kept_experts_in_common() -> None:
    base = select_experts(tiny("mixtral"), 4, method="random")
    a = _with_kept(base, (0, 1, 2, 3), (4, 5, 6, 7))
    b = _with_kept(base, (0, 1, 6, 7), (4, 5, 6, 7))  # 2 of 4, then 4 of 4 in common
    c = _with_kept(base, (4, 5, 6, 7), (0, 1, 2, 3))
    assert selection_overlap(a, a) == 1.0
    assert selection_overlap(a, b) == selection_overlap(b, a) == 6 / 8
    assert selection_overlap(a, c) == 0.0
    table = overlap_table({"a": a, "b": b, "c": c})
    assert list(table.columns) == list(table.index) == ["a", "b", "c"]
    assert table.loc["b", "a"] == 6 / 8 and table.loc["c", "a"] == 0.0
    assert all(table.loc[name, name] == 1.0 for name in "abc")


def test_overlap_refuses_selections_of_other_layers() -> None:
    base = select_experts(tiny("mixtral"), 4, method="random")
    other = replace(base, layers=base.layers[:1])
    with pytest.raises(MoescopeError, match="different MoE layers"):
        selection_overlap(base, other)


def test_kept_table_lists_every_methods_experts_per_layer() -> None:
    model = tiny("mixtral")
    selections = {f"seed {s}": select_experts(model, 4, method="random", seed=s) for s in (0, 1)}
    table = kept_table(selections)
    assert table.index.name == "layer" and table.index.tolist() == [0, 1]
    assert list(table.columns) == ["seed 0", "seed 1"]
    for name, selection in selections.items():
        assert table[name].tolist() == [list(selection.kept(layer)) for layer in (0, 1)]
