#!/usr/bin/env bash
# Replay a TRL GRPO recipe on a model and on its 1/4 proxy, with the same fault; then the verdict.
#
#   examples/trl_recipe.sh [MODEL] [FAULT] [STEPS] [OUT]      (defaults: toy lr_spike@4 12 trl-recipe)
#
# MODEL is an embedded model's name or a local checkpoint directory. Each run writes a moescope
# trace (TRL's metrics and moescope's MoE instruments); `moescope diagnose A --against B` says
# whether the proxy reproduces what the original did. Needs the trl extra: pip install 'moescope[trl]'.
set -euo pipefail
MODEL=${1:-toy}
FAULT=${2:-lr_spike@4}
STEPS=${3:-12}
OUT=${4:-trl-recipe}
PYTHON=${PYTHON:-python3}
EXPORT_FLAGS=${EXPORT_FLAGS:-}  # more `moescope export` flags, e.g. "--method reap"

# shellcheck disable=SC2086  # EXPORT_FLAGS is a list of flags
moescope export "$MODEL" --keep 1/4 --out "$OUT/proxy" --overwrite $EXPORT_FLAGS
for run in original proxy; do
    model=$MODEL
    [ "$run" = proxy ] && model=$OUT/proxy
    # 4 prompts x 8 generations per step, the same TRL config and seed for both
    "$PYTHON" -m moescope.integrations.trl_tasks "$model" --trace "$OUT/$run.jsonl" \
        --steps "$STEPS" --fault "$FAULT" --batch 32
done
moescope diagnose "$OUT/original.jsonl" --against "$OUT/proxy.jsonl"
