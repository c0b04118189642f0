#!/usr/bin/env bash
# The TRL recipe (examples/trl_recipe.sh) with every GRPO run sharded by FSDP2 over N processes.
#
#   examples/trl_fsdp2.sh [MODEL] [FAULT] [STEPS] [OUT] [PROCESSES]    (PROCESSES default: 2)
#
# accelerate launches each run with examples/accelerate_fsdp2.yaml: one process per GPU over NCCL,
# or CPU processes over gloo where no GPU is seen. Only the main process writes each trace; the
# MoE statistics are summed over the processes and the gradient norms read from the shards.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PROCESSES=${5:-2}
ACCELERATE=${ACCELERATE:-accelerate}
PORT=${PORT:-29500}  # the main process's port; pick another when a run already holds it
export LAUNCH="$ACCELERATE launch --config_file $HERE/accelerate_fsdp2.yaml --num_processes $PROCESSES --main_process_port $PORT"
exec "$HERE/trl_recipe.sh" "${@:1:4}"
