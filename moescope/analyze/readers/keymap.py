"""Which key of which framework is which canonical moescope metric.

The diagnosis reads one vocabulary (:mod:`moescope.schema`), whatever wrote the log. The
table below is :data:`KEY_MAP`; the sources are the frameworks' own code as summarised in the
project's log-format reference. A key with no row keeps its original name in the step (nothing
is dropped), and a key that is already canonical (verl's ``actor/pg_loss``) is listed so that
it counts when the framework is guessed from a log's keys. A ``train/`` prefix in front of a key
the framework logs bare (HF Trainer's TensorBoard callback adds one) is ignored.

| framework | foreign key | canonical key |
|---|---|---|
| verl | `actor/loss` | `actor/loss` |
| verl | `actor/pg_loss` | `actor/pg_loss` |
| verl | `actor/grad_norm` | `actor/grad_norm` |
| verl | `actor/entropy` | `actor/entropy` |
| verl | `actor/entropy_loss` | `actor/entropy` |
| verl | `actor/kl_loss` | `actor/kl` |
| verl | `actor/ppo_kl` | `actor/ppo_kl` |
| verl | `actor/pg_clipfrac` | `actor/clipfrac` |
| verl | `actor/lr` | `optim/lr` |
| verl | `critic/score/mean` | `reward/mean` |
| verl | `critic/score/max` | `reward/max` |
| verl | `critic/score/min` | `reward/min` |
| verl | `critic/vf_loss` | `critic/vf_loss` |
| verl | `critic/grad_norm` | `critic/grad_norm` |
| verl | `response_length/mean` | `response/length_mean` |
| verl | `response_length/clip_ratio` | `response/truncated_frac` |
| verl | `rollout_corr/k3_kl` | `rollout/k3_kl` |
| verl | `rollout_corr/rollout_is_mean` | `rollout/is_ratio_mean` |
| verl | `rollout_corr/rollout_is_std` | `rollout/is_ratio_std` |
| verl | `rollout_corr/rollout_is_max` | `rollout/is_ratio_max` |
| verl | `rollout_corr/rollout_is_min` | `rollout/is_ratio_min` |
| verl | `rollout_corr/rollout_rs_masked_fraction` | `rollout/is_truncated_frac` |
| verl | `rollout_corr/log_ppl_diff` | `rollout/log_ppl_diff` |
| verl | `rollout_corr/chi2_token` | `rollout/chi2_token` |
| verl | `rollout_corr/chi2_seq` | `rollout/chi2_seq` |
| verl | `training/rollout_probs_diff_mean` | `rollout/probs_diff_mean` |
| verl | `training/rollout_probs_diff_max` | `rollout/probs_diff_max` |
| verl | `rollout_corr/kl` | `rollout/k3_kl` |
| verl | `rollout_corr/rollout_is_eff_sample_size` | `rollout/is_ess` |
| verl | `rollout_corr/rollout_rs_mean` | `rollout/is_ratio_mean` |
| verl | `rollout_corr/rollout_rs_max` | `rollout/is_ratio_max` |
| verl | `rollout_corr/rollout_rs_min` | `rollout/is_ratio_min` |
| trl | `loss` | `actor/loss` |
| trl | `policy_loss` | `actor/pg_loss` |
| trl | `grad_norm` | `actor/grad_norm` |
| trl | `learning_rate` | `optim/lr` |
| trl | `reward` | `reward/mean` |
| trl | `reward_std` | `reward/std` |
| trl | `frac_reward_zero_std` | `reward/no_signal_frac` |
| trl | `entropy` | `actor/entropy` |
| trl | `kl` | `actor/kl` |
| trl | `clip_ratio/region_mean` | `actor/clipfrac` |
| trl | `completions/mean_length` | `response/length_mean` |
| trl | `completion_length` | `response/length_mean` |
| trl | `completions/clipped_ratio` | `response/truncated_frac` |
| trl | `aux_loss` | `moe/aux_loss` |
| trl | `sampling/sampling_logp_difference/mean` | `rollout/logprob_mismatch` |
| trl | `sampling/importance_sampling_ratio/mean` | `rollout/is_ratio_mean` |
| trl | `sampling/importance_sampling_ratio/max` | `rollout/is_ratio_max` |
| trl | `sampling/importance_sampling_ratio/min` | `rollout/is_ratio_min` |
| ms-swift | (every trl row) | |
| ms-swift | `entropy/mean` | `actor/entropy` |
| ms-swift | `k3_kl` | `rollout/k3_kl` |
| ms-swift | `log_ppl_diff` | `rollout/log_ppl_diff` |
| ms-swift | `chi2_token` | `rollout/chi2_token` |
| ms-swift | `chi2_seq` | `rollout/chi2_seq` |
| openrlhf | `train/policy_loss` | `actor/pg_loss` |
| openrlhf | `train/actor_grad_norm` | `actor/grad_norm` |
| openrlhf | `train/actor_lr` | `optim/lr` |
| openrlhf | `train/entropy_loss` | `actor/entropy` |
| openrlhf | `train/kl` | `actor/kl` |
| openrlhf | `train/ppo_kl` | `actor/ppo_kl` |
| openrlhf | `train/ppo_clip_ratio` | `actor/clipfrac` |
| openrlhf | `train/reward` | `reward/mean` |
| openrlhf | `train/group_reward_std` | `reward/std` |
| openrlhf | `train/response_length` | `response/length_mean` |
| openrlhf | `train/response_clip_ratio` | `response/truncated_frac` |
| openrlhf | `train/critic_loss` | `critic/vf_loss` |
| openrlhf | `train/critic_grad_norm` | `critic/grad_norm` |
| openrlhf | `train/vllm_kl` | `rollout/k3_kl` |
| openrlhf | `train/logprobs_diff` | `rollout/logprob_mismatch` |
| openrlhf | `policy_loss` | `actor/pg_loss` |
| openrlhf | `actor_grad_norm` | `actor/grad_norm` |
| openrlhf | `actor_lr` | `optim/lr` |
| openrlhf | `entropy_loss` | `actor/entropy` |
| openrlhf | `kl` | `actor/kl` |
| openrlhf | `ppo_kl` | `actor/ppo_kl` |
| openrlhf | `ppo_clip_ratio` | `actor/clipfrac` |
| openrlhf | `reward` | `reward/mean` |
| openrlhf | `group_reward_std` | `reward/std` |
| openrlhf | `response_length` | `response/length_mean` |
| openrlhf | `response_clip_ratio` | `response/truncated_frac` |
| openrlhf | `critic_loss` | `critic/vf_loss` |
| openrlhf | `act_loss` | `actor/pg_loss` |
| openrlhf | `act_lr` | `optim/lr` |
| openrlhf | `gen_len` | `response/length_mean` |
| openrlhf | `ent_loss` | `actor/entropy` |
| openrlhf | `vllm_kl` | `rollout/k3_kl` |
| openrlhf | `logprobs_diff` | `rollout/logprob_mismatch` |
| megatron | `lm loss` | `actor/loss` |
| megatron | `grad norm` | `actor/grad_norm` |
| megatron | `learning rate` | `optim/lr` |
| megatron | `loss scale` | `optim/loss_scale` |
| megatron | `number of skipped iterations` | `optim/skipped` |
| megatron | `number of nan iterations` | `health/nonfinite` |
| megatron | `attempted loss scale` | `optim/loss_scale_tried` |
| megatron | `load_balancing_loss` | `moe/aux_loss` |
| megatron | `z_loss` | `moe/z_loss` |
| nemo-rl | `train/loss` | `actor/loss` |
| nemo-rl | `train/grad_norm` | `actor/grad_norm` |
| nemo-rl | `train/lr` | `optim/lr` |
| nemo-rl | `train/reward` | `reward/mean` |
| nemo-rl | `train/kl_penalty` | `actor/kl` |
| nemo-rl | `train/probs_ratio_clamped` | `actor/clipfrac` |
| nemo-rl | `train/approx_entropy` | `actor/entropy` |
| nemo-rl | `train/moe/load_balancing_loss` | `moe/aux_loss` |
| nemo-rl | `train/moe/z_loss` | `moe/z_loss` |
| nemo-rl | `train/gen_kl_error` | `rollout/k3_kl` |
| nemo-rl | `Loss` | `actor/loss` |
| nemo-rl | `Generation KL Error` | `rollout/k3_kl` |
| nemo-rl | `Avg Reward` | `reward/mean` |
| nemo-rl | `Mean Generation Length` | `response/length_mean` |
| nemo-rl | `train/token_mult_prob_error` | `rollout/mult_prob_error` |
| nemo-rl | `train/sampling_importance_ratio` | `rollout/is_ratio_mean` |
| prime-rl | `Loss` | `actor/loss` |
| prime-rl | `Entropy` | `actor/entropy` |
| prime-rl | `Mismatch KL` | `rollout/k3_kl` |
| prime-rl | `Grad. Norm` | `actor/grad_norm` |
| prime-rl | `LR` | `optim/lr` |
| prime-rl | `Reward` | `reward/mean` |
| prime-rl | `Time` | `time/step_s` |
| prime-rl | `loss/mean` | `actor/loss` |
| prime-rl | `entropy/all/mean` | `actor/entropy` |
| prime-rl | `entropy/mean` | `actor/entropy` |
| prime-rl | `mismatch_kl/all/mean` | `rollout/k3_kl` |
| prime-rl | `mismatch_kl/mean` | `rollout/k3_kl` |
| prime-rl | `optim/grad_norm` | `actor/grad_norm` |
| prime-rl | `optim/lr` | `optim/lr` |
| prime-rl | `reward/mean` | `reward/mean` |
| prime-rl | `Max Vio` | `moe/max_violation` |
| prime-rl | `max_vio/mean` | `moe/max_violation` |
| slime | `train/loss` | `actor/loss` |
| slime | `train/pg_loss` | `actor/pg_loss` |
| slime | `train/grad_norm` | `actor/grad_norm` |
| slime | `train/entropy_loss` | `actor/entropy` |
| slime | `train/kl_loss` | `actor/kl` |
| slime | `train/ppo_kl` | `actor/ppo_kl` |
| slime | `train/pg_clipfrac` | `actor/clipfrac` |
| slime | `train/lr-pg_0` | `optim/lr` |
| slime | `rollout/raw_reward` | `reward/mean` |
| slime | `response_len/mean` | `response/length_mean` |
| slime | `rollout/response_lengths` | `response/length_mean` |
| slime | `rollout/truncated` | `response/truncated_frac` |
| slime | `train/train_rollout_logprob_abs_diff` | `rollout/logprob_mismatch` |
| slime | `train/tis` | `rollout/is_ratio_mean` |
| slime | `train/tis_clipfrac` | `rollout/is_truncated_frac` |
| roll | `actor/total_loss` | `actor/loss` |
| roll | `actor/pg_loss` | `actor/pg_loss` |
| roll | `actor_train/grad_norm` | `actor/grad_norm` |
| roll | `actor/kl_loss` | `actor/kl` |
| roll | `actor/approxkl` | `actor/ppo_kl` |
| roll | `actor/clipfrac` | `actor/clipfrac` |
| roll | `critic/score/mean` | `reward/mean` |
| roll | `critic/score/max` | `reward/max` |
| roll | `critic/score/min` | `reward/min` |
| roll | `tokens/response_length/mean` | `response/length_mean` |
| generic | `loss` | `actor/loss` |
| generic | `policy_loss` | `actor/pg_loss` |
| generic | `pg_loss` | `actor/pg_loss` |
| generic | `grad_norm` | `actor/grad_norm` |
| generic | `gradient_norm` | `actor/grad_norm` |
| generic | `lr` | `optim/lr` |
| generic | `learning_rate` | `optim/lr` |
| generic | `model_lr` | `optim/lr` |
| generic | `current_learning_rate` | `optim/lr` |
| generic | `current_lr` | `optim/lr` |
| generic | `entropy` | `actor/entropy` |
| generic | `kl` | `actor/kl` |
| generic | `reward` | `reward/mean` |
| generic | `reward_mean` | `reward/mean` |
| generic | `reward_std` | `reward/std` |
| generic | `clipped_ratio` | `response/truncated_frac` |
| generic | `clipfrac` | `actor/clipfrac` |
| generic | `clip_frac` | `actor/clipfrac` |
| generic | `response_length` | `response/length_mean` |
| areal | `ppo_actor/task_reward/avg` | `reward/mean` |
| areal | `ppo_actor/update/grad_norm` | `actor/grad_norm` |
| areal | `ppo_actor/actor_loss/avg` | `actor/pg_loss` |
| areal | `ppo_actor/entropy/avg` | `actor/entropy` |
| areal | `ppo_actor/clip_ratio/avg` | `actor/clipfrac` |
| areal | `ppo_actor/importance_weight/avg` | `rollout/is_ratio_mean` |
| areal | `ppo_actor/no_eos_ratios/avg` | `response/truncated_frac` |
| areal | `rollout_train_k3_kl` | `rollout/k3_kl` |
| areal | `rollout_train_k3_kl/avg` | `rollout/k3_kl` |
| areal | `compute_logp/r3/rollout_train_k3_kl/avg` | `rollout/k3_kl` |
| areal | `rollout_train_logp_abs_diff/avg` | `rollout/logprob_mismatch` |
| areal | `compute_logp/r3/rollout_train_logp_abs_diff/avg` | `rollout/logprob_mismatch` |
| nemo | `reduced_train_loss` | `actor/loss` |
| nemo-automodel | `moe/dead_expert_frac` | `moe/dead_expert_frac` |
| nemo-automodel | `dead_expert_frac` | `moe/dead_expert_frac` |
| nemo-automodel | `moe/load_cv` | `moe/load_cv` |
| tinker | `e_max_violation` | `moe/max_violation` |
| tinker | `e_frac_with_tokens` | `moe/used_expert_frac` |
| deepspeed-chat | `act_loss` | `actor/pg_loss` |
| deepspeed-chat | `cri_loss` | `critic/vf_loss` |
| deepspeed-chat | `average reward score` | `reward/mean` |
| deepspeed-chat | `Actor Loss` | `actor/pg_loss` |
| deepspeed-chat | `Critic Loss` | `critic/vf_loss` |
| rlkit | `trainer/QF1 Loss` | `critic/vf_loss` |
| olmo | `train/CrossEntropyLoss` | `actor/loss` |
| olmo | `optim/total_grad_norm` | `actor/grad_norm` |
| marian | `Cost` | `actor/loss` |
| marian | `gNorm` | `actor/grad_norm` |
| marian | `L.r.` | `optim/lr` |
| generic | `loss_scale` | `optim/loss_scale` |
| generic | `grad_scale` | `optim/loss_scale` |
| generic | `optim0_lr0` | `optim/lr` |
| generic | `cost` | `actor/loss` |
| generic | `grad_norm_total` | `actor/grad_norm` |
| generic | `grad_norm_(total)` | `actor/grad_norm` |
| generic | `gnorm` | `actor/grad_norm` |
| generic | `gradnorm` | `actor/grad_norm` |
| generic | `total_grad_norm` | `actor/grad_norm` |
| generic | `grad_norm_mean` | `actor/grad_norm` |
| generic | `mean_grad_norm` | `actor/grad_norm` |
| generic | `avg_grad_norm` | `actor/grad_norm` |
| generic | `grad_norm_window_max` | `optim/grad_norm_window_max` |
| generic | `bits/dim` | `actor/loss` |
| generic | `bits_per_dim` | `actor/loss` |
| generic | `bpd` | `actor/loss` |
| generic | `reduced_train_loss` | `actor/loss` |
| generic | `total_loss` | `actor/loss` |
| generic | `training_loss` | `actor/loss` |
| generic | `minibatch_loss` | `actor/loss` |
| generic | `train_loss` | `actor/loss` |
| generic | `tr_loss` | `actor/loss` |
| generic | `current_loss` | `actor/loss` |
| generic | `avr_loss` | `actor/loss` |
| generic | `ce` | `actor/loss` |
| generic | `trainlosspersample` | `actor/loss` |
| generic | `le` | `actor/loss` |
| generic | `ep_r` | `reward/mean` |
| generic | `ep_reward` | `reward/mean` |
| generic | `running_reward` | `reward/mean` |
| generic | `total_reward` | `reward/mean` |
| generic | `rewards` | `reward/mean` |
| generic | `loss_train` | `actor/loss` |
| generic | `main/loss` | `actor/loss` |
| generic | `lossvalue` | `actor/loss` |
| generic | `skipped` | `optim/skipped_total` |
| generic | `avg_reward` | `reward/mean` |
| generic | `mean_reward` | `reward/mean` |
| generic | `average_reward` | `reward/mean` |
| generic | `average_score` | `reward/mean` |
| generic | `avg_score` | `reward/mean` |
| generic | `return` | `reward/mean` |
| generic | `average_return` | `reward/mean` |
| generic | `averagereturn` | `reward/mean` |
| generic | `avg_return` | `reward/mean` |
| generic | `mean_return` | `reward/mean` |
| generic | `episode_return` | `reward/mean` |
| generic | `ret` | `reward/mean` |
| generic | `ep_ret` | `reward/mean` |
| generic | `epret` | `reward/mean` |
| generic | `averageepret` | `reward/mean` |
| generic | `episode_reward` | `reward/mean` |
| generic | `episode_reward_mean` | `reward/mean` |
| generic | `ep_rewmean` | `reward/mean` |
| generic | `ep_rew_mean` | `reward/mean` |
| generic | `mean_100_episode_reward` | `reward/mean` |
| generic | `policy_entropy` | `actor/entropy` |
| generic | `approxkl` | `actor/ppo_kl` |
| generic | `approx_kl` | `actor/ppo_kl` |
| generic | `kl_loss` | `actor/kl` |
| generic | `aux_loss` | `moe/aux_loss` |
| generic | `dead_expert_frac` | `moe/dead_expert_frac` |
| generic | `max_vio` | `moe/max_violation` |
| generic | `rollout_train_k3_kl` | `rollout/k3_kl` |
| generic | `total_rewards_mean` | `reward/mean` |
| generic | `grouped_rewards_std` | `reward/std` |
| generic | `kl_divergence` | `actor/kl` |
| generic | `kl_divergence_mean` | `actor/kl` |
| generic | `kl_divergence_max` | `actor/kl_max` |
| generic | `grpo_loss/kl_divergence` | `actor/kl` |
| generic | `grpo_loss/kl_divergence_mean` | `actor/kl` |
| generic | `grpo_loss/kl_divergence_max` | `actor/kl_max` |

The ``generic`` table serves logs of trainers not listed (:mod:`moescope.analyze.readers.steplines`,
:mod:`moescope.analyze.readers.keyvalues`); a key is looked up there in lower case with runs of
spaces, dots and hyphens made one ``_`` (``Grad Norm`` → ``grad_norm``; mlx-lm's GRPO report
prints ``Total rewards mean 0.000`` for ``total_rewards_mean``, and its ``grouped_rewards_std`` is
the mean of the per-prompt reward std, TRL's ``reward_std``); torchforge's GRPO loss logs the
per-token KL to the reference as ``grpo_loss/kl_divergence_mean`` and ``…_max``. slime's ``train/tis``
is the mean importance weight after its truncation. The ``areal``, ``nemo``, ``nemo-automodel``,
``tinker`` and ``deepspeed-chat`` tables serve the free-text records of
:mod:`moescope.analyze.readers.records` (and any flat JSON lines naming those keys), the ``rlkit``
table rllab / rlkit's ``dump_tabular`` tables (:mod:`moescope.analyze.readers.keyvalues`); a key a
framework's table lacks is then looked up in the ``generic`` table. NeMo Automodel's per-layer
``moe/layer_<i>/cv`` keys keep their names: the load rule reads them layer by layer. AReaL's
``rollout_train_k3_kl`` is its Taylor estimate ``exp(δ) − 1 − δ`` of δ = train − rollout log-prob,
the k3 KL. NeMo-RL's
``gen_kl_error`` is its ``kl_type`` estimate, k3 by default; prime-rl's ``Mismatch KL`` is k3.

Not keys but lines: a DeepSpeed ``OVERFLOW! … Attempted loss scale: X, reducing to Y`` line
becomes ``optim/skipped``, ``optim/loss_scale`` and ``optim/loss_scale_tried`` (see
:mod:`moescope.analyze.readers.megatron`);
``entropy_log.txt`` and ``expert_load.log`` columns become ``actor/entropy`` and the ``moe/*``
load metrics (see :mod:`moescope.analyze.readers.columns`); a plain line mentioning NaN/Inf becomes
``health/nonfinite`` (see :mod:`moescope.analyze.readers.plain`).

Where a framework logs two keys for one canonical metric in the same step (verl's
``actor/entropy`` next to an old ``actor/entropy_loss``), the first keeps the canonical name and
the other keeps its own, with a note.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from moescope import schema as S

_TRL = {
    "loss": S.ACTOR_LOSS,
    "policy_loss": S.PG_LOSS,
    "grad_norm": S.GRAD_NORM,
    "learning_rate": S.LR,
    "reward": S.REWARD_MEAN,
    "reward_std": S.REWARD_STD,
    "frac_reward_zero_std": S.NO_SIGNAL_FRAC,
    "entropy": S.ENTROPY,
    "kl": S.KL,
    "clip_ratio/region_mean": S.CLIPFRAC,
    "completions/mean_length": S.LENGTH_MEAN,
    "completion_length": S.LENGTH_MEAN,  # TRL <= 0.16
    "completions/clipped_ratio": S.TRUNCATED_FRAC,
    "aux_loss": S.AUX_LOSS,
    "sampling/sampling_logp_difference/mean": S.LOGPROB_MISMATCH,  # mean |old − rollout log-prob|
    "sampling/importance_sampling_ratio/mean": S.IS_RATIO_MEAN,
    "sampling/importance_sampling_ratio/max": S.IS_RATIO_MAX,
    "sampling/importance_sampling_ratio/min": S.IS_RATIO_MIN,
}

KEY_MAP: dict[str, dict[str, str]] = {
    "moescope": {key: key for key in S.CANONICAL_METRICS},
    "verl": {
        "actor/loss": S.ACTOR_LOSS,
        "actor/pg_loss": S.PG_LOSS,
        "actor/grad_norm": S.GRAD_NORM,
        "actor/entropy": S.ENTROPY,
        "actor/entropy_loss": S.ENTROPY,  # older logs
        "actor/kl_loss": S.KL,
        "actor/ppo_kl": S.PPO_KL,
        "actor/pg_clipfrac": S.CLIPFRAC,
        "actor/lr": S.LR,
        "critic/score/mean": S.REWARD_MEAN,
        "critic/score/max": S.REWARD_MAX,
        "critic/score/min": S.REWARD_MIN,
        "critic/vf_loss": S.VF_LOSS,
        "critic/grad_norm": S.CRITIC_GRAD_NORM,
        "response_length/mean": S.LENGTH_MEAN,
        "response_length/clip_ratio": S.TRUNCATED_FRAC,
        "rollout_corr/k3_kl": S.MISMATCH_KL,
        "rollout_corr/rollout_is_mean": S.IS_RATIO_MEAN,
        "rollout_corr/rollout_is_std": S.IS_RATIO_STD,
        "rollout_corr/rollout_is_max": S.IS_RATIO_MAX,
        "rollout_corr/rollout_is_min": S.IS_RATIO_MIN,
        "rollout_corr/rollout_rs_masked_fraction": S.IS_TRUNCATED_FRAC,
        "rollout_corr/log_ppl_diff": S.LOG_PPL_DIFF,
        "rollout_corr/chi2_token": S.CHI2_TOKEN,
        "rollout_corr/chi2_seq": S.CHI2_SEQ,
        "training/rollout_probs_diff_mean": S.PROBS_DIFF_MEAN,
        "training/rollout_probs_diff_max": S.PROBS_DIFF_MAX,
        "rollout_corr/kl": S.MISMATCH_KL,  # the direct estimate; k3_kl takes the name when both are logged
        "rollout_corr/rollout_is_eff_sample_size": S.IS_ESS,
        "rollout_corr/rollout_rs_mean": S.IS_RATIO_MEAN,  # the ratio rejection sampling tests
        "rollout_corr/rollout_rs_max": S.IS_RATIO_MAX,
        "rollout_corr/rollout_rs_min": S.IS_RATIO_MIN,
    },
    "trl": _TRL,
    "ms-swift": {
        **_TRL,
        "entropy/mean": S.ENTROPY,
        "k3_kl": S.MISMATCH_KL,
        "log_ppl_diff": S.LOG_PPL_DIFF,
        "chi2_token": S.CHI2_TOKEN,
        "chi2_seq": S.CHI2_SEQ,
    },
    "openrlhf": {
        "train/policy_loss": S.PG_LOSS,
        "train/actor_grad_norm": S.GRAD_NORM,
        "train/actor_lr": S.LR,
        "train/entropy_loss": S.ENTROPY,
        "train/kl": S.KL,
        "train/ppo_kl": S.PPO_KL,
        "train/ppo_clip_ratio": S.CLIPFRAC,
        "train/reward": S.REWARD_MEAN,
        "train/group_reward_std": S.REWARD_STD,
        "train/response_length": S.LENGTH_MEAN,
        "train/response_clip_ratio": S.TRUNCATED_FRAC,
        "train/critic_loss": S.VF_LOSS,
        "train/critic_grad_norm": S.CRITIC_GRAD_NORM,
        "train/vllm_kl": S.MISMATCH_KL,  # KL of the vLLM rollout to the trainer
        "train/logprobs_diff": S.LOGPROB_MISMATCH,
        # the console's progress-bar postfix: the Episode bar's full names, the inner bar's short ones
        "policy_loss": S.PG_LOSS,
        "actor_grad_norm": S.GRAD_NORM,
        "actor_lr": S.LR,
        "entropy_loss": S.ENTROPY,
        "kl": S.KL,
        "ppo_kl": S.PPO_KL,
        "ppo_clip_ratio": S.CLIPFRAC,
        "reward": S.REWARD_MEAN,
        "group_reward_std": S.REWARD_STD,
        "response_length": S.LENGTH_MEAN,
        "response_clip_ratio": S.TRUNCATED_FRAC,
        "critic_loss": S.VF_LOSS,
        "act_loss": S.PG_LOSS,
        "act_lr": S.LR,
        "gen_len": S.LENGTH_MEAN,
        "ent_loss": S.ENTROPY,
        "vllm_kl": S.MISMATCH_KL,
        "logprobs_diff": S.LOGPROB_MISMATCH,
    },
    "megatron": {
        "lm loss": S.ACTOR_LOSS,
        "grad norm": S.GRAD_NORM,
        "learning rate": S.LR,
        "loss scale": S.LOSS_SCALE,
        "number of skipped iterations": S.SKIPPED,
        "number of nan iterations": S.NONFINITE,
        "attempted loss scale": S.LOSS_SCALE_TRIED,
        "load_balancing_loss": S.AUX_LOSS,
        "z_loss": S.Z_LOSS,
    },
    "nemo-rl": {
        "train/loss": S.ACTOR_LOSS,
        "train/grad_norm": S.GRAD_NORM,
        "train/lr": S.LR,
        "train/reward": S.REWARD_MEAN,
        "train/kl_penalty": S.KL,
        "train/probs_ratio_clamped": S.CLIPFRAC,
        "train/approx_entropy": S.ENTROPY,
        "train/moe/load_balancing_loss": S.AUX_LOSS,
        "train/moe/z_loss": S.Z_LOSS,
        "train/gen_kl_error": S.MISMATCH_KL,  # its kl_type estimate, k3 by default
        "train/token_mult_prob_error": S.MULT_PROB_ERROR,
        "train/sampling_importance_ratio": S.IS_RATIO_MEAN,
        # the console block under each "===== Step N/M =====" banner
        "Loss": S.ACTOR_LOSS,
        "Generation KL Error": S.MISMATCH_KL,
        "Avg Reward": S.REWARD_MEAN,
        "Mean Generation Length": S.LENGTH_MEAN,
    },
    "prime-rl": {
        # the trainer's and orchestrator's "Step N | …" lines
        "Loss": S.ACTOR_LOSS,
        "Entropy": S.ENTROPY,
        "Mismatch KL": S.MISMATCH_KL,  # k3 of trainer vs inference log-probs
        "Grad. Norm": S.GRAD_NORM,
        "LR": S.LR,
        "Reward": S.REWARD_MEAN,
        "Time": S.TIME_STEP,
        # its W&B keys
        "loss/mean": S.ACTOR_LOSS,
        "entropy/all/mean": S.ENTROPY,
        "entropy/mean": S.ENTROPY,
        "mismatch_kl/all/mean": S.MISMATCH_KL,
        "mismatch_kl/mean": S.MISMATCH_KL,
        "optim/grad_norm": S.GRAD_NORM,
        "optim/lr": S.LR,
        "reward/mean": S.REWARD_MEAN,
        "Max Vio": S.MAX_VIOLATION,
        "max_vio/mean": S.MAX_VIOLATION,
    },
    "slime": {
        "train/loss": S.ACTOR_LOSS,
        "train/pg_loss": S.PG_LOSS,
        "train/grad_norm": S.GRAD_NORM,
        "train/entropy_loss": S.ENTROPY,
        "train/kl_loss": S.KL,
        "train/ppo_kl": S.PPO_KL,
        "train/pg_clipfrac": S.CLIPFRAC,
        "train/lr-pg_0": S.LR,
        "rollout/raw_reward": S.REWARD_MEAN,
        "response_len/mean": S.LENGTH_MEAN,
        "rollout/response_lengths": S.LENGTH_MEAN,  # the rollout record's own (slime#1527)
        "rollout/truncated": S.TRUNCATED_FRAC,
        "train/train_rollout_logprob_abs_diff": S.LOGPROB_MISMATCH,
        "train/tis": S.IS_RATIO_MEAN,
        "train/tis_clipfrac": S.IS_TRUNCATED_FRAC,
    },
    "roll": {
        "actor/total_loss": S.ACTOR_LOSS,
        "actor/pg_loss": S.PG_LOSS,
        "actor_train/grad_norm": S.GRAD_NORM,
        "actor/kl_loss": S.KL,
        "actor/approxkl": S.PPO_KL,
        "actor/clipfrac": S.CLIPFRAC,
        "critic/score/mean": S.REWARD_MEAN,
        "critic/score/max": S.REWARD_MAX,
        "critic/score/min": S.REWARD_MIN,
        "tokens/response_length/mean": S.LENGTH_MEAN,
    },
    "areal": {
        "ppo_actor/task_reward/avg": S.REWARD_MEAN,
        "ppo_actor/update/grad_norm": S.GRAD_NORM,
        "ppo_actor/actor_loss/avg": S.PG_LOSS,
        "ppo_actor/entropy/avg": S.ENTROPY,
        "ppo_actor/clip_ratio/avg": S.CLIPFRAC,
        "ppo_actor/importance_weight/avg": S.IS_RATIO_MEAN,
        "ppo_actor/no_eos_ratios/avg": S.TRUNCATED_FRAC,
        "rollout_train_k3_kl": S.MISMATCH_KL,
        "rollout_train_k3_kl/avg": S.MISMATCH_KL,
        "compute_logp/r3/rollout_train_k3_kl/avg": S.MISMATCH_KL,
        "rollout_train_logp_abs_diff/avg": S.LOGPROB_MISMATCH,
        "compute_logp/r3/rollout_train_logp_abs_diff/avg": S.LOGPROB_MISMATCH,
    },
    "nemo": {  # NeMo 2.0 (Lightning): progress-bar postfix and "Training epoch E, iteration i/n | …" lines
        "reduced_train_loss": S.ACTOR_LOSS,
    },
    "nemo-automodel": {
        "moe/dead_expert_frac": S.DEAD_EXPERT_FRAC,
        "dead_expert_frac": S.DEAD_EXPERT_FRAC,
        "moe/load_cv": S.LOAD_CV,
    },
    "tinker": {
        "e_max_violation": S.MAX_VIOLATION,
        "e_frac_with_tokens": S.USED_EXPERT_FRAC,
    },
    "deepspeed-chat": {
        "act_loss": S.PG_LOSS,
        "cri_loss": S.VF_LOSS,
        "average reward score": S.REWARD_MEAN,
        "Actor Loss": S.PG_LOSS,
        "Critic Loss": S.VF_LOSS,
    },
    "rlkit": {  # SAC's first Q-network's TD loss, a squared error as a critic's value loss is
        "trainer/QF1 Loss": S.VF_LOSS,
    },
    "olmo": {  # OLMo's trainer: a "[step=N/M,epoch=E]" line over one "    name=value" line a metric
        "train/CrossEntropyLoss": S.ACTOR_LOSS,
        "optim/total_grad_norm": S.GRAD_NORM,
    },
    "marian": {  # Marian NMT's line: "Ep. 8 : Up. 535500 : … : Cost nan : … : gNorm 0.6068 : L.r. 5.18e-05"
        "Cost": S.ACTOR_LOSS,
        "gNorm": S.GRAD_NORM,
        "L.r.": S.LR,
    },
    "generic": {  # looked up normalised (see the module docstring)
        "loss": S.ACTOR_LOSS,
        "policy_loss": S.PG_LOSS,
        "pg_loss": S.PG_LOSS,
        "grad_norm": S.GRAD_NORM,
        "gradient_norm": S.GRAD_NORM,
        "lr": S.LR,
        "learning_rate": S.LR,
        "model_lr": S.LR,  # XLM's optimizer of the model: "model LR: 1.0000e-04"
        "current_learning_rate": S.LR,  # BigDL's "Current learning rate is 0.0463."
        "current_lr": S.LR,
        "entropy": S.ENTROPY,
        "kl": S.KL,
        "reward": S.REWARD_MEAN,
        "reward_mean": S.REWARD_MEAN,
        "reward_std": S.REWARD_STD,
        "clipped_ratio": S.TRUNCATED_FRAC,  # TRL's completions/clipped_ratio, pasted without its prefix
        "clipfrac": S.CLIPFRAC,
        "clip_frac": S.CLIPFRAC,
        "response_length": S.LENGTH_MEAN,
        "loss_scale": S.LOSS_SCALE,
        "grad_scale": S.LOSS_SCALE,  # icefall's: torch.amp's GradScaler scale, "grad_scale: 6.1e-05"
        "optim0_lr0": S.LR,  # ESPnet2's: the first optimizer's first parameter group
        "ce": S.ACTOR_LOSS,  # CNTK's cross-entropy criterion: "Minibatch[ 1- 500]: ce = 2.30255688 * 16000;"
        "trainlosspersample": S.ACTOR_LOSS,  # CNTK's older trainer: "TrainLossPerSample =  5.87155566;"
        "le": S.ACTOR_LOSS,  # VSE++ / SCAN / GSMN's matching loss: "Eit 12400  lr 0.0002  Le 25.6000"
        "cost": S.ACTOR_LOSS,  # TensorFlow 1's tutorials and the notebooks built on them: "Cost: 2.3016"
        "grad_norm_total": S.GRAD_NORM,
        "grad_norm_(total)": S.GRAD_NORM,
        "gnorm": S.GRAD_NORM,
        "gradnorm": S.GRAD_NORM,  # minFM's step line: "Step   1560 | Loss: 0.5275 | GradNorm: 2.29"
        "total_grad_norm": S.GRAD_NORM,
        "grad_norm_mean": S.GRAD_NORM,  # an epoch's mean of its steps' norms (a PR's results table)
        "mean_grad_norm": S.GRAD_NORM,
        "avg_grad_norm": S.GRAD_NORM,
        "grad_norm_window_max": S.GRAD_NORM_WINDOW_MAX,  # icefall's ScaledAdam: its quartiles' largest
        "bits/dim": S.ACTOR_LOSS,  # a flow's or a VAE's negative log-likelihood in bits a dimension
        "bits_per_dim": S.ACTOR_LOSS,
        "bpd": S.ACTOR_LOSS,
        "reduced_train_loss": S.ACTOR_LOSS,
        "total_loss": S.ACTOR_LOSS,
        "training_loss": S.ACTOR_LOSS,  # Lasagne's examples: "  training loss:\t\t2.471961"
        "minibatch_loss": S.ACTOR_LOSS,  # TensorFlow's examples, tf_unet: "Iter 950, Minibatch Loss= 0.6931"
        "train_loss": S.ACTOR_LOSS,  # DINO's / DeiT's log.txt records (train_lr, train_wd beside it)
        "tr_loss": S.ACTOR_LOSS,  # "Tr.Loss: 3.13  Val.Loss: 2.93" (deep_avsr)
        "current_loss": S.ACTOR_LOSS,  # NeuralPDE / Optimization.jl callbacks: "Current loss is: 133.45"
        "avr_loss": S.ACTOR_LOSS,  # kohya's sd-scripts and musubi-tuner bars: "176/800 [… avr_loss=0.0912]"
        "loss_train": S.ACTOR_LOSS,  # litgpt's fine-tuning lines: "loss train: 2.424, val: n/a"
        "main/loss": S.ACTOR_LOSS,  # Chainer's reporter: "epoch  main/loss  validation/main/loss …"
        "lossvalue": S.ACTOR_LOSS,  # InsightFace's MXNet metric: "Batch [0-20]\t… acc=0.00\tlossvalue=6.24"
        "skipped": S.SKIPPED_TOTAL,  # DeepSpeed's engine: "step=16, skipped=16, lr=[0.0001], …"
        "avg_reward": S.REWARD_MEAN,
        "mean_reward": S.REWARD_MEAN,
        "average_reward": S.REWARD_MEAN,
        "average_score": S.REWARD_MEAN,  # RL tutorials' "episode 6264 score -73.42 average score -178.85"
        "avg_score": S.REWARD_MEAN,
        # classic RL libraries log an episode's return (its summed rewards), averaged over the
        # episodes of the interval: tf-agents "Average Return", acme "Return", rllab "AverageReturn",
        # Stable Baselines "ep_rewmean" / "ep_rew_mean", RLlib "episode_reward_mean"
        "return": S.REWARD_MEAN,
        "average_return": S.REWARD_MEAN,
        "averagereturn": S.REWARD_MEAN,
        "avg_return": S.REWARD_MEAN,
        "mean_return": S.REWARD_MEAN,
        "episode_return": S.REWARD_MEAN,
        "ret": S.REWARD_MEAN,  # a loop's "ep 12 | ret 9.4", Spinning Up's "EpRet" / "AverageEpRet"
        "ep_ret": S.REWARD_MEAN,
        "epret": S.REWARD_MEAN,
        "averageepret": S.REWARD_MEAN,
        "episode_reward": S.REWARD_MEAN,
        "ep_r": S.REWARD_MEAN,  # MorvanZhou's tutorials and the loops copied from them: "Ep: 203 | Ep_r: 3.3"
        "ep_reward": S.REWARD_MEAN,  # DDPG / HER loops: "Epoch:0| Running_reward:-50.000| EP_reward:-50.000|"
        "running_reward": S.REWARD_MEAN,  # PyTorch's actor-critic example and the loops copied from it
        "total_reward": S.REWARD_MEAN,  # FinRL's environments: "total_reward:0.0"
        "rewards": S.REWARD_MEAN,  # "Total rewards in episode 73 is 3.799999999999999" (the word before it)
        "episode_reward_mean": S.REWARD_MEAN,
        "ep_rewmean": S.REWARD_MEAN,
        "ep_rew_mean": S.REWARD_MEAN,
        "mean_100_episode_reward": S.REWARD_MEAN,  # baselines' DQN table
        "policy_entropy": S.ENTROPY,  # stable-baselines' PPO2 and A2C tables
        "approxkl": S.PPO_KL,
        "approx_kl": S.PPO_KL,  # Stable-Baselines3's and CleanRL's "train/approx_kl"
        "kl_loss": S.KL,
        "aux_loss": S.AUX_LOSS,
        "dead_expert_frac": S.DEAD_EXPERT_FRAC,
        "max_vio": S.MAX_VIOLATION,
        "rollout_train_k3_kl": S.MISMATCH_KL,
        "total_rewards_mean": S.REWARD_MEAN,  # mlx-lm's GRPO report, printed "Total rewards mean 0.625"
        "grouped_rewards_std": S.REWARD_STD,  # ...its mean per-prompt reward std, TRL's reward_std
        # torchforge's GRPO loss records its per-token KL to the reference as a mean and a max
        "kl_divergence": S.KL,
        "kl_divergence_mean": S.KL,
        "kl_divergence_max": S.KL_MAX,
        "grpo_loss/kl_divergence": S.KL,
        "grpo_loss/kl_divergence_mean": S.KL,
        "grpo_loss/kl_divergence_max": S.KL_MAX,
    },
}
NORMALISED = frozenset({"generic"})
"""Tables whose keys are looked up normalised: lower case, spaces, dots and hyphens as one ``_``."""
_SEPARATORS = re.compile(r"[\s.\-]+")

# keys that name a framework without being metrics (they tip the guess between look-alikes)
MARKERS: dict[str, frozenset[str]] = {
    "ms-swift": frozenset({"global_step/max_steps", "memory(GiB)", "train_speed(iter/s)"}),
    "openrlhf": frozenset({"train/global_step", "train/return"}),
    "nemo-rl": frozenset({"train/token_mult_prob_error", "train/gen_kl_error", "train/mean_prompt_length"}),
    "slime": frozenset({"train/train_rollout_logprob_abs_diff", "train/global_batch_size"}),
    "areal": frozenset({"ppo_actor/update/grad_norm", "ppo_actor/task_reward/avg"}),
    "llamafactory": frozenset({"current_steps", "total_steps", "remaining_time", "elapsed_time"}),
    "nemo": frozenset({"reduced_train_loss", "consumed_samples", "train_step_timing in s"}),
    "nemo-automodel": frozenset({"moe/dead_expert_frac", "num_label_tokens", "moe/layer_0/cv"}),
    "tinker": frozenset({"e_max_violation", "e_frac_with_tokens"}),
    "deepspeed-chat": frozenset({"ppo_ep", "unsuper_loss", "average reward score"}),
    "rlkit": frozenset({"trainer/QF2 Loss", "trainer/Policy Loss", "replay_buffer/size"}),
    "olmo": frozenset({"train/CrossEntropyLoss", "train/Perplexity", "optim/total_grad_norm"}),
    "prime-rl": frozenset(
        {
            "Grad. Norm",
            "Mismatch KL",
            "Max Vio",
            "Seq. Length",
            "Async Level",
            "Max. Off-Policy Level",
            "Routing Conf.",
            "Peak Mem.",
        }
    ),
}


@lru_cache(maxsize=1 << 16)  # a log repeats a handful of names on every one of its records
def canonical(framework: str | None, key: str) -> str | None:
    """The canonical name of ``key`` as ``framework`` logs it, or ``None`` when it has none."""
    table = KEY_MAP.get(framework or "", {})
    if framework in NORMALISED:
        key = _SEPARATORS.sub("_", key.strip().lower()).strip("_")
    if key in table:
        return table[key]
    return table.get(key[len("train/") :]) if key.startswith("train/") else None


def rename(framework: str | None, metrics: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``metrics`` under canonical names; of two keys for one canonical name, one keeps its own.

    A key that already is the canonical name wins; otherwise the first one does. Returns the
    renamed dict (``metrics`` itself when every key is canonical already) and the keys that
    kept their own name, for a note.
    """
    keys = tuple(metrics)
    names = _distinct_names(framework, keys)
    if names is not None:  # the common record: its keys seen before, no two for one name
        return (metrics if names == keys else dict(zip(names, metrics.values(), strict=True))), []
    out: dict[str, Any] = {}
    source: dict[str, str] = {}
    kept: list[str] = []
    for key, value, name in zip(keys, metrics.values(), _names(framework, keys), strict=True):
        if name in out:
            if name == key:  # the newcomer is the canonical key itself: the earlier one steps aside
                earlier = source.pop(name)
                out[earlier] = out.pop(name)
                kept.append(earlier)
            else:
                name = key
                kept.append(key)
        out[name] = value
        source[name] = key
    return out, kept


@lru_cache(maxsize=1 << 12)  # a log's records repeat one or a few key lists
def _distinct_names(framework: str | None, keys: tuple[str, ...]) -> tuple[str, ...] | None:
    """The names ``keys`` are kept under when no two of them share one, else ``None``."""
    names = _names(framework, keys)
    return names if len(set(names)) == len(names) else None


# a preference trainer's record (TRL's DPO / KTO / ORPO log these): its ``kl`` is no per-token KL
PREFERENCE_KEYS = frozenset({"rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected"})


def _names(framework: str | None, keys: tuple[str, ...]) -> tuple[str, ...]:
    """Each key's name (:func:`_name`), where the record says what a name means: a preference
    trainer's ``kl`` keeps its own. TRL's KTO logs as ``kl`` its loss's reference point, the
    batch's KL estimate from summed (sequence) log-probabilities clamped at 0: it starts at 0
    and grows by nats as the policy moves, which read as the per-token KL to the reference
    (``actor/kl``) would be a blow-up on every healthy run."""
    names = tuple(_name(framework, key) for key in keys)
    if S.KL not in names or PREFERENCE_KEYS.isdisjoint(keys):
        return names
    return tuple(key if name == S.KL and key != S.KL else name for key, name in zip(keys, names, strict=True))


@lru_cache(maxsize=1 << 16)
def _name(framework: str | None, key: str) -> str:
    """The name ``key`` is kept under: one string shared by every record that logs it."""
    return canonical(framework, key) or key


def guess_framework(keys: Iterable[str], candidates: Iterable[str]) -> str | None:
    """The candidate whose table (and markers) recognise most of ``keys``; ties go to the first."""
    keys = set(keys)
    best, best_score = None, 0
    for name in candidates:
        score = sum(canonical(name, k) is not None for k in keys) + len(keys & MARKERS.get(name, frozenset()))
        if score > best_score:
            best, best_score = name, score
    return best


FRAMEWORK_TABLES = tuple(name for name in KEY_MAP if name not in ("moescope", "generic"))


def guess_beyond_generic(keys: Iterable[str], candidates: Iterable[str] = FRAMEWORK_TABLES) -> str | None:
    """The framework whose table recognises more of ``keys`` than the ``generic`` table of common
    names does (``loss`` and ``grad_norm`` name no framework), else ``None``."""
    keys = set(keys)
    common = sum(canonical("generic", k) is not None for k in keys)
    best = guess_framework(keys, candidates)
    if best is None:
        return None
    score = sum(canonical(best, k) is not None for k in keys) + len(keys & MARKERS.get(best, frozenset()))
    return best if score > common else None
