"""Names shared by the library, the charts and the notebooks.

Axis names are the column names of every long-form frame (``to_frame()``); indices are the
0-based positions in the *original* model, also inside a proxy's manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moescope.errors import MoescopeError

LAYER = "layer"
EXPERT = "expert"
CLUSTER = "cluster"
STEP = "step"
TOKEN = "token"
TASK = "task"

SCHEMA_VERSION = 1


def check_schema(version: Any, path: str | Path) -> None:
    """Refuse a file written under another schema version."""
    if version != SCHEMA_VERSION:
        raise MoescopeError(
            f"{path} has schema version {version}, this moescope reads {SCHEMA_VERSION}; "
            "recompute it with this version."
        )


# Canonical trace metrics (readers map other frameworks' keys onto these).
ACTOR_LOSS = "actor/loss"
PG_LOSS = "actor/pg_loss"
GRAD_NORM = "actor/grad_norm"
ENTROPY = "actor/entropy"
KL = "actor/kl"
CLIPFRAC = "actor/clipfrac"
REWARD_MEAN = "reward/mean"
REWARD_STD = "reward/std"
LENGTH_MEAN = "response/length_mean"
LR = "optim/lr"
LOSS_SCALE = "optim/loss_scale"
SKIPPED = "optim/skipped"
NONFINITE = "health/nonfinite"
LOAD_CV = "moe/load_cv"
MAX_LOAD_SHARE = "moe/max_load_share"
DEAD_EXPERTS = "moe/dead_experts"
ROUTER_ENTROPY = "moe/router_entropy"
EXPERT_LOAD = "moe/expert_load"  # [layer][expert] token shares
TOKEN_ENTROPY = "actor/token_entropy"  # per-position-bucket summary and histogram
GRAD_NORM_GROUP = "actor/grad_norm/"  # prefix: actor/grad_norm/<group>
FIRST_NONFINITE_MODULE = "health/first_nonfinite_module"  # first module whose output went NaN/Inf

CANONICAL_METRICS = (
    ACTOR_LOSS,
    PG_LOSS,
    GRAD_NORM,
    ENTROPY,
    KL,
    CLIPFRAC,
    REWARD_MEAN,
    REWARD_STD,
    LENGTH_MEAN,
    LR,
    LOSS_SCALE,
    SKIPPED,
    NONFINITE,
    LOAD_CV,
    MAX_LOAD_SHARE,
    DEAD_EXPERTS,
    ROUTER_ENTROPY,
)

# replay extras read by the diagnosis
NO_SIGNAL_FRAC = "reward/no_signal_frac"  # share of groups whose rewards were all equal
TRUNCATED_FRAC = "response/truncated_frac"  # share of responses that hit the token budget

# further canonical keys that other frameworks' logs carry (moescope.analyze.readers maps onto them)
PPO_KL = "actor/ppo_kl"  # KL between the behaviour and the updated policy (the PPO ratio's)
VF_LOSS = "critic/vf_loss"
CRITIC_GRAD_NORM = "critic/grad_norm"
REWARD_MAX = "reward/max"
REWARD_MIN = "reward/min"
AUX_LOSS = "moe/aux_loss"  # router load-balancing loss, as the framework logs it
Z_LOSS = "moe/z_loss"
