#!/usr/bin/env bash
# Replay a TRL GRPO recipe on a model and on its 1/4 proxy, with the same fault; then the verdict.
#
#   examples/trl_recipe.sh [MODEL] [FAULT] [STEPS] [OUT]      (defaults: toy lr_spike@4 12 trl-recipe)
#
# MODEL is an embedded model's name or a local checkpoint directory. Each run writes a moescope
# trace (TRL's metrics and moescope's MoE instruments); `moescope diagnose A --against B` says
# whether the proxy reproduces what the original did. Needs the trl extra: pip install 'moescope[trl]'.
# LAUNCH runs each GRPO run (default: one process); examples/trl_fsdp2.sh sets it to an accelerate
# FSDP2 launch, e.g. LAUNCH="accelerate launch --config_file examples/accelerate_fsdp2.yaml".
set -euo pipefail
MODEL=${1:-toy}
FAULT=${2:-lr_spike@4}
STEPS=${3:-12}
OUT=${4:-trl-recipe}
PYTHON=${PYTHON:-python3}
EXPORT_FLAGS=${EXPORT_FLAGS:-}  # more `moescope export` flags, e.g. "--method reap"
LAUNCH=${LAUNCH:-$PYTHON}

# shellcheck disable=SC2086  # EXPORT_FLAGS is a list of flags
moescope export "$MODEL" --keep 1/4 --out "$OUT/proxy" --overwrite $EXPORT_FLAGS
for run in original proxy; do
    model=$MODEL
    [ "$run" = proxy ] && model=$OUT/proxy
    # 4 prompts x 8 generations per step and process, the same TRL config and seed for both
    # shellcheck disable=SC2086  # LAUNCH is a command with its flags
    $LAUNCH -m moescope.integrations.trl_tasks "$model" --trace "$OUT/$run.jsonl" \
        --steps "$STEPS" --fault "$FAULT" --batch 32
done
moescope diagnose "$OUT/original.jsonl" --against "$OUT/proxy.jsonl"
