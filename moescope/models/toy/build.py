"""Regenerate the embedded toy model: ``python -m moescope.models.toy.build --out DIR``.

Trains a stock ``Qwen3MoeForCausalLM`` from scratch on the task suite with a fixed number of
steps (not a time budget, so a busy machine gives the same model), then measures it and writes
a standard Hugging Face checkpoint plus ``toy_card.json``: the recipe, per-task accuracy
(greedy, sampled, mixed), per-layer expert load, wall time and library versions. With the same
torch build and thread count the weights are bit-identical from run to run.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from moescope._util.io import check_output_dir, replace_dir
from moescope.errors import MoescopeError
from moescope.models import tasks as task_suite
from moescope.models.evaluation import TaskAccuracy, evaluate_tasks
from moescope.models.toy import CARD_NAME
from moescope.models.toy.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, build_tokenizer


@dataclass(frozen=True)
class ToyRecipe:
    """Every hyperparameter of the toy model; saved in ``toy_card.json``."""

    seed: int = 0
    tasks: tuple[str, ...] = task_suite.TASK_FAMILIES
    # model: 32 experts, top-2, so that keeping 1/8 of the experts still leaves more than top-k
    num_layers: int = 4
    hidden_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    num_experts: int = 32
    top_k: int = 2
    moe_intermediate_size: int = 32  # narrow experts keep the fp32 checkpoint under 10 MB
    max_position_embeddings: int = 64  # longest example is 31 tokens
    # router load balancing, applied per layer (the stock loss pools all layers' counts, which
    # cannot see an expert that is dead in one layer and busy in another)
    router_aux_loss_coef: float = 0.05
    # optimisation
    # Addition learns in a sharp phase transition (add2 near 1700 steps, add3 near 1900);
    # 2400 steps leaves add2 just below 90 % and add3 near 45 % when sampled at T=1.
    steps: int = 2400
    batch_size: int = 64
    lr: float = 2e-3
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at the last step
    threads: int = 2  # CPU reductions depend on the thread count; fixing it keeps runs bit-identical
    # measurement written to the card
    eval_n: int = 200
    eval_samples: int = 4
    eval_temperature: float = 1.0
    eval_seed: int = 0
    eval_batch_size: int = 256  # sampled figures depend on batch composition; 256 is ~3x faster than 64

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_config(r: ToyRecipe) -> Qwen3MoeConfig:
    """The stock Qwen3-MoE config of the toy: every layer sparse, normalised top-k weights."""
    return Qwen3MoeConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=r.hidden_size,
        intermediate_size=4 * r.hidden_size,  # unused: no dense MLP layers
        moe_intermediate_size=r.moe_intermediate_size,
        num_hidden_layers=r.num_layers,
        num_attention_heads=r.num_heads,
        num_key_value_heads=r.num_kv_heads,
        head_dim=r.head_dim,
        num_experts=r.num_experts,
        num_experts_per_tok=r.top_k,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        router_aux_loss_coef=r.router_aux_loss_coef,
        max_position_embeddings=r.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
    )


def _encode(tok: Any, batch: list[task_suite.Example]) -> dict[str, torch.Tensor]:
    # Right padding, so positions start at 0 as in unpadded generation; the loss covers the
    # answer and <eos> only, since the prompt is given.
    rows, labels = [], []
    for ex in batch:
        prompt = tok(ex.prompt).input_ids  # <bos> + characters
        answer = [*tok(ex.answer, add_special_tokens=False).input_ids, EOS_ID]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), PAD_ID)
    lab = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, lb) in enumerate(zip(rows, labels, strict=True)):
        ids[i, : len(row)], lab[i, : len(lb)], mask[i, : len(row)] = torch.tensor(row), torch.tensor(lb), 1
    return {"input_ids": ids, "attention_mask": mask, "labels": lab}


def _batches(tok: Any, r: ToyRecipe) -> Iterator[dict[str, torch.Tensor]]:
    stream = task_suite.mixed_examples(r.tasks, seed=r.seed)
    while True:
        yield _encode(tok, [next(stream) for _ in range(r.batch_size)])


def _lr_lambda(r: ToyRecipe) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < r.warmup_steps:
            return (step + 1) / r.warmup_steps
        progress = (step - r.warmup_steps) / max(1, r.steps - r.warmup_steps)
        return r.min_lr_ratio + (1 - r.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def per_layer_aux_loss(
    router_logits: tuple[torch.Tensor, ...], mask: torch.Tensor, r: ToyRecipe
) -> torch.Tensor:
    """Mean over layers of the stock Switch load-balancing loss computed on each layer alone."""
    losses = [load_balancing_loss_func((lg,), r.num_experts, r.top_k, mask) for lg in router_logits]
    return torch.stack(losses).mean()


def _loss(
    model: Qwen3MoeForCausalLM, batch: dict[str, torch.Tensor], r: ToyRecipe
) -> tuple[torch.Tensor, ...]:
    """Cross-entropy on answer tokens and the per-layer load-balancing loss, from one forward."""
    mask = batch["attention_mask"]
    out = model(input_ids=batch["input_ids"], attention_mask=mask, output_router_logits=True)
    logits = out.logits[:, :-1]  # (b, t-1, vocab): position i predicts token i + 1
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"][:, 1:].flatten())
    aux = per_layer_aux_loss(out.router_logits, mask, r)
    return ce, aux


def train(
    model: Qwen3MoeForCausalLM, tok: Any, r: ToyRecipe, on_step: Callable[[int, dict], None] | None = None
) -> list[dict[str, float]]:
    """Train in place for ``r.steps`` AdamW steps; returns the per-step losses.

    ``on_step(step, losses)`` is called after each step (progress reports, trajectories).
    """
    opt = torch.optim.AdamW(model.parameters(), lr=r.lr, betas=r.betas, weight_decay=r.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(r))
    model.train()
    history = []
    for step, batch in zip(range(r.steps), _batches(tok, r), strict=False):
        ce, aux = _loss(model, batch, r)
        opt.zero_grad(set_to_none=True)
        (ce + r.router_aux_loss_coef * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r.grad_clip)
        opt.step()
        sched.step()
        history.append({"ce": ce.item(), "aux": aux.item()})
        if on_step is not None:
            on_step(step, history[-1])
    return history


def expert_load(model: Qwen3MoeForCausalLM, tok: Any, r: ToyRecipe, n: int = 200) -> list[list[float]]:
    """Share of top-k routing slots per expert, per layer, over the held-out full sequences.

    Counts every non-pad token (prompt and answer) of ``n`` held-out examples per task.

    Returns
    -------
    list of list of float, shape (layers, experts); each row sums to 1.
    """
    counts = torch.zeros(r.num_layers, r.num_experts, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for t in r.tasks:
            batch = _encode(tok, task_suite.heldout(t, n))
            out = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                output_router_logits=True,
            )
            keep = batch["attention_mask"].reshape(-1).bool()
            for layer, logits in enumerate(out.router_logits):
                chosen = logits[keep].topk(r.top_k, dim=-1).indices.reshape(-1)
                counts[layer] += torch.bincount(chosen, minlength=r.num_experts).double()
    return (counts / counts.sum(dim=1, keepdim=True)).tolist()


def load_summary(load: list[list[float]]) -> list[dict[str, float]]:
    """Per-layer min and max expert share and the count of experts under 1 % of slots."""
    return [
        {"layer": i, "min_share": min(s), "max_share": max(s), "experts_under_1pct": sum(x < 0.01 for x in s)}
        for i, s in enumerate(load)
    ]


def _save(model: Qwen3MoeForCausalLM, tok: Any, out: Path) -> None:
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        max_new_tokens=max(map(task_suite.max_answer_chars, task_suite.TASK_FAMILIES)) + 1,
    )
    model.save_pretrained(out)
    tok.save_pretrained(out)
    for f in out.iterdir():
        f.chmod(0o644)  # safetensors writes owner-only files; these ship in the package


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def eval_settings(recipe: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of :func:`evaluate_tasks` that reproduce a card's accuracy figures.

    Takes the recipe as a dict, as found in ``toy_card()["recipe"]``.
    """
    keys = ("n", "samples", "temperature", "seed", "batch_size")
    return {k: recipe[f"eval_{k}"] for k in keys}


def measure(path: Path, r: ToyRecipe) -> tuple[TaskAccuracy, list[list[float]]]:
    """Accuracy and expert load of the checkpoint at ``path``, as a user would load it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    acc = evaluate_tasks(model, tok, r.tasks, **eval_settings(r.to_dict()))
    return acc, expert_load(model, tok, r, n=r.eval_n)


def _versions() -> dict[str, str]:
    import tokenizers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def build(
    out: str | Path, r: ToyRecipe | None = None, *, overwrite: bool = False, log: Callable[[str], Any] = print
) -> Path:
    """Train the toy model under recipe ``r``, measure it and write it to ``out`` atomically."""
    r = r or ToyRecipe()
    check_output_dir(out, overwrite=overwrite)
    t0 = time.perf_counter()
    torch.set_num_threads(r.threads)
    torch.manual_seed(r.seed)
    tok = build_tokenizer()
    model = Qwen3MoeForCausalLM(model_config(r))

    def progress(step: int, losses: dict) -> None:
        if (step + 1) % 100 == 0:
            log(
                f"step {step + 1}/{r.steps}  ce {losses['ce']:.3f}  aux {losses['aux']:.3f}  "
                f"{time.perf_counter() - t0:.0f} s"
            )

    history = train(model, tok, r, progress)
    train_s = time.perf_counter() - t0

    def fill(tmp: Path) -> None:
        _save(model, tok, tmp)
        acc, load = measure(tmp, r)
        last = history[-100:]
        card = {
            "recipe": r.to_dict(),
            "parameters": sum(p.numel() for p in model.parameters()),
            "accuracy": acc.to_dict(),
            "expert_load": {"summary": load_summary(load), "share": load},
            "final_loss": {k: sum(h[k] for h in last) / len(last) for k in ("ce", "aux")},
            "wall_time_s": {"train": round(train_s, 1), "total": round(time.perf_counter() - t0, 1)},
            "model_sha256": _sha256(tmp / "model.safetensors"),
            "versions": _versions(),
        }
        (tmp / CARD_NAME).write_text(json.dumps(card, indent=2) + "\n")
        log(acc.to_frame().to_string(index=False))

    return replace_dir(Path(out), fill, overwrite=overwrite)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moescope.models.toy.build", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", required=True, type=Path, help="checkpoint directory to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing directory")
    args = parser.parse_args(argv)
    try:
        path = build(args.out, overwrite=args.overwrite, log=lambda m: print(m, file=sys.stderr, flush=True))
    except MoescopeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
