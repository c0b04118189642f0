"""One export plan, two gatherers: an original read a decoder layer at a time (forced here with a
memory budget below the embedded model's size) gives the proxy the in-memory export gives."""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path

import pytest
import torch

from moescope.cli import main
from moescope.errors import MoescopeError
from moescope.explore.clustering import select_experts
from moescope.explore.sequential import layer_sequential
from moescope.export.fidelity.validity import backbone_check, routing_check
from moescope.export.gather import IN_MEMORY, LAYER_SEQUENTIAL, choose_placement, parse_size
from moescope.export.manifest import read_manifest
from moescope.export.pipeline import export_proxy
from moescope.export.surgery import build_proxy, expert_state_keys
from moescope.models.loading import load_model, resolve_model, weight_files
from moescope.models.view import adapt

TOY_BUDGET = "4MB"  # below the toy's weights, above one of its layers and a 1/4 proxy
QUICK = {"keep": "1/4", "calibration": "tasks", "n_tokens": 1000, "fidelity": False, "min_capability": 0}


def test_the_budget_chooses_the_gatherer() -> None:
    """Layer-sequential when the original and a proxy exceed the budget, or when told."""
    assert choose_placement(100, 0.25, streaming=None, max_memory=125).mode == IN_MEMORY
    assert choose_placement(100, 0.25, streaming=None, max_memory=124).mode == LAYER_SEQUENTIAL
    assert choose_placement(100, 0.25, streaming=True, max_memory=None).mode == LAYER_SEQUENTIAL
    assert choose_placement(100, 0.25, streaming=False, max_memory=1).mode == IN_MEMORY
    assert "exceed --max-memory (124 B" not in choose_placement(100, 0.25, streaming=None, max_memory=124).why
    assert parse_size("4MB") == 4_000_000 and parse_size("1GiB") == 1 << 30
    assert parse_size("1.5GB") == 1_500_000_000 and parse_size("0.5 GiB") == 1 << 29  # accelerate: no


@pytest.mark.parametrize("size", ["lots", "0", "-3MB", "", "4.7", "MB", "1.2.3GB"])
def test_a_budget_that_is_no_size_is_one_sentence(size: str) -> None:
    with pytest.raises(MoescopeError, match=r"max_memory=.* is not a size; give bytes or a size such as"):
        parse_size(size)


def test_the_toy_budget_forces_the_layer_sequential_gatherer() -> None:
    weights = sum(f.stat().st_size for f in weight_files(resolve_model("toy")))
    assert weights > parse_size(TOY_BUDGET)  # so the test exercises the path it names


@pytest.mark.parametrize("method", ["frequency", "reap", "paper", "taylor", "cluster"])
def test_a_budget_below_the_model_keeps_the_in_memory_experts(method: str, tmp_path: Path) -> None:
    options = {**QUICK, "method": method, "progress": False}
    memory = export_proxy("toy", tmp_path / "memory", **options)
    sequential = export_proxy("toy", tmp_path / "sequential", max_memory=TOY_BUDGET, **options)
    assert memory.manifest["original"]["read"] == IN_MEMORY
    assert sequential.manifest["original"]["read"] == LAYER_SEQUENTIAL
    assert "exceed --max-memory (4.0 MB)" in sequential.manifest["original"]["why"]
    kept = [[layer.kept for layer in result.selection.layers] for result in (memory, sequential)]
    assert kept[0] == kept[1], method
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        written = [
            load_model(result.path, with_tokenizer=False)[0].state_dict() for result in (memory, sequential)
        ]
    assert written[0].keys() == written[1].keys()
    assert all(written[0][name].equal(written[1][name]) for name in written[0]), method


def test_a_layer_sequential_original_heals_the_proxy_the_in_memory_one_heals(tmp_path: Path) -> None:
    """Healing against the layer-sequential original's cached distributions (the whole toy
    vocabulary) trains the weights healing against the original in memory trains."""
    options = {**QUICK, "method": "frequency", "heal_steps": 3, "tasks": ("add2",), "progress": False}
    memory = export_proxy("toy", tmp_path / "memory", **options)
    sequential = export_proxy("toy", tmp_path / "sequential", max_memory=TOY_BUDGET, **options)
    assert sequential.manifest["original"]["read"] == LAYER_SEQUENTIAL
    assert sequential.healing.loss == pytest.approx(memory.healing.loss, rel=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        written = [load_model(r.path, with_tokenizer=False)[0].state_dict() for r in (memory, sequential)]
    trained = {name for name in written[0] if any(part in name for part in memory.healing.trained)}
    # Adam scales each gradient by its own running size, so float noise in a near-zero gradient
    # (the two passes sum in another order) moves a weight by a visible share of a step: on an
    # AVX2-only EPYC 1.2e-5 after three steps of lr 1e-3. Within 1 % of the most a weight can move.
    moved = memory.healing.steps * memory.healing.lr
    assert trained and all(
        torch.allclose(written[1][name], written[0][name], rtol=0, atol=0.01 * moved) for name in written[0]
    )


@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen2_moe", "gpt_oss"])
def test_the_checklist_reads_a_layer_sequential_original_a_layer_at_a_time(
    arch: str, tiny_checkpoint, tmp_path: Path
) -> None:
    """Backbone and routing checks of a proxy against the original read from its shards equal the
    checks against the original in memory (correction biases, shared experts, router biases),
    the proxy's own layers read from its saved shards too."""
    path = tiny_checkpoint(arch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, _ = load_model(path, dtype="auto", with_tokenizer=False)
        selection = select_experts(model, "1/2", method="random", seed=1)
        proxy = build_proxy(model, selection)
        expected = [
            backbone_check(adapt(model), adapt(proxy)),
            routing_check(adapt(model), adapt(proxy), selection),
        ]
        with layer_sequential(path, dtype="auto") as original:
            got = [
                backbone_check(adapt(original), adapt(proxy)),
                routing_check(adapt(original), adapt(proxy), selection),
            ]
            proxy.save_pretrained(tmp_path / "proxy")
            with layer_sequential(tmp_path / "proxy", dtype="auto") as read:
                both = _checks(original, read, selection)
            proxy.model.norm.weight.data.add_(1.0)  # a changed backbone tensor is found there too,
            proxy.model.layers[1].input_layernorm.weight.data.add_(1.0)  # inside a layer too
            changed = backbone_check(adapt(original), adapt(proxy))
            layer = original._layer_weights.read(
                "model.layers.1.", leave_out=expert_state_keys(adapt(original))
            )
    assert [(c.passed, c.figure) for c in got] == [(c.passed, c.figure) for c in expected]
    assert [(c.passed, c.figure) for c in both] == [(c.passed, c.figure) for c in expected]
    assert all(c.passed for c in got)
    differing = changed.details["tensors_differing"]
    assert not changed.passed and {"model.norm.weight", "model.layers.1.input_layernorm.weight"} <= set(
        differing
    )
    experts = {n for n in expert_state_keys(adapt(model)) if n.startswith("model.layers.1.")}
    assert experts and not experts & set(layer) and "model.layers.1.input_layernorm.weight" in layer


def _checks(original, proxy, selection) -> list:
    return [
        backbone_check(adapt(original), adapt(proxy)),
        routing_check(adapt(original), adapt(proxy), selection),
    ]


def test_healing_a_proxy_larger_than_the_budget_is_refused_before_any_pass(tmp_path: Path, capsys) -> None:
    out = tmp_path / "proxy"
    argv = ["export", "toy", "--keep", "1/2", "--max-memory", "10kB", "--heal-steps", "5", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "does not fit --max-memory (10.0 kB)" in err and "healing it loads it whole" in err, err
    assert "--shard fsdp" in err and err.count("\n") == 0, err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_healing_a_cut_proxy_larger_than_the_budget_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys
) -> None:
    """A half proxy passes the check before any pass (the kept share of the weights, 3.6 MB, fits
    4 MB) but its cut (4.0 MB) does not: measured only, it would be read a layer at a time, but
    healing trains it whole, so it is one sentence, and the scratch cut is removed."""
    argv = ["export", "toy", "--keep", "1/2", "--max-memory", TOY_BUDGET, "--method", "frequency"]
    quick = ["--calibration", "tasks", "--n-tokens", "1000", "--heal-steps", "5", "--min-capability", "0"]
    assert main([*argv, *quick, "--out", str(tmp_path / "proxy")]) == 2
    err = capsys.readouterr().err.strip()
    assert "the proxy (4.0 MB) does not fit --max-memory (4.0 MB), and healing it loads it whole" in err, err
    assert "--shard fsdp" in err and err.count("\n") == 0, err
    assert not list(tmp_path.iterdir())


def test_a_proxy_too_large_to_heal_is_measured_and_refused_only_when_short_of_the_target(
    tmp_path: Path, capsys
) -> None:
    """A half proxy (4.0 MB) cannot be trained within 4 MB, but a target asks for healing only
    where the proxy falls short of it: one that passes is read a layer at a time, measured and
    written; one that falls short is the one sentence, with nothing written."""
    argv = ["export", "toy", "--keep", "1/2", "--max-memory", TOY_BUDGET, "--method", "reap"]
    quick = ["--calibration", "tasks", "--n-tokens", "1000"]
    assert main([*argv, *quick, "--min-capability", "0.3", "--out", str(tmp_path / "passes")]) == 0
    manifest = read_manifest(tmp_path / "passes")
    assert manifest["proxy_read"]["read"] == LAYER_SEQUENTIAL
    assert manifest["targeting"]["passed"] and "after 0 healing steps, pass" in capsys.readouterr().out
    assert main([*argv, *quick, "--min-capability", "0.99", "--out", str(tmp_path / "short")]) == 2
    err = capsys.readouterr().err.strip()
    assert "the proxy (4.0 MB) does not fit --max-memory (4.0 MB), and healing it loads it whole" in err, err
    assert err.count("\n") == 0 and not (tmp_path / "short").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["passes"]


def test_a_budget_below_one_layer_is_refused(tmp_path: Path, capsys) -> None:
    out = tmp_path / "proxy"
    argv = [
        "export",
        "toy",
        "--keep",
        "1/4",
        "--max-memory",
        "10kB",
        "--no-fidelity",
        "--min-capability",
        "0",
    ]
    assert main([*argv, "--method", "frequency", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "one decoder layer of the original" in err and "raise --max-memory" in err and err.count("\n") == 0
    assert not list(tmp_path.iterdir())


def test_the_console_says_where_the_original_was_read_and_why_capability_was_not_measured(
    tmp_path: Path, capsys
) -> None:
    argv = ["export", "toy", "--keep", "1/4", "--max-memory", TOY_BUDGET, "--method", "frequency"]
    quick = ["--calibration", "tasks", "--n-tokens", "1000", "--no-fidelity", "--min-capability", "0"]
    assert main([*argv, *quick, "--out", str(tmp_path / "proxy")]) == 0
    printed = capsys.readouterr().out
    assert "original: read layer-sequential (the original and a proxy" in printed
    assert "capability: not measured: fidelity is off (--no-fidelity)" in printed
    manifest = read_manifest(tmp_path / "proxy")
    assert manifest["original"]["read"] == LAYER_SEQUENTIAL and manifest["config"]["max_memory"] == TOY_BUDGET


def test_own_completions_are_sampled_as_many_chunks_at_a_time_as_memory_holds() -> None:
    """Chunks sampled in one generate draw each with its own seed: the same completions as one
    chunk per call, so the layer-sequential export reads the checkpoint once per token for all."""
    from moescope.explore import rl_data

    model, tokenizer = load_model("toy")
    alone = list(itertools.islice(rl_data._chunks(model, tokenizer, "add2", 0, 1.0, first=1, group=1), 3))
    grouped = list(itertools.islice(rl_data._chunks(model, tokenizer, "add2", 0, 1.0, first=1, group=3), 3))
    assert grouped == alone and len({pair for chunk in alone for pair in chunk}) > 300
    with layer_sequential(resolve_model("toy")) as original:
        assert rl_data.chunks_per_pass(original, 8, available=1 << 30) > 1
    assert rl_data.chunks_per_pass(model, 8) == 1  # in memory: one chunk per call, as ever


def test_healing_samples_a_round_ahead_of_a_layer_sequential_original(monkeypatch) -> None:
    """Rows sampled at once for healing are a round's, not all memory holds: the rest of a
    pass went unused whenever the proxy passed first."""
    from moescope.explore import rl_data
    from moescope.export.healing import training_batches

    _, tokenizer = load_model("toy")
    data = rl_data.RLCalibration(((1, 2),), ((3,),), 0, 1.0, 8, "add2", tokenizer.eos_token_id)
    passes: list[int] = []

    def sample(model, tokenizer, prompts, *args):
        passes.append(len(prompts))
        return [(tokenizer.eos_token_id,)] * len(prompts)

    monkeypatch.setattr(rl_data, "_sample", sample)
    shape = {"batch_size": 32, "seq_len": 64, "seed": 0}
    round_rows = 2 * rl_data._BATCH  # a round of 5 steps of 32 rows, in whole chunks
    with layer_sequential(resolve_model("toy")) as original:
        for round_steps in (5, None):
            passes.clear()
            batches = training_batches(data, tokenizer, model=original, round_steps=round_steps, **shape)
            list(itertools.islice(batches, 20))  # 639 fresh rows
            assert sum(passes) >= 639
            if round_steps:
                assert passes == [round_rows] * 3
            else:
                assert passes[0] > 10 * round_rows  # memory alone: more at once than healing may use


@pytest.mark.parametrize(
    "arch", ["mixtral", "deepseek_v3", "gpt_oss", "jamba", "qwen3_next", "lfm2_moe", "minimax"]
)
def test_rows_that_end_leave_a_grouped_generate_and_the_rest_draw_as_alone(
    arch, monkeypatch, one_thread
) -> None:
    """Chunks sampled together lose each row that ended, its cache rows with it (attention,
    sliding-window, state-space, linear-attention and MiniMax's own caches), and every other row
    still draws what its chunk draws in a call of its own."""
    from types import SimpleNamespace

    from moescope.explore import rl_data
    from moescope.models.zoo import tiny

    monkeypatch.setattr(rl_data, "_BATCH", 4)
    shapes: list[int] = []
    model = tiny(arch, vocab_size=8)  # end-of-sequence one token in eight: rows end at every length
    model.register_forward_pre_hook(lambda _, args, kw: shapes.append(len(kw["input_ids"])), with_kwargs=True)
    tokenizer = SimpleNamespace(eos_token_id=1, pad_token_id=0)
    rng = torch.Generator().manual_seed(0)
    prompts = [tuple(torch.randint(2, 8, (3 + i % 4,), generator=rng).tolist()) for i in range(12)]
    seeds = [rl_data._chunk_seed(0, i) for i in range(3)]
    together = rl_data._sample(model, tokenizer, prompts, 12, 1.0, seeds)
    grouped_forwards, shapes[:] = list(shapes), []
    alone = [
        c
        for i in range(3)
        for c in rl_data._sample(model, tokenizer, prompts[4 * i : 4 * i + 4], 12, 1.0, seeds[i : i + 1])
    ]
    assert together == alone
    assert min(map(len, together)) < 4 and max(map(len, together)) == 12
    assert grouped_forwards[0] == 12 and grouped_forwards[-1] < 12 == len(
        grouped_forwards
    )  # one forward a token


def test_a_users_own_rollouts_calibrate_without_sampling(tmp_path: Path, capsys) -> None:
    """A ``.jsonl`` of prompt + completion, as a rollout engine dumps it: the statistics are taken
    on those rows, nothing is sampled, and the console says so; a line without a completion is
    one sentence."""
    from moescope.models.tasks import heldout

    rollouts = tmp_path / "rollouts.jsonl"
    rows = [{"prompt": e.prompt, "completion": e.answer} for e in heldout("add2", 40)]
    rollouts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["export", "toy", "--keep", "1/4", "--method", "frequency", "--calibration", str(rollouts)]
    assert main([*argv, "--no-fidelity", "--min-capability", "0", "--out", str(tmp_path / "p")]) == 0
    printed, manifest = capsys.readouterr().out, read_manifest(tmp_path / "p")
    assert manifest["calibration"]["source"] == "rollouts" and manifest["calibration"]["prompts"] == 40
    assert "calibration: rollouts of rollouts.jsonl, 40 prompts" in printed and "none sampled" in printed
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"prompt": "1+2="}) + "\n")
    assert main([*argv[:-1], str(broken), "--out", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err.strip()
    assert "broken.jsonl:2 has no 'prompt' and 'completion' strings" in err and err.count("\n") == 0
    assert not (tmp_path / "q").exists()


def test_a_layer_sequential_export_measures_as_in_memory_in_few_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fidelity and the checklist of the same proxy equal the in-memory export's; the original's
    accuracy is teacher-forced in one pass on both paths (each measuring its own here, in its own
    cache), so both compare the proxy with the same figure; the held-out pass is batched, so
    the checkpoint is read a handful of times in all, the budget bounding a chunk of rows, not
    how many rows a forward takes."""
    options = {**QUICK, "method": "frequency", "fidelity": True, "tasks": ("add2",), "progress": False}
    monkeypatch.setenv("MOESCOPE_CACHE", str(tmp_path / "memory-cache"))
    memory = export_proxy("toy", tmp_path / "memory", **options)
    monkeypatch.setenv("MOESCOPE_CACHE", str(tmp_path / "sequential-cache"))
    sequential = export_proxy("toy", tmp_path / "sequential", max_memory=TOY_BUDGET, **options)
    original = sequential.manifest["original"]
    for result in (memory, sequential):
        assert result.manifest["original"]["accuracy"]["source"] == "teacher-forced, measured"
    assert original["checkpoint_reads"] <= 6, original  # routing 1, accuracy 1, held-out 1, checklist 2
    figures = [result.fidelity.task_accuracy["original"].tolist() for result in (memory, sequential)]
    assert figures[1] == pytest.approx(figures[0], abs=1e-6)
    assert sequential.fidelity.kl == pytest.approx(memory.fidelity.kl, rel=1e-4)
    assert [(c.name, c.passed, c.details.get("ratio")) for c in sequential.checklist] == [
        (c.name, c.passed, c.details.get("ratio")) for c in memory.checklist
    ]


def test_a_proxy_larger_than_the_budget_is_cut_from_the_shards_when_nothing_is_measured(
    tmp_path: Path,
) -> None:
    """Nothing measured or healed: the proxy is written from the shards and never loaded, so a
    half proxy (4.0 MB) is cut under the same 4 MB budget that refuses measuring it."""
    options = {**QUICK, "keep": "1/2", "method": "frequency", "progress": False}
    result = export_proxy("toy", tmp_path / "p", max_memory=TOY_BUDGET, **options)
    assert result.manifest["original"]["read"] == LAYER_SEQUENTIAL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proxy, _ = load_model(result.path, with_tokenizer=False)
    assert adapt(proxy).num_experts == 16 and sum(f.stat().st_size for f in weight_files(result.path)) > 4e6
    assert "proxy_read" not in result.manifest  # never read


def test_a_proxy_larger_than_the_budget_is_measured_a_layer_at_a_time(tmp_path: Path) -> None:
    """A half proxy that does not fit beside the original's layer is read from its cut a decoder
    layer at a time: the held-out KL and the checklist are the figures of the same proxy in
    memory, its cut read once for the KL and once per check, the proxy written is the one the
    in-memory export writes, and the scratch cut is gone."""
    # a quarter of the held-out tokens: every row still goes in the one read of the held-out KL
    options = {**QUICK, "keep": "1/2", "method": "frequency", "fidelity": {"n_tokens": 2048}, "tasks": ()}
    options["progress"] = False
    memory = export_proxy("toy", tmp_path / "memory", **options)
    sequential = export_proxy("toy", tmp_path / "sequential", max_memory=TOY_BUDGET, **options)
    read = sequential.manifest["proxy_read"]
    assert read["read"] == LAYER_SEQUENTIAL and "exceed --max-memory (4.0 MB)" in read["why"], read
    assert read["checkpoint_reads"] == 3, read  # the held-out KL, the backbone check, the routing check
    assert "proxy measured: read layer-sequential (the proxy (4.0 MB)" in sequential.text()
    assert "proxy_read" not in memory.manifest
    assert sequential.fidelity.kl == pytest.approx(memory.fidelity.kl, rel=1e-5)
    assert sequential.fidelity.top1_agreement == pytest.approx(memory.fidelity.top1_agreement, abs=1e-6)
    assert [(c.name, c.passed, c.figure) for c in sequential.checklist] == [
        (c.name, c.passed, c.figure) for c in memory.checklist
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        written = [load_model(r.path, with_tokenizer=False)[0].state_dict() for r in (memory, sequential)]
    assert written[0].keys() == written[1].keys()
    assert all(written[0][name].equal(written[1][name]) for name in written[0])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["memory", "sequential"]


def test_the_passes_share_the_budget_with_a_proxy_held_whole(tmp_path: Path) -> None:
    """Under --max-memory, a layer-sequential original's chunks of rows are sized within the
    budget, and, once a proxy is cut to be measured, within what the proxy holds: whole where it
    fits beside the original's layer twice over, else only what its decoder layers leave out."""
    from moescope.export.gather import gather, placement_for, resident_bytes
    from moescope.models.resident import read_per_forward

    source = resolve_model("toy")
    placement = placement_for("toy", "1/4", max_memory="6MB")
    with gather("toy", source, placement, out=tmp_path / "proxy") as got:
        assert got.original._pass_memory == parse_size("6MB")
        proxy = got.cut(select_experts(got.original, "1/4", method="random", seed=0))
        held = sum(t.numel() * t.element_size() for t in proxy.state_dict().values())
        assert got.original._pass_memory == parse_size("6MB") - held > 0
        assert got.proxy_read["read"] == IN_MEMORY and not read_per_forward(proxy)
        larger = got.cut(select_experts(got.original, "1/2", method="random", seed=0))
        assert got.proxy_read["read"] == LAYER_SEQUENTIAL and read_per_forward(larger)
        assert 0 < resident_bytes(larger) < held  # its decoder layers are read from the cut
        assert got.original._pass_memory == parse_size("6MB") - resident_bytes(larger)
        assert [p.name for p in tmp_path.iterdir() if ".cut-" in p.name]  # read from there
    assert not list(tmp_path.iterdir())  # the scratch cut removed once the proxy is done
