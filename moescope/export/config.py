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
from moescope.explore.methods import check_method, method_names
from moescope.explore.paper import DEFAULT_VIEWS, SIGMOID_VIEWS, paper_views
from moescope.explore.selection import Selection
from moescope.export.fidelity import CAPABILITY_THRESHOLD
from moescope.export.method_choice import AUTO_CANDIDATES, AUTO_METHOD, FALLBACK
from moescope.keep import AUTO
from moescope.models.tasks import family_names

EXPORT_METHODS = method_names(auto=True)
"""What an export may choose by: a selection method, or ``auto``, the best of
:data:`~moescope.export.method_choice.AUTO_CANDIDATES` measured (:mod:`moescope.export.method_choice`)."""

DEFAULT_METHOD = AUTO_METHOD
"""What an in-memory export chooses by unless told: whichever of ``paper``, ``reap`` and ``taylor``
keeps the most task skill on this model and calibration, measured; ``paper`` where nothing can be
measured. In the fidelity study no one method led at every keep (the documentation's *The
fidelity studies*)."""


@dataclass(frozen=True)
class ExportConfig:
    """How a proxy is cut from a model: which experts it keeps, and what is done to it after.

    Selection
        ``keep``: the routed experts kept per layer, a fraction (``0.25``), a ratio (``"1/4"``) or
        a count (``8``), or ``"auto"``: the smallest share from 1/8 to 1/2 whose proxy reaches
        ``min_capability`` (:func:`moescope.export.targeting.search_keep`); optional with a
        selection. ``selection``: a ``selection.json`` to reuse (e.g. notebook 01's); without
        one, the experts are chosen by ``method`` with ``seed`` (``None``: ``"auto"``,
        :data:`DEFAULT_METHOD`); ``"auto"`` cuts a proxy with each
        of ``paper``, ``reap`` and ``taylor`` and keeps the one that keeps the most task skill,
        measured (:mod:`moescope.export.method_choice`).
        ``views`` and ``view_weights`` (method ``paper``; :mod:`moescope.explore.paper`): the
        distance views fused (``None``: router and context under a sigmoid router, the router
        view alone otherwise; :func:`~moescope.explore.paper.default_views`) and one weight per
        view (default 1 each; give the views with them); a comma-separated string is split.
        ``allow_top_k`` accepts keeping exactly top-k experts (no routing choice left).
    Calibration
        ``calibration`` and ``n_tokens``: the tokens of the routing statistics that ``cluster``,
        ``frequency`` and ``reap`` choose by, that ``taylor`` scores (the completions of RL data,
        every token of other data) and that healing trains on: ``"rl"``, the RL
        replay's prompts (the task suite, or the ``tasks`` prompt file) with the model's own
        sampled completions (:mod:`moescope.explore.rl_data`), ``"tasks"`` (the task suite's
        prompts and answers), or a ``.txt`` / ``.jsonl`` file.
    Cut
        ``streaming``: where the original is read (:mod:`moescope.export.gather`): ``True``, a
        decoder layer at a time (layer-sequential), the proxy cut from its shards; ``False``,
        loaded whole; ``None``, layer-sequential when the original and a proxy would not fit
        ``max_memory`` (bytes or ``"24GB"``, as accelerate's ``max_memory``; default the memory
        available now). Every method, healing and measurement run either way, on the same data;
        a proxy healed is loaded whole, one only measured is read a layer at a time from its
        cut where it does not fit beside the original's layer. ``method="cluster"`` with
        ``streaming=True`` instead clusters the weight view in one read of the shards
        (:func:`~moescope.export.streaming.export.export_streaming`) and measures nothing.
    Compute
        ``device``: where the original and the proxy run (:mod:`moescope.models.device`):
        ``"cpu"``, ``"cuda:N"``, or ``"cuda"``, every GPU (an original in memory placed over
        them by accelerate, ``max_memory`` each; a layer-sequential one runs its resident layer
        on the first); ``None``, a GPU when one is present, else the CPU. ``dtype``: ``"float32"``,
        ``"bfloat16"``, ``"float16"`` or ``"auto"`` (the checkpoint's own); ``None``, the rule of
        :func:`~moescope.models.device.default_dtype` (bfloat16 on a GPU that computes it
        natively, the checkpoint's own on the CPU). Both are checked before any weight is read.
    Healing
        ``heal_steps`` of distillation toward the original at ``heal_lr`` (only router rows and
        kept experts train; :func:`moescope.export.healing.heal`). Capability target
        (:mod:`moescope.export.targeting`): while the proxy's accuracy ratio is under
        ``min_capability`` (``0``: no target), heal ``heal_round`` more steps and measure again,
        up to ``heal_budget`` steps; the checklist's capability check then asks for
        ``min_capability``. It needs tasks to measure and ``fidelity`` on; where either is
        missing the manifest says the target was not measured. ``original_accuracy``: the
        original's figure when known (``"0.83"``, or ``"add2=0.9,add3=0.7"``), else measured
        teacher-forced in one pass (:mod:`moescope.export.fidelity.original`), in memory or a
        layer at a time alike, and kept for the next export.
    Measurement
        ``fidelity``: measure fidelity and run the validity checklist (``True``, or the options
        of :func:`~moescope.export.fidelity.measure.measure_fidelity`). ``tasks``: the tasks of
        the accuracy that healing and fidelity report, and that the checklist's task capability
        compares: ``None`` (the task suite for the embedded models ``toy`` and ``toy-v3``, none
        otherwise), ``"toy"`` (the task suite), family names or a ``.jsonl`` of
        ``{"prompt", "answer"}`` lines. Both need the model in memory.
    """

    keep: str | float | int | None = field(
        default=None,
        metadata=flag(
            "experts kept per layer: 0.25, 1/4, a count like 8, or auto (the smallest share "
            "reaching --min-capability)",
            metavar="K",
            shown="the --selection's count",
        ),
    )
    selection: str | None = field(
        default=None,
        metadata=flag("a selection.json (e.g. notebook 01's)", metavar="FILE", shown="chosen by --method"),
    )
    method: str | None = field(
        default=None,
        metadata=flag(
            "selection method",
            choices=EXPORT_METHODS,
            shown=f"{DEFAULT_METHOD}: the best of {', '.join(AUTO_CANDIDATES)} on the tasks, "
            f"{FALLBACK} without tasks",
        ),
    )
    views: str | tuple[str, ...] | None = field(
        default=None,
        metadata=flag(
            "--method paper (and auto's paper candidate): the distance views fused, of router, "
            "coactivation, context",
            metavar="V,V",
            shown=f"{','.join(SIGMOID_VIEWS)} for a sigmoid router, else {','.join(DEFAULT_VIEWS)}",
        ),
    )
    view_weights: str | tuple[float, ...] | None = field(
        default=None,
        metadata=flag("--method paper: one weight per view", metavar="W,W", shown="1 per view"),
    )
    seed: int = field(default=0, metadata=flag("seed of the selection, healing and fidelity"))
    calibration: str = field(
        default="rl",
        metadata=flag(
            "routing statistics and healing on 'rl' (the replay's prompts + the model's own samples), "
            "'tasks' or a .txt/.jsonl file",
            metavar="SRC",
        ),
    )
    n_tokens: int = field(default=20_000, metadata=flag("calibration tokens", metavar="N"))
    allow_top_k: bool = field(default=False, metadata=flag("allow keeping exactly top-k experts"))
    streaming: bool | None = field(
        default=None,
        metadata=flag(
            "read the original a decoder layer at a time and cut the proxy from its shards",
            shown="when the original and a proxy would not fit --max-memory",
        ),
    )
    max_memory: str | None = field(
        default=None,
        metadata=flag(
            "memory the weights may take, as accelerate's max_memory (24GB, 4MB): an original that "
            "does not fit beside a proxy is read a decoder layer at a time",
            metavar="SIZE",
            shown="the memory available",
        ),
    )
    device: str | None = field(
        default=None,
        metadata=flag(
            "where the model runs: cpu, cuda (every GPU, placed by accelerate) or cuda:N",
            metavar="D",
            shown="a GPU when one is present, else cpu",
        ),
    )
    dtype: str | None = field(
        default=None,
        metadata=flag(
            "compute dtype: float32, bfloat16, float16 or auto (the checkpoint's own)",
            metavar="DTYPE",
            shown="bfloat16 on a GPU of compute capability 8+, the checkpoint's own on cpu",
        ),
    )
    heal_steps: int = field(
        default=0, metadata=flag("distil the proxy N steps toward the original", metavar="N")
    )
    heal_lr: float = field(default=1e-3, metadata=flag("healing learning rate", metavar="LR"))
    min_capability: float = field(
        default=CAPABILITY_THRESHOLD,
        metadata=flag("heal in rounds until the proxy keeps this accuracy ratio; 0: off", metavar="R"),
    )
    original_accuracy: str | None = field(
        default=None,
        metadata=flag(
            "the original's sampled accuracy, if known: one share (0.83) or one per task "
            "(add2=0.9,add3=0.7); not measured then",
            metavar="ACC",
            shown="measured teacher-forced and cached",
        ),
    )
    heal_budget: int = field(
        default=400, metadata=flag("most healing steps spent reaching --min-capability", metavar="STEPS")
    )
    heal_round: int = field(
        default=50, metadata=flag("healing steps between two measurements", metavar="STEPS")
    )
    fidelity: bool | dict[str, Any] = field(
        default=True, metadata=flag("measure fidelity and run the validity checklist")
    )
    tasks: str | tuple[str, ...] | None = field(
        default=None,
        metadata=flag(
            "task accuracy and rl calibration on task families (add2,add3) or a .jsonl of "
            '{"prompt", "answer"} lines',
            metavar="SRC",
            name="--prompts",
            shown="the task suite for toy and toy-v3, none for other models",
        ),
    )

    def __post_init__(self) -> None:
        for name in ("selection", "calibration", "tasks"):  # paths are kept as JSON keeps them
            value = getattr(self, name)
            if isinstance(value, Path):
                object.__setattr__(self, name, str(value))
        named = family_names(self.tasks) if isinstance(self.tasks, str) else None
        if named:  # the command line's add2,add3
            object.__setattr__(self, "tasks", named)
        if isinstance(self.tasks, list | tuple):
            object.__setattr__(self, "tasks", tuple(self.tasks))
        if self.views is not None:  # None: the router's default views, chosen at selection
            views, weights = paper_views(self.views, self.view_weights)  # refuses a bad view or weight
            object.__setattr__(self, "views", views)
            object.__setattr__(self, "view_weights", None if self.view_weights is None else weights)
        elif self.view_weights is not None:
            raise MoescopeError(
                "view weights were given without the views they weigh; name them too, "
                "e.g. --views router,context --view-weights 2,1."
            )
        _check(self)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values, what ``moescope.json`` records under ``"config"``."""
        d = asdict(self)
        d["tasks"] = list(self.tasks) if isinstance(self.tasks, tuple) else self.tasks
        d["views"] = None if self.views is None else list(self.views)
        d["view_weights"] = None if self.view_weights is None else list(self.view_weights)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExportConfig:
        """The config of :meth:`to_dict`'s dict (a manifest's ``"config"``); a wrong field is one sentence."""
        return config_from_dict(cls, d, "export")


def _check(c: ExportConfig) -> None:
    """One sentence per impossible setting, naming the fix."""
    if c.method is not None:
        check_method(c.method, auto=True)
    if c.heal_steps < 0:
        raise MoescopeError(
            f"heal_steps={c.heal_steps} must be 0 (no healing) or a positive number of steps."
        )
    _check_target(c)
    if c.keep == AUTO:
        _check_auto(c)


def _check_target(c: ExportConfig) -> None:
    if isinstance(c.min_capability, bool) or not 0 <= c.min_capability <= 1:
        raise MoescopeError(
            f"min_capability={c.min_capability!r} is no accuracy ratio; give one from 0 (no target) to 1."
        )
    for name in ("heal_budget", "heal_round"):
        value = getattr(c, name)
        if c.min_capability > 0 and (isinstance(value, bool) or value <= 0):
            raise MoescopeError(
                f"{name}={value!r} leaves no healing to reach min_capability={c.min_capability:g}; "
                "give a positive number of steps, or min_capability 0 for no target."
            )


def _check_auto(c: ExportConfig) -> None:
    """``keep="auto"`` measures each candidate: it needs a target, tasks and the model in memory."""
    problems = (
        (c.min_capability == 0, "a capability target; give min_capability above 0"),
        (c.tasks == (), 'a task to measure; give tasks (e.g. "toy") or a prompt file'),
        (c.selection is not None, "to choose the experts; drop the selection (it fixes the count)"),
        (c.heal_steps > 0, "to heal each candidate itself; drop heal_steps (heal_budget bounds it)"),
        (not c.fidelity, "the fidelity measurement; drop no-fidelity"),
    )
    for bad, needs in problems:
        if bad:
            raise MoescopeError(f"keep=auto needs {needs}.")


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


def resolve_method(
    config: ExportConfig, inputs: ExportInputs, default: str = DEFAULT_METHOD
) -> tuple[ExportConfig, ExportInputs]:
    """The config and its manifest record with the selection method in effect: the one asked for,
    else ``default`` (:data:`DEFAULT_METHOD`; the one-read shard cut of
    :func:`~moescope.export.streaming.export.export_streaming` passes
    :data:`~moescope.explore.selection.STREAMING_METHOD`, which needs no forward pass)."""
    method = config.method or default
    return replace(config, method=method), replace(inputs, record={**inputs.record, "method": method})
