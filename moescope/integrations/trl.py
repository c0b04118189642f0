"""moescope inside TRL: a callback that writes a moescope trace of the run the user already runs.

TRL's trainers (``GRPOTrainer`` and the rest) are 🤗 ``Trainer`` subclasses, so the integration is
a ``TrainerCallback``; it needs transformers only, and works with any ``Trainer``::

    from moescope.integrations.trl import MoescopeCallback

    trainer = GRPOTrainer(model=proxy_dir, args=GRPOConfig(..., logging_steps=1),
                          callbacks=[MoescopeCallback("proxy.jsonl")], ...)
    trainer.train()
    # then: moescope diagnose proxy.jsonl --against original.jsonl

The trace has the format ``moescope replay`` writes, so ``diagnose``, ``compare``, ``TraceBoard``
and ``EntropyFlow`` read it unchanged: a header (model, its proxy manifest when it is one, the
trainer's config, library versions), then one flushed line per optimizer step with the metrics
TRL logged at that step under moescope's canonical names (the readers' TRL key map) and the MoE
metrics of :class:`~moescope.integrations.probe.MoEProbe`: per-layer expert load and its spread,
router entropy, top-k margin, largest router logit, gradient norms by parameter group, the
non-finite gradient count and the first module whose output went non-finite. With
``logging_steps=1`` every line carries TRL's metrics; otherwise the steps between two logs have
the MoE metrics only.

HF's Trainer clips the gradients before its ``on_pre_optimizer_step`` event, so the norms per
group are taken there, after clipping, and scaled back by the pre-clip total TRL logs as
``grad_norm`` (clipping scales every gradient by one factor).

``faults=("lr_spike@5", ...)`` injects moescope's faults under the replay's names
(:mod:`moescope.integrations.faults`); :func:`instrument` adds the callback to a trainer already
built and is needed for ``reward_scale``, which wraps the trainer's reward functions.

Under an accelerate FSDP2 launch (``examples/accelerate_fsdp2.yaml``) the callback works as in a
data-parallel one: only the main process writes the trace (its header says ``sharded``), the
routing statistics are summed over the processes, the gradient norms are taken from each rank's
shard of the gradients, and the faults act on the sharded model (:mod:`moescope.integrations.fsdp`
for CPU launches and what it refuses).

Errors come before training: a model moescope does not read as MoE when the trainer is built
(``on_init_end``), an unwritable trace path or a fault with no Trainer equivalent when the
callback is made. A crash mid-run leaves the trace readable up to the last finished step (each
line is flushed as it is written).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from moescope import schema as S
from moescope._version import __version__
from moescope.analyze.readers.keymap import rename
from moescope.errors import MoescopeError
from moescope.export.manifest import read_manifest
from moescope.integrations.faults import TrainerFaults
from moescope.integrations.fsdp import check_sharding, shard_on_cpu
from moescope.integrations.probe import MoEProbe
from moescope.models.sharding import is_sharded_model
from moescope.provenance import config_hash, library_versions
from moescope.replay.faults import parse_faults, split_faults
from moescope.traces import TraceWriter

__all__ = ["MoescopeCallback", "instrument"]

ENGINE = "trl"


class MoescopeCallback(TrainerCallback):
    """Write a moescope trace of a TRL (or any 🤗 ``Trainer``) run to ``trace``."""

    def __init__(self, trace: str | Path, *, faults: str | tuple[str, ...] | list[str] = ()) -> None:
        self.path = Path(trace)
        self.fault_texts = split_faults(faults)
        TrainerFaults.check(parse_faults(list(self.fault_texts)))
        _check_writable(self.path)
        self.rewards_wrapped = False
        self.faults: TrainerFaults | None = None
        self.probe: MoEProbe | None = None
        self.writer: TraceWriter | None = None
        self._pending: tuple[int, dict[str, Any]] | None = None
        self._grads: dict[str, float] = {}

    # -- events, in the order the Trainer sends them
    def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._attach(model)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        check_sharding(_unwrapped(model))
        probe = self._attach(model)
        probe.regroup()  # the model as prepared for training: sharded parameters are new ones
        if any("reward_scale" in f for f in self.fault_texts) and not self.rewards_wrapped:
            raise MoescopeError(
                "the reward_scale fault wraps the trainer's reward functions; add the callback with "
                "moescope.integrations.trl.instrument(trainer, TRACE, faults=...) instead."
            )
        if state.is_world_process_zero:  # the others reduce their statistics into its lines
            header = {
                **_header(probe, args),
                "faults": list(self.fault_texts),
                "world_size": args.world_size,
                "sharded": is_sharded_model(probe.model),  # FSDP2: each rank holds 1/world of the state
            }
            self.writer = TraceWriter(self.path, header)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.faults is not None:
            self.faults.step_begin(state.global_step, args)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.probe is not None:
            self._grads = self.probe.gradients()
        if self.faults is not None and kwargs.get("optimizer") is not None:
            self.faults.before_update(kwargs["optimizer"])

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.faults is not None:
            self.faults.after_update()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()  # the previous step, when no log came for it
        if self.probe is not None and self.faults is not None:
            record = {**self.probe.take(), **self._grads, **self.faults.take()}
            self._pending = (state.global_step - 1, record)
            self._grads = {}

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if self._pending is None or not logs or self._pending[0] != state.global_step - 1:
            return
        step, record = self._pending
        metrics, _ = rename(ENGINE, {k: v for k, v in logs.items() if isinstance(v, int | float)})
        applied = {S.LR: record[S.LR]} if S.LR in record else {}  # over the scheduler's rate TRL logs
        record = _rescaled(record, metrics.get(S.GRAD_NORM)) | metrics | applied
        if self.faults is not None:
            record.update(self.faults.clip_coef(metrics.get(S.GRAD_NORM)))
        self._pending = (step, record)
        self._flush()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()
        self.close()

    # -- the rest
    def close(self) -> None:
        """Close the trace and take the hooks off the model (also done at the end of training)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.faults is not None:
            self.faults.close()
            self.faults = None
        if self.probe is not None:
            self.probe.remove()
            self.probe = None

    def _attach(self, model: Any) -> MoEProbe:
        model = _unwrapped(model)
        if self.probe is None or self.probe.model is not model:
            self.close()
            self.probe = MoEProbe(model)
            self.faults = TrainerFaults(self.fault_texts, model, self.probe.moe)
        return self.probe

    def _flush(self) -> None:
        if self._pending is not None and self.writer is not None:
            step, record = self._pending
            record.pop("total", None)
            self.writer.write_step(step, record)
        self._pending = None


def instrument(
    trainer: Any, trace: str | Path, *, faults: str | tuple[str, ...] | list[str] = ()
) -> MoescopeCallback:
    """Add a :class:`MoescopeCallback` to a trainer already built (the one way to inject
    ``reward_scale``: its reward functions are wrapped here). Under an FSDP2 launch on CPU it
    also makes the trainer shard (:func:`~moescope.integrations.fsdp.shard_on_cpu`). Returns the
    callback."""
    callback = MoescopeCallback(trace, faults=faults)
    shard_on_cpu(trainer)  # an FSDP2 launch on CPU, sharded as on GPUs (elsewhere: nothing)
    callback._attach(trainer.model)
    if any("reward_scale" in f for f in callback.fault_texts):
        funcs = getattr(trainer, "reward_funcs", None)
        if not funcs or not all(callable(f) and not isinstance(f, torch.nn.Module) for f in funcs):
            raise MoescopeError(
                "reward_scale scales reward functions, and this trainer has reward models or none; "
                "drop the fault or pass reward functions."
            )
        trainer.reward_funcs = [_scaled(f, callback) for f in funcs]
        callback.rewards_wrapped = True
    trainer.add_callback(callback)
    return callback


def _scaled(func: Any, callback: MoescopeCallback) -> Any:
    """A reward function whose rewards the reward_scale fault multiplies (the name kept: TRL
    logs each reward function under it)."""

    def scaled(*args: Any, **kwargs: Any) -> list[float | None]:
        factor = callback.faults.reward_factor() if callback.faults is not None else 1.0
        return [r * factor if r is not None else None for r in func(*args, **kwargs)]

    scaled.__name__ = getattr(func, "__name__", "reward")
    return scaled


def _rescaled(record: dict[str, Any], logged_norm: Any) -> dict[str, Any]:
    """Group norms taken after clipping, scaled back to the pre-clip total the trainer logged."""
    total = record.get("total")
    if not isinstance(logged_norm, int | float) or not total:
        return record
    factor = float(logged_norm) / total
    return {k: v * factor if k.startswith(S.GRAD_NORM_GROUP) else v for k, v in record.items()}


def _unwrapped(model: Any) -> Any:
    """The model under a DDP / accelerate wrapper."""
    return getattr(model, "module", model)


def _header(probe: MoEProbe, args: Any) -> dict[str, Any]:
    model = probe.model
    source = getattr(model.config, "_name_or_path", "") or type(model).__name__
    directory = Path(source)
    return {
        "model": source,
        "model_type": model.config.model_type,
        "config_hash": config_hash(model.config),
        "proxy": read_manifest(directory) if directory.is_dir() else None,
        "engine": ENGINE,
        "trainer_config": _jsonable(args.to_dict()) if hasattr(args, "to_dict") else {},
        "num_experts": probe.moe.num_experts,
        "moe_layers": [layer.index for layer in probe.moe.layers],
        "parameters": sum(p.numel() for p in model.parameters()),
        "moescope_version": __version__,
        "versions": library_versions(),
    }


def _jsonable(config: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v if isinstance(v, str | int | float | bool | type(None)) else str(v) for k, v in config.items()
    }


def _check_writable(path: Path) -> None:
    """Refuse a trace path that cannot be written, before any training."""
    if path.is_dir():
        raise MoescopeError(
            f"the trace path {path} is a directory; pass a file path such as {path / 'run.jsonl'}."
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=True):
            pass
    except OSError as err:
        raise MoescopeError(
            f"cannot write the trace at {path} ({err.strerror or err}); pass a path in a writable directory."
        ) from None
