"""What to do with the mass outside a teacher cache's top k: which truncated KL heals like the full one?

Heals a random 1/4 proxy of each embedded toy ``--steps`` steps against the full teacher (its
whole vocabulary cached), then against its top ``k`` with three treatments of the tail:

- ``rest``: the KL over ``k + 1`` outcomes, the top-k tokens and one bucket for the rest
  (:func:`moescope.export.teacher.coarse_kl`);
- ``renorm``: the top-k probabilities renormalised to 1, cross-entropy of the proxy's full softmax;
- ``drop``: the top-k terms of the KL alone, the tail ignored.

Every run sees the same batches and starts from the same proxy (``Distillation``: constant
``lr``, as a capability-targeted export heals). Prints one row per run: the held-out KL after,
and how far its trained weights end from the full teacher's, relative to how far those moved.

    .venv/bin/python bench/teacher_tail.py [--steps 60] [--ks 1 2 4]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from unittest import mock

import torch

from moescope.explore.clustering import select_experts
from moescope.export import teacher
from moescope.export.fidelity.agreement import heldout_batches, next_token_agreement
from moescope.export.healing import Distillation, healing_batches, trainable_tensors
from moescope.export.surgery import build_proxy
from moescope.models.loading import load_model
from moescope.models.view import adapt


def renorm(log_p, token_ids, log_rest, log_q):
    target = torch.softmax(log_p, -1)
    return (target * (torch.log(target) - log_q.gather(-1, token_ids))).sum(-1)


def drop(log_p, token_ids, log_rest, log_q):
    return (log_p.exp() * (log_p - log_q.gather(-1, token_ids))).sum(-1)


TAILS = {"rest": teacher.coarse_kl, "renorm": renorm, "drop": drop}


def truncated(cache: teacher.TeacherCache, k: int) -> teacher.TeacherCache:
    """The top ``k`` of a whole-vocabulary cache, its rest summed exactly from the columns cut."""
    rest = torch.logsumexp(cache.log_probs[:, k:], dim=-1)
    top, ids = cache.log_probs[:, :k], cache.token_ids[:, :k]
    return replace(cache, log_probs=top, token_ids=ids, log_rest=rest, k=k)


def heal_once(model, selection, source, batches, steps, tail):
    proxy = build_proxy(model, selection)
    with mock.patch.object(teacher, "coarse_kl", TAILS[tail]):
        Distillation(source, proxy, iter(batches), lr=1e-3).train(steps)
    return proxy, weights_of(proxy)


def weights_of(proxy):
    return {n: p.detach().clone() for n, p in trainable_tensors(adapt(proxy)).items()}


def distance(a: dict, b: dict) -> float:
    return sum(float((a[n] - b[n]).pow(2).sum()) for n in a) ** 0.5


def run(name: str, steps: int, ks: list[int]) -> None:
    model, tok = load_model(name)
    selection = select_experts(model, "1/4", method="random")
    batches = healing_batches("tasks", tok, steps=steps)
    check = heldout_batches("tasks", tok, n_tokens=4096)
    start = weights_of(build_proxy(model, selection))
    clock = time.perf_counter()
    full = teacher.build_teacher_cache(model, batches, k=model.config.vocab_size)
    took = time.perf_counter() - clock
    print(f"{name}: cache of {steps} batches in {took:.1f} s, {full.forwards} forward(s)")
    proxy, reference = heal_once(model, selection, model, batches, steps, "rest")
    moved = distance(reference, start)
    kl = next_token_agreement(model, proxy, check)[0]["kl"]
    print(f"  teacher   k   tail    heldout KL  weights off full (of moved {moved:.3f})")
    print(f"  model     -   -       {kl:.4f}")
    top = full.log_probs.exp()
    for k in ks:
        mass = float(top[:, :k].sum(-1).mean())
        for tail in TAILS:
            proxy, weights = heal_once(model, selection, truncated(full, k), batches, steps, tail)
            kl = next_token_agreement(model, proxy, check)[0]["kl"]
            off = distance(weights, reference) / moved
            print(f"  cache     {k:<3} {tail:<7} {kl:.4f}      {off:.3f}   (top-k mass {mass:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--models", nargs="+", default=["toy", "toy-v3"])
    args = parser.parse_args()
    for name in args.models:
        run(name, args.steps, args.ks)


if __name__ == "__main__":
    main()
