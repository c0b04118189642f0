"""What to try next: each finding's likely causes and the fixes moescope can test on a proxy.

A finding says what went wrong; a user's next question is why, and what would stop it. For each
finding type :data:`REMEDIES` lists the usual causes (from the frameworks' issue threads, see the
project's log-format reference) and, where moescope can reproduce the failure, the fault that
does (:mod:`moescope.replay.faults`) and the fixes to try against it (:mod:`moescope.analyze.fixes`).
:func:`next_steps` turns them into the two commands a user runs: ``moescope export`` to make a
proxy of their model, then one ``moescope validate`` per fix, which replays the fault with and
without the fix and says whether the finding goes away.

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

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in KINDS:
            raise ValueError(f"unknown fault {self.fault!r}")
        unknown = [f for f in self.fixes if f.partition(":")[0] not in FIXES]
        if unknown:
            raise ValueError(f"unknown fix(es) {unknown}")


_LR = ("a learning rate too high for the model or the batch", "no or too loose gradient clipping")
_MISMATCH = (
    "routing flips between the rollout engine and the trainer near top-k ties (MoE)",
    "rollout log-probs computed in lower precision or with other kernels than the trainer's",
    "token-level importance ratios amplifying the gap over long responses",
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
    ),
}


def next_steps(finding: Finding, model: str = "MODEL", proxy: str = "PROXY") -> dict[str, Any]:
    """The causes to check and the commands that test a fix, for ``finding``.

    Returns ``{"causes": [...], "fault": name or None, "fixes": [...], "export": command,
    "validate": [one command per fix]}``; a finding moescope cannot reproduce has no fault, no
    fixes and no commands.
    """
    remedy = REMEDIES[finding.type]
    validate = [
        VALIDATE.format(
            proxy=proxy,
            fault=remedy.fault,
            fix=fix,
            flags=remedy.flags,
            type=finding.type,
            name=fix.partition(":")[0],
        )
        for fix in remedy.fixes
    ]
    return {
        "causes": list(remedy.causes),
        "fault": remedy.fault,
        "fixes": list(remedy.fixes),
        "export": EXPORT.format(model=model, proxy=proxy) if validate else None,
        "validate": validate,
    }


def next_steps_text(finding: Finding, model: str = "MODEL", proxy: str = "PROXY") -> list[str]:
    """:func:`next_steps` as indented lines for a terminal."""
    steps = next_steps(finding, model, proxy)
    lines = ["likely causes: " + "; ".join(steps["causes"])]
    if steps["validate"]:
        fixes = ", ".join(f"{f} ({FIXES[f.partition(':')[0]].does})" for f in steps["fixes"])
        lines.append(f"fixes to test on a proxy ({steps['fault']} reproduces it): {fixes}")
        lines += [f"  $ {steps['export']}", *(f"  $ {line}" for line in steps["validate"])]
    else:
        lines.append("no moescope fault reproduces it: check the causes in the run's config and data")
    return lines


NEXT_COLUMNS = ("model", "type", "step", "fault", "fix", "validate")


def next_steps_frame(
    by_model: Mapping[str, Sequence[Finding]], model: str = "MODEL", proxy: str = "PROXY"
) -> pd.DataFrame:
    """One row per finding and fix to test: the ``validate`` command that tests it on a proxy.

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
            tries = list(zip(steps["fixes"], steps["validate"], strict=True)) or [(None, None)]
            rows += [
                {
                    "model": name,
                    "type": f.type,
                    "step": f.step,
                    "fault": steps["fault"],
                    "fix": fix,
                    "validate": cmd,
                }
                for fix, cmd in tries
            ]
    return pd.DataFrame(rows, columns=list(NEXT_COLUMNS))
