"""Training, measuring and writing an embedded model: what every ``build`` module shares.

An embedded model (:mod:`moescope.models.embedded`) is trained from scratch on the task suite
for a fixed number of steps — not a time budget, since addition is learned in a sharp phase
transition and a busy machine would otherwise give another model — then measured as a user would
load it and written as a standard Hugging Face checkpoint plus its card: the recipe, per-task
accuracy (greedy, sampled, mixed), per-layer expert load, wall time and library versions. With
the same torch build and thread count the weights are bit-identical from run to run.

A build module supplies only what differs: its recipe (a :class:`Recipe` subclass with the
architecture fields), how to make the model, and its training objective
(:func:`train` with a step loss and an optional after-step update).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import transformers
from transformers import GenerationConfig

from moescope._util.io import check_output_dir, replace_dir
from moescope.errors import MoescopeError
from moescope.models import tasks as task_suite
from moescope.models.embedded import CARD_NAME
from moescope.models.evaluation import TaskAccuracy, evaluate_tasks
from moescope.models.toy.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer
from moescope.models.view import adapt

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Batch = dict[str, torch.Tensor]
StepLoss = Callable[["PreTrainedModel", Batch], tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""``(model, batch) → (loss to minimise, named parts logged per step)``."""


@dataclass(frozen=True)
class Recipe:
    """Data, optimisation and measurement settings shared by every embedded model's recipe.

    A build subclasses it with its architecture fields; the whole recipe goes into the card.
    """

    seed: int = 0
    tasks: tuple[str, ...] = task_suite.TASK_FAMILIES
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


# --- data and schedule ---------------------------------------------------------------------------


def encode(tok: Any, batch: list[task_suite.Example]) -> Batch:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` of task examples.

    Right padding, so positions start at 0 as in unpadded generation; the labels cover the
    answer and ``<eos>`` only (the rest is -100), since the prompt is given.
    """
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


def batches(tok: Any, r: Recipe) -> Iterator[Batch]:
    """The endless training stream: each batch mixes the recipe's task families."""
    stream = task_suite.mixed_examples(r.tasks, seed=r.seed)
    while True:
        yield encode(tok, [next(stream) for _ in range(r.batch_size)])


def lr_lambda(r: Recipe) -> Callable[[int], float]:
    """Linear warmup, then cosine decay to ``lr * min_lr_ratio`` at the last step."""

    def factor(step: int) -> float:
        if step < r.warmup_steps:
            return (step + 1) / r.warmup_steps
        progress = (step - r.warmup_steps) / max(1, r.steps - r.warmup_steps)
        return r.min_lr_ratio + (1 - r.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def answer_ce(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Cross-entropy on the answer tokens: position ``i`` of ``logits`` predicts token ``i + 1``."""
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten())


# --- training ------------------------------------------------------------------------------------


def train(
    model: PreTrainedModel,
    tok: Any,
    r: Recipe,
    step_loss: StepLoss,
    on_step: Callable[[int, dict], None] | None = None,
    after_step: Callable[[], None] | None = None,
) -> list[dict[str, float]]:
    """Train in place for ``r.steps`` AdamW steps; returns the logged parts of each step's loss.

    ``after_step()`` runs after each optimiser step (e.g. a routing-bias update);
    ``on_step(step, parts)`` after that (progress reports, trajectories).
    """
    opt = torch.optim.AdamW(model.parameters(), lr=r.lr, betas=r.betas, weight_decay=r.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(r))
    model.train()
    history = []
    for step, batch in zip(range(r.steps), batches(tok, r), strict=False):
        loss, parts = step_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r.grad_clip)
        opt.step()
        sched.step()
        if after_step is not None:
            after_step()
        history.append({name: value.item() for name, value in parts.items()})
        if on_step is not None:
            on_step(step, history[-1])
    return history


class RoutingCounter:
    """Per MoE layer, how often each expert is among a token's chosen top-k, counted by forward
    hooks on the routers while the ``with`` block lasts.

    The index counted is the router's own choice (for DeepSeek-V3, after the correction bias
    and the group limit), so it is the load that balancing acts on. Set :attr:`mask` to the
    batch's attention mask to leave padding out.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.layers = adapt(model).layers
        self.counts = torch.zeros(len(self.layers), self.layers[0].num_experts, dtype=torch.float64)
        self.mask: torch.Tensor | None = None  # (batch, seq) of the batch in flight
        self._handles: list[Any] = []

    @property
    def layer_indices(self) -> list[int]:
        """Decoder positions of the counted layers (dense layers have no router)."""
        return [layer.index for layer in self.layers]

    def _hook(self, row: int) -> Callable[..., None]:
        layer = self.layers[row]

        def count(_module: Any, _args: Any, out: Any) -> None:
            index = layer.router_choice(out)[1]  # (tokens, k)
            if self.mask is not None:
                index = index[self.mask.reshape(-1).bool()]
            self.counts[row] += torch.bincount(index.reshape(-1), minlength=self.counts.shape[1]).double()

        return count

    def reset(self) -> None:
        self.counts.zero_()

    def __enter__(self) -> RoutingCounter:
        self._handles = [
            layer.router.register_forward_hook(self._hook(i)) for i, layer in enumerate(self.layers)
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


# --- measurement ---------------------------------------------------------------------------------


def expert_load(
    model: PreTrainedModel, tok: Any, r: Recipe, n: int = 200
) -> tuple[list[int], list[list[float]]]:
    """Share of top-k routing slots per expert, per MoE layer, over the held-out full sequences.

    Counts every non-pad token (prompt and answer) of ``n`` held-out examples per task.

    Returns
    -------
    layers : decoder positions of the MoE layers.
    share : list of list of float, shape (MoE layers, experts); each row sums to 1.
    """
    model.eval()
    with torch.no_grad(), RoutingCounter(model) as counter:
        for t in r.tasks:
            batch = encode(tok, task_suite.heldout(t, n))
            counter.mask = batch["attention_mask"]
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    counts = counter.counts
    return counter.layer_indices, (counts / counts.sum(dim=1, keepdim=True)).tolist()


def load_summary(layers: list[int], load: list[list[float]]) -> list[dict[str, float]]:
    """Per MoE layer: min and max expert share and the count of experts under 1 % of slots."""
    return [
        {"layer": i, "min_share": min(s), "max_share": max(s), "experts_under_1pct": sum(x < 0.01 for x in s)}
        for i, s in zip(layers, load, strict=True)
    ]


def eval_settings(recipe: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of :func:`evaluate_tasks` that reproduce a card's accuracy figures.

    Takes the recipe as a dict, as found in ``card["recipe"]``.
    """
    keys = ("n", "samples", "temperature", "seed", "batch_size")
    return {k: recipe[f"eval_{k}"] for k in keys}


def measure(path: Path, r: Recipe) -> tuple[TaskAccuracy, tuple[list[int], list[list[float]]]]:
    """Accuracy and expert load of the checkpoint at ``path``, as a user would load it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    acc = evaluate_tasks(model, tok, r.tasks, **eval_settings(r.to_dict()))
    return acc, expert_load(model, tok, r, n=r.eval_n)


# --- writing -------------------------------------------------------------------------------------


def save_checkpoint(model: PreTrainedModel, tok: Any, out: Path) -> None:
    """``save_pretrained`` of model and tokenizer, with the task suite's generation settings."""
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


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def versions() -> dict[str, str]:
    import tokenizers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def _card(model: PreTrainedModel, r: Recipe, history: list[dict], measured: tuple, times: dict) -> dict:
    acc, (layers, load) = measured
    last = history[-100:]
    return {
        "recipe": r.to_dict(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "accuracy": acc.to_dict(),
        "expert_load": {"layers": layers, "summary": load_summary(layers, load), "share": load},
        "final_loss": {k: sum(h[k] for h in last) / len(last) for k in history[-1]},
        "wall_time_s": times,
    }


Fit = Callable[["PreTrainedModel", Any, Any, Callable[[int, dict], None]], list[dict[str, float]]]
"""``(model, tokenizer, recipe, on_step) → history``: a build's training run (see :func:`train`)."""


def build_embedded(
    out: str | Path,
    r: Recipe,
    make_model: Callable[[Any], PreTrainedModel],
    fit: Fit,
    *,
    overwrite: bool = False,
    log: Callable[[str], Any] = print,
) -> Path:
    """``make_model(r)``, train it with ``fit``, measure it and write it plus its card to ``out`` atomically.

    Runs on ``r.threads`` threads (part of what makes the weights bit-identical) and restores the
    caller's thread count afterwards.
    """
    check_output_dir(out, overwrite=overwrite)
    threads = torch.get_num_threads()
    torch.set_num_threads(r.threads)
    try:
        return _build(out, r, make_model, fit, overwrite=overwrite, log=log)
    finally:
        torch.set_num_threads(threads)


def _build(
    out: str | Path,
    r: Recipe,
    make_model: Callable[[Any], PreTrainedModel],
    fit: Fit,
    *,
    overwrite: bool,
    log: Callable[[str], Any],
) -> Path:
    t0 = time.perf_counter()
    torch.manual_seed(r.seed)
    tok = build_tokenizer()
    model = make_model(r)

    def progress(step: int, parts: dict) -> None:
        if (step + 1) % 100 == 0:
            losses = "  ".join(f"{k} {v:.3f}" for k, v in parts.items())
            log(f"step {step + 1}/{r.steps}  {losses}  {time.perf_counter() - t0:.0f} s")

    history = fit(model, tok, r, progress)
    train_s = time.perf_counter() - t0

    def fill(tmp: Path) -> None:
        save_checkpoint(model, tok, tmp)
        measured = measure(tmp, r)
        times = {"train": round(train_s, 1), "total": round(time.perf_counter() - t0, 1)}
        card = _card(model, r, history, measured, times)
        card.update(model_sha256=sha256(tmp / "model.safetensors"), versions=versions())
        (tmp / CARD_NAME).write_text(json.dumps(card, indent=2) + "\n")
        log(measured[0].to_frame().to_string(index=False))

    return replace_dir(Path(out), fill, overwrite=overwrite)


def build_main(argv: list[str] | None, prog: str, doc: str, build: Callable[..., Path]) -> int:
    """The ``python -m …build --out DIR [--overwrite]`` command of a build module."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
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
