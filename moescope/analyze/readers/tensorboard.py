"""TensorBoard event files: OpenRLHF (``train/*``), NeMo-RL, slime, verl and HF Trainer runs.

Read with the ``tensorboard`` package's own record reader (``EventFileLoader``), which needs no
TensorFlow and no server. Old-style ``simple_value`` summaries (tensorboardX, TF1) and
tensor summaries of the scalars plugin (``torch.utils.tensorboard``, TF2) are both read, through
``data_compat.migrate_value``; histograms, images and text are left out. A directory is read
with every event file below it, so a run that restarted into a new file reads as one run (a
later event for the same tag and step wins); a damaged tail (a crash mid-write) ends a file
quietly. Values are float32 in the file and are given as the shortest decimal that round-trips
in float32 (``0.1``, not ``0.10000000149``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moescope.analyze.readers._rows import Parsed, Row
from moescope.analyze.readers._text import LogFile
from moescope.analyze.readers.keymap import guess_framework
from moescope.errors import MoescopeError

MARK = "tfevents"
FRAMEWORKS = ("openrlhf", "nemo-rl", "slime", "verl", "trl", "prime-rl")


def event_files(path: Path) -> list[Path]:
    """The event files at ``path`` (a file, or every one below a directory)."""
    if path.is_dir():
        return sorted(p for p in path.rglob(f"*{MARK}*") if p.is_file())
    return [path]


def read(log: LogFile) -> Parsed:
    """Scalars by step from the event file(s) at ``log.path``."""
    try:
        from tensorboard import data_compat
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util
    except ImportError:
        raise MoescopeError(
            "reading TensorBoard event files needs the tensorboard package; install it with "
            "pip install 'moescope[logs]'."
        ) from None
    files = event_files(log.path)
    steps: dict[int, dict[str, Any]] = {}
    raws: dict[int, list[str]] = {}
    rewritten = 0
    for file in files:
        try:
            events = list(EventFileLoader(str(file)).Load())
        except Exception as err:  # the record reader raises many types on damaged bytes
            raise MoescopeError(
                f"{file} is not a readable TensorBoard event file ({err}); pass an intact one."
            ) from None
        for event in events:
            for value in event.summary.value:
                scalar = _scalar(data_compat.migrate_value(value), tensor_util)
                if scalar is None:
                    continue
                record = steps.setdefault(int(event.step), {})
                rewritten += value.tag in record
                record[value.tag] = scalar
                raws.setdefault(int(event.step), []).append(f"{file.name}: {value.tag} = {scalar!r}")
    rows = [Row(step, steps[step], "\n".join(raws[step])) for step in sorted(steps)]
    parsed = Parsed(rows, guess_framework({k for r in rows for k in r.metrics}, FRAMEWORKS), lines=len(rows))
    if len({f.parent for f in files}) > 1:
        parsed.notes.append(
            f"read {len(files)} event files from {len({f.parent for f in files})} directories as one run; "
            "pass one run's directory to read only that run"
        )
    if rewritten:
        parsed.notes.append(
            f"{rewritten} scalars were logged twice for the same tag and step; the later one is kept"
        )
    return parsed


def _scalar(value: Any, tensor_util: Any) -> float | int | None:
    """A scalar summary's value, or ``None`` for anything else."""
    if value.metadata.plugin_data.plugin_name != "scalars":
        return None
    try:
        array = tensor_util.make_ndarray(value.tensor)
    except Exception:  # a tensor proto of an unknown dtype or a damaged shape
        return None
    if array.size != 1 or array.dtype.kind not in "fiub":
        return None
    scalar = array.reshape(())[()]
    return float(str(scalar)) if array.dtype.kind == "f" else scalar.item()
