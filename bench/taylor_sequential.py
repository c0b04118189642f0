"""Layer-sequential Taylor importance against two layer-sequential forward passes, side by side.

Taylor importance a decoder layer at a time reads every layer twice a batch (its forward, and
the backward's run of the layer again from its kept input) and computes a forward, a forward
again and a backward; two calibration passes (``collect_routing``) read every layer twice and
compute two forwards. On one model loaded a layer at a time, on the same random token ids and
the same rows per batch, the two are timed alternately (``--repeats`` rounds, medians) and the
ratio printed against the goal (at most 1.5x); so are two bare forwards (the model's forward
without the statistics' hooks), the floor of any pass. It reports; it does not pass or fail.

    .venv/bin/python bench/taylor_sequential.py [--model toy-v3] [--gb 4.0] [--n-tokens 1024] [--repeats 7]

``--gb`` adds the synthetic Qwen3-MoE-shaped bf16 checkpoint of ``bench/export.py``, written
to a temporary folder first: at 4 GB about 15 minutes on two cores with 3 repeats, where the
layers' reads take most of every pass. toy-v3 alone takes about a minute.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

GOAL = 1.5  # Taylor / two forward passes


def measure(source: str | Path, args: argparse.Namespace) -> dict[str, Any]:
    """Median wall times of Taylor and of two routing passes on ``source`` loaded a layer at a time."""
    import torch

    from moescope.explore.routing import collect_routing
    from moescope.explore.sequential import layer_sequential
    from moescope.explore.taylor import taylor_importance

    options = {"n_tokens": args.n_tokens, "seq_len": args.seq_len, "progress": False}
    with layer_sequential(source, dtype=args.dtype) as model:
        vocab = model.config.get_text_config().vocab_size
        rows = args.n_tokens // args.seq_len
        ids = torch.randint(3, vocab, (rows, args.seq_len), generator=torch.Generator().manual_seed(0))
        options["batch_size"] = args.batch_size or rows  # one batch, as memory allows at these sizes
        runs = {
            "taylor": lambda: taylor_importance(model, ids, **options),
            "two forwards": lambda: [collect_routing(model, ids, **options) for _ in range(2)],
            "two bare forwards": lambda: [bare_forward(model, ids, options["batch_size"]) for _ in range(2)],
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for round_ in range(args.repeats):
            for name in list(runs)[:: 1 if round_ % 2 == 0 else -1]:  # alternate the order
                start = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - start)
    rounds = [t / f for t, f in zip(times["taylor"], times["two forwards"], strict=True)]
    medians = {name: statistics.median(each) for name, each in times.items()}
    return {"batch_size": options["batch_size"], "rounds": rounds, **medians}


def bare_forward(model: Any, ids: Any, batch_size: int) -> None:
    """The model's forward alone, no statistics hooks: what ``collect_routing`` adds its hooks to."""
    import torch

    with torch.no_grad():
        for start in range(0, len(ids), batch_size):
            model(input_ids=ids[start : start + batch_size], use_cache=False, logits_to_keep=1)


def report(name: str, result: dict[str, Any], args: argparse.Namespace) -> None:
    ratio = result["taylor"] / result["two forwards"]
    verdict = "met" if ratio <= GOAL else "NOT met"
    print(f"{name}: {args.n_tokens} tokens, {result['batch_size']} rows a batch, medians of {args.repeats}")
    print(f"  layer-sequential Taylor:                    {result['taylor']:7.2f} s")
    print(f"  two layer-sequential passes (collect_routing): {result['two forwards']:7.2f} s")
    print(f"  two bare layer-sequential forwards:         {result['two bare forwards']:7.2f} s")
    print(f"  Taylor / two passes: {ratio:.2f}x on medians (goal <= {GOAL}x: {verdict})", end="")
    rounds = result["rounds"]
    print(f"; same-round {statistics.median(rounds):.2f}x median, {min(rounds):.2f}-{max(rounds):.2f}x")
    print(f"  Taylor / two bare forwards: {result['taylor'] / result['two bare forwards']:.2f}x")


def cpu() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU"
    found = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return f"{found.get('Model name', 'unknown CPU')}, {os.cpu_count()} cores seen"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="toy-v3", help="an embedded model or a checkpoint directory")
    parser.add_argument("--gb", type=float, default=0.0, help="also the synthetic checkpoint of this size")
    parser.add_argument("--n-tokens", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=0, help="rows a batch (0: all in one)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dtype", default="auto", help="auto (the checkpoint's) or float32")
    return parser.parse_args()


def main() -> None:
    import torch

    args = parse_args()
    print(f"CPU: {cpu()}; torch threads: {torch.get_num_threads()}")
    report(args.model, measure(args.model, args), args)
    if args.gb:
        from export import write_checkpoint  # bench/export.py: the same synthetic checkpoint

        with tempfile.TemporaryDirectory(prefix="moescope-bench-") as tmp:
            size = write_checkpoint(Path(tmp) / "model", args.gb)
            report(f"{size / 1e9:.2f} GB bf16 checkpoint", measure(Path(tmp) / "model", args), args)


if __name__ == "__main__":
    main()
