"""``ExportConfig``: every knob of a proxy export in one dataclass, saved whole in the manifest.

The twin of :class:`~moescope.replay.config.ReplayConfig`. ``export_proxy(model, config, out=...)``
takes one; ``moescope export`` generates its flags (default, type, choices, help) from the fields
declared here; ``moescope.json`` keeps ``config.to_dict()`` under ``"config"``, so a proxy says how
it was made. A config holds what a JSON file can: a selection file, not a
:class:`~moescope.explore.selection.Selection` object; a calibration source, not token ids. Those
two may still be given to an export beside the config (:func:`configure`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from moescope._util.configs import config_from_dict
from moescope._util.flags import flag
from moescope.errors import MoescopeError
from moescope.explore.selection import METHODS, Selection


@dataclass(frozen=True)
class ExportConfig:
    """How a proxy is cut from a model: which experts it keeps, and what is done to it after.

    Selection
        ``keep``: the routed experts kept per layer, a fraction (``0.25``), a ratio (``"1/4"``) or
        a count (``8``); optional with a selection. ``selection``: a ``selection.json`` to reuse
        (e.g. notebook 01's); without one, the experts are chosen by ``method`` with ``seed``.
        ``allow_top_k`` accepts keeping exactly top-k experts (no routing choice left).
    Calibration
        ``calibration`` (``"tasks"``, or a ``.txt`` / ``.jsonl`` file) and ``n_tokens``: the
        routing statistics that ``cluster``, ``frequency`` and ``reap`` choose by.
    Cut
        ``streaming``: cut the safetensors shards without loading the model
        (:func:`~moescope.export.streaming.export.export_streaming`; ``cluster`` clusters the
        weights view, ``frequency`` and ``reap`` need a selection); ``None`` streams when the
        in-memory export would not fit in the memory available now.
    Healing
        ``heal_steps`` of distillation toward the original at ``heal_lr`` (only router rows and
        kept experts train; :func:`moescope.export.healing.heal`).
    Measurement
        ``fidelity``: measure fidelity and run the validity checklist (``True``, or the options
        of :func:`~moescope.export.fidelity.measure.measure_fidelity`). ``tasks``: the tasks of
        the accuracy that healing and fidelity report, and that the checklist's task capability
        compares: ``None`` (the task suite for the toy, none otherwise), ``"toy"``, family names
        or a ``.jsonl`` of ``{"prompt", "answer"}`` lines. Both need the model in memory.
    """

    keep: str | float | int | None = field(
        default=None,
        metadata=flag(
            "experts kept per layer: 0.25, 1/4 or a count like 8",
            metavar="K",
            shown="the --selection's count",
        ),
    )
    selection: str | None = field(
        default=None,
        metadata=flag("a selection.json (e.g. notebook 01's)", metavar="FILE", shown="chosen by --method"),
    )
    method: str = field(default="cluster", metadata=flag("selection method", choices=METHODS))
    seed: int = field(default=0, metadata=flag("seed of the selection, healing and fidelity"))
    calibration: str = field(
        default="tasks", metadata=flag("'tasks' or a .txt/.jsonl file for routing statistics", metavar="SRC")
    )
    n_tokens: int = field(default=20_000, metadata=flag("calibration tokens", metavar="N"))
    allow_top_k: bool = field(default=False, metadata=flag("allow keeping exactly top-k experts"))
    streaming: bool | None = field(
        default=None,
        metadata=flag(
            "cut the safetensors shards without loading the model",
            shown="when the in-memory export would not fit",
        ),
    )
    heal_steps: int = field(
        default=0, metadata=flag("distil the proxy N steps toward the original", metavar="N")
    )
    heal_lr: float = field(default=1e-3, metadata=flag("healing learning rate", metavar="LR"))
    fidelity: bool | dict[str, Any] = field(
        default=True, metadata=flag("measure fidelity and run the validity checklist")
    )
    tasks: str | tuple[str, ...] | None = field(
        default=None,
        metadata=flag(
            'task accuracy on a .jsonl of {"prompt", "answer"} lines',
            metavar="FILE",
            name="--prompts",
            shown="the toy's tasks, none for other models",
        ),
    )

    def __post_init__(self) -> None:
        for name in ("selection", "calibration", "tasks"):  # paths are kept as JSON keeps them
            value = getattr(self, name)
            if isinstance(value, Path):
                object.__setattr__(self, name, str(value))
        if isinstance(self.tasks, list | tuple):
            object.__setattr__(self, "tasks", tuple(self.tasks))
        _check(self)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values, what ``moescope.json`` records under ``"config"``."""
        d = asdict(self)
        d["tasks"] = list(self.tasks) if isinstance(self.tasks, tuple) else self.tasks
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExportConfig:
        """The config of :meth:`to_dict`'s dict (a manifest's ``"config"``); a wrong field is one sentence."""
        return config_from_dict(cls, d, "export")


def _check(c: ExportConfig) -> None:
    """One sentence per impossible setting, naming the fix."""
    if c.method not in METHODS:
        raise MoescopeError(f"unknown selection method {c.method!r}; choose one of {', '.join(METHODS)}.")
    if c.heal_steps < 0:
        raise MoescopeError(
            f"heal_steps={c.heal_steps} must be 0 (no healing) or a positive number of steps."
        )


@dataclass(frozen=True)
class ExportInputs:
    """What an export reads beside its config: the selection and the calibration data in effect
    (a config's file, or an object given in its place), and the config as the manifest records it."""

    selection: Selection | str | None
    calibration: Any
    record: dict[str, Any]

    def objects(self) -> dict[str, Any]:
        """The inputs given as objects rather than in the config, as keywords for another export."""
        objects: dict[str, Any] = {}
        if isinstance(self.selection, Selection):
            objects["selection"] = self.selection
        if _is_data(self.calibration):
            objects["calibration"] = self.calibration
        return objects


def configure(config: ExportConfig | None, options: dict[str, Any]) -> tuple[ExportConfig, ExportInputs]:
    """``config`` (default ``ExportConfig()``) with ``options``, fields given as keywords, put in.

    A :class:`~moescope.explore.selection.Selection` given as ``selection``, or token ids given as
    ``calibration``, stay beside the config: its record names no selection file (the manifest's
    ``"selection"`` holds the selection either way) and says how many rows of token ids.
    """
    options = dict(options)
    selection, data = options.get("selection"), options.get("calibration")
    if isinstance(selection, Selection):
        options["selection"] = None
    if _is_data(data):
        del options["calibration"]
    config = replace(config or ExportConfig(), **options)
    record = config.to_dict()
    if _is_data(data):
        record["calibration"] = f"token ids ({len(data)} rows)"
    given_selection = selection if isinstance(selection, Selection) else config.selection
    return config, ExportInputs(given_selection, data if _is_data(data) else config.calibration, record)


def _is_data(calibration: Any) -> bool:
    """Calibration given as data (token ids) rather than named (``"tasks"`` or a file)."""
    return calibration is not None and not isinstance(calibration, str | Path)
