"""``ReplayConfig``: every knob of a replay in one dataclass, saved whole in the trace header.

Defaults follow the deployment guide where it gives one (``difficulty_threshold=0.6``,
``min_entropy_floor=0.3``, ``sample_steps=50``, ``variance_threshold=0.15``,
``max_grad_norm=1.0``) and common GRPO practice elsewhere. ``digest()`` identifies a config for
``--resume``: a checkpoint written under one config never continues under another.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from moescope._util.configs import config_from_dict
from moescope._util.flags import flag
from moescope.errors import MoescopeError
from moescope.models.tasks import family_names
from moescope.replay.faults import FaultPrecondition, check_faults, find_fault, split_faults

Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS = ("fp32", "bf16", "fp16")
ALGOS = ("grpo", "gepo", "gspo")
IS_MODES = ("token", "sequence")
REWARDS = ("exact", "numeric", "regex")
SCHEDULES = ("constant", "cosine")
SHARDING = ("none", "fsdp")


@dataclass(frozen=True)
class ReplayConfig:
    """A short RL post-training run, the same on an original model and its proxies.

    Data and rewards
        ``prompts``: ``"toy"`` (the task suite), family names (``"add2,add3"``, read as ``"toy"``
        with those ``tasks``) or a ``.jsonl`` path of ``{"prompt", "answer"}`` lines; ``tasks``
        limits the toy families; ``reward``: ``exact`` (stripped completion equals
        the answer), ``numeric`` (first number equals the answer's), ``regex`` (the answer is a
        pattern the completion must fully match).
    Rollout
        ``prompts_per_step`` prompts, ``group_size`` samples each (G), ``temperature``, ``top_p``,
        ``max_new_tokens`` (``None``: the longest answer of the toy tasks + 1, else 32).
    Objective
        PPO-clip with ``clip_low`` / ``clip_high`` on each token's ratio; with ``algo="gspo"``
        on each response's length-normalised ratio instead, clipped to ``seq_clip_low`` /
        ``seq_clip_high`` (GSPO's 3e-4 / 4e-4); ``kl_beta`` times the k3 estimate of KL to the
        frozen reference (``ref_model_path``, default the policy at step 0); router
        load-balancing (``aux_loss_coef``) and z-loss (``z_loss_coef``); ``minibatches`` optimizer
        steps per RL step over the rollout batch (at most one per prompt).
    Optimiser
        AdamW (``lr``, ``weight_decay``, ``betas``), ``lr_schedule`` with ``warmup_steps``,
        gradient clipping at ``max_grad_norm``; a step whose gradient norm is not finite is
        skipped and recorded (``skip_nonfinite``), as verl and Megatron do.
    Mechanisms
        ``algo="gepo"`` (or ``use_gepo``) with ``difficulty_threshold``; PivotRL (``pivot``,
        ``sample_steps``, ``variance_threshold``, ``pivot_keep``); OPEFO
        (``token_entropy_flow_control``, ``min_entropy_floor``, ``entropy_coef_max``,
        ``low_entropy_damping``).
    Precision
        ``precision`` for training, ``rollout_precision`` for the rollout engine (``None``: the
        same); fp16 uses dynamic loss scaling from ``initial_loss_scale``.
    Faults
        ``faults``: ``NAME[@STEP][:ARG]`` strings (see :mod:`moescope.replay.faults`), or one
        comma-separated string of them.
    Fixes
        ``routing_replay``: training reuses the rollout engine's top-k expert choices
        (:mod:`moescope.replay.router_replay`); ``is_correction``: ``"token"`` (the PPO loss
        of each token weighted by π_train / π_rollout truncated at ``is_threshold``) or
        ``"sequence"`` (responses whose length-normalised ratio leaves ``[1/C, C]`` masked out),
        active when the rollout's log-probs differ from the trainer's; ``fp32_router``: every
        router scored in fp32 in training and rollout alike, which also cancels the
        ``router_precision`` and ``routing_mismatch`` faults' rounding; ``is_mask``: tokens whose
        ratio π_train / π_rollout leaves ``[1/C, C]`` left out of the loss (IcePop-style bounds,
        verl's ``rollout_rs``); ``seq_kl_mask``: responses whose mean k3 KL(rollout ‖ training)
        per token exceeds the bound left out. Both act where the two sides' log-probs differ.
    Packing
        ``packing``: the trainer packs each minibatch's rows into one sequence, position ids reset
        at every row's boundary (so each row is scored as alone; the ``packing_positions`` fault
        drops the reset).
    Instruments
        ``instruments=False`` drops per-layer routing, per-group gradient norms, the non-finite
        watch and token-entropy summaries (the bare step the bench compares against).
    Sharding
        ``shard="fsdp"``: under ``torchrun``, every decoder layer of the policy and the reference
        is sharded over the processes with FSDP2, so each holds 1/N of the parameters, gradients
        and AdamW state (:mod:`moescope.models.sharding`); ``"none"``: each process holds the
        whole model (data parallel). The trace is the same either way.
    Looped MoE
        ``loop_times``: apply the decoder stack this many times with shared weights (``None``:
        the model's own ``loop_times`` config field, else 1).
    """

    steps: int = field(default=20, metadata=flag("RL steps", metavar="N"))
    seed: int = field(default=0, metadata=flag("seed"))
    # data and rewards
    prompts: str = field(
        default="toy",
        metadata=flag(
            '\'toy\' (the task suite), task families (add2,add3) or a .jsonl of {"prompt", "answer"} lines',
            metavar="SRC",
        ),
    )
    tasks: tuple[str, ...] | None = None
    reward: str = field(default="exact", metadata=flag("reward function", choices=REWARDS))
    # rollout
    prompts_per_step: int = field(default=8, metadata=flag("prompts per step", metavar="P"))
    group_size: int = field(default=8, metadata=flag("samples per prompt", metavar="G"))
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int | None = None
    # objective
    algo: str = field(
        default="grpo",
        metadata=flag("grpo, gepo (its advantages) or gspo (sequence-level ratio)", choices=ALGOS),
    )
    use_gepo: bool = False
    difficulty_threshold: float = 0.6
    clip_low: float = 0.2
    clip_high: float = 0.28
    seq_clip_low: float = 3e-4
    seq_clip_high: float = 4e-4
    kl_beta: float = field(default=0.01, metadata=flag("KL-to-reference weight", metavar="B"))
    ref_model_path: str | None = None
    aux_loss_coef: float = field(default=0.0, metadata=flag("router load-balancing loss weight", metavar="C"))
    z_loss_coef: float = 0.0
    minibatches: int = 2
    # optimiser
    lr: float = field(default=1e-5, metadata=flag("learning rate"))
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    skip_nonfinite: bool = True
    # PivotRL
    pivot: bool = field(default=False, metadata=flag("PivotRL: learn from pivots of reference answers"))
    sample_steps: int = 50
    variance_threshold: float = 0.15
    pivot_keep: int | None = None
    # OPEFO
    token_entropy_flow_control: bool = False
    min_entropy_floor: float = 0.3
    entropy_coef_max: float = 0.1
    low_entropy_damping: float = 0.5
    # precision
    precision: str = field(default="fp32", metadata=flag("training precision", choices=PRECISIONS))
    rollout_precision: str | None = field(
        default=None,
        metadata=flag("rollout engine precision", choices=PRECISIONS, shown="the training precision"),
    )
    initial_loss_scale: float = 2.0**16
    # fixes
    routing_replay: bool = field(
        default=False,
        metadata=flag("training reuses the rollout's top-k expert choices (Rollout Routing Replay)"),
    )
    is_correction: str | None = field(
        default=None,
        metadata=flag(
            "importance-sampling correction of rollout vs training log-probs",
            choices=IS_MODES,
            shown="off",
        ),
    )
    is_threshold: float = field(default=2.0, metadata=flag("its truncation / masking bound", metavar="C"))
    fp32_router: bool = field(
        default=False, metadata=flag("routers scored in fp32 on both sides, whatever the precision")
    )
    is_mask: float | None = field(
        default=None,
        metadata=flag(
            "mask tokens whose training / rollout ratio leaves [1/C, C] (IcePop-style)",
            metavar="C",
            shown="off",
        ),
    )
    seq_kl_mask: float | None = field(
        default=None,
        metadata=flag(
            "mask responses whose mean k3 KL(rollout || training) per token exceeds this bound",
            metavar="KL",
            shown="off",
        ),
    )
    packing: bool = field(
        default=False,
        metadata=flag("the trainer packs each minibatch's rows into one sequence (position ids reset)"),
    )
    # faults and looping
    faults: tuple[str, ...] = field(default_factory=tuple)
    loop_times: int | None = field(
        default=None,
        metadata=flag(
            "apply the decoder stack N times (looped MoE)",
            metavar="N",
            shown="the model's loop_times, else 1",
        ),
    )
    shard: str = field(
        default="none",
        metadata=flag(
            "under torchrun: fsdp shards each decoder layer over the processes (FSDP2); "
            "none replicates the model (data parallel)",
            choices=SHARDING,
        ),
    )
    # instrumentation (off only to measure its cost: bench/replay.py)
    instruments: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", split_faults(self.faults))
        named = family_names(self.prompts)
        if named:  # the command line's add2,add3: the task suite limited to those families
            if self.tasks is not None and tuple(self.tasks) != named:
                raise MoescopeError(
                    f"prompts={self.prompts!r} names task families and tasks={list(self.tasks)} others; "
                    "give the families once, as prompts or as tasks."
                )
            object.__setattr__(self, "prompts", "toy")
            object.__setattr__(self, "tasks", named)
        _check(self)

    @property
    def gepo(self) -> bool:
        """True when GEPO advantages are on (``algo="gepo"`` or ``use_gepo``)."""
        return self.use_gepo or self.algo == "gepo"

    @property
    def rollout_dtype_name(self) -> str:
        return self.rollout_precision or self.precision

    @property
    def sharded(self) -> bool:
        """Whether the models are sharded over the processes (FSDP2)."""
        return self.shard == "fsdp"

    def check_world(self, world: int, *, group: bool) -> None:
        """Refuse a sharded run without a process group, or whose processes would not all run
        the same passes: under FSDP every process calls every forward and backward together, so
        each minibatch's prompts must split evenly over the processes."""
        if not self.sharded:
            return
        if not group:
            raise MoescopeError(
                "shard='fsdp' needs a process group: launch with `torchrun --nproc-per-node N "
                "-m moescope replay ...` (or accelerate), or use shard='none'."
            )
        per = self.minibatches * world
        if self.prompts_per_step % per:
            raise MoescopeError(
                f"prompts_per_step {self.prompts_per_step} does not split evenly over {self.minibatches} "
                f"minibatches x {world} sharded processes; make it a multiple of {per}."
            )
        if self.pivot:
            raise MoescopeError(
                "PivotRL samples a different number of pivots on each process, which sharded "
                "training cannot run in step; replay --pivot with shard='none'."
            )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tasks"] = list(self.tasks) if self.tasks is not None else None
        d["betas"], d["faults"] = list(self.betas), list(self.faults)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReplayConfig:
        d = dict(d)
        if isinstance(d.get("faults"), str):
            d["faults"] = split_faults(d["faults"])
        for key in ("tasks", "betas", "faults"):
            if d.get(key) is not None:
                d[key] = tuple(d[key])
        return config_from_dict(cls, d, "replay")

    def digest(self) -> str:
        """Short hash of the config (order-independent), to match a checkpoint to its run."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _check(c: ReplayConfig) -> None:
    """One sentence per impossible setting, naming the fix."""
    problems = []
    if c.steps < 1:
        problems.append(f"steps must be at least 1, not {c.steps}")
    if c.prompts_per_step < 1:
        problems.append(f"prompts_per_step must be at least 1, not {c.prompts_per_step}")
    if c.group_size < 2:
        problems.append(
            f"group_size {c.group_size} leaves GRPO no group to normalise against (its advantages "
            "would all be 0); use group_size >= 2"
        )
    if c.algo not in ALGOS:
        problems.append(f"algo {c.algo!r} is not one of {', '.join(ALGOS)}")
    if c.precision not in PRECISIONS:
        problems.append(f"precision {c.precision!r} is not one of {', '.join(PRECISIONS)}")
    if c.rollout_precision is not None and c.rollout_precision not in PRECISIONS:
        problems.append(f"rollout_precision {c.rollout_precision!r} is not one of {', '.join(PRECISIONS)}")
    if isinstance(c.reward, str) and c.reward not in REWARDS:
        problems.append(f"reward {c.reward!r} is not one of {', '.join(REWARDS)}")
    if c.lr_schedule not in SCHEDULES:
        problems.append(f"lr_schedule {c.lr_schedule!r} is not one of {', '.join(SCHEDULES)}")
    if not 0 <= c.seq_clip_low < 1 or c.seq_clip_high < 0:
        problems.append(
            f"sequence clip range ({c.seq_clip_low}, {c.seq_clip_high}) must satisfy "
            "0 <= seq_clip_low < 1 and seq_clip_high >= 0"
        )
    if not 0 <= c.clip_low < 1 or c.clip_high < 0:
        problems.append(
            f"clip range ({c.clip_low}, {c.clip_high}) must satisfy 0 <= clip_low < 1 and clip_high >= 0"
        )
    if not 0 < c.difficulty_threshold < 1:
        problems.append(f"difficulty_threshold must lie in (0, 1), not {c.difficulty_threshold}")
    if c.is_correction is not None and c.is_correction not in IS_MODES:
        problems.append(f"is_correction {c.is_correction!r} is not one of {', '.join(IS_MODES)}")
    if c.is_threshold <= 1:
        problems.append(f"is_threshold must be above 1, not {c.is_threshold}")
    if c.is_mask is not None and c.is_mask <= 1:
        problems.append(f"is_mask must be above 1, not {c.is_mask}")
    if c.seq_kl_mask is not None and c.seq_kl_mask <= 0:
        problems.append(f"seq_kl_mask must be positive, not {c.seq_kl_mask}")
    if c.minibatches < 1:
        problems.append(f"minibatches must be at least 1, not {c.minibatches}")
    if c.max_grad_norm <= 0:
        problems.append(
            f"max_grad_norm must be positive, not {c.max_grad_norm} "
            "(the no_grad_clip fault disables clipping)"
        )
    if c.temperature <= 0:
        problems.append(f"temperature must be positive, not {c.temperature}")
    if not 0 < c.top_p <= 1:
        problems.append(f"top_p must lie in (0, 1], not {c.top_p}")
    if c.loop_times is not None and c.loop_times < 1:
        problems.append(f"loop_times must be at least 1, not {c.loop_times}")
    if c.sample_steps < 1:
        problems.append(f"sample_steps must be at least 1, not {c.sample_steps}")
    if c.shard not in SHARDING:
        problems.append(f"shard {c.shard!r} is not one of {', '.join(SHARDING)}")
    if problems:
        raise MoescopeError("Invalid replay config: " + "; ".join(problems) + ".")
    faults = check_faults(c.faults, precision=c.precision, steps=c.steps)  # before any model loads
    _check_fault_settings(c, faults)


NEEDS = {
    "packing_positions": (lambda c: c.packing, "packed rows; add --packing"),
    "stale_routes": (lambda c: c.routing_replay, "routing replay; add --routing-replay"),
    "aux_loss_double": (
        lambda c: c.aux_loss_coef > 0,
        "a load-balancing loss; add --aux-loss-coef 0.01",
    ),
}
"""Faults that need a setting of the run: the test, and the setting named in the refusal."""


def _check_fault_settings(c: ReplayConfig, faults: list) -> None:
    """Refuse a fault the run has no setting for (one sentence), before anything is written."""
    for name, (has, what) in NEEDS.items():
        if find_fault(faults, name) is not None and not has(c):
            raise FaultPrecondition(f"Fault {name} needs {what}.")
