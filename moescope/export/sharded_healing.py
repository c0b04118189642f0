"""Healing an exported proxy without its original in memory, in one process or sharded (FSDP2).

A proxy of a 30B MoE at keep 1/4 still needs ~160 GB of training state, more than one device;
its original is larger still. Here neither is ever whole in one process:

1. the original's top-k next-token distributions on the healing batches are computed once, a
   decoder layer at a time, and cached (:mod:`moescope.export.teacher`; rank 0 does it, the
   others read the file);
2. with ``shard=True`` (under ``torchrun``) rank 0 reads the proxy, the others build it empty,
   each decoder layer is sharded over the processes (:func:`moescope.models.sharding.shard_model`)
   and filled from rank 0, so each holds 1/N of its weights, gradients and Adam state;
3. each process trains on its share of every batch's rows (the losses are normalised by the whole
   batch's scored positions and FSDP sums the gradients, so a step equals the one-process step);
4. rank 0 gathers the healed weights and rewrites the proxy directory atomically.

What trains is what :func:`~moescope.export.healing.heal` trains (router rows and biases, kept
experts), checked afterwards as there: every other tensor bit-identical (on each process's shards).
The KL before and after is measured on the cache's own batches, which the report says are the
training data, not held out; the manifest's fidelity and checklist, which described the weights
before, are dropped (measure them again with ``measure_fidelity``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist

from moescope.errors import MoescopeError
from moescope.explore.calibration import TASKS
from moescope.export.fidelity.agreement import evaluating, scored_log_probs
from moescope.export.fidelity.original_record import cache_root
from moescope.export.fidelity.records import HealingReport, manifest_sections
from moescope.export.healing import (
    BATCH_SIZE,
    check_steps,
    distil_step,
    frozen_digests,
    healing_batches,
    rewrite_proxy_dir,
    train_cosine,
    trainable_tensors,
    verify_frozen,
)
from moescope.export.manifest import read_manifest
from moescope.export.teacher import TeacherCache, coarse_kl, row_share, teacher_cache
from moescope.models.sharding import (
    all_reduce_,
    barrier,
    fill_from_rank0,
    from_rank0,
    load_for_sharding,
    rank0_state,
    shard_model,
)
from moescope.models.view import adapt

__all__ = ["heal_exported", "teacher_file"]

CAPABILITY_ROWS = 64
"""Rows per forward when a proxy's capability is scored (fixed, so every process runs the same
forwards)."""


def heal_exported(
    proxy_dir: str | Path,
    *,
    teacher: str | Path | None = None,
    original: str | Path | None = None,
    steps: int = 50,
    lr: float = 1e-3,
    seed: int = 0,
    batch_size: int = BATCH_SIZE,
    shard: bool = False,
    min_capability: float = 0.0,
    heal_round: int = 10,
) -> HealingReport:
    """Heal the proxy in ``proxy_dir`` against its original's cached distributions; rewrite it.

    With ``min_capability`` > 0, healing runs in rounds of ``heal_round`` steps at a constant LR
    (as a capability-targeted export does) and stops once the proxy's task accuracy over the
    original's reaches it, or after ``steps``. Both accuracies are teacher-forced (one forward of
    every prompt with its answer; :mod:`moescope.export.fidelity.original`): the original's
    measured a decoder layer at a time once and cached, the sharded proxy's by every process
    together. The rounds are recorded in the manifest (``healing.capability``).

    Parameters
    ----------
    proxy_dir : an exported proxy (its ``moescope.json`` names the original).
    teacher : a teacher cache file (:meth:`TeacherCache.save`); default :func:`teacher_file`,
        built from the original, read a decoder layer at a time, when it is not there yet.
    original : the original checkpoint, when it has moved since the export.
    steps, lr, seed, batch_size : the run, as :func:`~moescope.export.healing.heal`'s.
    shard : shard the proxy over the ``torchrun`` processes with FSDP2.
    min_capability, heal_round : the capability target and the steps between its measurements.
    """
    check_steps(steps)
    check_steps(heal_round)
    if not 0 <= min_capability <= 1:
        raise MoescopeError(
            f"min_capability must lie in [0, 1], not {min_capability}; 0.8 is the default target."
        )
    rank, world = _process(shard)
    proxy_dir = Path(proxy_dir)
    manifest = read_manifest(proxy_dir)
    if manifest is None:
        raise MoescopeError(f"{proxy_dir} holds no moescope.json, so it is no proxy; export one first.")
    if batch_size % world:
        raise MoescopeError(
            f"batch size {batch_size} does not split evenly over {world} processes; "
            f"give --batch-size a multiple of {world}."
        )
    source_hash = manifest["source"]["config_hash"]
    path = Path(teacher) if teacher is not None else teacher_file(source_hash, steps, batch_size, seed)
    known = cache = None
    if rank == 0 and (teacher is None or min_capability > 0):
        shape = {"steps": steps, "batch_size": batch_size, "seed": seed}
        source = original or manifest["source"]["path"]
        built = _original_side(source, source_hash, None if teacher else path, min_capability > 0, **shape)
        known, cache = built
    known = from_rank0(known)
    barrier()  # the cache file is whole before the other processes read it
    if cache is None:  # given, or built by rank 0
        if not path.is_file():
            raise MoescopeError(
                f"teacher cache {path} does not exist; give the file build_teacher_cache saved."
            )
        cache = TeacherCache.load(path, config=source_hash)
    if steps > len(cache.batches):
        raise MoescopeError(
            f"the teacher cache holds {len(cache.batches)} batches and healing asks for {steps} steps; "
            "heal fewer steps, or build a cache of as many batches."
        )
    target = Target(min_capability, heal_round, *known) if known is not None else None
    run = {"steps": steps, "lr": lr, "seed": seed, "shard": shard, "part": (rank, world)}
    return _heal(proxy_dir, manifest, cache, target, **run)


def teacher_file(source_hash: str, steps: int, batch_size: int, seed: int) -> Path:
    """Where the teacher cache of an original's healing batches lives (under ``$MOESCOPE_CACHE``)."""
    return cache_root() / "teachers" / source_hash / f"tasks-{steps}x{batch_size}-seed{seed}.safetensors"


def _process(shard: bool) -> tuple[int, int]:
    """(rank, world) of a sharded run, refusing one without a process group; (0, 1) otherwise."""
    if not shard:
        return 0, 1
    if not (dist.is_available() and dist.is_initialized()):
        raise MoescopeError(
            "sharded healing needs a process group: launch with `torchrun --nproc-per-node N -m "
            "moescope heal PROXY --shard fsdp`, or drop --shard."
        )
    return dist.get_rank(), dist.get_world_size()


@dataclass(frozen=True)
class Target:
    """A capability target: the ratio to reach, the steps between measurements, the tasks, and
    the original's teacher-forced accuracy on them."""

    min_capability: float
    heal_round: int
    tasks: tuple[str, ...]
    original: pd.DataFrame


def _original_side(
    original: str | Path,
    source_hash: str,
    path: Path | None,
    capability: bool,
    *,
    steps: int,
    batch_size: int,
    seed: int,
) -> tuple[tuple[tuple[str, ...], pd.DataFrame] | None, TeacherCache | None]:
    """What healing needs of the original, read a decoder layer at a time: with ``capability``
    its tasks and teacher-forced task accuracy (cached), and its distributions on the healing
    batches cached at ``path`` (reused when it already holds them; none when ``path`` is ``None``)."""
    from moescope.explore.sequential import layer_sequential
    from moescope.export.fidelity.original_record import export_original_accuracy
    from moescope.models.accuracy import resolve_tasks
    from moescope.models.loading import load_tokenizer, resolve_model
    from moescope.provenance import config_hash

    source = resolve_model(original)
    tokenizer = load_tokenizer(source)
    with layer_sequential(source, dtype="auto") as lm:
        if config_hash(lm.config) != source_hash:
            raise MoescopeError(
                f"{source} is not the model this proxy was cut from (config hash "
                f"{config_hash(lm.config)}, recorded {source_hash}); pass --original the source checkpoint."
            )
        known = cache = None
        if capability:
            tasks = resolve_tasks(None, lm) if tokenizer is not None else None
            if not isinstance(tasks, tuple):
                raise MoescopeError(
                    "the capability target needs the task suite, and this model has none; heal without "
                    "--min-capability."
                )
            frame, _ = export_original_accuracy(lm, tokenizer, tasks, given=None, seed=seed)
            known = (tasks, frame)
        if path is not None:
            batches = healing_batches(
                TASKS, tokenizer, model=lm, steps=steps, batch_size=batch_size, seed=seed
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            cache = teacher_cache(lm, batches, path)
    return known, cache


def _heal(
    proxy_dir: Path,
    manifest: dict[str, Any],
    cache: TeacherCache,
    target: Target | None,
    *,
    steps: int,
    lr: float,
    seed: int,
    shard: bool,
    part: tuple[int, int],
) -> HealingReport:
    from moescope.models.loading import load_model, load_tokenizer

    load = load_for_sharding if shard else load_model  # sharded: rank 0 alone reads the checkpoint
    proxy, _ = load(proxy_dir, dtype="auto", with_tokenizer=False)
    names = set(trainable_tensors(adapt(proxy)))
    proxy.requires_grad_(False).eval()  # inference routing, no dropout, as heal() trains
    for name, p in proxy.named_parameters():
        p.requires_grad_(name in names)
    if shard:
        whole = rank0_state(proxy)
        shard_model(proxy)
        fill_from_rank0(proxy, whole)
        del whole
    params = {name: p for name, p in proxy.named_parameters() if name in names}
    frozen = frozen_digests(proxy, names)
    split = part if shard else None
    before = _fit(cache, proxy, steps, split)
    rounds, run = None, {"steps": steps, "lr": lr, "part": split}
    if target is None:
        losses, tokens = train_cosine(cache, proxy, params, iter(cache.batches), **run)
    else:
        tokenizer = load_tokenizer(proxy_dir)
        losses, tokens, rounds = _rounds(cache, proxy, params, target, tokenizer, **run)
    after = _fit(cache, proxy, steps, split)  # the batches "before" was measured on
    verified = verify_frozen(frozen, proxy, names)
    losses = _summed(losses) if shard else losses
    report = HealingReport(
        steps=len(losses),
        lr=lr,
        seed=seed,
        batch_size=int(cache.batches[0]["input_ids"].shape[0]),
        n_tokens=tokens,
        loss=tuple(losses),
        kl_before=before[0],
        kl_after=after[0],
        top1_before=before[1],
        top1_after=after[1],
        accuracy=None,
        trained=tuple(sorted(names)),
        frozen_verified=verified,
        data=f"teacher cache of {len(cache.batches)} batches ({cache.k} next tokens a position)",
        heldout="the teacher cache's batches (the training data: not held out)",
        capability=rounds,
    )
    state = _full_state(proxy) if shard else None
    if part[0] == 0:
        _rewrite(proxy_dir, manifest, proxy, state, report, cache)
    barrier()
    return report


def _rounds(
    cache: TeacherCache,
    proxy: torch.nn.Module,
    params: dict[str, torch.nn.Parameter],
    target: Target,
    tokenizer: Any,
    *,
    steps: int,
    lr: float,
    part: tuple[int, int] | None,
) -> tuple[list[float], int, dict[str, Any]]:
    """Heal ``target.heal_round`` steps at a time at a constant ``lr`` until the proxy's capability
    reaches the target or ``steps`` are spent; (losses, tokens seen, the rounds' record)."""
    optimizer = torch.optim.Adam(params.values(), lr=lr)
    losses, tokens, record = [], 0, []
    batches = iter(cache.batches)
    ratio = _capability(proxy, tokenizer, target)
    record.append({"steps": 0, "ratio": ratio})
    while ratio < target.min_capability and len(losses) < steps:
        for batch in itertools.islice(batches, min(target.heal_round, steps - len(losses))):
            losses.append(distil_step(cache, proxy, params, optimizer, batch, part))
            tokens += int(batch["attention_mask"].sum())
        ratio = _capability(proxy, tokenizer, target)
        record.append({"steps": len(losses), "ratio": ratio})
    reached = ratio >= target.min_capability
    summary = {
        "min_capability": target.min_capability,
        "heal_round": target.heal_round,
        "rounds": record,
        "reached": reached,
        "estimator": "teacher-forced (original and proxy)",
    }
    return losses, tokens, summary


def _capability(proxy: torch.nn.Module, tokenizer: Any, target: Target) -> float:
    """The proxy's teacher-forced accuracy over the original's on the target's tasks. Every
    process scores every row, in batches of a fixed size, so a sharded proxy runs the same
    forwards everywhere."""
    from moescope.export.fidelity.measure import pair_accuracy
    from moescope.export.fidelity.original import teacher_forced_accuracy
    from moescope.export.fidelity.validity import capability_of

    with torch.no_grad(), evaluating(proxy):
        frame = teacher_forced_accuracy(proxy, tokenizer, target.tasks, batch_size=CAPABILITY_ROWS)
    check = capability_of(pair_accuracy(target.original, frame), target.min_capability)
    return float(check.details.get("ratio", math.nan))


@torch.no_grad()
def _fit(
    cache: TeacherCache, proxy: torch.nn.Module, steps: int, part: tuple[int, int] | None
) -> tuple[float, float]:
    """(coarse KL, top-1 agreement) of the proxy against the cache on its first ``steps`` batches:
    sums over this process's share, added over processes."""
    totals = torch.zeros(3, dtype=torch.float64)
    with evaluating(proxy):
        for batch in cache.batches[:steps]:
            log_p, ids, rest = cache.teacher(batch)
            rows, positions = row_share(batch, *(part or (0, 1)))
            log_q = scored_log_probs(proxy, {k: v[rows] for k, v in batch.items()})
            kl = coarse_kl(log_p[positions], ids[positions], rest[positions], log_q)
            agree = (log_q.argmax(-1) == ids[positions, 0]).sum()
            totals += torch.tensor([float(kl.sum()), float(agree), float(len(kl))])
    if part is not None and part[1] > 1:
        all_reduce_(totals)
    n = max(float(totals[2]), 1.0)
    return float(totals[0]) / n, float(totals[1]) / n


def _summed(values: list[float]) -> list[float]:
    """Each process's loss shares, added over processes (the whole batch's losses)."""
    return all_reduce_(torch.tensor(values, dtype=torch.float64)).tolist()


def _full_state(proxy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The sharded proxy's whole state dict on rank 0 (in CPU memory; empty on the others),
    each tied tensor once (as ``save_pretrained`` writes an unsharded model's)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(proxy, options=options)
    first: dict[int, str] = {}
    for name, param in proxy.named_parameters(remove_duplicate=False):
        if first.setdefault(id(param), name) != name:
            state.pop(name, None)
    return state


def _rewrite(
    proxy_dir: Path,
    manifest: dict[str, Any],
    proxy: torch.nn.Module,
    state: dict[str, torch.Tensor] | None,
    report: HealingReport,
    cache: TeacherCache,
) -> None:
    """The healed proxy in place of the old directory, its manifest recording the healing."""
    manifest = dict(manifest)
    for stale in ("fidelity", "checklist"):  # they described the weights before healing
        manifest.pop(stale, None)
    manifest.update(manifest_sections(healing=report))
    manifest["healing"]["teacher"] = {"digest": cache.digest, "k": cache.k, "forwards": cache.forwards}
    rewrite_proxy_dir(proxy_dir, proxy, manifest, state)
