"""Fault injection: ``NAME[@STEP][:ARG]``, composable, each with the signature it leaves.

``@STEP`` is the first faulted step (default 5, or 0 for faults that model a setting rather than
an event); *point* faults last that one step, *persistent* faults last to the end of the run.
``ARG`` is the fault's one parameter (a factor, a module name, a precision).

Each fault: kind and default ARG — what it simulates — the signature it leaves in the trace.
``FaultKind.signature`` names the findings (:mod:`moescope.analyze.findings`) that show the
fault's own mechanism at work — the ones :func:`~moescope.analyze.verdict.compare` requires of a
proxy — as opposed to where a run goes afterwards, which can differ from seed to seed on the
same model (a policy broken by an LR spike drifts toward noise on one seed and into a
repetition loop on another). Faults whose mark is a logged metric rather than a finding
(``update_omission``, ``reward_scale``, ``no_grad_clip``) have none.

``lr_spike`` (point, ×1000)
    A scheduler or config bug multiplying the LR. ``optim/lr`` jumps; a grad-norm spike and a
    KL jump follow, and the policy's reward collapses (signature: ``grad_spike``, ``kl_blowup``,
    ``reward_collapse``: the update moved the policy far in one step).
``fp16_overflow`` (point, ×2^24; needs fp16)
    A loss spike under fp16: the loss scale becomes far too large. ``optim/skipped`` >= 1 and
    ``optim/loss_scale`` halving step by step.
``nan_op`` (point, ARG a module name; default the last MoE layer's experts)
    An operator bug writing NaN into one module's output in the trainer's forward passes.
    ``health/nonfinite`` at the step, ``health/first_nonfinite_module`` naming the module, the
    step skipped.
``router_precision`` (persistent, bf16)
    The router scored in low precision (an engine or a kernel with a bf16 gate).
    ``rollout/logprob_mismatch`` > 0 (absent from a clean fp32 run); routes flip near ties.
``update_omission`` (persistent)
    The actor update silently skipped. ``actor/update_applied`` = 0 while
    ``actor/grad_norm`` > 0; the weights stay frozen.
``rollout_logprob_precision`` (persistent, bf16)
    Old log-probs taken from a lower-precision rollout engine. ``rollout/logprob_mismatch`` > 0;
    the PPO ratio starts away from 1 (``actor/ppo_kl``).
``routing_mismatch`` (persistent, fp8)
    The rollout engine routes on low-precision router logits (its inputs and weights rounded to
    fp8 e4m3, bf16 or fp16) while the trainer routes in its own precision, so a share of tokens
    take other experts in the rollout than in training, as happens when the two engines choose
    top-k separately. Samples and old log-probs come from the rollout engine. Logged:
    ``rollout/routing_flip_frac`` (per layer in ``rollout/routing_flip_frac_layers``), the share of
    routing choices that differ between the two, and the mismatch metrics > 0.
``reward_scale`` (persistent, ×100)
    A reward function on another scale. ``reward/mean`` and ``reward/std`` jump by the factor;
    GRPO advantages (and so the updates) are unchanged.
``no_grad_clip`` (persistent)
    Gradient clipping off. ``optim/clip_coef`` stays 1 while ``actor/grad_norm`` exceeds
    ``max_grad_norm``.
``aux_loss_off`` (persistent)
    The router load-balancing loss dropped. ``moe/aux_loss`` = 0 from the step; load CV free
    to grow.
``entropy_control_off`` (persistent)
    The OPEFO entropy floor not applied. ``opefo/active`` and ``opefo/entropy_coef`` = 0 from
    the step.

The next six are training–inference mismatches that routing replay does not remove, as users of
verl, slime, NeMo-RL, prime-rl and TRL report them (``rl-mismatch`` reference):

``engine_drift`` (persistent, ARG 0.005 nats a step)
    The rollout engine's log-probs part from the trainer's a little more every step (vime#64:
    0.011 flat with one engine, 0.011 → 0.036 with another): each of its log-probs is offset by
    seeded noise whose scale grows by ARG per faulted step. Samples' old log-probs are the
    rollout's. ``rollout/logprob_mismatch`` > 0 and rising (signature: ``rollout_mismatch``).
``parallel_reduction`` (persistent, bf16)
    The trainer's MoE combine (the routed experts' weighted sum) reduced in another order and
    precision than the rollout's, as a change of expert-parallel degree does (NeMo-RL#4243):
    every MoE layer's routed output rounded to ARG (bf16|fp16) in the trainer's passes, the
    router untouched, so an fp32 router does not help. ``rollout/logprob_mismatch`` > 0 with
    ``rollout/routing_flip_frac`` near 0 (signature: ``rollout_mismatch``).
``resume_state`` (point, optimizer)
    A resume that restores the weights but not the AdamW state (its moments and step count), as
    after a checkpoint written without it (slime#1695): the first update after it is Adam's
    first, every coordinate moved by the full learning rate. ``optim/update_ratio`` (RMS weight
    change over the LR) jumps back to about 1 mid-run (signature: ``optimizer_reset``).
``packing_positions`` (persistent; needs ``packing``)
    The trainer packs each minibatch's rows into one sequence without resetting the position ids
    at the rows' boundaries, so the boundaries are lost and each row attends to the rows packed
    before it (Megatron-Bridge#1776: 0.73 vs 0.03 log-prob difference), while the rollout
    scored each row alone. ``rollout/logprob_mismatch`` large from the first faulted step
    (signature: ``rollout_mismatch``).
``stale_routes`` (persistent, shift; needs ``routing_replay``)
    Routing replay wired wrong: the replayed routes shifted by one token (``shift``) or those
    recorded at the previous step (``step``, a stale registry: verl#4562), so the trainer's
    experts are not the rollout's although R3 is on. ``rollout/route_overlap``, the share of
    replayed choices the trainer's own router also makes, drops far below the few per cent a
    precision difference leaves (signature: ``route_overlap_low``, ``rollout_mismatch``).
``aux_loss_double`` (persistent; needs ``aux_loss_coef`` > 0)
    The load-balancing loss counted twice (Megatron-LM#1330 under activation recompute): its
    gradient and its logged value doubled. ``moe/aux_loss`` doubles at the step while the expert
    load does not move (signature: ``aux_loss_doubled``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from moescope.errors import MoescopeError

DEFAULT_STEP = 5


@dataclass(frozen=True)
class FaultKind:
    name: str
    persistent: bool
    default_arg: Any
    simulates: str
    arg_type: type = float
    default_step: int = DEFAULT_STEP
    signature: tuple[str, ...] = ()


KINDS: dict[str, FaultKind] = {
    k.name: k
    for k in (
        FaultKind(
            "lr_spike",
            False,
            1000.0,
            "a learning-rate spike (LR × ARG for one step)",
            signature=("grad_spike", "kl_blowup", "reward_collapse"),
        ),
        FaultKind(
            "fp16_overflow",
            False,
            float(2**24),
            "a loss-scale blow-up under fp16 (scale × ARG)",
            signature=("overflow",),
        ),
        FaultKind(
            "nan_op",
            False,
            None,
            "NaN written into one module's output (ARG: module name)",
            str,
            signature=("nonfinite",),
        ),
        FaultKind(
            "router_precision",
            True,
            "bf16",
            "router scoring in low precision (ARG: bf16|fp16)",
            str,
            0,
            signature=("rollout_mismatch",),
        ),
        FaultKind("update_omission", True, None, "the actor update silently skipped", str),
        FaultKind(
            "rollout_logprob_precision",
            True,
            "bf16",
            "old log-probs from a low-precision rollout (ARG: bf16|fp16)",
            str,
            0,
            signature=("rollout_mismatch",),
        ),
        FaultKind(
            "routing_mismatch",
            True,
            "fp8",
            "the rollout engine routes on low-precision router logits (ARG: fp8|bf16|fp16)",
            str,
            0,
            signature=("rollout_mismatch",),
        ),
        FaultKind("reward_scale", True, 100.0, "rewards multiplied by ARG"),
        FaultKind("no_grad_clip", True, None, "gradient clipping off", str, 0),
        FaultKind(
            "aux_loss_off", True, None, "router load-balancing loss off", str, signature=("load_collapse",)
        ),
        FaultKind(
            "entropy_control_off",
            True,
            None,
            "the OPEFO entropy floor off",
            str,
            signature=("entropy_collapse",),
        ),
        FaultKind(
            "engine_drift",
            True,
            0.005,
            "the rollout's log-probs drift from the trainer's by ARG more each step",
            float,
            0,
            signature=("rollout_mismatch",),
        ),
        FaultKind(
            "parallel_reduction",
            True,
            "bf16",
            "the trainer's MoE combine reduced in another order and precision (ARG: bf16|fp16)",
            str,
            0,
            signature=("rollout_mismatch",),
        ),
        FaultKind(
            "resume_state",
            False,
            "optimizer",
            "a resume without the optimizer state (ARG: optimizer)",
            str,
            signature=("optimizer_reset",),
        ),
        FaultKind(
            "packing_positions",
            True,
            None,
            "packed rows whose position ids are not reset at their boundaries",
            str,
            0,
            signature=("rollout_mismatch",),
        ),
        FaultKind(
            "stale_routes",
            True,
            "shift",
            "routing replay fed routes shifted by a token or from the previous step (ARG: shift|step)",
            str,
            0,
            signature=("route_overlap_low", "rollout_mismatch"),
        ),
        FaultKind(
            "aux_loss_double",
            True,
            None,
            "the load-balancing loss counted twice",
            str,
            signature=("aux_loss_doubled",),
        ),
    )
}

CHOICES: dict[str, tuple[str, ...]] = {
    "router_precision": ("bf16", "fp16"),
    "rollout_logprob_precision": ("bf16", "fp16"),
    "routing_mismatch": ("fp8", "bf16", "fp16"),
    "parallel_reduction": ("bf16", "fp16"),
    "resume_state": ("optimizer",),
    "stale_routes": ("shift", "step"),
}
"""The arguments a fault with named choices takes."""


class FaultPrecondition(MoescopeError):
    """A fault that needs a setting the run does not have (fp16, packed rows, routing replay)."""


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    step: int
    arg: Any

    @property
    def name(self) -> str:
        return self.kind.name

    def active(self, step: int) -> bool:
        return step >= self.step if self.kind.persistent else step == self.step

    def __str__(self) -> str:
        arg = "" if self.arg is None else f":{self.arg}"
        return f"{self.name}@{self.step}{arg}"


def parse_fault(text: str) -> Fault:
    """``NAME[@STEP][:ARG]`` → :class:`Fault`; an unknown name or bad field is one sentence."""
    head, _, arg_text = text.partition(":")
    name, _, step_text = head.partition("@")
    name = name.strip()
    if name not in KINDS:
        raise MoescopeError(
            f"Unknown fault {name!r}; choose from {', '.join(KINDS)} (syntax NAME[@STEP][:ARG])."
        )
    kind = KINDS[name]
    try:
        step = int(step_text) if step_text else kind.default_step
    except ValueError:
        raise MoescopeError(
            f"Fault {text!r} has step {step_text!r}, not an integer; write {name}@STEP."
        ) from None
    if step < 0:
        raise MoescopeError(f"Fault {text!r} has a negative step; steps count from 0.")
    if not arg_text:
        return Fault(kind, step, kind.default_arg)
    if kind.default_arg is None and kind.name != "nan_op":
        raise MoescopeError(f"Fault {name} takes no argument, got {arg_text!r}; write {name}[@STEP].")
    try:
        arg = kind.arg_type(arg_text)
    except ValueError:
        raise MoescopeError(f"Fault {text!r} has argument {arg_text!r}, not a number.") from None
    choices = CHOICES.get(name)
    if choices is not None and arg not in choices:
        named = f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else choices[0]
        raise MoescopeError(f"Fault {name} takes {named}, not {arg!r}.")
    return Fault(kind, step, arg)


def split_faults(faults: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Fault strings as a tuple: one comma-separated string (a notebook or papermill parameter,
    ``"no_grad_clip@3, lr_spike@6"``) is split; ``""`` is a healthy run.

    >>> split_faults("no_grad_clip@3, lr_spike@6:10"), split_faults("")
    (('no_grad_clip@3', 'lr_spike@6:10'), ())
    """
    parts = faults.split(",") if isinstance(faults, str) else faults
    return tuple(p.strip() for p in parts if p.strip())


def parse_faults(texts: tuple[str, ...] | list[str]) -> list[Fault]:
    faults = [parse_fault(t) for t in texts]
    names = [f.name for f in faults]
    dup = sorted({n for n in names if names.count(n) > 1 and KINDS[n].persistent})
    if dup:
        raise MoescopeError(f"Persistent fault(s) {', '.join(dup)} given twice; give each once.")
    return faults


def check_faults(texts: tuple[str, ...] | list[str], *, precision: str, steps: int) -> list[Fault]:
    """Parse the faults of a run and check they fit it (precision, step range)."""
    faults = parse_faults(texts)
    for f in faults:
        if f.name == "fp16_overflow" and precision != "fp16":
            raise FaultPrecondition(
                "Fault fp16_overflow needs fp16 training with loss scaling; add --precision fp16."
            )
        if f.name == "stale_routes" and f.arg == "step" and f.step == 0:
            raise MoescopeError(
                "Fault stale_routes:step replays the previous step's routes, and step 0 has none; "
                "start it at @1 or later."
            )
        if f.step >= steps:
            raise MoescopeError(
                f"Fault {f} starts at step {f.step}, after the run's last step {steps - 1}; "
                "use an earlier @STEP or more --steps."
            )
    return faults


def find_fault(faults: Iterable[Fault], name: str, step: int | None = None) -> Fault | None:
    """The first fault named ``name`` (active at ``step`` when one is given): how a harness asks
    its faults what to do, in a replay and inside a Trainer alike."""
    return next((f for f in faults if f.name == name and (step is None or f.active(step))), None)


class FaultPlan:
    """The faults of a run, queried per step by the trainer."""

    def __init__(self, texts: tuple[str, ...] | list[str], *, precision: str, steps: int) -> None:
        self.faults = check_faults(texts, precision=precision, steps=steps)

    def get(self, name: str, step: int) -> Fault | None:
        return find_fault(self.faults, name, step)

    def active_names(self, step: int) -> list[str]:
        return [f.name for f in self.faults if f.active(step)]

    def describe(self) -> list[str]:
        return [str(f) for f in self.faults]
