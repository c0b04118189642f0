"""How much task skill each selection keeps on an embedded model: ``paper`` by view, and the baselines.

For every keep, method (and view subset of ``paper``) and calibration seed, the experts are chosen
from one calibration pass (20,000 tokens, as ``moescope export`` does; ``--calibration``
``tasks``, the task suite's prompts and answers, or ``rl``, the replay's prompts with the model's
own samples, the export's default), the proxy is cut in memory and its sampled accuracy measured
on the held-out prompts at each sampling seed. The figure is the capability ratio pooled over all
of those runs: the proxy's summed accuracy over the original's, on the tasks whose original
accuracy lies in the validity checklist's RL window (``add2`` and ``add3`` on the toy). One run
moves a lot: a single kept expert can change a task's accuracy by 0.2, and the checklist's own
ratio counts whichever tasks are in the window at its sampling seed, so the pooled figure is the
one to compare; ``check`` is the checklist's ratio at calibration and sampling seed 0 (what
``moescope export toy --calibration tasks`` prints).

``paper (routed tokens)`` is the paper's own representative rule (the most frequently routed
member, K-Medoids started from the most routed experts) in place of moescope's (largest routed
contribution), with all three views: the measurement behind that choice.

    .venv/bin/python bench/paper_selection.py [--model toy] [--calibration tasks] [--keeps 1/2 1/4]
        [--calibration-seeds 3] [--sampling-seeds 2]

prints one markdown table (and writes it to ``--out`` when given). It reports; it does not pass or fail.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np
import pandas as pd
import torch

from moescope.explore import paper
from moescope.explore.calibration import TASKS, calibration_data
from moescope.explore.clustering import select_experts
from moescope.explore.embeddings import embed_experts
from moescope.explore.routing import collect_routing
from moescope.export.fidelity.measure import pair_accuracy
from moescope.export.fidelity.validity import WINDOW, capability_check
from moescope.export.surgery import build_proxy
from moescope.models.accuracy import model_accuracy, resolve_tasks
from moescope.models.embedded import EMBEDDED, load_embedded

ALL_VIEWS = "router,coactivation,context"
VARIANTS: dict[str, dict[str, Any]] = {
    f"paper (default: {'+'.join(paper.DEFAULT_VIEWS)})": {"method": "paper"},
    "paper router": {"method": "paper", "views": "router"},
    "paper coactivation": {"method": "paper", "views": "coactivation"},
    "paper context": {"method": "paper", "views": "context"},
    "paper router+coactivation": {"method": "paper", "views": "router,coactivation"},
    "paper router+context": {"method": "paper", "views": "router,context"},
    "paper coactivation+context": {"method": "paper", "views": "coactivation,context"},
    "paper all three views": {"method": "paper", "views": ALL_VIEWS},
    "paper (routed tokens), all three": {"method": "paper", "views": ALL_VIEWS, "tokens": True},
    "cluster": {"method": "cluster"},
    "frequency": {"method": "frequency"},
    "reap": {"method": "reap"},
    "random": {"method": "random"},
}


@contextmanager
def routed_tokens_importance(on: bool) -> Iterator[None]:
    """The paper's rule for this run only: importance = routed tokens (``RoutingStats.counts``)."""
    kept = paper.importance
    if on:
        paper.importance = lambda stats, layer: np.asarray(stats.counts[stats.layer_index(layer)], float)
    try:
        yield
    finally:
        paper.importance = kept


class Bench:
    """The model, its calibration statistics per seed, and the original's accuracy per sampling seed."""

    def __init__(self, model: str, calibration: str, calibration_seeds: int, sampling_seeds: int) -> None:
        self.model, self.tokenizer = load_embedded(model)
        self.tasks = resolve_tasks("toy", self.model)
        self.stats = {
            seed: collect_routing(
                self.model,
                calibration_data(self.model, self.tokenizer, calibration, seed=seed),
                tokenizer=self.tokenizer,
                n_tokens=20_000,
                seed=seed,
                progress=False,
            )
            for seed in range(calibration_seeds)
        }
        self.embeddings: dict[int, Any] = {}
        self.sampling = range(sampling_seeds)
        self.original = {seed: self.accuracy(self.model, seed) for seed in self.sampling}
        first = self.original[0]
        sampled = first[first["mode"] == "sampled"]
        self.window = sampled[sampled["accuracy"].between(*WINDOW)]["task"].tolist()

    def accuracy(self, model: Any, seed: int) -> pd.DataFrame:
        return model_accuracy(model, self.tokenizer, self.tasks, n_prompts=100, samples=4, seed=seed)

    def select(self, keep: str, seed: int, variant: dict[str, Any]) -> Any:
        options = {k: v for k, v in variant.items() if k != "tokens"}
        if options["method"] == "cluster" and seed not in self.embeddings:
            self.embeddings[seed] = embed_experts(
                self.model, "multiview", stats=self.stats[seed], seed=0, progress=False
            )
        if options["method"] == "cluster":
            options["embeddings"] = self.embeddings[seed]
        with routed_tokens_importance(variant.get("tokens", False)):
            return select_experts(self.model, keep, stats=self.stats[seed], seed=0, **options)

    def measure(self, keep: str, variant: dict[str, Any]) -> dict[str, float]:
        frames, check = [], float("nan")
        for cal in self.stats:
            proxy = build_proxy(self.model, self.select(keep, cal, variant))
            for seed in self.sampling:
                pair = pair_accuracy(self.original[seed], self.accuracy(proxy, seed))
                frames.append(pair[(pair["mode"] == "sampled") & pair["task"].isin(self.window)])
                if cal == 0 and seed == 0:
                    check = capability_check(SimpleNamespace(task_accuracy=pair)).details["ratio"]
        pooled = pd.concat(frames)
        return {"pooled": pooled["proxy"].sum() / pooled["original"].sum(), "check": check}


def table(
    results: dict[tuple[str, str], dict[str, float]], keeps: list[str], window: list[str], how: str
) -> str:
    head = " | ".join(f"keep {k} pooled | keep {k} check" for k in keeps)
    lines = [
        f"Capability ratio on {how}'s in-window tasks ({', '.join(window)}), sampled.",
        "",
        f"| selection | {head} |",
        "|---|" + "---:|" * (2 * len(keeps)),
    ]
    for name in VARIANTS:
        cells = " | ".join(
            f"{results[k, name]['pooled']:.2f} | {results[k, name]['check']:.2f}" for k in keeps
        )
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="toy", choices=tuple(EMBEDDED))
    parser.add_argument("--calibration", default=TASKS, choices=(TASKS, "rl"))
    parser.add_argument("--keeps", nargs="+", default=["1/2", "1/4"])
    parser.add_argument("--calibration-seeds", type=int, default=3)
    parser.add_argument("--sampling-seeds", type=int, default=2)
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny problems; a second thread only waits on shared cores
    bench = Bench(args.model, args.calibration, args.calibration_seeds, args.sampling_seeds)
    results = {}
    for keep in args.keeps:
        for name, variant in VARIANTS.items():
            results[keep, name] = bench.measure(keep, variant)
            print(f"keep {keep} {name}: {results[keep, name]}", flush=True)
    text = table(results, args.keeps, bench.window, f"{args.model} (calibration {args.calibration})")
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
