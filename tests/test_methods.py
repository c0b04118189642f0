"""The selection-method registry: what a method declares is what the export gathers and all its
selector reads; the names, the choices and the refusal of an unknown one come from it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from moescope.cli import main
from moescope.errors import MoescopeError
from moescope.explore.clustering import select_experts
from moescope.explore.methods import (
    METHODS,
    ROUTERS,
    ROUTING_SUMS,
    TAYLOR,
    WEIGHTS,
    auto_candidates,
    method,
    method_names,
)
from moescope.explore.routing import collect_routing
from moescope.explore.taylor import taylor_importance
from moescope.export import pipeline
from moescope.export.config import ExportConfig
from moescope.export.pipeline import export_proxy
from moescope.models.zoo import tiny

QUICK = {"keep": "1/2", "fidelity": False, "min_capability": 0, "n_tokens": 256, "progress": False}


@pytest.fixture(scope="module")
def gathered(one_thread):
    """A tiny model with everything any method may read: routing sums and Taylor scores."""
    model = tiny("qwen3_moe")
    ids = torch.randint(3, 128, (8, 16), generator=torch.Generator().manual_seed(0))
    stats = collect_routing(model, ids, n_tokens=ids.numel(), progress=False)
    return model, stats, taylor_importance(model, ids, n_tokens=ids.numel(), progress=False)


@pytest.mark.parametrize("name", list(METHODS))
def test_a_method_selects_from_what_it_declares_alone(name: str, gathered) -> None:
    """Each selector runs on the inputs its entry names (nothing else given), and a deterministic
    method keeps the same experts whatever the seed."""
    model, stats, taylor = gathered
    spec = method(name)
    given = {
        "stats": stats if spec.needs & ROUTING_SUMS else None,
        "taylor": taylor if TAYLOR in spec.needs else None,
    }
    kept = [select_experts(model, "1/2", method=name, seed=seed, **given).layers for seed in (0, 1, 2)]
    assert all(len(layer.kept) == 4 for layer in kept[0])
    if spec.deterministic:
        assert kept[0] == kept[1] == kept[2], name


@pytest.mark.parametrize("name", list(METHODS))
def test_the_export_gathers_exactly_what_the_method_needs(
    name: str, tiny_checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The routing pass, the clustered embeddings and the Taylor pass run only for a method
    whose entry needs them."""
    ran: list[str] = []

    def recorded(step: str):
        real = getattr(pipeline, step)

        def run(*args, **kwargs):
            ran.append(step)
            return real(*args, **kwargs)

        return run

    for step in ("collect_routing", "embed_experts", "taylor_importance"):
        monkeypatch.setattr(pipeline, step, recorded(step))
    result = export_proxy(tiny_checkpoint("qwen3_moe"), tmp_path / "proxy", method=name, **QUICK)
    needs = method(name).needs
    assert result.selection.method == name
    assert ("collect_routing" in ran) == bool(needs & (ROUTING_SUMS | {ROUTERS}))
    assert ("embed_experts" in ran) == (WEIGHTS in needs)
    assert ("taylor_importance" in ran) == (TAYLOR in needs)


def test_auto_compares_the_registered_candidates() -> None:
    assert [m.name for m in auto_candidates()] == [m for m in METHODS if METHODS[m].auto_candidate]
    assert not any(m.backward for m in auto_candidates(backward=False))
    assert ExportConfig(method="auto").method == "auto"


def test_an_unknown_method_is_one_sentence_naming_the_registry(capsys, tmp_path: Path) -> None:
    with pytest.raises(MoescopeError, match="unknown selection method 'best'; choose one of cluster, "):
        select_experts(tiny("mixtral"), "1/2", method="best")
    with pytest.raises(MoescopeError) as refused:
        ExportConfig(method="best")
    assert all(name in str(refused.value) for name in method_names(auto=True))
    with pytest.raises(SystemExit) as cli:
        main(["export", "toy", "--keep", "1/2", "--method", "best", "--out", str(tmp_path / "p")])
    assert cli.value.code == 2 and not (tmp_path / "p").exists()
    err = capsys.readouterr().err
    assert "--method" in err and all(name in err for name in method_names(auto=True))


def test_a_method_the_layer_sequential_gatherer_cannot_run_is_refused_before_loading(
    tiny_checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the gatherer supports a method is read from its entry, for auto's candidates too."""
    monkeypatch.setitem(METHODS, "reap", replace(METHODS["reap"], sequential=False))
    monkeypatch.setattr(pipeline, "gather", None)  # loading anything would fail otherwise
    path = tiny_checkpoint("qwen3_moe")
    for name in ("reap", "auto"):
        with pytest.raises(MoescopeError, match=rf"--method {name} needs the original in memory \(reap\)"):
            export_proxy(path, tmp_path / "p", method=name, streaming=True, **QUICK)
    assert not (tmp_path / "p").exists()
