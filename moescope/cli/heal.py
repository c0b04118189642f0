"""``moescope heal``: distil an exported proxy toward its original's cached distributions."""

from __future__ import annotations

import argparse
from pathlib import Path

from moescope.cli.common import command


def add(sub: argparse._SubParsersAction) -> None:
    heal = command(
        sub,
        "heal",
        run,
        "heal an exported proxy against its original's cached next-token distributions "
        "(the original read a layer at a time; under torchrun, --shard fsdp shards the proxy)",
    )
    heal.add_argument("proxy", metavar="PROXY", type=Path, help="an exported proxy directory (rewritten)")
    heal.add_argument("--steps", type=int, default=50, metavar="N", help="healing steps (default: 50)")
    heal.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default: 0.001)")
    heal.add_argument("--seed", type=int, default=0, help="seed of the healing batches (default: 0)")
    heal.add_argument("--batch-size", type=int, default=32, metavar="B", help="rows per step (default: 32)")
    heal.add_argument(
        "--teacher", type=Path, metavar="FILE", help="a teacher cache (default: built once and kept)"
    )
    heal.add_argument(
        "--original", metavar="MODEL", help="the original checkpoint (default: the manifest's source)"
    )
    heal.add_argument(
        "--min-capability",
        type=float,
        default=0.0,
        metavar="X",
        help="heal in rounds until the proxy keeps this share of the original's accuracy (default: 0, off)",
    )
    heal.add_argument(
        "--heal-round", type=int, default=10, metavar="STEPS", help="steps between measurements (default: 10)"
    )
    heal.add_argument(
        "--shard",
        choices=("none", "fsdp"),
        default="none",
        help="fsdp: shard the proxy over the torchrun processes (FSDP2) (default: none)",
    )


def run(args: argparse.Namespace) -> int:
    from moescope.export.sharded_healing import heal_exported
    from moescope.replay.comm import Comm

    sharded = args.shard == "fsdp"
    with Comm.from_env(sharded=sharded) as comm:
        report = heal_exported(
            args.proxy,
            teacher=args.teacher,
            original=args.original,
            steps=args.steps,
            lr=args.lr,
            seed=args.seed,
            batch_size=args.batch_size,
            shard=sharded,
            min_capability=args.min_capability,
            heal_round=args.heal_round,
        )
    if comm.is_main:
        where = f"{comm.world} processes, sharded" if sharded else "one process"
        print(
            f"healed {args.proxy}: {report.steps} steps on {where}; KL to the original on the teacher "
            f"batches {report.kl_before:.4f} -> {report.kl_after:.4f}, top-1 agreement "
            f"{report.top1_before:.3f} -> {report.top1_after:.3f}; {report.frozen_verified} frozen "
            "tensors verified unchanged (fidelity and checklist dropped: measure them again)"
        )
        target = report.capability
        if target:
            curve = ", ".join(f"{r['steps']}: {r['ratio']:.2f}" for r in target["rounds"])
            verdict = "reached" if target["reached"] else "NOT reached"
            head = f"capability target {target['min_capability']:g} {verdict}"
            print(f"{head} (teacher-forced; steps: ratio {curve})")
    return 0
