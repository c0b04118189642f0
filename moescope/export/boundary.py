"""An export's inputs checked before any weight is read: each mistake is one sentence in seconds.

:func:`~moescope.export.pipeline.export_proxy` calls :func:`check_inputs` after it has resolved
the model and the output and before it places the original: the device and dtype
(:func:`~moescope.models.device.choose_compute`), whether transformers can build the model the
config describes, every line of a rollouts file, and the original's accuracy given with
``--original-accuracy`` against the tasks the export will measure. Each of these would otherwise
fail after the original was loaded and passes had run, or (a config transformers cannot build)
as a traceback.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from moescope.errors import MoescopeError
from moescope.models.device import Compute, choose_compute

if TYPE_CHECKING:
    from moescope.export.config import ExportConfig


def check_inputs(source: Path, config: ExportConfig, calibration: Any) -> Compute:
    """Refuse, before anything is read, what the export could not run; return where it runs.

    ``calibration`` is the calibration in effect (a source name, a file, or token ids).
    """
    from moescope.explore.rl_data import check_rollouts, is_rollouts_file
    from moescope.models.loading import check_builds, load_config

    stored = getattr(load_config(source), "dtype", None)
    compute = choose_compute(config.device, config.dtype, stored=str(stored).removeprefix("torch."))
    check_builds(source)
    if is_rollouts_file(calibration):
        check_rollouts(calibration)
    if config.original_accuracy is not None:
        check_given_accuracy(config.original_accuracy, config.tasks, source)
    return compute


def check_given_accuracy(given: str, tasks: Any, source: Path) -> None:
    """``--original-accuracy`` read against the tasks the export measures (the task suite for
    an embedded model unless ``tasks`` names others), as the export will read it later: a share
    outside 0 to 1, a task not measured, or a figure for an export that measures no task is
    one sentence now rather than after the calibration passes."""
    from moescope.export.fidelity.original_record import parse_original_accuracy
    from moescope.models.accuracy import resolve_tasks
    from moescope.models.loading import load_config

    resolved = resolve_tasks(tasks, SimpleNamespace(config=load_config(source)))  # type: ignore[arg-type]
    if resolved is None:
        raise MoescopeError(
            f"--original-accuracy {given!r} gives the original's task accuracy, and this export measures "
            'no task; name the tasks with --prompts (families, or a .jsonl of {"prompt", "answer"} '
            "lines), or drop --original-accuracy."
        )
    parse_original_accuracy(given, resolved)
