"""Replay RL post-training on an original model and its proxies: same algorithm, data, precision, faults.

``moescope.replay(model, config)`` runs the replay and returns its trace; this package is also
that function (the module is callable), so ``moescope.replay.ReplayConfig`` and
``moescope.replay(...)`` both read naturally.

Modules: ``config`` (:class:`ReplayConfig`), ``data`` (the prompt schedule), ``rewards``,
``models`` (policy, reference, tokenizer), ``rollout`` (sampling groups), ``pivot`` (PivotRL),
``sampling`` (a step's groups and minibatches), ``advantages`` (GRPO / GEPO), ``forward``
(training forwards under faults, old and reference log-probs), ``losses``, ``objective`` (the
loss), ``update`` (the optimiser step), ``metrics`` (the trace record), ``opefo`` (entropy flow
control), ``precision``, ``faults``, ``instruments``, ``comm`` (data parallelism),
``checkpoint``, ``trainer`` (one step) and ``run`` (the whole replay).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from moescope.replay.config import ReplayConfig
from moescope.replay.faults import KINDS as FAULTS

__all__ = ["FAULTS", "ReplayConfig", "replay"]


def __getattr__(name: str) -> Any:
    """``replay`` on first use: the config and the fault names stay free of torch (the command
    line builds its flags from them), the run imports it."""
    if name == "replay":
        from moescope.replay.run import replay

        return replay
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    """Lets ``moescope.replay(model, config)`` call :func:`moescope.replay.run.replay`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return __getattr__("replay")(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
