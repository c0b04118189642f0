"""Sharded training (FSDP2) measured side by side: training state per process, step time, and the
cost of moescope's MoE instruments on a sharded step.

The model is the toy's architecture (a stock ``Qwen3MoeForCausalLM``) made wider, so that its
training state is large enough to see: ``--hidden`` and ``--experts`` set it. The same script runs
under ``torchrun`` with 1 and with 2 processes (gloo on CPU, NCCL on GPUs); each process shards
the model with :func:`moescope.models.sharding.shard_model` and trains a few steps of next-token
loss with AdamW on seeded random tokens (the same global batch whatever the process count).

1. **State per process**: the bytes of this process's parameter shards, gradient shards and AdamW
   moments, counted from the local tensors (exact, not a sampled RSS), and the ratio of 2
   processes to 1 against the 0.55x goal.
2. **Step time**: the median step time with 1 and 2 processes (on a 2-core machine two processes
   share the cores, so this says what sharding costs here, not what a node of GPUs gains).
3. **Instruments**: with 2 processes, steps with every instrument of a replay's update (router
   records and routing sums, per-group gradient norms summed over shards, the non-finite watch)
   alternate with bare steps (one fused norm and clip); the median of the per-pair ratios
   against the 1.10x goal.

It reports; it does not pass or fail.

    .venv/bin/python bench/sharded.py [--hidden 256] [--experts 32] [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

STATE_GOAL, INSTRUMENT_GOAL = 0.55, 1.10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    runs = {n: launch(n, args) for n in (1, 2)}
    one, two = runs[1], runs[2]
    print(
        f"model: toy architecture, hidden {args.hidden}, {args.experts} experts, {one['parameters']:,} params"
    )
    print(
        f"{'processes':>10} {'params MB':>10} {'grads MB':>9} {'AdamW MB':>9} {'state MB':>9} {'step s':>7}"
    )
    for n, r in runs.items():
        mb = {k: r[k] / 2**20 for k in ("params", "grads", "optim")}
        print(
            f"{n:>10} {mb['params']:>10.1f} {mb['grads']:>10.1f} {mb['optim']:>10.1f} "
            f"{sum(mb.values()):>10.1f} {r['step_s']:>10.3f}"
        )
    ratio = (two["params"] + two["grads"] + two["optim"]) / (one["params"] + one["grads"] + one["optim"])
    print(f"training state per process, 2 / 1 processes: {ratio:.3f}x (goal <= {STATE_GOAL}x)"
          + ("" if ratio <= STATE_GOAL else "  MISSES THE GOAL"))  # fmt: skip
    print(f"step time, 2 / 1 processes: {two['step_s'] / one['step_s']:.2f}x (2 processes share these cores)")
    overhead = two["instrument_ratio"]
    verdict = "" if overhead <= INSTRUMENT_GOAL else "  MISSES THE GOAL"
    print(f"instruments on a sharded step (2 processes), median per-pair ratio: {overhead:.3f}x "
          f"(goal <= {INSTRUMENT_GOAL}x){verdict}")  # fmt: skip
    return 0


def launch(nproc: int, args: argparse.Namespace) -> dict:
    """Run this script under torchrun with ``nproc`` processes; rank 0's JSON line."""
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
        str(Path(__file__).resolve()), "--worker",
        "--hidden", str(args.hidden), "--experts", str(args.experts), "--steps", str(args.steps),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // nproc))}
    run = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if run.returncode:
        raise SystemExit(f"torchrun with {nproc} processes failed:\n{run.stderr[-3000:]}")
    return json.loads(next(line for line in run.stdout.splitlines() if line.startswith("{")))


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from moescope.models.sharding import local, shard_model
    from moescope.models.toy import load_toy
    from moescope.models.view import adapt
    from moescope.replay.instruments import (
        grad_norms,
        parameter_groups,
        record_routers,
        routing_sums,
        watch_nonfinite,
    )

    dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = load_toy()[0].config
    config.hidden_size, config.num_experts = args.hidden, args.experts
    config.intermediate_size = config.moe_intermediate_size = args.hidden
    config.head_dim = args.hidden // config.num_attention_heads
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    parameters = sum(p.numel() for p in model.parameters())
    moe = adapt(model)
    shard_model(model)
    groups = parameter_groups(model, moe)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rows, width = 8, 64
    data = torch.randint(
        0, config.vocab_size, (args.steps * 2 + 2, rows, width), generator=torch.Generator().manual_seed(0)
    )

    def step(i: int, instruments: bool) -> float:
        batch = data[i][rank * rows // world : (rank + 1) * rows // world]
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        if instruments:
            with record_routers(moe) as record, watch_nonfinite(model):
                loss = model(input_ids=batch, labels=batch).loss / world
            routing_sums(record, torch.ones_like(batch), moe)
            loss.backward()
            grad_norms(groups)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        else:
            loss = model(input_ids=batch, labels=batch).loss / world
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        dist.barrier()
        return time.perf_counter() - start

    step(0, False)  # warm-up: AdamW's moments exist from here on
    bare = [step(1 + i, False) for i in range(args.steps)]
    pairs = [(step(1 + i, True), step(1 + i, False)) for i in range(args.steps)]
    size = lambda tensors: sum(local(t).numel() * local(t).element_size() for t in tensors)  # noqa: E731
    moments = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    result = {
        "parameters": parameters,
        "params": size(model.parameters()),
        "grads": size(p.grad for p in model.parameters() if p.grad is not None),
        "optim": size(moments),
        "step_s": statistics.median(bare),
        "instrument_ratio": statistics.median(full / plain for full, plain in pairs),
    }
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
