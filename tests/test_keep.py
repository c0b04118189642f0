"""``keep`` parsed once into a :class:`Keep`: the count every entry point reads, ``auto``'s
candidates, and a refusal before anything loads."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from moescope.errors import MoescopeError
from moescope.explore.clustering import select_experts
from moescope.export import pipeline
from moescope.export.cost.shape import ModelShape
from moescope.export.pipeline import export_proxy
from moescope.keep import Keep, parse_keep
from moescope.models.zoo import tiny


@pytest.mark.parametrize("keep", ["1/4", 0.25, 16, " 1/4 "])
def test_a_keep_holds_the_count_parse_keep_gives(keep) -> None:
    parsed = Keep.parse(keep, 64, 8)
    assert parsed.count == parse_keep(keep, 64, 8) == 16 and parsed.ratio == 0.25
    assert parsed.requested == keep and not parsed.searched
    assert parsed.describe() == "16 of 64 routed experts per layer (25.0%)"


def test_auto_stays_expressible_and_its_candidates_are_the_valid_counts() -> None:
    routing = {"n_group": 8, "topk_group": 4}
    auto = Keep.parse("auto", 256, 8, allow_auto=True, **routing)
    assert auto.searched and auto.count is None and auto.ratio == 0.5 and "auto" in auto.describe()
    valid = []
    for count in range(32, 129):
        with contextlib.suppress(MoescopeError):
            valid.append(parse_keep(count, 256, 8, **routing))
    assert auto.candidates() == valid and auto.with_count(valid[0]).count == 32
    with pytest.raises(MoescopeError, match="keep=auto searches the kept count"):
        auto.fixed()
    with pytest.raises(MoescopeError, match=r"keep='auto' searches the kept count.*e\.g\. 0\.25, 1/4 or 8"):
        parse_keep("auto", 256, 8)
    with pytest.raises(MoescopeError, match="no kept count from 1/8 to 1/2 of the 4 experts"):
        Keep.parse("auto", 4, 2, allow_auto=True).candidates()


def test_a_parsed_keep_is_passed_down_not_parsed_again() -> None:
    """The same routing takes the object as it is; another routing checks what was asked."""
    model = tiny("mixtral")  # 8 experts, top-2
    keep = Keep.parse("1/2", 8, 2)
    assert Keep.parse(keep, 8, 2) is keep
    assert select_experts(model, keep, method="random").keep == 4
    assert Keep.parse(keep, 64, 8).count == 32
    with pytest.raises(MoescopeError, match=r"keep='1/2' means 2 of 4 experts per layer"):
        Keep.parse(keep, 4, 2)
    assert ModelShape.from_entry(_shape()).with_keep(Keep.parse("1/4", 64, 8)).routed_experts == 16


def test_an_impossible_keep_is_refused_before_the_model_loads(
    tiny_checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(pipeline, "gather", never)
    options = {"fidelity": False, "min_capability": 0, "progress": False}
    with pytest.raises(MoescopeError, match=r"keep=2 means 2 of 8 experts per layer, only top-k=2"):
        export_proxy(tiny_checkpoint("mixtral"), tmp_path / "p", keep=2, method="random", **options)
    with pytest.raises(MoescopeError, match="say how many experts to keep"):
        export_proxy(tiny_checkpoint("mixtral"), tmp_path / "p", method="random", **options)
    assert not (tmp_path / "p").exists()


def _shape() -> dict:
    """A reference entry of 64 routed experts, top-8."""
    from moescope.export.cost.shape import reference_entries

    return next(e for e in reference_entries() if e["routed_experts"] == 64 and e["top_k"] == 8)
