"""The original's task accuracy kept for later exports (``original_accuracy.json``), or given.

An export measures the original's accuracy teacher-forced
(:mod:`moescope.export.fidelity.original`), in memory or a layer at a time alike, so both reads
of one model compare their proxies with one figure. Read from disk, that is a pass over the
checkpoint, so the figure is measured once and written beside the selection (or in the cache)
with what it was measured on: the model's config hash, the examples (a digest of every prompt
and answer), the settings that change the figure and the estimator. A later export of the same
model with the same settings reuses it (:func:`cached_original_accuracy`); any difference
measures again and replaces it. A user who knows the figure gives it instead
(:func:`parse_original_accuracy`, the ``--original-accuracy`` value).

Example
-------
>>> parse_original_accuracy("add2=0.9,add3=0.7", ("add2", "add3"), n_prompts=50)["accuracy"].tolist()
[nan, 0.9, nan, 0.7]
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope._util.records import check_kind, read_record, write_record
from moescope.errors import MoescopeError
from moescope.export.fidelity.original import Method, measured_examples, original_accuracy
from moescope.models.evaluation import GREEDY, SAMPLED
from moescope.models.tasks import Example
from moescope.provenance import config_hash, library_versions
from moescope.schema import SCHEMA_VERSION

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PreTrainedModel

ORIGINAL_ACCURACY_NAME = "original_accuracy.json"
"""The record's file name, beside the selection it was measured for."""

COLUMNS = ("task", "mode", "accuracy", "mixed", "n")
_KIND = "moescope.original_accuracy"
_FIX = "delete it to measure the original again"


@dataclass(frozen=True)
class Measurement:
    """What an original-accuracy figure depends on; two figures with equal ones are the same.

    ``prompts`` is a digest of every measured example (task, prompt, answer); ``n_prompts`` and
    ``samples`` are ``None`` for a prompt file (judged greedily, every line), and ``seed`` is
    ``None`` where the estimator draws nothing (teacher-forced, or a prompt file).
    """

    config_hash: str
    tasks: tuple[str, ...]
    prompts: str
    n_prompts: int | None
    samples: int | None
    seed: int | None
    method: str

    @classmethod
    def of(
        cls,
        model: PreTrainedModel,
        tasks: tuple[str, ...] | list[Example],
        *,
        n_prompts: int,
        samples: int,
        seed: int,
        method: Method,
    ) -> Measurement:
        examples = measured_examples(tasks, n_prompts)
        suite = isinstance(tasks, tuple)
        return cls(
            config_hash(model.config),
            _task_names(tasks),
            _digest(examples),
            n_prompts if suite else None,
            samples if suite else None,
            seed if suite and method == "sampled" else None,
            method,
        )

    def differences(self, other: Measurement) -> list[str]:
        """The fields in which ``other`` differs, by name."""
        return [name for name, value in asdict(self).items() if asdict(other)[name] != value]


@dataclass(frozen=True)
class OriginalAccuracy:
    """The original's accuracy frame (``task, mode, accuracy, mixed, n``) and its :class:`Measurement`."""

    rows: tuple[tuple[str, str, float, float, int], ...]
    measurement: Measurement

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, measurement: Measurement) -> OriginalAccuracy:
        """The record of an accuracy frame (:func:`~moescope.models.accuracy.model_accuracy`'s shape)."""
        rows = frame[list(COLUMNS)].itertuples(index=False, name=None)
        return cls(tuple((str(t), str(m), float(a), float(x), int(n)) for t, m, a, x, n in rows), measurement)

    def to_frame(self) -> pd.DataFrame:
        """:func:`~moescope.models.accuracy.model_accuracy`'s frame (NaN where ``None`` was written)."""
        import pandas as pd

        return pd.DataFrame(list(self.rows), columns=list(COLUMNS)).astype(
            {"accuracy": float, "mixed": float}
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": _KIND,
            "schema_version": SCHEMA_VERSION,
            "measurement": asdict(self.measurement),
            "rows": [dict(zip(COLUMNS, row, strict=True)) for row in self.rows],
            "versions": library_versions(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OriginalAccuracy:
        check_kind(d, _KIND, _FIX)
        fields = dict(d["measurement"], tasks=tuple(d["measurement"]["tasks"]))
        rows = tuple(
            (r["task"], r["mode"], _float(r["accuracy"]), _float(r["mixed"]), int(r["n"])) for r in d["rows"]
        )
        return cls(rows, Measurement(**fields))

    def save(self, path: str | Path) -> Path:
        """Write JSON atomically (temporary sibling, then rename)."""
        return write_record(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> OriginalAccuracy:
        """Read a file written by :meth:`save`."""
        try:
            return cls.from_dict(read_record(path, _KIND, _FIX))
        except (KeyError, TypeError, ValueError) as err:
            raise MoescopeError(
                f"{path} is not a complete original-accuracy record ({err!r}); {_FIX}."
            ) from None


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _task_names(tasks: tuple[str, ...] | list[Example]) -> tuple[str, ...]:
    return tasks if isinstance(tasks, tuple) else tuple(dict.fromkeys(ex.task for ex in tasks))


def _digest(examples: list[Example]) -> str:
    text = json.dumps([(ex.task, ex.prompt, ex.answer) for ex in examples], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_original_accuracy(
    path: str | Path,
    model: PreTrainedModel,
    tokenizer: Any,
    tasks: tuple[str, ...] | list[Example],
    *,
    n_prompts: int = 100,
    samples: int = 4,
    seed: int = 0,
    method: Method = "teacher-forced",
    batch_size: int | None = None,
) -> tuple[OriginalAccuracy, bool]:
    """The record at ``path`` if it was measured as asked (same model config, examples,
    settings and estimator), else :func:`~moescope.export.fidelity.original.original_accuracy`
    measured now and written there; and whether it was reused. An unreadable record is
    measured again too."""
    settings = {"n_prompts": n_prompts, "samples": samples, "seed": seed, "method": method}
    wanted = Measurement.of(model, tasks, **settings)
    if Path(path).is_file():
        try:
            found = OriginalAccuracy.load(path)
        except MoescopeError:
            found = None
        if found is not None and not found.measurement.differences(wanted):
            return found, True
    frame = original_accuracy(model, tokenizer, tasks, batch_size=batch_size, **settings)
    record = OriginalAccuracy.from_frame(frame, wanted)
    record.save(path)
    return record, False


# --- a figure the user gives -----------------------------------------------------------------------

_FORMS = "one share such as 0.83, or one per task such as add2=0.9,add3=0.7"


def parse_original_accuracy(
    text: str, tasks: tuple[str, ...] | list[Example], *, n_prompts: int = 100
) -> pd.DataFrame:
    """The ``--original-accuracy`` value as the original's accuracy frame over resolved ``tasks``.

    ``"0.83"`` gives every task that share, so the capability check's mean over any of them is
    0.83 (and every task is in its window or none is); ``"add2=0.9,add3=0.7"`` gives each task
    its own and must name every task. The figure is the sampled accuracy for the task suite
    (greedy rows NaN) and the greedy one for a prompt file, the rows the check compares. Shares
    are 0 to 1, not all 0; anything else is one :class:`MoescopeError` sentence with the fix.
    """
    names = _task_names(tasks)
    given = _shares(text, names)
    if all(share == 0 for share in given.values()):
        raise MoescopeError(
            f"--original-accuracy {text!r} says the original solves none of the tasks, so no accuracy "
            "ratio can be measured; give the share it does solve, or leave the flag out to measure it."
        )
    counts = {name: n_prompts for name in names} if isinstance(tasks, tuple) else _line_counts(tasks)
    import pandas as pd

    rows = []
    for name in names:
        if isinstance(tasks, tuple):
            rows.append((name, GREEDY, math.nan, math.nan, counts[name]))
            rows.append((name, SAMPLED, given[name], math.nan, counts[name]))
        else:
            rows.append((name, GREEDY, given[name], math.nan, counts[name]))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _line_counts(examples: list[Example]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ex in examples:
        counts[ex.task] = counts.get(ex.task, 0) + 1
    return counts


def _shares(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """``task → share`` of ``text`` (one bare share: every task), checked against ``names``."""
    if not text.strip():
        raise MoescopeError(f"--original-accuracy is empty; give {_FORMS}.")
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise MoescopeError(f"--original-accuracy {text!r} has an empty part; give {_FORMS}.")
    if len(parts) == 1 and "=" not in parts[0]:
        return dict.fromkeys(names, _share(parts[0], text))
    given: dict[str, float] = {}
    for part in parts:
        task, sep, value = (piece.strip() for piece in part.partition("="))
        if not sep or not task:
            raise MoescopeError(
                f"--original-accuracy {text!r}: {part!r} names no task; write task=share for every task, "
                "or one share alone for all of them."
            )
        if task in given:
            raise MoescopeError(f"--original-accuracy {text!r} gives {task} twice; give each task once.")
        given[task] = _share(value, text, task)
    unknown = [task for task in given if task not in names]
    if unknown:
        raise MoescopeError(
            f"--original-accuracy {text!r} names {', '.join(unknown)}, not among the measured tasks "
            f"({', '.join(names)}); give those tasks' shares, or one share for all."
        )
    missing = [name for name in names if name not in given]
    if missing:
        raise MoescopeError(
            f"--original-accuracy {text!r} gives no share for {', '.join(missing)}; give every measured "
            "task's share, or one share for all."
        )
    return {name: given[name] for name in names}


def _share(value: str, text: str, task: str | None = None) -> float:
    where = f"{task}={value}" if task else value
    try:
        share = float(value)
    except ValueError:
        raise MoescopeError(
            f"--original-accuracy {text!r}: {where!r} is not a number; give {_FORMS}."
        ) from None
    if not 0 <= share <= 1:  # NaN fails too
        raise MoescopeError(
            f"--original-accuracy {text!r}: {where} is outside 0 to 1; give a share (0.83, not 83)."
        )
    return share


# --- which figure an export uses -------------------------------------------------------------------


def cache_root() -> Path:
    """Where moescope keeps what it measured of an original: ``$MOESCOPE_CACHE`` (default
    ``~/.cache/moescope``)."""
    import os

    root = (
        os.environ.get("MOESCOPE_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moescope"
    )
    return Path(root)


def cache_path(model: PreTrainedModel) -> Path:
    """Where an export keeps the original's measured figure when no selection file names a
    place: under :func:`cache_root`, by the model's config hash."""
    return cache_root() / "originals" / config_hash(model.config) / ORIGINAL_ACCURACY_NAME


def export_original_accuracy(
    model: PreTrainedModel,
    tokenizer: Any,
    tasks: tuple[str, ...] | list[Example],
    *,
    given: str | None,
    path: Path | None = None,
    n_prompts: int = 100,
    samples: int = 4,
    seed: int = 0,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The original's accuracy frame an export compares its proxies with, and the manifest's
    record of where it came from: ``given`` (``--original-accuracy``), else teacher-forced in one
    pass and kept at ``path`` (default :func:`cache_path`) for the next export. One estimator
    whether the original is in memory or read a layer at a time, so both reads of the same
    model set the same capability target; the teacher-forced figure is the expectation that
    sampling estimates, without a draw's noise (:mod:`moescope.export.fidelity.original`)."""
    settings = {"n_prompts": n_prompts, "samples": samples, "seed": seed}
    if given is not None:
        return parse_original_accuracy(given, tasks, n_prompts=n_prompts), {"source": "given", "value": given}
    path = path or cache_path(model)
    record, reused = cached_original_accuracy(path, model, tokenizer, tasks, **settings)
    how = "reused" if reused else "measured"
    return record.to_frame(), {"source": f"teacher-forced, {how}", "path": str(path), **settings}
