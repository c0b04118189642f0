"""Optional healing: a short distillation of a proxy toward its original.

:func:`heal` minimises the next-token ``KL(original ‖ proxy)`` on calibration data, training
only what expert pruning cut: the router rows (and router bias) and the kept experts. Every
other tensor (attention, norms, embeddings, LM head, shared experts, dense layers, buffers
such as a correction bias) is frozen and verified bit-identical afterwards, so the backbone
check of the validity checklist still passes and the healed proxy saves and loads like any
proxy.

The routing semantics of :mod:`moescope.export.surgery` hold: the config, the routing rule and the set
of experts are unchanged, and the models run in eval mode during training, so routing is the
deterministic inference routing (PhiMoE samples routes in train mode; dropout is off). The
selection-only correction bias of DeepSeek-V3-style routers gets no gradient (top-k is not
differentiable) and stays as exported. Training runs in the proxy's own dtype.

The default data, ``"tasks"``, is the task suite's training stream (seeded), scored on answer
and end-of-sequence tokens; the KL before and after is measured on the held-out pool, which
healing never sees.

Example
-------
>>> from moescope.models.toy import load_toy
>>> from moescope.explore.clustering import select_experts
>>> from moescope.export.surgery import build_proxy
>>> model, tok = load_toy()
>>> proxy = build_proxy(model, select_experts(model, "1/4", method="random"))
>>> report = heal(model, proxy, tokenizer=tok, steps=2, batch_size=4, heldout_tokens=256, tasks=())
>>> report.kl_after < report.kl_before
True
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from moescope._util.io import readable, replace_dir
from moescope.errors import MoescopeError
from moescope.explore.calibration import TASKS, calibration_batches, describe_source, pad_scored
from moescope.explore.rl_data import RLCalibration, rl_pairs
from moescope.export.fidelity.agreement import (
    Batch,
    heldout_batches,
    next_token_agreement,
    task_batches,
)
from moescope.export.fidelity.measure import measure_fidelity
from moescope.export.fidelity.records import HealingReport, manifest_sections
from moescope.export.fidelity.validity import model_tensors, tensor_bytes, validity_checklist
from moescope.export.manifest import copy_side_files, read_manifest, write_manifest
from moescope.export.surgery import expert_state_keys
from moescope.export.teacher import TeacherCache, distillation_loss
from moescope.models.accuracy import TaskSpec, model_accuracy, resolve_tasks
from moescope.models.loading import load_model
from moescope.models.multimodal import is_multimodal, save_with_language_model
from moescope.models.sharding import local
from moescope.models.tasks import mixed_examples
from moescope.models.view import MoEModel, adapt
from moescope.provenance import config_hash

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["HealingReport", "heal", "heal_proxy_dir", "healing_batches"]

BATCH_SIZE, SEQ_LEN = 32, 128
"""Rows per healing step and the longest row, unless told otherwise."""


# --- what trains, and proof that nothing else did --------------------------------------------------


def trainable_tensors(moe: MoEModel) -> dict[str, torch.nn.Parameter]:
    """State-dict name → parameter of every per-expert tensor that can learn: the router rows,
    a router bias and the kept experts' weights (a correction bias is a buffer: not here)."""
    params = dict(moe.model.named_parameters())
    return {name: params[name] for name in expert_state_keys(moe) if name in params}


def frozen_digests(model: torch.nn.Module, skip: set[str]) -> dict[str, str]:
    """SHA-256 of every tensor not in ``skip``: memory stays flat however large the backbone.
    A sharded model's tensors are digested as this process's shards (no gathering)."""
    tensors = model_tensors(model)
    return {
        name: hashlib.sha256(tensor_bytes(local(t))).hexdigest()
        for name, t in tensors.items()
        if name not in skip
    }


def verify_frozen(before: dict[str, str], model: torch.nn.Module, skip: set[str]) -> int:
    """How many tensors outside ``skip`` still hash as ``before`` (raises if one does not)."""
    after = frozen_digests(model, skip)
    changed = sorted(name for name in before if after.get(name) != before[name])
    if changed or after.keys() != before.keys():
        raise RuntimeError(f"healing changed tensors it must not train: {changed}")
    return len(before)


# --- the run ---------------------------------------------------------------------------------------


def training_batches(
    data: Any,
    tokenizer: Any,
    *,
    batch_size: int,
    seq_len: int,
    seed: int,
    model: Any = None,
    round_steps: int | None = None,
) -> Iterator[Batch]:
    """Endless calibration batches: the seeded task training stream, or ``data`` again and again.

    RL data is scored on its sampled completions, as task data on its answers; given the
    ``model`` it was sampled from (the original), it goes on with fresh samples of the same
    prompt stream once its own rows are used, else its rows come round again. ``round_steps``:
    the batches drawn at once (a healing round), which a model read from disk samples no more
    rows ahead of (:func:`~moescope.explore.rl_data.rl_pairs`).
    """
    if isinstance(data, str) and data == TASKS:
        return task_batches(mixed_examples(seed=seed), tokenizer, n_tokens=2**62, batch_size=batch_size)
    if isinstance(data, RLCalibration):
        pad = getattr(tokenizer, "pad_token_id", None) or 0
        pairs: Iterator[Any] = itertools.cycle(data.pairs())
        if model is not None:
            pairs = rl_pairs(data, model, tokenizer, rows=round_steps * batch_size if round_steps else None)
        return (
            pad_scored([list(p) for p in itertools.islice(pairs, batch_size)], pad) for _ in itertools.count()
        )

    def passes() -> Iterator[Batch]:
        while True:
            yield from calibration_batches(
                data, tokenizer, n_tokens=2**62, batch_size=batch_size, seq_len=seq_len, seed=seed
            )

    return passes()


def healing_batches(
    data: Any,
    tokenizer: Any,
    *,
    steps: int,
    batch_size: int = BATCH_SIZE,
    seq_len: int = SEQ_LEN,
    seed: int = 0,
    model: Any = None,
) -> list[Batch]:
    """The first ``steps`` batches healing draws from ``data`` (``steps × batch_size`` rows): the
    batches of a :class:`~moescope.export.teacher.TeacherCache` for a budget of ``steps``.

    They are the batches :func:`training_batches` gives an in-memory run with the same
    arguments. RL data goes on sampling from ``model`` (the original) once its own rows are
    used, as the in-memory run does; without it, a budget the rows do not cover is refused. A
    capability-targeted export needs its ``heal_budget`` batches (every attempt of
    ``keep="auto"`` starts again from the first).
    """
    check_steps(steps)
    if model is None and isinstance(data, RLCalibration) and steps * batch_size > len(data):
        raise MoescopeError(
            f"{steps} healing steps of {batch_size} rows need {steps * batch_size} RL rows and the "
            f"data holds {len(data)}; sample more (a larger n_tokens) or heal fewer steps."
        )
    shape = {"batch_size": batch_size, "seq_len": seq_len, "seed": seed}
    return list(itertools.islice(training_batches(data, tokenizer, model=model, **shape), steps))


def train_cosine(
    original: PreTrainedModel | TeacherCache,
    proxy: PreTrainedModel,
    params: dict[str, torch.nn.Parameter],
    batches: Iterator[Batch],
    *,
    steps: int,
    lr: float,
    part: tuple[int, int] | None = None,
) -> tuple[list[float], int]:
    """Adam on the KL with cosine decay to 0 and gradient clipping; (losses, tokens seen).

    ``part=(rank, world)``: a sharded proxy, each process training on its share of every batch
    (:func:`~moescope.export.teacher.distillation_loss`); the losses are then this process's
    shares (their sum over processes is the batch's loss)."""
    optimizer = torch.optim.Adam(params.values(), lr=lr)
    cosine = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    losses, tokens = [], 0
    for batch in itertools.islice(batches, steps):
        losses.append(distil_step(original, proxy, params, optimizer, batch, part))
        cosine.step()
        tokens += int(batch["attention_mask"].sum())
    return losses, tokens


def distil_step(
    original: PreTrainedModel | TeacherCache,
    proxy: PreTrainedModel,
    params: dict[str, torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    part: tuple[int, int] | None = None,
) -> float:
    """One update on the KL, gradients clipped to norm 1 (over every shard, when sharded); the loss."""
    loss = distillation_loss(original, proxy, batch, part)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
    optimizer.step()
    return float(loss.detach())


UNTRAINABLE = "_moescope_untrainable"
"""The attribute of a proxy too large to be trained whole: the error that says so, raised when
healing it is first needed (:func:`check_trainable`), not when it is cut: it may pass unhealed."""


def check_trainable(proxy: PreTrainedModel) -> None:
    """Raise the refusal ``proxy`` carries where it was cut too large to be trained whole."""
    refusal = getattr(proxy, UNTRAINABLE, None)
    if refusal is not None:
        raise refusal


class Distillation:
    """A healing run that pauses: :meth:`train` some steps, measure the proxy, train on.

    One Adam state at a constant ``lr`` throughout (no decay: how long it runs is not known at
    the start), on one stream of ``batches`` that goes on where it stopped; the rounds of a
    capability-targeted export (:mod:`moescope.export.targeting`) are one such run. What trains
    is what :func:`heal` trains; :meth:`verify` proves every other tensor bit-identical. The
    ``original`` may be its :class:`~moescope.export.teacher.TeacherCache` on the ``batches``.
    """

    def __init__(
        self,
        original: PreTrainedModel | TeacherCache,
        proxy: PreTrainedModel,
        batches: Iterator[Batch],
        *,
        lr: float,
    ) -> None:
        self.original, self.proxy, self.batches = original, proxy, batches
        self.params = trainable_tensors(adapt(proxy))
        self._frozen = frozen_digests(proxy, set(self.params))
        self._optimizer = torch.optim.Adam(self.params.values(), lr=lr)
        self.losses: list[float] = []

    def train(self, steps: int) -> list[float]:
        """``steps`` more updates; their losses."""
        check_steps(steps)
        with _training_only(self.original, self.proxy, self.params):
            for batch in itertools.islice(self.batches, steps):
                step = distil_step(self.original, self.proxy, self.params, self._optimizer, batch)
                self.losses.append(step)
        return self.losses[-steps:]

    def verify(self) -> int:
        """How many frozen tensors are bit-identical to the start (raises if one is not)."""
        return verify_frozen(self._frozen, self.proxy, set(self.params))


def heal(
    original: PreTrainedModel,
    proxy: PreTrainedModel,
    data: Any = TASKS,
    *,
    tokenizer: Any = None,
    steps: int = 50,
    lr: float = 1e-3,
    seed: int = 0,
    batch_size: int = BATCH_SIZE,
    seq_len: int = SEQ_LEN,
    heldout: Any = None,
    heldout_tokens: int = 4096,
    tasks: TaskSpec = None,
    n_prompts: int = 100,
    samples: int = 4,
    teacher: TeacherCache | None = None,
) -> HealingReport:
    """Distil ``proxy`` toward ``original`` in place; return what happened.

    Parameters
    ----------
    original, proxy : the source model and its proxy (loaded; the proxy is changed in place).
    data : ``"tasks"`` (the seeded task training stream), RL data (sampled on as needed), or
        calibration data (``.txt`` / ``.jsonl`` path or token ids), cycled as ``steps`` needs.
    tokenizer : the models' tokenizer; needed for text data and tasks.
    steps, lr, seed, batch_size, seq_len : the run; the same seed gives the same healed weights.
    heldout, heldout_tokens : data and token budget of the KL before and after; by default the
        task suite's held-out pool for ``"tasks"`` and RL data, else ``data`` itself (then not
        held out, which the report says).
    tasks, n_prompts, samples : the accuracy before and after, as in
        :func:`moescope.export.fidelity.measure.measure_fidelity` (``()`` for none).
    teacher : the original's :class:`~moescope.export.teacher.TeacherCache`, trained against in
        its place on the batches it was computed on (:func:`healing_batches` of these arguments
        are the in-memory run's; ``original`` is then run only for the KL and accuracy before
        and after).
    """
    check_steps(steps)
    if teacher is not None:
        teacher.check(config=original.config)  # a cache of another model fails before any work
    resolved = resolve_tasks(tasks, original)  # a malformed prompt file fails before any training
    accuracy_kw = {"n_prompts": n_prompts, "samples": samples, "seed": seed}
    check, check_text = _heldout_check(data, heldout, tokenizer, n_tokens=heldout_tokens, seed=seed)
    before, _ = next_token_agreement(original, proxy, check)
    accuracy = [_accuracy(m, tokenizer, resolved, accuracy_kw) for m in (original, proxy)]
    shape = {"batch_size": batch_size, "seq_len": seq_len, "seed": seed}
    if teacher is None:
        batches = training_batches(data, tokenizer, model=original, **shape)  # RL data goes on sampling
    elif steps > len(teacher.batches):
        raise MoescopeError(
            f"the teacher cache holds {len(teacher.batches)} batches and healing asks for {steps} "
            "steps; build it on as many batches as steps (healing_batches), or heal fewer steps."
        )
    else:
        batches = iter(teacher.batches)  # what the cache was computed on
    trainer = original if teacher is None else teacher
    trained, losses, tokens, verified = _distil(trainer, proxy, batches, steps=steps, lr=lr)
    after, _ = next_token_agreement(original, proxy, check)
    accuracy.append(_accuracy(proxy, tokenizer, resolved, accuracy_kw))
    return HealingReport(
        steps=steps,
        lr=lr,
        seed=seed,
        batch_size=batch_size,
        n_tokens=tokens,
        loss=tuple(losses),
        kl_before=before["kl"],
        kl_after=after["kl"],
        top1_before=before["top1_agreement"],
        top1_after=after["top1_agreement"],
        accuracy=_before_after(*accuracy),
        trained=trained,
        frozen_verified=verified,
        data=describe_source(data, seed),
        heldout=check_text,
    )


def check_steps(steps: Any) -> None:
    """Refuse a step count that is not a positive whole number, before any slow work."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise MoescopeError(f"steps must be a positive whole number, not {steps!r}; pass one such as 50.")


def _distil(
    original: PreTrainedModel | TeacherCache,
    proxy: PreTrainedModel,
    batches: Iterator[Batch],
    *,
    steps: int,
    lr: float,
) -> tuple[tuple[str, ...], list[float], int, int]:
    """Train the proxy's trainable tensors alone; (their names, losses, tokens seen, how many
    other tensors were verified bit-identical after)."""
    params = trainable_tensors(adapt(proxy))
    frozen = frozen_digests(proxy, set(params))
    with _training_only(original, proxy, params):
        losses, tokens = train_cosine(original, proxy, params, batches, steps=steps, lr=lr)
    return tuple(params), losses, tokens, verify_frozen(frozen, proxy, set(params))


def _heldout_check(
    data: Any, heldout: Any, tokenizer: Any, *, n_tokens: int, seed: int
) -> tuple[list[Batch], str]:
    """The batches healing is judged on (``heldout``, else ``data`` itself: the held-out task pool
    for RL data, whose prompts come from the task suite's training stream), and how to name them."""
    if heldout is None and isinstance(data, RLCalibration):
        heldout = TASKS
    check_data = data if heldout is None else heldout
    batches = heldout_batches(check_data, tokenizer, n_tokens=n_tokens, seed=seed)
    return batches, _describe_heldout(check_data, defaulted=heldout is None)


def _describe_heldout(data: Any, *, defaulted: bool) -> str:
    if isinstance(data, str) and data == TASKS:
        return "held-out task pool"
    return describe_source(data) + (" (the training data: not held out)" if defaulted else "")


def _accuracy(model: PreTrainedModel, tokenizer: Any, tasks: Any, kw: dict[str, Any]) -> pd.DataFrame | None:
    return None if tasks is None else model_accuracy(model, tokenizer, tasks, **kw)


def _before_after(
    original: pd.DataFrame | None, before: pd.DataFrame | None, after: pd.DataFrame | None
) -> pd.DataFrame | None:
    """``task, mode, n, original, before, after``: the proxy's accuracy around healing."""
    if original is None or before is None or after is None:
        return None
    frame = original[["task", "mode", "n", "accuracy"]].rename(columns={"accuracy": "original"})
    frame["before"] = before["accuracy"].to_numpy()
    frame["after"] = after["accuracy"].to_numpy()
    return frame


@contextmanager
def _training_only(
    original: PreTrainedModel | TeacherCache, proxy: PreTrainedModel, params: dict[str, torch.nn.Parameter]
) -> Iterator[None]:
    """Gradients for ``params`` only; both models in eval mode (inference routing, no dropout).
    Training flags and ``requires_grad`` are restored after. A teacher cache has no mode."""
    flags = {name: p.requires_grad for name, p in proxy.named_parameters()}
    original = original if isinstance(original, torch.nn.Module) else torch.nn.Module()
    modes = (original.training, proxy.training)
    try:
        proxy.requires_grad_(False).eval()
        original.eval()
        for p in params.values():
            p.requires_grad_(True)
        yield
    finally:
        for name, p in proxy.named_parameters():
            p.requires_grad_(flags[name])
        original.train(modes[0])
        proxy.train(modes[1])


# --- an exported proxy directory -------------------------------------------------------------------


def rewrite_proxy_dir(
    proxy_dir: Path,
    proxy: torch.nn.Module,
    manifest: dict[str, Any],
    state_dict: dict[str, torch.Tensor] | None = None,
) -> None:
    """Replace ``proxy_dir`` with ``proxy``'s weights (or ``state_dict``: a sharded proxy's,
    gathered), its side files and ``manifest``, atomically (a temporary sibling, then a rename)."""

    def fill(work: Path) -> None:
        if is_multimodal(proxy_dir):  # the loaded language model lacks the vision tower
            save_with_language_model(proxy_dir, proxy, work)
        else:
            proxy.save_pretrained(work, state_dict=state_dict)
        copy_side_files(proxy_dir, work)
        write_manifest(work, manifest)
        readable(work)

    replace_dir(proxy_dir, fill, overwrite=True)


def heal_proxy_dir(
    proxy_dir: str | Path,
    *,
    original: str | Path | None = None,
    data: Any = TASKS,
    steps: int = 50,
    measure: bool | dict[str, Any] = True,
    **options: Any,
) -> HealingReport:
    """Heal an exported proxy and rewrite its directory atomically (temporary sibling, rename).

    The original is the manifest's source unless given (it must have the recorded config hash).
    The weights are saved with ``save_pretrained`` in the stored dtype; the manifest gains the
    ``healing`` section, and its ``fidelity`` and ``checklist`` are measured again on the healed
    weights (``measure``: ``True``, or the options of
    :func:`~moescope.export.fidelity.measure.measure_fidelity`) or dropped, since they described the weights
    before. ``options`` go to :func:`heal` (``lr``, ``seed``, ``batch_size``, ``tasks``, ...).

    Example
    -------
    >>> report = heal_proxy_dir("proxy-dir", steps=50)  # doctest: +SKIP
    """
    proxy_dir = Path(proxy_dir)
    manifest = read_manifest(proxy_dir)
    if manifest is None:
        raise MoescopeError(f"{proxy_dir} holds no moescope.json, so it is no proxy; export one first.")
    source = original if original is not None else manifest["source"]["path"]
    lm, tokenizer = load_model(source, dtype="auto")  # type: ignore[arg-type]
    if config_hash(lm.config) != manifest["source"]["config_hash"]:
        raise MoescopeError(
            f"{source} is not the model this proxy was cut from (config hash {config_hash(lm.config)}, "
            f"recorded {manifest['source']['config_hash']}); pass original= the source checkpoint."
        )
    proxy, own = load_model(proxy_dir, dtype="auto")  # type: ignore[arg-type]
    tokenizer = tokenizer or own
    report = heal(lm, proxy, data, tokenizer=tokenizer, steps=steps, **options)
    for stale in ("fidelity", "checklist"):
        manifest.pop(stale, None)
    if measure:
        kw = {"seed": report.seed, **(measure if isinstance(measure, dict) else {})}
        fidelity = measure_fidelity(lm, proxy, tokenizer=tokenizer, **kw)
        manifest.update(manifest_sections(fidelity, validity_checklist(lm, proxy, fidelity)))
    manifest.update(manifest_sections(healing=report))

    rewrite_proxy_dir(proxy_dir, proxy, manifest)
    return report
