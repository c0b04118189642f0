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

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from moescope._util.io import readable, replace_dir
from moescope.errors import MoescopeError
from moescope.explore.calibration import TASKS
from moescope.export.fidelity.agreement import evaluating, scored_log_probs
from moescope.export.fidelity.original_record import cache_root
from moescope.export.fidelity.records import HealingReport, manifest_sections
from moescope.export.healing import (
    BATCH_SIZE,
    _check_steps,
    _digests,
    _train,
    _verify_frozen,
    healing_batches,
    trainable_tensors,
)
from moescope.export.manifest import copy_side_files, read_manifest, write_manifest
from moescope.export.teacher import TeacherCache, coarse_kl, row_share, teacher_cache
from moescope.models.sharding import fill_from_rank0, load_for_sharding, rank0_state, shard_model
from moescope.models.view import adapt

__all__ = ["heal_exported", "teacher_file"]


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
) -> HealingReport:
    """Heal the proxy in ``proxy_dir`` against its original's cached distributions; rewrite it.

    Parameters
    ----------
    proxy_dir : an exported proxy (its ``moescope.json`` names the original).
    teacher : a teacher cache file (:meth:`TeacherCache.save`); default :func:`teacher_file`,
        built from the original, read a decoder layer at a time, when it is not there yet.
    original : the original checkpoint, when it has moved since the export.
    steps, lr, seed, batch_size : the run, as :func:`~moescope.export.healing.heal`'s.
    shard : shard the proxy over the ``torchrun`` processes with FSDP2.
    """
    _check_steps(steps)
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
    if rank == 0 and teacher is None:
        _build_teacher(original or manifest["source"]["path"], source_hash, path, steps, batch_size, seed)
    _barrier(world)
    if not path.is_file():
        raise MoescopeError(f"teacher cache {path} does not exist; give the file build_teacher_cache saved.")
    cache = TeacherCache.load(path, config=source_hash)
    if steps > len(cache.batches):
        raise MoescopeError(
            f"the teacher cache holds {len(cache.batches)} batches and healing asks for {steps} steps; "
            "heal fewer steps, or build a cache of as many batches."
        )
    return _heal(proxy_dir, manifest, cache, steps=steps, lr=lr, seed=seed, shard=shard, part=(rank, world))


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


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def _build_teacher(
    original: str | Path, source_hash: str, path: Path, steps: int, batch_size: int, seed: int
) -> None:
    """The original's distributions on the healing batches, a decoder layer at a time, cached at
    ``path`` (kept when it already holds them)."""
    from moescope.explore.sequential import layer_sequential
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
        shape = {"steps": steps, "batch_size": batch_size, "seed": seed}
        batches = healing_batches(TASKS, tokenizer, model=lm, **shape)
        path.parent.mkdir(parents=True, exist_ok=True)
        teacher_cache(lm, batches, path)


def _heal(
    proxy_dir: Path,
    manifest: dict[str, Any],
    cache: TeacherCache,
    *,
    steps: int,
    lr: float,
    seed: int,
    shard: bool,
    part: tuple[int, int],
) -> HealingReport:
    from moescope.models.loading import load_model

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
    frozen = _digests(proxy, names)
    split = part if shard else None
    before = _fit(cache, proxy, steps, split)
    losses, tokens = _train(cache, proxy, params, iter(cache.batches), steps=steps, lr=lr, part=split)
    after = _fit(cache, proxy, steps, split)
    verified = _verify_frozen(frozen, proxy, names)
    losses = _summed(losses) if shard else losses
    report = HealingReport(
        steps=steps,
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
    )
    state = _full_state(proxy) if shard else None
    if part[0] == 0:
        _rewrite(proxy_dir, manifest, proxy, state, report, cache)
    _barrier(part[1] if shard else 1)
    return report


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
        dist.all_reduce(totals)
    n = max(float(totals[2]), 1.0)
    return float(totals[0]) / n, float(totals[1]) / n


def _summed(values: list[float]) -> list[float]:
    """Each process's loss shares, added over processes (the whole batch's losses)."""
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


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
    """The healed proxy in place of the old directory (a temporary sibling, then a rename)."""
    manifest = dict(manifest)
    for stale in ("fidelity", "checklist"):  # they described the weights before healing
        manifest.pop(stale, None)
    manifest.update(manifest_sections(healing=report))
    manifest["healing"]["teacher"] = {"digest": cache.digest, "k": cache.k, "forwards": cache.forwards}

    def fill(work: Path) -> None:
        proxy.save_pretrained(work, state_dict=state)
        copy_side_files(proxy_dir, work)
        write_manifest(work, manifest)
        readable(work)

    replace_dir(proxy_dir, fill, overwrite=True)
