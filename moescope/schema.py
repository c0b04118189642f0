"""The library's vocabulary: axis names, the schema version, and every key a trace carries.

Axis names are the column names of every long-form frame (``to_frame()``); indices are the
0-based positions in the *original* model, also inside a proxy's manifest.

Every metric key a replay writes into a trace step, every canonical key the readers map other
frameworks' logs onto, the foreign keys the diagnosis reads under their own names, and every
trace header field is declared here once, with its meaning, in :data:`METRICS`; the module
constants (``GRAD_NORM``, ``REWARD_MEAN``, …) are those declarations. The documentation's *Metric
vocabulary* page is :func:`markdown_table` (``python -m moescope.schema --markdown``).

Examples
--------
>>> METRICS[GRAD_NORM].kind, METRICS[GRAD_NORM].source
('scalar', 'replay')
>>> declared(GRAD_NORM_GROUP + "router").key
'actor/grad_norm/<group>'
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
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


KINDS = ("scalar", "array", "text", "template", "field")
"""Value shapes: one number; a nested list or record; a string or list of strings; a key family
``prefix<name>`` of scalars; a structural field of a step or a header."""

SOURCES = ("replay", "readers", "foreign", "trace", "header")
"""Who writes a key: a replay's step; only the readers (from other frameworks' logs); another
framework under its own name (read as is by the diagnosis); every step of any trace; the header
line (a replay's, or a read log's)."""


@dataclass(frozen=True)
class Metric:
    """One declared key: its name (``prefix<name>`` for a template), meaning, shape and writer."""

    key: str
    meaning: str
    kind: str = "scalar"
    source: str = "replay"

    @property
    def prefix(self) -> str:
        """The fixed part of a template's keys (the whole key otherwise)."""
        return self.key.split("<", 1)[0] if self.kind == "template" else self.key

    def matches(self, key: str) -> bool:
        """Whether ``key`` is this metric (a template matches any non-empty name after its prefix)."""
        if self.kind == "template":
            return key.startswith(self.prefix) and len(key) > len(self.prefix)
        return key == self.key


METRICS: dict[str, Metric] = {}
"""Every declared key, in declaration order (the documentation table's order)."""


def _declare(key: str, meaning: str, kind: str = "scalar", source: str = "replay") -> str:
    if key in METRICS or kind not in KINDS or source not in SOURCES:
        raise ValueError(f"bad or repeated declaration of {key!r}")
    METRICS[key] = Metric(key, meaning, kind, source)
    return key


def _template(prefix: str, name: str, meaning: str, source: str = "replay") -> str:
    """Declare ``prefix<name>``; returns the prefix, which code extends with the name."""
    _declare(f"{prefix}<{name}>", meaning, "template", source)
    return prefix


# --- every step of a trace ------------------------------------------------------------------------
_declare(STEP, "the RL step (0-based in a replay, as logged in a read log)", "field", "trace")
KIND = _declare("kind", '"step" on a step line, "header" on the header line', "field", "trace")
RAW = _declare("raw", "the log text a read step came from", "field", "readers")

# --- canonical trace metrics (readers map other frameworks' keys onto these) ----------------------
ACTOR_LOSS = _declare(
    "actor/loss", "the minimised loss (PPO-clip + KL + router losses − entropy bonus), mean over minibatches"
)
PG_LOSS = _declare("actor/pg_loss", "the PPO-clip policy-gradient term alone (mean per token)")
GRAD_NORM = _declare("actor/grad_norm", "global gradient norm after unscaling, before clipping")
ENTROPY = _declare("actor/entropy", "mean token entropy of the policy on the responses (nats)")
KL = _declare("actor/kl", "k3 KL of the policy to the frozen reference (when kl_beta > 0)")
CLIPFRAC = _declare("actor/clipfrac", "share of response tokens whose PPO ratio was clipped")
REWARD_MEAN = _declare("reward/mean", "mean reward of the step's responses")
REWARD_STD = _declare("reward/std", "standard deviation of the step's rewards")
LENGTH_MEAN = _declare("response/length_mean", "mean response length (tokens)")
LR = _declare("optim/lr", "learning rate of the step (schedule and lr_spike fault applied)")
LOSS_SCALE = _declare("optim/loss_scale", "fp16 dynamic loss scale after the step (1 when off)")
SKIPPED = _declare(
    "optim/skipped", "optimizer steps skipped, one per minibatch (fp16 overflow, non-finite norm)"
)
NONFINITE = _declare(
    "health/nonfinite", "non-finite gradient values (uninstrumented: norms) plus non-finite losses"
)
LOAD_CV = _declare("moe/load_cv", "coefficient of variation of expert token shares, mean over layers")
MAX_LOAD_SHARE = _declare("moe/max_load_share", "largest share of a layer's routing slots one expert took")
DEAD_EXPERTS = _declare("moe/dead_experts", "(layer, expert) pairs that received no token")
ROUTER_ENTROPY = _declare("moe/router_entropy", "mean entropy of the router's softmax, over layers")
EXPERT_LOAD = _declare("moe/expert_load", "token shares per [layer][expert]", "array")
TOKEN_ENTROPY = _declare(
    "actor/token_entropy",
    "token entropy by response position (position_buckets, bucket_mean, bucket_tokens) and as a "
    "histogram (hist_edges, hist)",
    "array",
)
GRAD_NORM_GROUP = _template(
    "actor/grad_norm/",
    "group",
    "gradient norm of one parameter group: attention, routed_experts, router, shared_experts, "
    "embeddings, other",
)
FIRST_NONFINITE_MODULE = _declare(
    "health/first_nonfinite_module", "first module whose output went NaN/Inf (null when none)", "text"
)

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

# --- replay extras (the diagnosis reads the first two) --------------------------------------------
NO_SIGNAL_FRAC = _declare("reward/no_signal_frac", "share of groups whose rewards were all equal")
TRUNCATED_FRAC = _declare("response/truncated_frac", "share of responses that hit the token budget")
PPO_KL = _declare("actor/ppo_kl", "mean old − current log-prob per token: the KL the PPO ratio sees")
CLIP_COEF = _declare("optim/clip_coef", "gradient clipping factor applied (1: not clipped)")
UPDATE_APPLIED = _declare("actor/update_applied", "optimizer steps applied (not skipped, not omitted)")
ROUTER_LOGIT_MAX = _declare("moe/router_logit_max", "largest |router logit| of the step")
TOPK_MARGIN = _declare(
    "moe/topk_margin",
    "mean gap between the k-th and the next selection score, over tokens and layers (small: flip risk)",
)
TOPK_MARGIN_LAYERS = _declare("moe/topk_margin_layers", "that gap per MoE layer", "array")
LOGPROB_MISMATCH = _declare(
    "rollout/logprob_mismatch",
    "mean |rollout − training log-prob| per token (when their precisions differ)",
)
MISMATCH_KL = _declare(
    "rollout/k3_kl",
    "k3 estimate of KL(rollout ‖ training) per token, on the rollout's samples (verl's rollout_corr/k3_kl)",
)
IS_RATIO_MEAN = _declare(
    "rollout/is_ratio_mean", "mean training / rollout probability ratio per token (1 when they agree)"
)
IS_RATIO_STD = _declare("rollout/is_ratio_std", "standard deviation of that ratio over the step's tokens")
IS_TRUNCATED_FRAC = _declare(
    "rollout/is_truncated_frac",
    "share of tokens whose importance weight was truncated or masked (with is_correction, or as logged)",
)
ROUTING_FLIP_FRAC = _declare(
    "rollout/routing_flip_frac",
    "share of (token, layer) expert choices the rollout makes otherwise than training, mean over layers",
)
ROUTING_FLIP_LAYERS = _declare("rollout/routing_flip_frac_layers", "that share per MoE layer", "array")
ROUTE_OVERLAP = _declare(
    "rollout/route_overlap",
    "under routing replay: share of replayed expert choices the trainer's own router also makes",
)
MASKED_FRAC = _declare(
    "rollout/masked_frac",
    "share of tokens the mismatch masks (is_mask, seq_kl_mask) left out of the loss",
)
UPDATE_RATIO = _declare(
    "optim/update_ratio",
    "RMS of AdamW's step per coordinate over the learning rate (about 1 on Adam's first step)",
)
OPTIMIZER_STEPS = _declare(
    "optim/state_steps", "updates the optimizer's state has counted (set back by a resume without it)"
)
AUX_LOSS = _declare("moe/aux_loss", "router load-balancing loss (when its coefficient > 0, or as logged)")
Z_LOSS = _declare("moe/z_loss", "router z-loss (when its coefficient > 0, or as logged)")
OPEFO_ACTIVE = _declare("opefo/active", "1 while OPEFO's entropy floor is undercut")
OPEFO_COEF = _declare("opefo/entropy_coef", "OPEFO's entropy bonus coefficient")
OPEFO_DAMPED = _declare("opefo/damped_frac", "share of tokens whose advantage OPEFO damped")
PIVOT_SAMPLED = _declare("pivot/sampled", "PivotRL pivots sampled")
PIVOT_KEPT = _declare("pivot/kept", "PivotRL pivots kept for the update")
FAULTS_ACTIVE = _declare("faults/active", "names of the faults active in this step", "text")
TIME_ROLLOUT = _declare("time/rollout_s", "wall time of the rollout (s)")
TIME_UPDATE = _declare("time/update_s", "wall time of the updates (s)")
TIME_STEP = _declare("time/step_s", "wall time of the whole step (s)")
TIMING_KEYS = (TIME_ROLLOUT, TIME_UPDATE, TIME_STEP)
"""Step fields that measure wall time; everything else is deterministic on CPU."""

# --- canonical keys only other frameworks' logs carry (moescope.analyze.readers maps onto them) ---
VF_LOSS = _declare("critic/vf_loss", "value-function loss (PPO with a critic)", source="readers")
CRITIC_GRAD_NORM = _declare("critic/grad_norm", "the critic's gradient norm", source="readers")
REWARD_MAX = _declare("reward/max", "largest reward of the step", source="readers")
REWARD_MIN = _declare("reward/min", "smallest reward of the step", source="readers")
KL_MAX = _declare(
    "actor/kl_max", "largest per-token KL to the reference of the step (torchforge)", source="readers"
)
LOSS_SCALE_TRIED = _declare(
    "optim/loss_scale_tried", "fp16 loss scale an overflowing step was tried at", source="readers"
)
SCALER_STOPPED = _declare(
    "optim/scaler_stopped",
    "1 where the fp16 loss scaler, at its minimum, stopped the run (DeepSpeed's 'Exiting run', "
    "fairseq's 'Minimum loss scale reached')",
    source="readers",
)
SKIPPED_TOTAL = _declare(
    "optim/skipped_total",
    "optimizer steps skipped since the run began (DeepSpeed's 'step=16, skipped=16')",
    source="readers",
)
EXPERT_LOAD_LAYERS = _declare(
    "moe/expert_load_layers",
    "layer ids of the rows of moe/expert_load when not 0, 1, … (expert_load.log)",
    "array",
    "readers",
)
IS_RATIO_MAX = _declare(
    "rollout/is_ratio_max", "largest training / rollout ratio of the step", source="readers"
)
IS_RATIO_MIN = _declare(
    "rollout/is_ratio_min", "smallest training / rollout ratio of the step", source="readers"
)
PROBS_DIFF_MEAN = _declare(
    "rollout/probs_diff_mean",
    "mean |rollout − training probability| per token (not log-prob)",
    source="readers",
)
PROBS_DIFF_MAX = _declare(
    "rollout/probs_diff_max", "largest |rollout − training probability| of the step", source="readers"
)
MULT_PROB_ERROR = _declare(
    "rollout/mult_prob_error",
    "mean exp|rollout − training log-prob| per token (1 when equal)",
    source="readers",
)
LOG_PPL_DIFF = _declare(
    "rollout/log_ppl_diff", "training − rollout log-perplexity of the responses", source="readers"
)
CHI2_TOKEN = _declare("rollout/chi2_token", "χ² divergence of the token-level ratio", source="readers")
CHI2_SEQ = _declare("rollout/chi2_seq", "χ² divergence of the sequence-level ratio", source="readers")
DEAD_EXPERT_FRAC = _declare(
    "moe/dead_expert_frac", "share of (layer, expert) pairs that received no token", source="readers"
)
USED_EXPERT_FRAC = _declare(
    "moe/used_expert_frac", "share of (layer, expert) pairs that received tokens", source="readers"
)
MAX_VIOLATION = _declare(
    "moe/max_violation", "MaxVio: (largest expert load − mean load) / mean load", source="readers"
)
IS_ESS = _declare(
    "rollout/is_ess", "effective sample size of the importance weights over the batch size", source="readers"
)
GRAD_SPIKES = _declare(
    "health/grad_spikes",
    "updates the trainer's own guard skipped for a gradient norm it judged a spike (minFM's 'spiky "
    "gradient (norm=2.19); skipping optimizer step')",
    source="readers",
)
GRAD_NORM_WINDOW_MAX = _declare(
    "optim/grad_norm_window_max",
    "the largest gradient norm of the optimizer's recent steps, beside their median as the step's "
    "actor/grad_norm (icefall's ScaledAdam: 'grad-norm quartiles … 1.745e+00')",
    source="readers",
)
DIVERGED = _declare(
    "health/diverged",
    "1 where the trainer's own guard says the loss is exploding and stops (karpathy's neuraltalk: "
    "'Aboring, cost seems to be exploding'; char-rnn: 'loss is exploding, aborting')",
    source="readers",
)
LOSS_MISSING = _declare(
    "health/loss_missing",
    "1 on a step whose line logs no loss though the step made updates (Megatron omits a NaN loss)",
    source="readers",
)
ALERTS = _declare(
    "health/alerts",
    "the framework's own warning lines at the step (Megatron's NaN checks, DeepSpeed overflows, ...)",
    "text",
    "readers",
)

# --- foreign keys the diagnosis reads under their own names (no canonical row) --------------------
_FOREIGN = "as some frameworks log it; no canonical key, read as is"
CRITIC_LOSS = _declare("critic/loss", f"critic loss, {_FOREIGN}", source="foreign")
CRITIC_VALUES = _declare("critic/values/mean", f"mean critic value, {_FOREIGN}", source="foreign")
KL_LOSS = _declare("actor/kl_loss", "verl's KL loss where it stands next to an actor/kl", source="foreign")
SFT_LOSS = _declare("actor/sft_loss", f"supervised loss term, {_FOREIGN}", source="foreign")
LM_LOSS = _declare("lm_loss", f"language-model loss, {_FOREIGN}", source="foreign")
LM_LOSS_SPACED = _declare(
    "lm loss", "Megatron's language-model loss where no framework was guessed", source="foreign"
)
ADVANTAGE_MAX = _declare(
    "critic/advantages/max", f"largest advantage of the step, {_FOREIGN}", source="foreign"
)
ADVANTAGE_MIN = _declare(
    "critic/advantages/min", f"smallest advantage of the step, {_FOREIGN}", source="foreign"
)
LENGTH_MIN = _declare("response_length/min", f"shortest response, {_FOREIGN}", source="foreign")
LENGTH_MAX = _declare("response_length/max", f"longest response, {_FOREIGN}", source="foreign")

# --- the header line of a replay's trace ----------------------------------------------------------
for _key, _meaning in (
    ("format", '"moescope.trace" for a replay; the log format for a read log'),
    ("schema_version", "the schema version the trace was written under"),
    ("model", "the replayed model: its path, or its class name when passed loaded"),
    ("model_type", "the transformers model_type"),
    ("config_hash", "digest of the model's config"),
    ("proxy", "the proxy's manifest (null for an original model)"),
    ("replay_config", "the full ReplayConfig"),
    ("config_digest", "digest of the ReplayConfig (resume refuses another)"),
    ("seed", "the replay's seed"),
    ("faults", "the planned faults, as written on the command line"),
    ("reward_function", "the reward function's name"),
    ("loop_times", "passes over the decoder stack (looped models)"),
    ("world_size", "data-parallel ranks"),
    ("num_experts", "routed experts per MoE layer"),
    ("moe_layers", "indices of the MoE layers"),
    ("parameters", "trainable parameters"),
    ("moescope_version", "the moescope that wrote the trace"),
    ("versions", "versions of torch, transformers and the other libraries"),
    ("timing_keys", "the step fields that measure wall time"),
    ("source", "a read log's path"),
    ("framework", "the framework a read log's keys were taken for (null: none guessed)"),
):
    _declare(_key, _meaning, "field", "header")
HEADER_FIELDS = tuple(m.key for m in METRICS.values() if m.source == "header")


def declared(key: str) -> Metric | None:
    """The declaration of a step or header key (a template's for ``actor/grad_norm/router``)."""
    if key in METRICS:
        return METRICS[key]
    return next((m for m in METRICS.values() if m.matches(key)), None)


def markdown_table() -> str:
    """The vocabulary as the documentation's Markdown table: key, kind, written by, meaning."""
    rows = ["| key | kind | written by | meaning |", "|---|---|---|---|"]
    rows += [f"| `{m.key}` | {m.kind} | {m.source} | {_cell(m.meaning)} |" for m in METRICS.values()]
    return "\n".join(rows) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


if __name__ == "__main__":  # python -m moescope.schema --markdown
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m moescope.schema --markdown")
    sys.stdout.write(markdown_table())
