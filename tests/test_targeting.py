"""Calibration on the RL task's own data, healing in rounds toward a capability target, and
``keep="auto"``: what is sampled, when healing stops, which counts are tried and what is written."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from moescope.cli import main
from moescope.errors import MoescopeError
from moescope.explore.calibration import calibration_batches, calibration_data
from moescope.explore.clustering import select_experts
from moescope.explore.rl_data import RLCalibration, rl_pairs, sample_rl_calibration
from moescope.export.config import ExportConfig
from moescope.export.fidelity.records import Check
from moescope.export.fidelity.validity import CAPABILITY
from moescope.export.healing import training_batches
from moescope.export.manifest import read_manifest
from moescope.export.pipeline import export_proxy
from moescope.export.surgery import build_proxy
from moescope.export.targeting import Attempt, Targeting, keep_candidates, reach_target, search_keep
from moescope.keep import parse_keep
from moescope.models.tasks import heldout
from moescope.models.toy import load_toy
from moescope.models.view import adapt
from moescope.models.zoo import tiny
from moescope.replay.config import ReplayConfig
from moescope.replay.data import prompt_schedule


@pytest.fixture(scope="module")
def toy():
    return load_toy()


# --- calibration "rl" ------------------------------------------------------------------------------


def test_rl_calibration_is_the_replays_prompts_and_the_models_own_samples(toy) -> None:
    model, tok = toy
    torch.manual_seed(0)
    expected_draw = torch.rand(1)
    torch.manual_seed(0)
    data = sample_rl_calibration(model, tok, n_tokens=300, seed=3)
    assert torch.equal(torch.rand(1), expected_draw)  # the caller's random stream is left as it was
    assert data == sample_rl_calibration(model, tok, n_tokens=300, seed=3)  # same seed, same rows
    assert data.prompts != sample_rl_calibration(model, tok, n_tokens=300, seed=4).prompts

    schedule = prompt_schedule(ReplayConfig(seed=3, steps=1, prompts_per_step=len(data)))[0]
    assert data.prompts == tuple(tuple(tok(ex.prompt)["input_ids"]) for ex in schedule)
    for completion in data.completions:  # up to and including end-of-sequence, within the budget
        ended = completion[-1] == tok.eos_token_id
        assert len(completion) <= data.max_new_tokens and (ended or len(completion) == data.max_new_tokens)
        assert tok.eos_token_id not in completion[:-1]
    record = data.record()
    assert (record["source"], record["prompts"], record["completions"]) == ("rl", len(data), len(data))
    assert record["tokens"] == data.n_tokens == record["prompt_tokens"] + record["completion_tokens"] >= 300

    batches = list(calibration_batches(data, tok, n_tokens=data.n_tokens, batch_size=64, seq_len=128))
    rows = [
        row[mask.bool()].tolist()
        for b in batches
        for row, mask in zip(b["input_ids"], b["attention_mask"], strict=True)
    ]
    assert rows == data.rows()  # the routing pass reads prompt + completion, every token


def test_healing_goes_on_along_the_same_stream(toy) -> None:
    model, tok = toy
    data = sample_rl_calibration(model, tok, n_tokens=100, seed=0)
    longer = sample_rl_calibration(model, tok, n_tokens=data.n_tokens + 1, seed=0)
    assert len(longer) > len(data)
    assert list(itertools.islice(rl_pairs(data, model, tok), len(longer))) == longer.pairs()
    batch = next(training_batches(data, tok, batch_size=4, seq_len=128, seed=0, model=model))
    first = data.pairs()[0]
    scored = batch["input_ids"][0][batch["scored"][0]].tolist()
    assert scored == list(first[1])  # healing scores the sampled completion, not the prompt


def test_a_model_without_tokenizer_calibrates_on_random_ids() -> None:
    model = tiny("qwen3_moe")
    data = calibration_data(model, None, "rl", n_tokens=100, seed=0)
    assert not isinstance(data, RLCalibration) and data.shape == (2, 64)
    with pytest.raises(MoescopeError, match="sampled from the model"):
        next(calibration_batches("rl", None, n_tokens=10, batch_size=2, seq_len=8))


# --- rounds ----------------------------------------------------------------------------------------


class _Probe:
    """Passes from measurement ``passes_at`` on (never when 0); the ratio grows by a quarter a call."""

    def __init__(self, passes_at: int, ratio: float | None = None) -> None:
        self.calls, self.passes_at, self.ratio = 0, passes_at, ratio

    def check(self, proxy) -> Check:
        self.calls += 1
        ratio = self.calls / 4 if self.ratio is None else self.ratio
        return Check(CAPABILITY, 0 < self.passes_at <= self.calls, "", {"ratio": ratio})


def _tiny_run():
    model = tiny("qwen3_moe")
    selection = select_experts(model, "1/2", method="random")
    ids = torch.randint(3, 100, (8, 16), generator=torch.Generator().manual_seed(0))
    batches = training_batches(ids, None, batch_size=4, seq_len=16, seed=0)
    return model, selection, build_proxy(model, selection), batches


def test_healing_stops_at_the_first_passing_round_and_records_the_curve() -> None:
    model, selection, proxy, batches = _tiny_run()
    router = adapt(proxy).layers[0].router_weight.detach().clone()
    probe = _Probe(passes_at=3)
    attempt = reach_target(
        model, proxy, selection, probe, batches, ExportConfig(heal_budget=50, heal_round=5)
    )
    assert attempt.curve == ((0, 0.25), (5, 0.5), (10, 0.75)) and attempt.passed and probe.calls == 3
    assert (attempt.keep, attempt.before, attempt.after, attempt.steps) == (selection.keep, 0.25, 0.75, 10)
    assert not torch.equal(adapt(proxy).layers[0].router_weight, router)  # it healed


def test_healing_spends_at_most_the_budget_and_stops_when_unmeasurable() -> None:
    model, selection, proxy, batches = _tiny_run()
    config = ExportConfig(heal_budget=12, heal_round=5)
    attempt = reach_target(model, proxy, selection, _Probe(passes_at=0), batches, config)
    assert [steps for steps, _ in attempt.curve] == [0, 5, 10, 12] and not attempt.passed
    unmeasurable = _Probe(passes_at=0, ratio=math.nan)
    attempt = reach_target(model, proxy, selection, unmeasurable, batches, config)
    assert unmeasurable.calls == 1 and attempt.steps == 0  # the original solves nothing: no healing


# --- the search ------------------------------------------------------------------------------------


def test_the_search_tries_the_anchors_then_bisects() -> None:
    candidates = list(range(4, 17))  # 1/8 to 1/2 of 32
    for smallest_passing in range(1, 20):
        tried: list[int] = []

        def passes(count: int, smallest: int = smallest_passing, tried: list[int] = tried) -> bool:
            tried.append(count)
            return count >= smallest

        found = search_keep(candidates, passes, 32)
        assert found == (max(smallest_passing, 4) if smallest_passing <= 16 else None)
        assert len(tried) == len(set(tried)) <= 3 + 3  # anchors, then at most log2(7) + 1 bisections
        anchors = [4, 8, 16][: 1 + next((i for i, c in enumerate([4, 8, 16]) if c >= smallest_passing), 2)]
        assert tried[: len(anchors)] == anchors  # cheapest anchor first, up to the first that passes
    tried = []
    search_keep(candidates, lambda c: tried.append(c) or c >= 5, 32)
    assert tried == [4, 8, 6, 5]


@pytest.mark.parametrize("arch", ["qwen3_moe", "dots3_note_text"])
def test_keep_candidates_are_the_counts_the_routing_allows(arch: str) -> None:
    model = tiny(arch)
    moe = adapt(model)
    candidates = keep_candidates(moe)
    rule = moe.rule
    assert candidates and all(moe.num_experts / 8 <= c <= moe.num_experts / 2 for c in candidates)
    for count in range(1, moe.num_experts + 1):
        try:
            parse_keep(count, moe.num_experts, moe.top_k, rule.n_group, topk_group=rule.topk_group)
            allowed = moe.num_experts / 8 <= count <= moe.num_experts / 2
        except MoescopeError:
            allowed = False
        assert (count in candidates) == allowed
    for count in candidates:  # every candidate makes a valid selection (grouped routing included)
        assert select_experts(model, count, method="random").keep == count


# --- the export ------------------------------------------------------------------------------------


def _prompt_file(tmp_path: Path, n: int = 12) -> Path:
    """Held-out add2 prompts: greedy accuracy on a few lines is the cheapest capability to measure."""
    path = tmp_path / "add2.jsonl"
    lines = [json.dumps({"prompt": ex.prompt, "answer": ex.answer}) for ex in heldout("add2", n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_keep_auto_searches_with_one_calibration_pass_and_records_the_attempts(tmp_path: Path) -> None:
    result = export_proxy(
        "toy",
        tmp_path / "proxy",
        keep="auto",
        tasks=_prompt_file(tmp_path),
        n_tokens=1000,
        heal_budget=10,
        heal_round=5,
        fidelity={"n_tokens": 256},
        progress=False,
    )
    targeting, manifest = result.targeting, read_manifest(result.path)
    assert manifest["targeting"] == json.loads(json.dumps(targeting.to_dict()))
    assert Targeting.from_dict(manifest["targeting"]) == targeting
    assert Targeting.load(targeting.save(tmp_path / "targeting.json")) == targeting
    frame = result.targeting_frame()
    assert len(frame) == sum(len(a.curve) for a in targeting.attempts) and frame["chosen"].any()
    assert (
        manifest["calibration"]["source"] == "rl" and manifest["calibration"]["prompt_source"] == "add2.jsonl"
    )
    passed = {a.keep: a.passed for a in targeting.attempts}
    tried: list[int] = []
    search_keep(list(range(4, 17)), lambda c: tried.append(c) or passed[c], 32)
    assert [a.keep for a in targeting.attempts] == tried  # the documented order, each count once
    winners = [a.keep for a in targeting.attempts if a.passed]
    best = min(winners) if winners else max(targeting.attempts, key=lambda a: (a.after, a.keep)).keep
    assert targeting.keep == best == result.selection.keep == manifest["proxy"]["num_experts"]
    capability = result.checklist[2]
    assert capability.details["ratio"] == pytest.approx(targeting.chosen.after)  # the checklist's figure
    assert capability.passed == targeting.passed and bool(targeting.reason) != targeting.passed
    assert all(a.steps <= 10 and a.curve[0][0] == 0 for a in targeting.attempts)


def test_a_proxy_that_misses_its_target_is_written_marked_failing(tmp_path: Path, capsys) -> None:
    out, prompts = tmp_path / "proxy", _prompt_file(tmp_path)
    args = [
        "export",
        "toy",
        "--keep",
        "1/8",
        "--method",
        "random",
        "--prompts",
        str(prompts),
        "--out",
        str(out),
    ]
    target = ["--min-capability", "1", "--heal-budget", "4", "--heal-round", "2", "--n-tokens", "1000"]
    assert main([*args, *target]) == 0
    printed = capsys.readouterr().out
    manifest = read_manifest(out)
    targeting = manifest["targeting"]
    assert not targeting["passed"] and targeting["reason"] in printed
    assert [point["steps"] for point in targeting["attempts"][0]["curve"]] == [0, 2, 4]
    assert "FAIL: the proxy misses its capability target: " in printed and "keep 4 of 32" in printed
    capability = next(c for c in manifest["checklist"] if c["name"] == CAPABILITY)
    assert not capability["passed"] and capability["details"]["threshold"] == 1


def test_a_streaming_export_says_why_it_measured_no_target(tiny_checkpoint, tmp_path) -> None:
    """Read a layer at a time, the target is measured as in memory (here: no tasks, and it says
    so); the one-read weight-view cut runs no model, and says that."""
    source = tiny_checkpoint("qwen3_moe")
    planned = export_proxy(source, tmp_path / "p", keep="1/2", streaming=True, progress=False)
    assert planned.manifest["original"]["read"] == "layer-sequential"
    assert planned.manifest["targeting"]["why"].startswith("no tasks for this model; give --prompts FILE")
    cut = export_proxy(source, tmp_path / "c", keep="1/2", streaming=True, method="cluster", progress=False)
    why = cut.manifest["calibration"]["why"]
    assert why.startswith("the weight view is cut in one read of the shards and runs no model")
    assert cut.manifest["calibration"] == {"source": "rl", "used": False, "why": why}
    assert cut.manifest["targeting"] == {"min_capability": 0.8, "measured": False, "why": why}


# --- bad input -------------------------------------------------------------------------------------


def _bad_inputs(tmp_path: Path, tiny_checkpoint) -> dict[str, list[str]]:
    blank, empty = tmp_path / "blank.txt", tmp_path / "empty.jsonl"
    blank.write_text("\n   \n\n")
    empty.write_text('{"text": ""}\n{"text": "  "}\n')
    toy = ["toy", "--keep", "1/4"]
    return {
        "keep=auto needs a capability target": ["toy", "--keep", "auto", "--min-capability", "0"],
        "keep=auto needs to heal each candidate": ["toy", "--keep", "auto", "--heal-steps", "5"],
        "heal_budget=0 leaves no healing": [*toy, "--heal-budget", "0"],
        "heal_round=-1 leaves no healing": [*toy, "--heal-round", "-1"],
        "min_capability=1.5 is no accuracy ratio": [*toy, "--min-capability", "1.5"],
        "min_capability=-0.1 is no accuracy ratio": [*toy, "--min-capability", "-0.1"],
        "(file blank.txt) holds no text": [*toy, "--calibration", str(blank)],
        "(file empty.jsonl) holds no text": [*toy, "--calibration", str(empty)],
        "keep=auto measures each candidate's task accuracy": [
            str(tiny_checkpoint("qwen3_moe")),
            "--keep",
            "auto",
        ],
    }


def test_bad_input_is_one_sentence_exit_2_and_nothing_written(
    tmp_path: Path, tiny_checkpoint, capsys
) -> None:
    for expected, args in _bad_inputs(tmp_path, tiny_checkpoint).items():
        out = tmp_path / "out"
        assert main(["export", *args, "--out", str(out)]) == 2, expected
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0] and lines[0].endswith("."), captured.err
        assert not out.exists() and not list(tmp_path.glob(".out*")), expected


@pytest.mark.parametrize("search", ["auto", "fixed"])
def test_the_targeting_text_says_when_the_kept_count_was_searched(search: str) -> None:
    attempts = (Attempt(4, 0.25, ((0, 0.5), (50, 0.9)), True),)
    text = Targeting(0.8, 400, 50, 1e-3, search, attempts, 4).text(num_experts=16)
    assert ("keep auto" in text) == ("chose keep 4 of 16" in text) == (search == "auto")
    assert text.startswith("capability target 0.8 (healing up to 400 steps, 50 per round")
    assert "  keep 4 of 16 (25.0%): accuracy ratio 0.50 -> 0.90 after 50 healing steps, pass" in text
