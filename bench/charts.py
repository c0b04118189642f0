"""Chart build + serialize times, side by side: trace boards and entropy flows of 1k, 10k and
100k steps, and the 58-layer × 256-expert routing heatmap.

Each chart is built from synthetic results (two traces with the default metrics and
token-entropy summaries, a spike and a NaN run; routing counts drawn from a Dirichlet) and
serialized with ``to_json()``; the median of a few repeats is printed with the spec's compact
size and the ratio to the 1,000-step board. It reports; it does not pass or fail.

    .venv/bin/python bench/charts.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from moescope.display.charts import DEFAULT_METRICS, entropy_flow, routing_heatmap, trace_board
from moescope.traces import Trace

STEPS = (1_000, 10_000, 100_000)
BUCKETS = [[0, 1], [1, 2], [2, 4], [4, 8], [8, 16], [16, None]]


def synthetic_trace(n: int, seed: int, proxy: bool = False) -> Trace:
    """``n`` steps of noisy metrics and token-entropy summaries; a gradient spike and a NaN run."""
    rng = np.random.default_rng(seed)
    metrics = {key: np.abs(rng.normal(1.0, 0.1, n)) for key in DEFAULT_METRICS}
    metrics["actor/grad_norm"][n // 2] = 1e4
    metrics["actor/loss"][n // 3 : n // 3 + 20] = math.nan
    buckets = np.abs(rng.normal(0.4, 0.1, (n, len(BUCKETS))))
    steps = [
        {
            "step": i,
            **{key: float(values[i]) for key, values in metrics.items()},
            "actor/token_entropy": {
                "position_buckets": BUCKETS,
                "bucket_mean": [*buckets[i, :-1].tolist(), None],
                "bucket_tokens": [8, 8, 16, 32, 64, 0],
            },
        }
        for i in range(n)
    ]
    return Trace(header={"model": "synthetic", "proxy": {"keep": 0.25} if proxy else None}, steps=steps)


def routing_stats(n_layers: int = 58, n_experts: int = 256, top_k: int = 8) -> Any:
    """Routing statistics of a DeepSeek-V3-sized MoE: uneven loads, every other sum zero."""
    import torch

    from moescope.explore.routing import RoutingStats
    from moescope.explore.routing_sums import RoutingSums

    rng = np.random.default_rng(0)
    shares = rng.dirichlet(np.full(n_experts, 0.6), size=n_layers)
    n_tokens = 20_000
    arrays = RoutingSums(n_layers, n_experts, torch.device("cpu"), sigmoid=True).arrays()
    arrays["counts"] = np.stack([rng.multinomial(n_tokens * top_k, row) for row in shares])
    return RoutingStats(
        model_type="synthetic",
        config_hash="synthetic",
        source="synthetic",
        layers=tuple(range(3, 3 + n_layers)),
        num_experts=n_experts,
        top_k=top_k,
        n_tokens=n_tokens,
        **arrays,
    )


def measure(build: Callable[[], Any], repeats: int) -> tuple[float, int]:
    """Median seconds of build + ``to_json()``, and the spec's compact size in bytes."""
    times, text = [], ""
    for _ in range(repeats):
        start = time.perf_counter()
        text = build().to_json()
        times.append(time.perf_counter() - start)
    return statistics.median(times), len(json.dumps(json.loads(text), separators=(",", ":")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    cases: list[tuple[str, Callable[[], Any]]] = []
    for n in STEPS:
        original, proxy = synthetic_trace(n, 0), synthetic_trace(n, 1, proxy=True)
        cases.append((f"trace_board, 2 traces × {n:,} steps", lambda o=original, p=proxy: trace_board(o, p)))
        cases.append((f"entropy_flow, {n:,} steps", lambda o=original: entropy_flow(o)))
    stats = routing_stats()
    cases.append(("routing_heatmap, 58 layers × 256 experts", lambda: routing_heatmap(stats)))

    print(f"{'chart':<42} {'build+to_json':>14} {'spec':>9} {'× 1k board':>11}")
    base = None
    for name, build in cases:
        seconds, size = measure(build, args.repeats)
        base = base or seconds
        print(f"{name:<42} {seconds:>12.3f} s {size / 1e3:>6.0f} kB {seconds / base:>10.2f}×")


if __name__ == "__main__":
    main()
