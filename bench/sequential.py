"""Layer-sequential calibration against the in-memory pass: peak memory and wall time, side by side.

Writes the synthetic Qwen3-MoE-shaped checkpoint of ``bench/export.py`` (random bf16 weights,
per-expert keys), then runs in a fresh process each: the in-memory pass (load the model, then
``collect_routing``) and the layer-sequential one (``collect_routing_sequential``), on the same
random token ids, alternating, and prints their peak RSS and wall times and the ratios against
the goals (peak RSS at most 1/8 of the in-memory pass's; wall time against the in-memory load +
pass, which reads the shards once and computes once). The statistics of the two are compared too.
It reports; it does not pass or fail.

    .venv/bin/python bench/sequential.py [--gb 4.0] [--n-tokens 512] [--repeats 1] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from export import vm_hwm, write_checkpoint  # bench/export.py: the same synthetic checkpoint

MEMORY_GOAL = 1 / 8
RUNS = ("in-memory", "layer-sequential")


def child(run: str, source: Path, n_tokens: int, batch: int, seq_len: int, dtype: str, out: Path) -> None:
    """One pass in this fresh process; its peak RSS, wall time and statistics go to ``out``."""
    import numpy as np
    import torch

    from moescope.explore.routing import collect_routing
    from moescope.explore.sequential import collect_routing_sequential
    from moescope.models.loading import load_model

    anonymous = _sample_anonymous()
    vocab = json.loads((source / "config.json").read_text())["vocab_size"]
    ids = torch.randint(3, vocab, (n_tokens // seq_len, seq_len), generator=torch.Generator().manual_seed(0))
    options = {"n_tokens": n_tokens, "batch_size": batch, "seq_len": seq_len, "progress": False}
    start = time.perf_counter()
    if run == "in-memory":
        model, _ = load_model(source, dtype=dtype, with_tokenizer=False)
        stats = collect_routing(model, ids, **options)
    else:
        stats = collect_routing_sequential(source, ids, dtype=dtype, **options)
    wall = time.perf_counter() - start
    arrays = {name: np.asarray(getattr(stats, name)).tolist() for name in ("counts", "saliency_sum")}
    peaks = {"peak_rss": vm_hwm(), "peak_anonymous": max(anonymous)}
    out.write_text(json.dumps({"wall_s": wall, **peaks, **arrays}))


def _sample_anonymous() -> list[int]:
    """Peak anonymous memory (``RssAnon``: not the shards' page-cache pages that a mapping
    counts in RSS), sampled every 10 ms by a daemon thread into the returned list."""
    import threading

    seen = [0]

    def sample() -> None:
        status = Path("/proc/self/status")
        while True:
            line = next(x for x in status.read_text().splitlines() if x.startswith("RssAnon:"))
            seen.append(int(line.split()[1]) * 1024)
            del seen[1:-1]
            seen[0] = max(seen)
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True).start()
    return seen


def measure(run: str, source: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / f"{run}.json"
    argv = [sys.executable, __file__, "--child", run, "--source", str(source), "--out", str(out)]
    argv += [
        "--n-tokens",
        str(args.n_tokens),
        "--batch-size",
        str(args.batch_size),
        "--seq-len",
        str(args.seq_len),
    ]
    subprocess.run(argv, check=True)
    return json.loads(out.read_text())


def report(results: dict[str, list[dict[str, Any]]], model_bytes: int, dtype: str) -> None:
    import numpy as np

    rss = {run: max(r["peak_rss"] for r in results[run]) for run in RUNS}
    anonymous = {run: max(r["peak_anonymous"] for r in results[run]) for run in RUNS}
    wall = {run: statistics.median(r["wall_s"] for r in results[run]) for run in RUNS}
    first = {run: results[run][0] for run in RUNS}
    same_counts = first["in-memory"]["counts"] == first["layer-sequential"]["counts"]
    saliency = [np.asarray(first[run]["saliency_sum"]) for run in RUNS]
    saliency_gap = float(np.abs(saliency[0] - saliency[1]).max() / max(np.abs(saliency[0]).max(), 1e-12))
    memory_ratio = rss["layer-sequential"] / rss["in-memory"]
    print(f"checkpoint: {model_bytes / 1e9:.2f} GB of bf16 shards, loaded as {dtype}")
    for run in RUNS:
        times = f"wall {wall[run]:6.1f} s (median of {len(results[run])})"
        memory = f"peak RSS {rss[run] / 1e9:6.2f} GB (anonymous {anonymous[run] / 1e9:5.2f} GB)"
        print(f"{run:>17}: {memory}, {times}")
    verdict = "met" if memory_ratio <= MEMORY_GOAL else "NOT met"
    print(f"peak RSS, layer-sequential / in-memory: 1/{1 / memory_ratio:.1f} (goal <= 1/8: {verdict})")
    anonymous_ratio = anonymous["layer-sequential"] / anonymous["in-memory"]
    print(f"peak anonymous memory, layer-sequential / in-memory: 1/{1 / anonymous_ratio:.1f}")
    time_ratio = wall["layer-sequential"] / wall["in-memory"]
    print(f"wall time, layer-sequential / (in-memory load + pass): {time_ratio:.2f}x")
    print(
        f"statistics: expert counts equal: {same_counts}; saliency sums differ by {saliency_gap:.1e} relative"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=4.0, help="checkpoint size")
    parser.add_argument("--n-tokens", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--dtype", default="auto", help="auto (the checkpoint's, as an export loads it) or float32"
    )
    parser.add_argument("--child", choices=RUNS, help=argparse.SUPPRESS)
    parser.add_argument("--source", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.child:
        child(args.child, args.source, args.n_tokens, args.batch_size, args.seq_len, args.dtype, args.out)
        return
    with tempfile.TemporaryDirectory(prefix="moescope-bench-") as tmp:
        work = Path(tmp)
        model_bytes = write_checkpoint(work / "model", args.gb)
        results: dict[str, list[dict[str, Any]]] = {run: [] for run in RUNS}
        for _ in range(args.repeats):
            for run in RUNS:
                results[run].append(measure(run, work / "model", args, work))
        report(results, model_bytes, args.dtype)


if __name__ == "__main__":
    main()
