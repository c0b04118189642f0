"""One decoder layer's activations: the estimate chunks were sized by, against what it allocates.

A layer-sequential pass runs each decoder layer on chunks of rows sized by one row's
activations (``moescope.models.row_chunks``): the larger of
:func:`~moescope.models.footprint.layer_activation_bytes` and the first row measured by
:func:`~moescope.models.peak_memory.peak_allocation`. For each model, this runs every decoder
layer (no gradients, float32, on the CPU) on ``rows`` rows of ``width`` random ids and prints
the largest layer's measured peak, the estimate, and their ratio (below 1: the estimate alone
would size chunks past their memory). Models: the embedded toys, tiny configs of the zoo, and
one layer of real shapes (Qwen3-30B-A3B; the 4 GB bench checkpoint's qwen3_moe layer).

    .venv/bin/python bench/activation_memory.py [--archs mixtral,jamba] [--real]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

ZOO = ("mixtral", "qwen3_moe", "deepseek_v3", "olmoe", "dbrx", "llama4_text", "jamba", "qwen3_next")
REAL = {  # one decoder layer of a published shape (moe_configs.json), a small vocabulary
    "Qwen3-30B-A3B layer": {
        "hidden_size": 2048,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 6144,
        "norm_topk_prob": True,
    },
}


def layer_peak(model: torch.nn.Module, rows: int, width: int) -> int:
    """The most bytes any decoder layer's forward allocated on ``rows`` rows of ``width`` ids."""
    from moescope.models.peak_memory import peak_allocation
    from moescope.models.view import decoder_layers

    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(3, vocab, (rows, width), generator=torch.Generator().manual_seed(0))
    worst = 0
    for layer in decoder_layers(model):
        inputs: dict[str, tuple] = {}
        hook = layer.register_forward_pre_hook(
            lambda _, args, kwargs, inputs=inputs: inputs.update(args=(args, kwargs)), with_kwargs=True
        )
        with torch.no_grad():
            model(input_ids=ids)
        hook.remove()
        args, kwargs = inputs["args"]
        with torch.no_grad(), peak_allocation(torch.device("cpu")) as peak:
            layer(*args, **kwargs)
        worst = max(worst, peak.bytes or 0)
    return worst


def models(archs: list[str], real: bool) -> dict[str, torch.nn.Module]:
    from transformers import AutoConfig, AutoModelForCausalLM

    from moescope.models.loading import load_model
    from moescope.models.zoo import tiny

    built = {name: load_model(name, with_tokenizer=False)[0] for name in ("toy", "toy-v3")}
    built.update({f"tiny {arch}": tiny(arch) for arch in archs})
    if real:
        from export import shape_for

        shapes = {**REAL, "4 GB bench checkpoint layer": shape_for(4.0)}
        for name, shape in shapes.items():
            config = AutoConfig.for_model(
                "qwen3_moe", **{**shape, "num_hidden_layers": 1, "vocab_size": 1000}
            )
            built[name] = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return built


def main() -> None:
    from diagnose_read import cpu_model

    from moescope.models.footprint import layer_activation_bytes
    from moescope.models.peak_memory import measurable

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default=",".join(ZOO), help="tiny zoo architectures, comma-separated")
    parser.add_argument("--real", action="store_true", help="also one layer of real shapes (2.5 GB)")
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--width", type=int, default=32)
    args = parser.parse_args()
    if not measurable(torch.device("cpu")):
        sys.exit("this C library has no mallinfo2 (glibc 2.33+): the CPU's allocations cannot be measured")
    torch.set_num_threads(1)
    print(f"CPU: {cpu_model()}; {args.rows} row(s) of {args.width} ids (real shapes: {4 * args.width})")
    print(f"{'model':30s} {'measured':>12s} {'estimate':>12s} {'estimate/measured':>18s}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, model in models([a for a in args.archs.split(",") if a], args.real).items():
            model.eval().requires_grad_(False)
            width = args.width if "layer" not in name else 4 * args.width
            measured = layer_peak(model, args.rows, width)
            estimate = layer_activation_bytes(model.config, rows=args.rows, seq_len=width)
            print(f"{name:30s} {measured:12,d} {estimate:12,d} {estimate / measured:18.2f}", flush=True)


if __name__ == "__main__":
    main()
