"""Replay RL post-training on an original model and its proxies: same algorithm, data, precision, faults.

``moescope.replay(model, config)`` runs the replay and returns its trace; this package is also
that function (the module is callable), so ``moescope.replay.ReplayConfig`` and
``moescope.replay(...)`` both read naturally.

Modules: ``config`` (:class:`ReplayConfig`), ``data`` (the prompt schedule), ``rewards``,
``rollout`` (sampling groups), ``pivot`` (PivotRL), ``advantages`` (GRPO / GEPO), ``losses``,
``opefo`` (entropy flow control), ``precision``, ``faults``, ``instruments``, ``comm``
(data parallelism), ``checkpoint``, ``trainer`` (one step) and ``run`` (the whole replay).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from moescope.replay.config import ReplayConfig
from moescope.replay.faults import KINDS as FAULTS
from moescope.replay.run import replay

__all__ = ["FAULTS", "ReplayConfig", "replay"]


class _CallableModule(types.ModuleType):
    """Lets ``moescope.replay(model, config)`` call :func:`moescope.replay.run.replay`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return replay(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
