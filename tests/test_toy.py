from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

import moescope.models.embedded as embedded_module
from moescope._util.io import replace_dir
from moescope.errors import MoescopeError
from moescope.models.embedded import EMBEDDED, embedded_card, embedded_path, load_embedded
from moescope.models.evaluation import evaluate_tasks, generate_answers
from moescope.models.tasks import TASK_FAMILIES, Example, heldout, score
from moescope.models.toy import load_toy, toy_card, toy_path, write_toy
from moescope.models.toy.build import eval_settings

EXPECTED_FILES = {
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "toy_card.json",
}


@pytest.fixture(scope="module")
def toy():
    return load_toy()


MIXED_FAMILIES = ("add2", "add3")  # the families meant to give RL groups mixed rewards
EASY_FAMILIES = ("copy", "rev", "sort")


@pytest.fixture(scope="module")
def measured(toy):
    """The mixed-reward families measured here, with the card's own settings.

    Seeds are per task, so these figures are the card's figures for the same tasks (on the same
    machine), without paying for the long-answer families.
    """
    model, tok = toy
    return evaluate_tasks(model, tok, MIXED_FAMILIES, **eval_settings(toy_card()["recipe"]))


def test_packaged_checkpoint_is_small_and_complete() -> None:
    files = {p.name: p.stat().st_size for p in toy_path().iterdir()}
    assert set(files) >= EXPECTED_FILES
    assert sum(files.values()) <= 10 * 2**20
    card = toy_card()
    assert card["model_sha256"] == hashlib.sha256((toy_path() / "model.safetensors").read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EMBEDDED))
def test_plain_transformers_loads_it_offline(name: str) -> None:
    # a fresh interpreter without moescope imported: the checkpoint must stand on its own
    code = (
        "import sys, torch; from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "ids = t('12+34=', return_tensors='pt').input_ids\n"
        "out = m.generate(ids, do_sample=False)\n"
        "print(type(m).__name__, m.dtype, t.decode(out[0, ids.shape[1]:], skip_special_tokens=True))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    res = subprocess.run(
        [sys.executable, "-c", code, str(embedded_path(name))],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    model, tok = load_embedded(name)
    (answer,) = generate_answers(model, tok, [Example("add2", "12+34=", "46")], do_sample=False)
    assert res.stdout.split() == [*model.config.architectures, "torch.float32", answer]


def test_is_a_stock_qwen3_moe_with_32_experts_top2(toy) -> None:
    from transformers import Qwen3MoeForCausalLM

    model, _ = toy
    cfg = model.config
    assert type(model) is Qwen3MoeForCausalLM and cfg.architectures == ["Qwen3MoeForCausalLM"]
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob) == (32, 2, True)
    assert cfg.num_hidden_layers >= 4 and cfg.mlp_only_layers == [] and cfg.decoder_sparse_step == 1
    assert cfg.num_experts // 8 > cfg.num_experts_per_tok  # keeping 1/8 still leaves more than top-k
    assert model.dtype == torch.float32 and not model.training
    assert load_toy(torch.bfloat16)[0].dtype == torch.bfloat16


def test_tokenizer_round_trips_every_task_string(toy) -> None:
    _, tok = toy
    for task in TASK_FAMILIES:
        for ex in heldout(task, 50):
            ids = tok(ex.prompt + ex.answer).input_ids
            assert ids[0] == tok.bos_token_id and tok.unk_token_id not in ids
            assert len(ids) == 1 + len(ex.prompt + ex.answer)  # one token per character
            assert tok.decode(ids, skip_special_tokens=True) == ex.prompt + ex.answer
    batch = tok(["1+2=", "cpy:abcdef="], padding=True)
    assert batch.input_ids[0][0] == tok.pad_token_id  # left padding, ready for generate


@pytest.mark.slow
def test_accuracy_gives_rl_groups_mixed_rewards(measured) -> None:
    sampled = {r.task: r.sampled for r in measured.results}
    assert any(0.3 <= s <= 0.9 for s in sampled.values()), sampled
    assert max(r.mixed for r in measured.results) >= 0.3
    assert measured["add2"].greedy > measured["add3"].greedy  # difficulty follows digit count


@pytest.mark.slow
def test_easy_families_are_solved_greedily(toy) -> None:
    model, tok = toy
    for task in EASY_FAMILIES:
        examples = heldout(task, 64)
        answers = generate_answers(model, tok, examples, batch_size=64, do_sample=False)
        assert sum(score(ex, a) for ex, a in zip(examples, answers, strict=True)) >= 0.95 * 64, task


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EMBEDDED))
def test_measurement_agrees_with_the_card(name: str, measured) -> None:
    card = embedded_card(name)
    if name != "toy":  # the toy's own measurement is shared with the test above
        model, tok = load_embedded(name)
        measured = evaluate_tasks(model, tok, MIXED_FAMILIES, **eval_settings(card["recipe"]))
    card = {r["task"]: r for r in card["accuracy"]["results"]}
    for r in measured.results:
        for mode, count in (("greedy", r.n), ("sampled", r.n * measured.samples)):
            p = card[r.task][mode]
            # The same machine reproduces the card exactly; another torch build or thread count
            # draws other random numbers, so allow 4 standard errors of the difference of two
            # independent estimates, plus a floor for greedy near-ties that flip.
            tol = 4 * math.sqrt(2 * p * (1 - p) / count) + 0.02
            assert abs(getattr(r, mode) - p) <= tol, (r.task, mode, getattr(r, mode), p)


def test_card_describes_the_checkpoint() -> None:
    card = toy_card()
    cfg = AutoConfig.from_pretrained(toy_path())
    recipe = card["recipe"]
    assert (recipe["num_experts"], recipe["top_k"]) == (cfg.num_experts, cfg.num_experts_per_tok)
    assert {r["task"] for r in card["accuracy"]["results"]} == set(card["recipe"]["tasks"])
    load = card["expert_load"]["share"]
    assert len(load) == cfg.num_hidden_layers and all(len(row) == 32 for row in load)
    assert all(abs(sum(row) - 1) < 1e-6 for row in load)
    assert {"torch", "transformers"} <= set(card["versions"])


def test_write_toy_copies_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = write_toy(tmp_path / "toy")
    assert {p.name for p in out.iterdir()} == {p.name for p in toy_path().iterdir()}
    assert (out / "model.safetensors").read_bytes() == (toy_path() / "model.safetensors").read_bytes()
    with pytest.raises(MoescopeError, match="--overwrite"):
        write_toy(out)
    (out / "stale.txt").write_text("old")
    write_toy(out, overwrite=True)
    assert not (out / "stale.txt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert write_toy(empty) == empty.absolute()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "toy"]  # no temporary left behind


def test_failed_write_keeps_the_old_directory(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")

    def fail(tmp: Path) -> None:
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        replace_dir(out, fail, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_missing_checkpoint_is_a_clear_error(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(embedded_module, "_MODELS_DIR", tmp_path / "nowhere")
    with pytest.raises(MoescopeError, match=r"moescope\.models\.toy\.build"):
        toy_path()
    with pytest.raises(MoescopeError, match=r"moescope\.models\.toy_v3\.build"):
        embedded_module.embedded_path("toy-v3")
