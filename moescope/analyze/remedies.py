"""What to try next: each finding's likely causes and the fixes moescope can test on a proxy.

A finding says what went wrong; a user's next question is why, and what would stop it. For each
finding type :data:`REMEDIES` lists the usual causes (from the frameworks' issue threads, see the
project's log-format reference) and, where moescope can reproduce the failure, the fault that
does (:mod:`moescope.replay.faults`) and the fixes to try against it (:mod:`moescope.analyze.fixes`).
:func:`next_steps` turns them into the two commands a user runs: ``moescope export`` to make a
proxy of their model, then one ``moescope validate`` per fix, which replays the fault with and
without the fix and says whether the finding goes away. A finding several faults reproduce
(``rollout_mismatch``: routing, engine drift, a parallel layout, packing, replay wired wrong)
lists the others' lines under ``also``.

Example
-------
>>> from moescope.analyze.findings import Finding
>>> steps = next_steps(Finding("overflow", 12, "warning", "fp16 overflow"))
>>> steps["validate"][0]
'moescope validate PROXY --fault fp16_overflow --fix bf16 --precision fp16 --out validate-overflow-bf16'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moescope.analyze.findings import Finding
from moescope.analyze.fixes import FIXES
from moescope.replay.faults import KINDS

if TYPE_CHECKING:
    import pandas as pd

EXPORT = "moescope export {model} --keep 1/4 --out {proxy}"
VALIDATE = "moescope validate {proxy} --fault {fault} --fix {fix}{flags} --out validate-{type}-{name}"


@dataclass(frozen=True)
class Remedy:
    """The usual causes of one finding type, and how moescope tests a fix for it."""

    causes: tuple[str, ...]
    fault: str | None = None  # the fault that reproduces it in a replay, if any
    fixes: tuple[str, ...] = ()  # validate's --fix values to try against that fault
    flags: str = ""  # replay flags the fault needs (fp16_overflow: --precision fp16)
    also: tuple[Remedy, ...] = ()  # other faults that raise the same finding, each with its fixes

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in KINDS:
            raise ValueError(f"unknown fault {self.fault!r}")
        unknown = [f for f in self.fixes if f.partition(":")[0] not in FIXES]
        if unknown:
            raise ValueError(f"unknown fix(es) {unknown}")

    def validate_lines(self, finding_type: str, proxy: str) -> list[str]:
        """One ``moescope validate`` line per fix (none without a fault)."""
        return [
            VALIDATE.format(
                proxy=proxy,
                fault=self.fault,
                fix=fix,
                flags=self.flags,
                type=finding_type,
                name=fix.partition(":")[0],
            )
            for fix in self.fixes
        ]


_LR = ("a learning rate too high for the model or the batch", "no or too loose gradient clipping")
_MISMATCH = (
    "routing flips between the rollout engine and the trainer near top-k ties (MoE)",
    "rollout log-probs computed in lower precision or with other kernels than the trainer's",
    "token-level importance ratios amplifying the gap over long responses",
    "a rollout engine whose log-probs drift a little more every step (a rising gap, vime#64)",
    "the trainer's expert-parallel layout reducing the MoE combine in another order (NeMo-RL#4243)",
    "packed sequences whose position ids are not reset at the boundaries (Megatron-Bridge#1776)",
    "routing replay wired wrong: routes from a stale step, shifted by a token or missing",
)
_MASKS = ("is_mask", "seq_kl_mask")
_MISMATCH_ALSO = (
    Remedy(_MISMATCH, "engine_drift", (*_MASKS, "is_correction")),
    Remedy(_MISMATCH, "parallel_reduction", (*_MASKS, "fp32_router")),
    Remedy(_MISMATCH, "packing_positions", _MASKS, " --packing"),
    Remedy(_MISMATCH, "stale_routes", _MASKS, " --routing-replay"),
)
REMEDIES: dict[str, Remedy] = {
    "nonfinite": Remedy(
        (
            "an operator writing NaN/Inf (attention or expert kernels, a log of 0, exp of a large ratio)",
            "fp16 overflow, or a bf16 loss reduction over very long sequences",
            "an empty micro-batch (gradient accumulation of 0: mini-batch smaller than the micro-batch)",
            *_LR,
        ),
        "nan_op",
        ("grad_clip", "bf16", "lower_lr"),
    ),
    "grad_spike": Remedy(
        (*_LR, "a rare batch of extreme advantages or ratios"), "lr_spike", ("grad_clip", "lower_lr")
    ),
    "zero_grad": Remedy(
        (
            "a loss detached from the graph (LoRA or frozen modules misconfigured, Megatron+LoRA)",
            "every token masked out, or a gradient-accumulation count of 0",
            "the optimizer step skipped on every rank",
            "outputs stuck at one guess whatever the input (a learning rate far too high or too low, "
            "labels that do not match the inputs)",
        ),
    ),
    "overflow": Remedy(
        ("fp16 dynamic loss scaling starting too high or a loss spike under fp16",),
        "fp16_overflow",
        ("bf16", "loss_scale"),
        " --precision fp16",
    ),
    "loss_divergence": Remedy(
        (*_LR, "a value function that cannot keep up (critic learning rate)"),
        "lr_spike",
        ("lower_lr", "grad_clip"),
    ),
    "entropy_collapse": Remedy(
        (
            "the policy sharpening on easy rewards (no entropy bonus or floor)",
            "clip-higher or covariance-based clipping settings that favour exploitation",
        ),
        "entropy_control_off",
        ("entropy_floor",),
    ),
    "entropy_surge": Remedy(
        (*_LR, "an entropy bonus too large, or clip-higher too loose"), "lr_spike", ("lower_lr", "grad_clip")
    ),
    "reward_collapse": Remedy(
        (*_LR, "a policy that fell into degenerate output after a non-finite or oversized update"),
        "lr_spike",
        ("lower_lr", "grad_clip"),
    ),
    "no_signal": Remedy(
        (
            "prompts too easy or too hard for the model: every sample of a group scores the same",
            "a reward function that returns a constant (a parsing or format bug)",
            "a policy that already collapsed (see the other findings)",
        ),
    ),
    "degenerate_output": Remedy(
        (
            "a repetition loop after a collapse (token id 0, '!!!!')",
            "a missing or wrong end-of-sequence token in the chat template",
            "a response length limit too short for the task's answers (every completion cut, none ending)",
            *_LR,
        ),
        "lr_spike",
        ("lower_lr", "grad_clip"),
    ),
    "load_collapse": Remedy(
        (
            "the load-balancing loss off, or its coefficient too small (a zero inherited from a config)",
            "the router trained in low precision, or an expert-bias update that stalled",
        ),
        "aux_loss_off",
        ("aux_loss",),
    ),
    "kl_blowup": Remedy(
        (*_LR, "a reference model that differs from the policy's start"),
        "lr_spike",
        ("lower_lr", "grad_clip"),
    ),
    "rollout_mismatch": Remedy(
        _MISMATCH,
        "routing_mismatch",
        ("routing_replay", "is_correction", "fp32_router", "gspo"),
        also=_MISMATCH_ALSO,
    ),
    "route_overlap_low": Remedy(
        (
            "routes replayed from a stale step (a router registry not refreshed after a reload, verl#4562)",
            "routes shifted by one token (prompt and response offsets misaligned)",
            "routes missing for some tokens (miles#407)",
        ),
        "stale_routes",
        _MASKS,
        " --routing-replay",
    ),
    "optimizer_reset": Remedy(
        (
            "a resume that loaded the weights but not the optimizer state (slime#1695)",
            "a checkpoint written without the optimizer, or an optimizer rebuilt after loading it",
        ),
        "resume_state",
        ("lower_lr",),
    ),
    "aux_loss_doubled": Remedy(
        (
            "the load-balancing loss recorded twice under activation recompute (Megatron-LM#1330)",
            "the model's own router aux loss added on top of the trainer's (TRL >= 1.7 turns it on)",
        ),
        "aux_loss_double",
        ("aux_loss:0.005",),
        " --aux-loss-coef 0.01",
    ),
}


def next_steps(finding: Finding, model: str = "MODEL", proxy: str = "PROXY") -> dict[str, Any]:
    """The causes to check and the commands that test a fix, for ``finding``.

    Returns ``{"causes": [...], "fault": name or None, "fixes": [...], "export": command,
    "validate": [one command per fix], "also": [{"fault", "fixes", "validate"} of each other
    fault that raises it]}``; a finding moescope cannot reproduce has no fault, no fixes and no
    commands.
    """
    remedy = REMEDIES[finding.type]
    validate = remedy.validate_lines(finding.type, proxy)
    return {
        "causes": list(remedy.causes),
        "fault": remedy.fault,
        "fixes": list(remedy.fixes),
        "export": EXPORT.format(model=model, proxy=proxy) if validate else None,
        "validate": validate,
        "also": [
            {
                "fault": r.fault,
                "fixes": list(r.fixes),
                "validate": r.validate_lines(f"{finding.type}-{r.fault}", proxy),  # its own --out
            }
            for r in remedy.also
        ],
    }


def next_steps_text(finding: Finding, model: str = "MODEL", proxy: str = "PROXY") -> list[str]:
    """:func:`next_steps` as indented lines for a terminal."""
    steps = next_steps(finding, model, proxy)
    lines = ["likely causes: " + "; ".join(steps["causes"])]
    if steps["validate"]:
        fixes = ", ".join(f"{f} ({FIXES[f.partition(':')[0]].does})" for f in steps["fixes"])
        lines.append(f"fixes to test on a proxy ({steps['fault']} reproduces it): {fixes}")
        lines += [f"  $ {steps['export']}", *(f"  $ {line}" for line in steps["validate"])]
        for other in steps["also"]:
            lines.append(f"or, if {other['fault']} reproduces it: {', '.join(other['fixes'])}")
            lines += [f"  $ {line}" for line in other["validate"]]
    else:
        lines.append("no moescope fault reproduces it: check the causes in the run's config and data")
    return lines


NEXT_COLUMNS = ("model", "type", "step", "fault", "fix", "validate")


def next_steps_frame(
    by_model: Mapping[str, Sequence[Finding]], model: str = "MODEL", proxy: str = "PROXY"
) -> pd.DataFrame:
    """One row per finding and fix to test: the ``validate`` command that tests it on a proxy.

    A finding several faults reproduce has the rows of each (``also``, after the first fault's).
    A finding moescope cannot reproduce has one row with no fault, fix or command (its causes
    are in :func:`next_steps`); info findings are left out, as nothing needs fixing there.
    """
    import pandas as pd

    rows = []
    for name, findings in by_model.items():
        for f in findings:
            if f.severity == "info":
                continue
            steps = next_steps(f, model, proxy)
            tries = [
                (s["fault"], fix, cmd)
                for s in (steps, *steps["also"])
                for fix, cmd in zip(s["fixes"], s["validate"], strict=True)
            ] or [(None, None, None)]
            rows += [
                {"model": name, "type": f.type, "step": f.step, "fault": fault, "fix": fix, "validate": cmd}
                for fault, fix, cmd in tries
            ]
    return pd.DataFrame(rows, columns=list(NEXT_COLUMNS))
