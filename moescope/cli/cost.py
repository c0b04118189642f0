"""``moescope cost``: accelerators to RL-train a model and its proxies; the flags that set the
assumptions and measured figures of single rows."""

from __future__ import annotations

import argparse
import json

from moescope.cli.common import MODEL_HELP, command
from moescope.errors import MoescopeError


def add(sub: argparse._SubParsersAction) -> None:
    from moescope.export.cost import ROUNDINGS

    cost = command(
        sub, "cost", run, "accelerators to RL-train the full model vs its proxies, and the reduction"
    )
    cost.add_argument("model", nargs="?", metavar="MODEL|CONFIG.json", help=MODEL_HELP + ", or a config.json")
    cost.add_argument(
        "--keep",
        action="append",
        metavar="K",
        help="routed experts kept: 0.25, 1/4 or a count; repeat for several (default: 1/2, 1/4, 1/8)",
    )
    cost.add_argument(
        "--device",
        default="h100",
        metavar="NAME|JSON",
        help="accelerator to predict step time on: h100, h200, h20, ascend-910b or a JSON profile "
        "(default h100)",
    )
    cost.add_argument(
        "--assume",
        action="append",
        metavar="KEY=VALUE",
        help="override a device or workload assumption (prompts=256, mfu=0.4, inter_node_gb_s=50)",
    )
    cost.add_argument(
        "--devices",
        action="append",
        metavar="KEEP=N",
        help="cost N devices for a row instead of the memory model's",
    )
    cost.add_argument(
        "--device-memory", type=float, metavar="GB", help="accelerator memory (default: the device's)"
    )
    cost.add_argument("--usable-fraction", type=float, metavar="F", help="usable share (default 0.9)")
    cost.add_argument(
        "--step-time",
        action="append",
        metavar="S|KEEP=S",
        help="measured seconds per RL step instead of predicted: every row's, or one row's (full=3000)",
    )
    cost.add_argument("--round", choices=ROUNDINGS, default="device", help="round device counts up to this")
    cost.add_argument("--reference", action="store_true", help="also cost the published MoE models")
    cost.add_argument("--json", action="store_true", help="print the table as JSON")


def run(args: argparse.Namespace) -> int:
    from moescope.export.cost import DEFAULT_KEEPS, cost_report
    from moescope.export.cost.assumptions import assumed

    if args.model is None and not args.reference:
        raise MoescopeError(
            "give a MODEL (checkpoint directory, config.json, 'toy' or 'toy-v3'), or --reference."
        )
    profile, workload, memory = assumed(args.device, args.assume, args.device_memory, args.usable_fraction)
    keeps = args.keep or DEFAULT_KEEPS
    step_time_s = _measured_steps(args.step_time, keeps)
    report = cost_report(
        args.model,
        keeps,
        reference=args.reference,
        strict=bool(args.keep),
        devices=_per_row(args.devices, "--devices", "KEEP=N", whole=True),
        memory=memory,
        step_time_s=step_time_s,
        rounding=args.round,
        profile=profile,
        workload=workload,
    )
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.text())
    return 0


def _measured_steps(pairs: list[str] | None, keeps: list[str]) -> float | dict[str, float | None] | None:
    """``--step-time``: one number for every row, or per row (``full=3000``), a bare number
    standing for the rows not named."""
    per_row = _per_row(pairs, "--step-time", "S or KEEP=S", whole=False)
    every = per_row.pop("*", None)
    if not per_row:
        return every
    return {label: per_row.get(label, every) for label in ("full", *map(str, keeps))}


def _per_row(pairs: list[str] | None, flag: str, example: str, whole: bool) -> dict[str, float]:
    """``--devices full=512 --devices 16=64`` as ``{"full": 512, "16": 64}``; a bare number
    (``--step-time 600``) is every row's, under the key ``"*"``."""
    given: dict[str, float] = {}
    for pair in pairs or []:
        label, _, value = pair.rpartition("=")
        try:
            number = int(value) if whole else float(value)
        except ValueError:
            number = 0
        if not number > 0 or (whole and not label):
            raise MoescopeError(
                f"{flag} {pair!r} is not {example}; write e.g. {flag} full=512 {flag} 1/8=64."
            )
        given[label.strip() or "*"] = number
    return given
