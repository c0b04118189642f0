"""Replay costs, measured side by side: instrumentation vs a bare step; the toy vs its proxies.

1. **Instrumentation.** Two trainers on the same toy and config, one with every instrument
   (per-layer routing, per-group gradient norms, the non-finite watch, token-entropy summaries)
   and one bare (``instruments=False``), step in alternation over the same steps; the two stay
   numerically identical, so each pair does the same work. Prints the median step time and the
   update-phase time of each, and the median of the per-step ratios (full / bare of the same
   step: steps differ in work, pairs do not) against the 1.10x goal.
2. **Toy vs proxies.** Proxies at keep 1/2, 1/4, 1/8 (frequency selection) are exported, then
   each model replays the same steps in a fresh process, which reports its median step time and
   its peak resident memory above the level after imports (sampled from /proc every ms; it
   includes the frozen reference, optimizer state and activations). Prints ratios to the toy.

It reports; it does not pass or fail.

    .venv/bin/python bench/replay.py [--steps 8] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

GOAL = 1.10
KEEPS = ("1/2", "1/4", "1/8")


def config(steps: int, **overrides: Any):
    from moescope.replay import ReplayConfig

    base = dict(steps=steps, prompts_per_step=8, group_size=8, tasks=("add2", "add3"), lr=1e-5)
    return ReplayConfig(**{**base, **overrides})


def trainer(cfg):
    import moescope
    from moescope.replay.comm import Comm
    from moescope.replay.data import max_new_tokens, prompt_schedule
    from moescope.replay.models import prepare_models
    from moescope.replay.rewards import reward_function
    from moescope.replay.trainer import Trainer

    policy, tok = moescope.load_model("toy")
    reference, _ = moescope.load_model("toy", with_tokenizer=False)
    schedule = prompt_schedule(cfg)
    models = prepare_models(policy, reference, tok, 1)
    return Trainer(models, cfg, schedule, reward_function(cfg.reward), max_new_tokens(cfg, schedule), Comm())


def instrumentation(steps: int) -> dict[str, float]:
    full, bare = trainer(config(steps)), trainer(config(steps, instruments=False))
    times: dict[str, list[float]] = {"full": [], "bare": [], "full_update": [], "bare_update": []}
    for step in range(steps):
        for name, t in (
            (("full", full), ("bare", bare)) if step % 2 == 0 else (("bare", bare), ("full", full))
        ):
            record = t.step(step)
            if step:  # the first step warms caches
                times[name].append(record["time/step_s"])
                times[f"{name}_update"].append(record["time/update_s"])
    med = {k: statistics.median(v) for k, v in times.items()}

    def paired(kind: str) -> float:
        return statistics.median(
            f / b for f, b in zip(times[f"full{kind}"], times[f"bare{kind}"], strict=True)
        )

    return {
        "full_step_s": med["full"],
        "bare_step_s": med["bare"],
        "step_ratio": paired(""),
        "ratio_of_medians": med["full"] / med["bare"],
        "full_update_s": med["full_update"],
        "bare_update_s": med["bare_update"],
        "update_ratio": paired("_update"),
    }


def child(model: str, steps: int) -> None:
    """Replay ``model`` and print its median step time and peak RSS growth (MiB) as JSON."""
    import torch  # noqa: F401 - imports are part of the baseline, not of the replay
    import transformers  # noqa: F401

    import moescope

    sampler = _RssSampler()
    with tempfile.TemporaryDirectory() as tmp, sampler:
        trace = moescope.replay(model, config(steps), out=Path(tmp) / "t.jsonl")
    times = [s["time/step_s"] for s in trace.steps[1:]]
    row = {"step_s": statistics.median(times), "rss_mib": sampler.growth_mib}
    print(json.dumps({**row, "parameters": trace.header["parameters"]}))


class _RssSampler:
    """Peak resident memory above the level at entry, sampled every millisecond from /proc.

    ``ru_maxrss`` cannot be used: importing torch peaks higher than a small model ever needs.
    """

    def __init__(self) -> None:
        self.base = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(0.001)

    def __enter__(self) -> _RssSampler:
        self.base = self.peak = self._rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.base) / 2**20


def proxies(steps: int) -> list[dict[str, Any]]:
    from moescope.export.pipeline import export_proxy

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = {"toy": "toy"}
        for keep in KEEPS:
            out = Path(tmp) / keep.replace("/", "of")
            export_proxy(
                "toy", out, keep=keep, method="frequency", n_tokens=4000, progress=False, fidelity=False
            )
            models[keep] = str(out)
        for label, path in models.items():
            run = subprocess.run(
                [sys.executable, __file__, "--child", path, "--steps", str(steps)],
                capture_output=True,
                text=True,
                check=True,
            )
            rows.append({"model": label, **json.loads(run.stdout.strip().splitlines()[-1])})
    toy = rows[0]
    for row in rows:
        row["step_ratio"] = row["step_s"] / toy["step_s"]
        row["rss_ratio"] = row["rss_mib"] / toy["rss_mib"] if toy["rss_mib"] > 0 else float("nan")
        row["parameter_ratio"] = row["parameters"] / toy["parameters"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps)
        return
    import torch

    started = time.perf_counter()
    inst = instrumentation(args.steps)
    verdict = "meets" if inst["step_ratio"] <= GOAL else "MISSES"
    threads = torch.get_num_threads()
    print(f"replay step, {args.steps} steps of 8 prompts x 8 samples on the toy ({threads} threads)")
    print(f"  full instrumentation {inst['full_step_s']:.3f} s/step, bare {inst['bare_step_s']:.3f} s/step")
    print(
        f"  ratio {inst['step_ratio']:.3f}x, median of same-step pairs ({verdict} the {GOAL}x goal); "
        f"ratio of the medians {inst['ratio_of_medians']:.3f}x"
    )
    print(
        f"  update phase alone: {inst['full_update_s']:.3f} vs {inst['bare_update_s']:.3f} s, "
        f"ratio {inst['update_ratio']:.3f}x"
    )
    rows = proxies(args.steps)
    print("toy vs proxies (frequency selection), each in a fresh process:")
    print(f"  {'model':6} {'params':>9} {'step s':>8} {'x toy':>6} {'peak RSS MiB':>13} {'x toy':>6}")
    for r in rows:
        print(
            f"  {r['model']:6} {r['parameters']:>9,} {r['step_s']:>8.3f} {r['step_ratio']:>6.2f} "
            f"{r['rss_mib']:>13.1f} {r['rss_ratio']:>6.2f}"
        )
    print(f"(bench wall time {time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(
            json.dumps({"instrumentation": inst, "proxies": rows, "goal": GOAL}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
