#!/usr/bin/env bash
# The export's GPU paths on a machine that has a GPU, in one run of under ten minutes.
#
# What it exercises (issue 43: "the GPU paths are written, typed and exercised where a device
# exists"): the default device and dtype rule on a real GPU (cuda, bfloat16 from compute
# capability 8), the device tests, and `moescope export` left to its defaults there, in memory
# and layer-sequential under a --max-memory that forces it (bench/export_beyond_memory.py:
# method, kept experts, capability, reads, peak RSS and wall time side by side), on toy-v3 and
# then on a 1 GB synthetic bf16 checkpoint. toy-v3's budget is 1.2 times its weights (9.4 MB:
# still layer-sequential, as the original and a proxy take 9.8 MB), where 4 MB runs every layer
# a row at a time (on the CPU 2.5 times the in-memory export's wall time, at 9 MB 1.9 times), so
# that the step ends within its limit and prints its table. Each step is bounded by its own
# timeout, so a slow one still leaves the others' figures; the log is also in $OUT/device_check.log.
#
# The machine needs torch, transformers, accelerate, safetensors, scikit-learn, pandas, pyarrow
# and tqdm (a stock CUDA image holds them) and two small wheels it may lack, carried in .whl/:
#
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl kmedoids wcwidth
#
# then, e.g. through the device tool: command "bash bench/device_check.sh", carry [".whl"].
# Without a GPU it runs the same steps on the CPU (a check of the script itself); FLAGS adds
# export flags to every export (FLAGS="--min-capability 0 --n-tokens 2000" for a quick one).
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
PY=${PYTHON:-python3}
LOG_DIR=${OUT:-$(mktemp -d)}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$WORK/site" .whl/*.whl || exit 1
    export PYTHONPATH="$WORK/site"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

step() {  # step SECONDS COMMAND...: the command under a timeout, its end said when not a success
    local limit=$1 code
    shift
    timeout "$limit" "$@"
    code=$?
    if [ "$code" -eq 124 ]; then echo "(stopped at its limit of $limit s)"; elif [ "$code" -ne 0 ]; then echo "(exit $code)"; fi
}

{
    echo "## machine"
    "$PY" - <<'EOF'
import importlib.util
import torch
import transformers
from moescope.models.device import choose_compute

print(f"torch {torch.__version__}, transformers {transformers.__version__}")
for i in range(torch.cuda.device_count()):
    free, total = torch.cuda.mem_get_info(i)
    print(f"cuda:{i} {torch.cuda.get_device_name(i)}, compute capability "
          f"{'.'.join(map(str, torch.cuda.get_device_capability(i)))}, {free / 2**30:.1f} of {total / 2**30:.1f} GiB free")
compute = choose_compute()
print(f"default compute: {compute.device} {compute.dtype} ({compute.why})")
needed = ("accelerate", "safetensors", "sklearn", "kmedoids", "pandas", "pyarrow", "tqdm", "tabulate", "wcwidth")
missing = [name for name in needed if importlib.util.find_spec(name) is None]
print("missing packages:", ", ".join(missing) if missing else "none")
EOF
    echo "## device tests"
    step 60 "$PY" -m pytest -q -p no:cacheprovider tests/test_export_device.py
    echo "## toy-v3 at 1/4: in memory and layer-sequential, defaults"
    step 360 "$PY" bench/export_beyond_memory.py --models toy-v3 --keep 1/4 --budget 1.2 --flags "${FLAGS:-}" --dir "$WORK"
    echo "## a 1 GB synthetic bf16 checkpoint at 1/4"
    step 120 "$PY" bench/export_beyond_memory.py --models bench --gb 1 --keep 1/4 --flags "${FLAGS:-}" --dir "$WORK"
} 2>&1 | tee "$LOG_DIR/device_check.log"
