"""Tiny models: every architecture runs a padded batch and generates, as real checkpoints do."""

from __future__ import annotations

import pytest
import torch

from moescope.models.zoo import TINY_ARCHS, tiny, tiny_config


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_padded_forward_and_generate(arch: str) -> None:
    model = tiny(arch)
    ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding, as in batched rollouts
    with torch.no_grad():
        assert torch.isfinite(model(ids, attention_mask=mask).logits).all()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 8)


def test_seed_controls_weights_without_touching_global_rng() -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = tiny("mixtral", seed=0), tiny("mixtral", seed=0), tiny("mixtral", seed=1)
    assert torch.equal(torch.rand(1), before)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_overrides_win() -> None:
    assert tiny_config("qwen2_moe", num_experts=16).num_experts == 16
    assert tiny_config("deepseek_v3", n_group=2).n_group == 2
