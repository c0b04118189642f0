"""Expert Taylor importance against the derivative of the model's own likelihood, on every
architecture of the tiny zoo, and the ``taylor`` selection and export built on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moescope.cli import main
from moescope.errors import MoescopeError
from moescope.explore.clustering import select_experts
from moescope.explore.taylor import supports_taylor, taylor_importance
from moescope.export.manifest import read_manifest
from moescope.export.pipeline import export_proxy
from moescope.export.streaming.export import export_streaming
from moescope.models.view import adapt
from moescope.models.zoo import TINY_ARCHS, tiny, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

_SLOW_ARCHS = {"granitemoehybrid"}  # the reference Mamba-2 kernel takes seconds on CPU
_SCALING = [a for a in TINY_ARCHS if supports_taylor(adapt(tiny(a)))]


def _model(arch: str):
    # The zoo's Multi-head Latent Attention models handle a padding mask only with one KV head
    # per query head, as real MLA checkpoints have (see test_routing).
    overrides = {"num_key_value_heads": 4} if "kv_lora_rank" in tiny_config(arch).to_dict() else {}
    return tiny(arch, **overrides).eval()


def _output_scale_derivative(model, row: int, expert: int, ids: torch.Tensor) -> float:
    """``d log p(ids) / dc`` where ``c`` scales the expert's output through its own down
    projection (and its bias): a backward pass through the weights, not through the routing."""
    layer = adapt(model).layers[row]
    params = list(layer.expert_module.parameters())
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
        p.grad = None
    log_p = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), dim=-1)
    log_p.gather(-1, ids[:, 1:, None]).sum().backward()
    weights = layer.expert(expert)
    for p in params:  # the same views, read from the gradients
        p.data, p.grad = p.grad, p.data
    grads = layer.expert(expert)
    for p, flag in zip(params, flags, strict=True):
        p.data, p.grad = p.grad, None
        p.requires_grad_(flag)
    pairs = [(weights.down, grads.down), (weights.down_bias, grads.down_bias)]
    return sum(float((w.detach().double() * g.detach().double()).sum()) for w, g in pairs if w is not None)


@pytest.mark.parametrize(
    "arch", [pytest.param(a, marks=pytest.mark.slow) if a in _SLOW_ARCHS else a for a in _SCALING]
)
def test_each_sum_is_the_derivative_of_the_likelihood_by_the_experts_output(arch: str) -> None:
    """One sequence: in the first and last MoE layer, the sum of the expert the pass ranks first
    equals the size of the derivative of the log-likelihood by a scale on that expert's output,
    taken through its down projection instead of the routing weights the pass scales."""
    model = _model(arch)
    flags = [p.requires_grad for p in model.parameters()]
    ids = torch.randint(3, model.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(0))
    taylor = taylor_importance(model, ids, n_tokens=ids.numel())
    moe = adapt(model)
    assert taylor.sums.shape == (len(moe.layers), moe.num_experts) and taylor.tokens == 9
    assert np.all(taylor.sums >= 0) and taylor.sequences == 1
    assert [p.requires_grad for p in model.parameters()] == flags, "the flags must be restored"
    for row in (0, len(moe.layers) - 1):
        expert = int(taylor.sums[row].argmax())
        derivative = _output_scale_derivative(model, row, expert, ids)
        assert taylor.sums[row, expert] > 0
        np.testing.assert_allclose(taylor.sums[row, expert], abs(derivative), rtol=1e-3)


def test_sums_add_over_sequences_and_score_only_the_completions(rl_rows) -> None:
    """RL calibration data: the completion tokens count and the prompt is context; two batches of
    one row each sum to one batch of both; an expert no token routed to scores 0."""
    model = _model("deepseek_v3")
    data = rl_rows(2)
    whole = taylor_importance(model, data, batch_size=2)
    parts = taylor_importance(model, data, batch_size=1)
    np.testing.assert_allclose(whole.sums, parts.sums, rtol=1e-5)
    assert whole.tokens == parts.tokens == 6 and whole.sequences == 2

    with torch.no_grad():  # a selection bias far below the others: the expert is never chosen
        adapt(model).layers[0].correction_bias[3] = -1e4
    assert taylor_importance(model, data).sums[0, 3] == 0.0


def test_rl_rows_are_batched_in_order_of_length_and_sum_as_sampled() -> None:
    """Rows of 3 to 12 ids: batched in order of length, longest first, two rows a batch pad 5
    positions where batched as sampled they padded 21, and the sums are those of one row a batch."""
    from moescope.explore import taylor as taylor_module
    from moescope.explore.rl_data import RLCalibration

    g = torch.Generator().manual_seed(0)
    lengths = [(8, 4), (2, 1), (6, 2), (2, 2), (9, 3), (3, 1)]
    rows = [torch.randint(2, 100, (p + c,), generator=g).tolist() for p, c in lengths]
    data = RLCalibration(
        tuple(tuple(r[:p]) for r, (p, _) in zip(rows, lengths, strict=True)),
        tuple(tuple(r[p:]) for r, (p, _) in zip(rows, lengths, strict=True)),
        seed=0,
        temperature=1.0,
        max_new_tokens=4,
    )
    batches = list(taylor_module._scored_batches(data, None, 0, 2, 0, 0))
    assert [b["input_ids"].shape[1] for b in batches] == [12, 8, 4]  # as sampled: 12, 8, 12
    assert sum(int((b["attention_mask"] == 0).sum()) for b in batches) == 0 + 4 + 1  # as sampled: 9 + 4 + 8
    model = _model("deepseek_v3")
    one_by_one = taylor_importance(model, data, batch_size=1)
    np.testing.assert_allclose(taylor_importance(model, data, batch_size=2).sums, one_by_one.sums, rtol=1e-5)


def test_taylor_keeps_the_experts_of_largest_sum_and_refuses_what_it_cannot_use() -> None:
    model = _model("mixtral")
    ids = torch.randint(3, 128, (4, 12), generator=torch.Generator().manual_seed(2))
    taylor = taylor_importance(model, ids, n_tokens=ids.numel())
    selection = select_experts(model, "1/2", method="taylor", taylor=taylor)
    for row, layer in enumerate(selection.layers):
        assert sorted(layer.kept) == sorted(np.argsort(-taylor.sums[row], kind="stable")[:4].tolist())
    with pytest.raises(MoescopeError, match="needs the model's expert Taylor importance"):
        select_experts(model, "1/2", method="taylor")
    with pytest.raises(MoescopeError, match=r"measured on model config .* measure it on this model"):
        select_experts(tiny("qwen3_moe"), "1/2", method="taylor", taylor=taylor)
    with pytest.raises(MoescopeError, match="scales the expert input instead; choose --method reap"):
        taylor_importance(tiny("llama4_text"), ids, n_tokens=ids.numel())


def test_export_with_taylor_scores_the_rl_completions(tmp_path) -> None:
    """``moescope export toy --method taylor`` calibrates on the toy's own completions, keeps the
    top-Taylor experts and says what the scores mean."""
    out = tmp_path / "proxy"
    args = ["--method", "taylor", "--n-tokens", "600", "--prompts", "add2", "--no-fidelity"]
    assert main(["export", "toy", "--keep", "1/2", *args, "--out", str(out)]) == 0
    manifest = read_manifest(out)
    assert manifest["method"] == "taylor" and manifest["keep"] == 16
    assert manifest["calibration"]["source"] == "rl" and manifest["calibration"]["completion_tokens"] > 0
    assert "Taylor importance" in manifest["selection"]["params"]["score"]


def test_a_streaming_export_scores_taylor_a_layer_at_a_time(tiny_checkpoint, tmp_path) -> None:
    """The export plan runs Taylor on an original read a layer at a time: the in-memory choice;
    the one-read shard cut, which runs no model, refuses it and names the way."""
    path = tiny_checkpoint("qwen3_moe")
    options = {"keep": "1/2", "method": "taylor", "fidelity": False, "min_capability": 0, "progress": False}
    streamed = export_proxy(path, tmp_path / "s", streaming=True, **options)
    in_memory = export_proxy(path, tmp_path / "m", streaming=False, **options)
    assert streamed.manifest["original"]["read"] == "layer-sequential"
    assert [layer.kept for layer in streamed.selection.layers] == [
        layer.kept for layer in in_memory.selection.layers
    ]
    with pytest.raises(MoescopeError, match=r"method=taylor runs a backward pass.*export_proxy"):
        export_streaming(path, tmp_path / "p", keep="1/2", method="taylor", progress=False)
    assert not (tmp_path / "p").exists()
