"""``replay(model, config)``: run a replay end to end and return its trace.

Loads the model (a checkpoint directory, ``"toy"``, or a model already in memory), the frozen
reference, the prompt schedule and the reward; writes the trace header; runs the steps, flushing
one line each; checkpoints every ``checkpoint_every`` steps; and with ``resume=True`` continues
from the last checkpoint of the same config (its trace truncated to that step), so the finished
trace equals an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from moescope import schema as S
from moescope._version import __version__
from moescope.errors import MoescopeError
from moescope.export.manifest import read_manifest
from moescope.models.loading import load_model, resolve_model
from moescope.models.sharding import load_for_sharding, meta_twin
from moescope.provenance import config_hash, library_versions
from moescope.replay.checkpoint import checkpoint_dir, load_checkpoint, read_state, save_checkpoint
from moescope.replay.comm import Comm
from moescope.replay.config import ReplayConfig
from moescope.replay.data import max_new_tokens, prompt_schedule
from moescope.replay.models import model_loop_times, prepare_models, reference_copy, shard_models
from moescope.replay.rewards import RewardFn, reward_function
from moescope.replay.trainer import Trainer
from moescope.traces import Trace, TraceWriter, read_trace


def replay(
    model: Any,
    config: ReplayConfig | None = None,
    *,
    out: str | Path | None = None,
    tokenizer: Any = None,
    reward: str | RewardFn | None = None,
    resume: bool = False,
    checkpoint_every: int = 0,
    progress: bool = False,
) -> Trace:
    """Replay a short RL post-training run on ``model`` and return the trace.

    Parameters
    ----------
    model : ``"toy"``, a checkpoint directory (an original or an exported proxy), or a loaded
        ``PreTrainedModel`` (then pass ``tokenizer``; it is trained in place).
    config : the run; :class:`ReplayConfig` defaults when omitted.
    out : the trace path (JSON Lines); a temporary file when omitted.
    reward : overrides ``config.reward`` with a name or a function ``(example, completion) -> float``.
    resume : continue from ``out``'s checkpoint (written with ``checkpoint_every``).
    checkpoint_every : write a checkpoint every N steps (0: never).
    """
    config = config or ReplayConfig()
    path = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="moescope-replay-")) / "trace.jsonl"
    with Comm.from_env(sharded=config.sharded) as comm:  # a group this call made is gone on return
        config.check_world(comm.world, group=comm.group)
        _check_writable(path, comm)  # before any model loads, on every process alike
        reward_fn = reward_function(reward if reward is not None else config.reward)
        schedule = prompt_schedule(config)
        state = _resumable_state(path, config) if resume else None  # checked before the (slow) model load
        source, policy, reference, tokenizer = _load(model, config, tokenizer)
        models = prepare_models(policy, reference, tokenizer, model_loop_times(config, policy.config))
        if config.sharded:  # filled from rank 0, the one process that read the checkpoint
            shard_models(models, reference_is_policy=config.kl_beta > 0 and not config.ref_model_path)
        trainer = Trainer(models, config, schedule, reward_fn, max_new_tokens(config, schedule), comm)
        start = _resume_from(path, state, trainer) if state is not None else 0
        if not resume and comm.is_main:
            shutil.rmtree(checkpoint_dir(path), ignore_errors=True)  # a new run never resumes an old one
        header = _header(source, policy, config, trainer, comm, reward_fn)
        resuming = resume and start > 0
        writer = TraceWriter(path, header, resume=resuming, resume_from=start) if comm.is_main else None
        try:
            for step in range(start, config.steps):
                record = trainer.step(step)
                if writer is not None:
                    writer.write_step(step, record)
                if progress and comm.is_main:
                    _progress(step, config.steps, record)
                if checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < config.steps:
                    save_checkpoint(path, policy, trainer.optimizer, trainer.state(step + 1), comm)
        finally:
            if writer is not None:
                writer.close()
        comm.barrier()
        return read_trace(path)


def _check_writable(path: Path, comm: Comm) -> None:
    """Refuse a trace path rank 0 cannot write, on every process (a rank left waiting in a
    collective for a rank that failed alone would hang)."""
    problem = None
    if comm.is_main:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.probe-"):
                pass
        except OSError as exc:
            problem = (
                f"cannot write the trace {path} ({exc.strerror or exc}); give --out a path in a writable "
                "directory."
            )
    problem = comm.first_text(problem)
    if problem:
        raise MoescopeError(problem)


def _load(model: Any, config: ReplayConfig, tokenizer: Any) -> tuple[Path | None, Any, Any, Any]:
    """(checkpoint path or None, policy, frozen reference or None, tokenizer)."""
    load = load_for_sharding if config.sharded else load_model  # sharded: rank 0 reads, others wait
    if isinstance(model, torch.nn.Module):
        policy = model
        source = Path(model.name_or_path) if getattr(model, "name_or_path", "") else None
    else:
        source = resolve_model(model)
        policy, loaded = load(source)
        tokenizer = tokenizer or loaded
    reference = None
    if config.kl_beta > 0:  # the given reference, else the policy as it starts
        ref_path = config.ref_model_path
        if ref_path:
            reference = load(ref_path, with_tokenizer=False)[0]
        else:
            reference = meta_twin(policy) if config.sharded else reference_copy(policy)
    return source, policy, reference, tokenizer


def _resumable_state(path: Path, config: ReplayConfig) -> dict[str, Any] | None:
    """The checkpoint state to resume from (None: start at step 0); refuses a trace or a
    checkpoint written under another config."""
    recorded = []
    if path.exists():
        with contextlib.suppress(MoescopeError):  # an unreadable trace is replaced, not compared
            recorded.append(read_trace(path).header.get("config_digest"))
    state = read_state(path)
    if state is not None:
        recorded.append(state.get("config_digest"))
    if any(d is not None and d != config.digest() for d in recorded):
        raise MoescopeError(
            f"Cannot resume {path}: it was written with a different replay config; rerun with the same "
            "options, or drop --resume to start a new trace."
        )
    return state


def _resume_from(path: Path, state: dict[str, Any], trainer: Trainer) -> int:
    """Load the checkpoint into the trainer; the step to continue from."""
    load_checkpoint(path, trainer.m.policy, trainer.optimizer, trainer.comm)
    trainer.load_state(state)
    return int(state["next_step"])


def _header(
    source: Path | None, policy: Any, config: ReplayConfig, trainer: Trainer, comm: Comm, reward_fn: RewardFn
) -> dict[str, Any]:
    manifest = _manifest(source)
    return {
        "model": str(source) if source is not None else type(policy).__name__,
        "model_type": policy.config.model_type,
        "config_hash": config_hash(policy.config),
        "proxy": manifest,
        "replay_config": config.to_dict(),
        "config_digest": config.digest(),
        "seed": config.seed,
        "faults": trainer.faults.describe(),
        "reward_function": getattr(reward_fn, "__name__", repr(reward_fn)),
        "loop_times": trainer.m.loop_times,
        "world_size": comm.world,
        "num_experts": trainer.m.moe.num_experts,
        "moe_layers": [layer.index for layer in trainer.m.moe.layers],
        "parameters": sum(p.numel() for p in trainer.params),
        "moescope_version": __version__,
        "versions": library_versions(),
        "timing_keys": list(S.TIMING_KEYS),
    }


def _manifest(source: Path | None) -> dict[str, Any] | None:
    return read_manifest(source) if source is not None else None


def _progress(step: int, steps: int, record: dict[str, Any]) -> None:
    print(
        f"step {step + 1}/{steps}  reward {record[S.REWARD_MEAN]:.3f}  loss {record[S.ACTOR_LOSS]:.4g}  "
        f"grad_norm {record[S.GRAD_NORM]:.3g}  entropy {record[S.ENTROPY]:.3f}",
        file=sys.stderr,
        flush=True,
    )
