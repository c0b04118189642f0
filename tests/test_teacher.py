"""Teacher cache: healing against a whole-vocabulary cache gives the weights healing against the
model gives; the layer-sequential cache equals the in-memory one, in one forward; a saved cache
comes back whole and a stale one is refused; a truncated cache still heals; computed a round
at a time, it runs the original on the batches healing reaches alone."""

from __future__ import annotations

import itertools

import pytest
import torch

from moescope.errors import MoescopeError
from moescope.explore.clustering import select_experts
from moescope.explore.rl_data import RLCalibration
from moescope.explore.sequential import layer_sequential
from moescope.export.fidelity.agreement import kl_loss, scored_log_probs
from moescope.export.healing import Distillation, heal, healing_batches, training_batches
from moescope.export.surgery import build_proxy
from moescope.export.teacher import (
    TeacherCache,
    TeacherRounds,
    batches_digest,
    build_teacher_cache,
    coarse_kl,
    distillation_loss,
    teacher_cache,
)
from moescope.models.toy import load_toy
from moescope.models.view import decoder_layers

STEPS, ROWS = 3, 6


@pytest.fixture(scope="module")
def toy():
    return load_toy()


@pytest.fixture(scope="module")
def batches(toy):
    return healing_batches("tasks", toy[1], steps=STEPS, batch_size=ROWS)


@pytest.fixture(scope="module")
def cache(toy, batches):
    """The whole vocabulary (44 tokens), in forwards of 4 rows: batches split across forwards."""
    return build_teacher_cache(toy[0], batches, k=64, rows=4)


def _proxy(model):
    return build_proxy(model, select_experts(model, "1/4", method="random"))


def test_healing_against_a_whole_vocabulary_cache_gives_the_same_weights(toy, cache) -> None:
    model, tok = toy
    options = {"tokenizer": tok, "steps": STEPS, "batch_size": ROWS, "heldout_tokens": 128, "tasks": ()}
    healed, cached = _proxy(model), _proxy(model)
    expected = heal(model, healed, **options)
    got = heal(model, cached, teacher=cache, **options)
    assert got.loss == pytest.approx(expected.loss, rel=1e-5)
    assert got.n_tokens == expected.n_tokens and got.trained == expected.trained
    # Forwards of other shapes round the teacher's log-probabilities differently (by up to 1e-5);
    # Adam carries that to 3e-6 on weights that moved 2e-3. With rows=ROWS both are bit-identical.
    for (name, want), have in zip(healed.state_dict().items(), cached.state_dict().values(), strict=True):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5, msg=name)
    fresh = _proxy(model).parameters()
    assert any(not torch.equal(a, b) for a, b in zip(healed.parameters(), fresh, strict=True))  # it trained


def test_a_full_cache_gives_the_loss_and_gradients_of_the_model(toy, cache, batches) -> None:
    model, _ = toy
    proxy = _proxy(model)

    def gradients(teacher):
        proxy.zero_grad()
        distillation_loss(teacher, proxy, batches[1]).backward()
        return [p.grad.clone() for p in proxy.parameters() if p.grad is not None]

    want, got = gradients(model), gradients(cache)
    assert len(got) == len(want) > 0
    for have, expected in zip(got, want, strict=True):
        torch.testing.assert_close(have, expected, rtol=1e-4, atol=1e-6)


def test_the_layer_sequential_cache_equals_the_in_memory_one_in_one_forward(toy, cache, batches) -> None:
    forwards = []
    with layer_sequential("toy") as model:
        decoder_layers(model)[0].register_forward_pre_hook(lambda *_: forwards.append(1))
        got = build_teacher_cache(model, batches, k=64, available=2**30)
    assert got.forwards == len(forwards) == 1  # every layer read once for all the batches
    assert got.config_hash == cache.config_hash and got.digest == cache.digest
    torch.testing.assert_close(got.log_probs, cache.log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.log_rest, cache.log_rest)
    top_two = cache.log_probs[:, 0] - cache.log_probs[:, 1] > 1e-4  # ties may swap
    assert torch.equal(got.token_ids[top_two, 0], cache.token_ids[top_two, 0])


def test_a_saved_cache_comes_back_and_a_stale_one_is_refused(toy, cache, batches, tmp_path) -> None:
    from moescope.models.toy_v3 import load_toy_v3

    model, tok = toy
    path = cache.save(tmp_path / "teacher.safetensors")
    back = TeacherCache.load(path, config=model.config, batches=batches, k=64)
    for name in ("log_probs", "token_ids", "log_rest", "offsets"):
        assert torch.equal(getattr(back, name), getattr(cache, name)), name
    assert back.digest == batches_digest(batches) and (back.k, back.forwards) == (64, cache.forwards)
    assert all(
        torch.equal(a[name], b[name]) for a, b in zip(back.batches, batches, strict=True) for name in b
    )
    other = healing_batches("tasks", tok, steps=STEPS, batch_size=ROWS, seed=1)
    for stale, what in (
        ({"k": 8}, "k 64"),
        ({"batches": other}, "batches digest"),
        ({"config": load_toy_v3()[0].config}, "config hash"),
    ):
        with pytest.raises(MoescopeError, match=what):
            TeacherCache.load(path, **stale)
    made = teacher_cache(model, other, path, k=64, rows=64)  # a stale file is made again, not reused
    assert made.digest == batches_digest(other) and TeacherCache.load(path).digest == made.digest


def test_a_batch_outside_the_cache_is_refused(toy, cache) -> None:
    model, tok = toy
    outside = healing_batches("tasks", tok, steps=STEPS + 1, batch_size=ROWS)[-1]
    with pytest.raises(MoescopeError, match="not in the teacher cache"):
        distillation_loss(cache, _proxy(model), outside)


def test_a_truncated_cache_bounds_the_kl_from_below_and_still_heals(toy, batches) -> None:
    model, _ = toy
    truncated = build_teacher_cache(model, batches, k=2)
    assert truncated.log_probs.shape[1] == 2 and bool((truncated.log_rest < 0).all())
    proxy = _proxy(model)
    with torch.no_grad():
        log_q = scored_log_probs(proxy, batches[0])
        log_p, token_ids, log_rest = truncated.teacher(batches[0])
        coarse = coarse_kl(log_p, token_ids, log_rest, log_q)
        full = kl_loss(model, proxy, batches[0])
    p = torch.cat([log_p, log_rest[:, None]], dim=-1).double().exp()  # top 2 and the rest
    q_all = log_q.double().exp()
    q = torch.cat([q_all.gather(-1, token_ids), q_all.scatter(-1, token_ids, 0).sum(-1, keepdim=True)], -1)
    expected = (torch.xlogy(p, p) - torch.xlogy(p, q)).sum(-1)
    torch.testing.assert_close(coarse.double(), expected, rtol=1e-4, atol=1e-5)
    assert 0 < float(coarse.mean()) <= float(full) + 1e-6
    run = Distillation(truncated, proxy, itertools.cycle(batches[:1]), lr=1e-2)
    losses = run.train(8)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert run.verify() > 0


def test_healing_batches_are_the_first_an_in_memory_run_draws(toy) -> None:
    model, tok = toy
    prompts = tuple((1, 5 + i, 7) for i in range(8))
    data = RLCalibration(prompts, tuple((9, i % 5 + 3, 2) for i in range(8)), 0, 1.0, 3, None, 2)
    drawn = training_batches(data, tok, model=model, batch_size=4, seq_len=16, seed=0)
    expected = list(itertools.islice(drawn, 2))  # the data's own rows: nothing sampled yet
    got = healing_batches(data, tok, steps=2, batch_size=4, seq_len=16)
    assert batches_digest(got) == batches_digest(expected)
    with pytest.raises(MoescopeError, match="need 12 RL rows"):
        healing_batches(data, tok, steps=3, batch_size=4)


def test_rounds_run_the_original_on_the_batches_healing_reaches_alone(toy, cache, batches) -> None:
    model, tok = toy
    drawn = []

    def stream():
        for batch in training_batches("tasks", tok, batch_size=ROWS, seq_len=128, seed=0):
            drawn.append(batch)
            yield batch

    rounds = TeacherRounds(model, stream(), steps=STEPS, size=2, k=64)
    assert not drawn  # nothing drawn or run before healing asks
    run = Distillation(rounds, _proxy(model), iter(rounds), lr=1e-3)
    run.train(1)
    assert len(drawn) == len(rounds.cache) == 2 and rounds.cache.forwards == 1  # the first round
    assert batches_digest(rounds.cache.batches) == batches_digest(batches[:2])
    run.train(2)  # the budget's last batch, in a round of its own; the stream is cut there
    assert len(drawn) == len(rounds.cache) == STEPS and rounds.cache.forwards == 2
    assert batches_digest(iter(rounds)) == batches_digest(batches)  # the same batches on every pass
    whole = rounds.upto(STEPS + 5)
    assert whole is rounds.cache and torch.equal(whole.offsets, cache.offsets)
    torch.testing.assert_close(whole.log_probs, cache.log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(whole.log_rest, cache.log_rest)
    with pytest.raises(MoescopeError, match="not in the teacher cache"):
        rounds.teacher(healing_batches("tasks", tok, steps=STEPS + 1, batch_size=ROWS)[-1])
