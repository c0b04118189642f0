"""moescope inside TRL: what the instruments cost per GRPO step, and whether a fault reproduces.

1. **Overhead**: rounds of the same TRL ``GRPOTrainer`` run on the toy (``grpo_on_tasks``
   defaults: 2 prompts × 8 generations per step), alternately without and with
   ``MoescopeCallback``; per run the median of TRL's own ``step_time`` (first step left out),
   and the ratio of the two medians over the rounds, side by side.
2. **Reproduction**: the toy and its capability-targeted 1/4 proxy (``moescope export toy --keep
   1/4``, or ``--proxy DIR``), each trained by TRL under the same fault (``--fault``, default
   ``lr_spike@4``) with the callback, 4 prompts × 8 generations per step, once per seed
   (``--seeds``); each proxy trace compared with the toy's of the same seed
   (:func:`moescope.compare`, as ``moescope diagnose ORIGINAL --against PROXY`` would), and the
   toy's seeds with each other: how far the original reproduces itself.

    .venv/bin/python bench/trl_integration.py [--rounds 5] [--steps 8] [--proxy DIR] [--fault F]
        [--seeds 0 1 2] [--skip-overhead]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from moescope.analyze.diagnosis import diagnose
from moescope.analyze.verdict import compare
from moescope.integrations.trl import instrument
from moescope.integrations.trl_tasks import grpo_on_tasks
from moescope.traces import read_trace


def step_time(work: Path, steps: int, instrumented: bool) -> float:
    """The median step time TRL logs for one run (its first step left out)."""
    trainer = grpo_on_tasks("toy", work / "run", max_steps=steps)
    if instrumented:
        instrument(trainer, work / "trace.jsonl")
    trainer.train()
    times = [entry["step_time"] for entry in trainer.state.log_history if "step_time" in entry]
    return statistics.median(times[1:])


def overhead(work: Path, rounds: int, steps: int) -> None:
    bare, probed = [], []
    for _ in range(rounds):
        bare.append(step_time(work, steps, False))
        probed.append(step_time(work, steps, True))
    print(f"overhead: {overhead_text(bare, probed, steps)}")


def overhead_text(bare: list[float], probed: list[float], steps: int, goal: float | None = None) -> str:
    """The instrumented and bare medians over the rounds, their ratio, the same-round range."""
    ratio = statistics.median(probed) / statistics.median(bare)
    pairs = sorted(p / b for p, b in zip(probed, bare, strict=True))
    verdict = "" if goal is None else f"goal <= {goal:.2f}x{'' if ratio <= goal else ', MISSED'}; "
    return (
        f"instrumented GRPO step {statistics.median(probed) * 1e3:.0f} ms vs bare "
        f"{statistics.median(bare) * 1e3:.0f} ms = {ratio:.3f}x ({verdict}medians of {len(bare)} rounds of "
        f"{steps} steps; same-round ratios {pairs[0]:.2f}-{pairs[-1]:.2f}x)"
    )


def reproduction(
    work: Path, proxy: Path | None, fault: str, steps: int, batch: int, seeds: list[int]
) -> None:
    if proxy is None:
        from moescope.export.pipeline import export_proxy

        proxy = work / "proxy"
        export_proxy("toy", proxy, keep="1/4", progress=False)
    traces = {}
    for seed in seeds:
        for label, model in (("toy", "toy"), ("proxy", str(proxy))):
            run = f"{label} seed {seed}"
            trainer = grpo_on_tasks(
                model, work / "run", max_steps=steps, per_device_train_batch_size=batch, seed=seed
            )
            instrument(trainer, work / f"{label}-{seed}.jsonl", faults=fault)
            trainer.train()
            trainer.accelerator.end_training()
            traces[run] = read_trace(work / f"{label}-{seed}.jsonl")
            found = ", ".join(f"{f.type}@{f.step}" for f in diagnose(traces[run]) if f.severity != "info")
            print(f"{run} under {fault}: {found or 'no findings'}")
    pairs = [(f"toy seed {s}", f"proxy seed {s}") for s in seeds]
    pairs += [(f"toy seed {a}", f"toy seed {b}") for i, a in enumerate(seeds) for b in seeds[i + 1 :]]
    for original, other in pairs:
        verdict = compare(traces[original], traces[other])
        print(f"{other} against {original}: {verdict.verdict} (every finding: {verdict.every_finding})")
        for reason in verdict.reasons:
            print(f"  - {reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--proxy", type=Path, help="a 1/4 proxy of the toy (default: export one)")
    parser.add_argument("--fault", default="lr_spike@4")
    parser.add_argument("--fault-steps", type=int, default=12)
    parser.add_argument("--fault-batch", type=int, default=32, help="completions per step (8 per prompt)")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run of each model per seed"
    )
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="moescope-trl-") as tmp:
        work = Path(tmp)
        if not args.skip_overhead:
            overhead(work, args.rounds, args.steps)
        reproduction(work, args.proxy, args.fault, args.fault_steps, args.fault_batch, args.seeds)


if __name__ == "__main__":
    main()
