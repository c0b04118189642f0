"""The candidate fixes of a targeted validation, by name: what each changes in a replay.

A fix is ``NAME[:ARG]``; each maps onto :class:`~moescope.replay.config.ReplayConfig` fields, so
any fix composes with any fault and with the others:

- ``routing_replay``: training reuses the rollout's top-k choices (Rollout Routing Replay);
- ``is_correction[:token|sequence]``: importance-sampling correction (default ``token``);
- ``gspo``: GSPO's sequence-level, length-normalised ratio;
- ``fp32_router``: routers scored in fp32 on both sides;
- ``grad_clip[:N]``: gradient clipping at ``N`` (default 0.5);
- ``lower_lr[:F]``: the learning rate times ``F`` (default 0.1);
- ``bf16``: bf16 instead of fp16 (no loss scaling; a fault that needs fp16 cannot happen);
- ``loss_scale[:S]``: fp16's initial loss scale ``S`` (default 2^8);
- ``entropy_floor[:X]``: OPEFO's entropy floor at ``X`` (default 0.3);
- ``aux_loss[:C]``: the router load-balancing loss at coefficient ``C`` (default 0.01);
- ``is_mask[:C]``: tokens whose ratio π_train / π_rollout leaves ``[1/C, C]`` masked out of the
  loss (IcePop-style bounds, verl's token ``rollout_rs``; default 2, verl's threshold);
- ``seq_kl_mask[:KL]``: responses whose mean k3 KL(rollout ‖ training) per token exceeds ``KL``
  masked out (default 1e-3, the top of the dense-model band).

The masks, like IS correction, keep a mismatch out of the update; they do not make the two sides
agree, so the mismatch metrics (and a finding read from them) stay as they were.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from moescope.errors import MoescopeError
from moescope.replay.config import IS_MODES, ReplayConfig


@dataclass(frozen=True)
class Fix:
    """One named fix: its default argument, the argument's type and the fields it sets."""

    name: str
    default: Any
    parse: Callable[[str], Any]
    fields: Callable[[ReplayConfig, Any], dict[str, Any]]
    does: str


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


def _above_one(text: str) -> float:
    value = float(text)
    if not value > 1:
        raise ValueError(text)
    return value


def _is_mode(text: str) -> str:
    if text not in IS_MODES:
        raise ValueError(text)
    return text


FIXES: dict[str, Fix] = {
    f.name: f
    for f in (
        Fix("routing_replay", None, str, lambda c, a: {"routing_replay": True}, "Rollout Routing Replay"),
        Fix("is_correction", "token", _is_mode, lambda c, a: {"is_correction": a}, "IS correction"),
        Fix("gspo", None, str, lambda c, a: {"algo": "gspo"}, "GSPO's sequence-level ratio"),
        Fix("fp32_router", None, str, lambda c, a: {"fp32_router": True}, "routers in fp32"),
        Fix("grad_clip", 0.5, _positive, lambda c, a: {"max_grad_norm": a}, "gradient clipping"),
        Fix("lower_lr", 0.1, _positive, lambda c, a: {"lr": c.lr * a}, "a lower learning rate"),
        Fix("bf16", None, str, lambda c, a: {"precision": "bf16"}, "bf16 instead of fp16"),
        Fix("loss_scale", 2.0**8, _positive, lambda c, a: {"initial_loss_scale": a}, "a lower loss scale"),
        Fix(
            "entropy_floor",
            0.3,
            _positive,
            lambda c, a: {"token_entropy_flow_control": True, "min_entropy_floor": a},
            "OPEFO's entropy floor",
        ),
        Fix("aux_loss", 0.01, _positive, lambda c, a: {"aux_loss_coef": a}, "the load-balancing loss"),
        Fix("is_mask", 2.0, _above_one, lambda c, a: {"is_mask": a}, "token masking by ratio bounds"),
        Fix(
            "seq_kl_mask", 1e-3, _positive, lambda c, a: {"seq_kl_mask": a}, "sequence masking by a KL bound"
        ),
    )
}


def fix_fields(config: ReplayConfig, fixes: Sequence[str]) -> dict[str, Any]:
    """The replay fields ``fixes`` (``NAME[:ARG]`` strings) set on top of ``config``; an unknown
    fix or a bad argument is one sentence."""
    if not fixes:
        raise MoescopeError("name at least one fix to validate, e.g. --fix routing_replay.")
    out: dict[str, Any] = {}
    for text in fixes:
        name, _, arg_text = text.strip().partition(":")
        if name not in FIXES:
            raise MoescopeError(f"unknown fix {name!r}; choose from {', '.join(FIXES)} (syntax NAME[:ARG]).")
        fix = FIXES[name]
        if arg_text and fix.default is None:
            raise MoescopeError(f"fix {name} takes no argument, got {arg_text!r}; write {name}.")
        try:
            arg = fix.parse(arg_text) if arg_text else fix.default
        except ValueError:
            raise MoescopeError(
                f"fix {text!r} has a bad argument {arg_text!r}; see moescope.analyze.fixes."
            ) from None
        out.update(fix.fields(config, arg))
    return out
