"""Cost of a routing-statistics calibration pass against the same forward passes with no hooks.

Runs on the toy model (a random Qwen3-MoE of the toy's shape while the toy checkpoint is not
built) over the same task-suite batches, alternating the two variants after a warm-up, and
prints the median wall times and their ratio against the 1.2x goal. It reports; it does not
pass or fail.

    .venv/bin/python bench/calibration.py [--n-tokens 20000] [--repeats 7] [--experts-impl eager]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

from moescope.errors import MoescopeError
from moescope.explore.routing import calibration_batches, collect_routing, observe_routing

GOAL = 1.2


def load_model() -> tuple[Any, Any, str]:
    """The toy model and tokenizer; a random model of the toy's shape when it is not built yet."""
    try:
        from moescope.models.toy import load_toy

        model, tokenizer = load_toy()
        return model, tokenizer, "toy model"
    except (MoescopeError, ImportError, OSError):
        from moescope.models.toy.tokenizer import VOCAB_SIZE, build_tokenizer
        from moescope.models.zoo import tiny

        shape = dict(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, num_key_value_heads=2)
        shape.update(head_dim=32, num_local_experts=32, moe_intermediate_size=32, max_position_embeddings=64)
        model = tiny("qwen3_moe", vocab_size=VOCAB_SIZE, **shape)
        return model, build_tokenizer(), "random Qwen3-MoE of the toy's shape (toy checkpoint not built)"


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """Wall time, and this process's CPU time (less sensitive to other jobs on a shared machine)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-tokens", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--experts-impl", default=None, help="e.g. eager, to time the recomputing fallback")
    # one thread: on a shared machine, OpenMP threads that wait on a busy core cost 10-100x
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args()


def variants(model: Any, tokenizer: Any, size: dict[str, int]) -> tuple[dict[str, Callable[[], Any]], int]:
    """The timed passes over one fixed list of batches, and the number of batches."""
    batches = list(calibration_batches("tasks", tokenizer, **size))
    extra = {"use_cache": False, "logits_to_keep": 1}  # what collect_routing passes

    def plain() -> None:
        with torch.no_grad():
            for batch in batches:
                model(**batch, **extra)

    def observed() -> dict[int, str]:
        with torch.no_grad(), observe_routing(model) as observer:
            for batch in batches:
                model(**batch, **extra)
        observer.stats()
        return observer.saliency_source

    def end_to_end() -> None:  # also tokenizes, batches and checks the data
        collect_routing(model, "tasks", tokenizer=tokenizer, progress=False, **size)

    return {"no hooks": plain, "full statistics": observed, "collect_routing": end_to_end}, len(batches)


def measure(passes: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) times after one warm-up each, interleaved so other jobs' load hits every variant alike."""
    for fn in passes.values():
        fn()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in passes}
    for _ in range(repeats):
        for name, fn in passes.items():
            times[name].append(timed(fn))
    return times


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer, what = load_model()
    if args.experts_impl:
        model.set_experts_implementation(args.experts_impl)
    size = dict(n_tokens=args.n_tokens, batch_size=args.batch_size, seq_len=args.seq_len)
    passes, n_batches = variants(model, tokenizer, size)
    times = measure(passes, args.repeats)

    saliency = sorted(set(passes["full statistics"]().values()))
    impl = getattr(model.config, "_experts_implementation", "?")
    print(f"model: {what}; experts implementation: {impl}; expert-output norms: {', '.join(saliency)}")
    print(f"data: task suite, {args.n_tokens} tokens in {n_batches} batches; torch threads: {args.threads}")
    report(times, n_batches)


def report(times: dict[str, list[tuple[float, float]]], n_batches: int) -> None:
    wall = {name: [w for w, _ in runs] for name, runs in times.items()}
    cpu = {name: [c for _, c in runs] for name, runs in times.items()}
    base, base_cpu = statistics.median(wall["no hooks"]), statistics.median(cpu["no hooks"])
    for name, values in wall.items():
        median, per_batch = statistics.median(values), 1000 * statistics.median(values) / n_batches
        spread = f"min {min(values):.3f} max {max(values):.3f}, {len(values)} runs"
        cpu_ratio = statistics.median(cpu[name]) / base_cpu
        print(f"{name:>16}: wall median {median:.3f} s = {per_batch:.1f} ms/batch ({spread})")
        print(f"{'':>16}  vs no hooks: wall {median / base:.2f}x, CPU time {cpu_ratio:.2f}x")
    ratio = statistics.median(wall["full statistics"]) / base
    cpu_ratio = statistics.median(cpu["full statistics"]) / base_cpu
    print(f"full statistics vs no hooks: {ratio:.2f}x wall, {cpu_ratio:.2f}x CPU time (goal at most {GOAL}x)")


if __name__ == "__main__":
    main()
