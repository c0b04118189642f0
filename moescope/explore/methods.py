"""The selection methods, in one registry: what each reads, how it behaves, and what runs it.

Every step that depends on the method asks the registry instead of comparing names:
:func:`~moescope.explore.clustering.select_experts` runs the method's selector; an export's plan
gathers exactly what the chosen method(s) :attr:`~Method.needs` (one calibration forward pass for
the routing sums, a backward pass for Taylor scores, the weights for the clustered embeddings);
``method="auto"`` compares :func:`auto_candidates`; the command line's ``--method`` choices and
the refusal of an unknown name come from :func:`method_names` and :func:`method`.

A selector is named as ``"module:function"`` (as packaging names entry points), so reading the
registry imports neither scikit-learn nor torch; :meth:`Method.selector` imports it when a
selection runs.

Examples
--------
>>> method("reap").needs == {SALIENCY}, method("taylor").backward
(True, True)
>>> [m.name for m in auto_candidates()]
['paper', 'reap', 'taylor']
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from moescope.errors import MoescopeError

# What a method reads, gathered by the export's plan.
COUNTS = "routing counts"
SALIENCY = "REAP saliency"
COACTIVATION = "co-activation"
CONTEXT = "routed context"
ROUTERS = "router rows"
TAYLOR = "Taylor gate gradients"
WEIGHTS = "weights"

ROUTING_SUMS = frozenset({COUNTS, SALIENCY, COACTIVATION, CONTEXT})
"""What one calibration forward pass sums (:func:`~moescope.explore.routing.collect_routing`)."""

AUTO = "auto"
"""The export method that measures each of :func:`auto_candidates` and keeps the best
(:mod:`moescope.export.method_choice`); not a selection method itself."""

_SELECTORS = "moescope.explore.clustering"


@dataclass(frozen=True)
class Method:
    """One selection method, as every step that depends on it reads it.

    Attributes
    ----------
    name : what ``method=`` says (a selection's ``method``).
    score : what the selection's per-expert scores mean.
    needs : what it reads of the model beside the routing rules: routing sums of a calibration
        pass (:data:`ROUTING_SUMS`), router rows, Taylor gate gradients, or the expert weights
        (for the clustered embeddings); nothing for a seeded draw.
    deterministic : the same model and data keep the same experts whatever the seed, so an
        original read in memory or a layer at a time gives the same selection.
    sequential : the layer-sequential gatherer (an original read a decoder layer at a time)
        gathers what it needs.
    one_read : the one-read shard cut chooses by it while it copies (the weight view, clustered
        layer by layer), running no model.
    auto_candidate : ``method="auto"`` measures it, in registry order.
    views : it fuses the paper's distance views (``views=`` and ``view_weights=`` apply).
    selector : ``"module:function"`` of ``request → (layers, view, params)``.
    """

    name: str
    score: str
    needs: frozenset[str]
    deterministic: bool
    selector: str
    sequential: bool = True
    one_read: bool = False
    auto_candidate: bool = False
    views: bool = False

    @property
    def forward(self) -> bool:
        """Whether it needs a calibration forward pass through the model."""
        return bool(self.needs & (ROUTING_SUMS | {ROUTERS, TAYLOR}))

    @property
    def backward(self) -> bool:
        """Whether it needs a backward pass (Taylor gate gradients)."""
        return TAYLOR in self.needs

    def select(self, request: Any) -> Any:
        """Run the selector on a request (:func:`~moescope.explore.clustering.select_experts`'s)."""
        module, _, function = self.selector.partition(":")
        selector: Callable[[Any], Any] = getattr(importlib.import_module(module), function)
        return selector(request)


_REGISTRY = (
    Method(
        "cluster",
        "negative distance to the cluster centre",
        frozenset({WEIGHTS, COUNTS, COACTIVATION}),
        deterministic=False,
        selector=f"{_SELECTORS}:select_clustered",
        one_read=True,
    ),
    Method(
        "paper",
        "routed contribution: gate weight × expert output norm summed over routed tokens",
        frozenset({ROUTERS, COACTIVATION, CONTEXT, SALIENCY}),
        deterministic=True,
        selector=f"{_SELECTORS}:select_paper",
        auto_candidate=True,
        views=True,
    ),
    Method(
        "frequency",
        "routed tokens",
        frozenset({COUNTS}),
        deterministic=True,
        selector=f"{_SELECTORS}:select_most_routed",
    ),
    Method(
        "reap",
        "REAP saliency: mean gate weight × expert output norm over routed tokens",
        frozenset({SALIENCY}),
        deterministic=True,
        selector=f"{_SELECTORS}:select_most_salient",
        auto_candidate=True,
    ),
    Method(
        "taylor",
        "Taylor importance: |d log-likelihood of a sequence's scored tokens / d expert output|, summed",
        frozenset({TAYLOR}),
        deterministic=True,
        selector=f"{_SELECTORS}:select_taylor",
        auto_candidate=True,
    ),
    Method(
        "random",
        "uniform random draw",
        frozenset(),
        deterministic=False,
        selector=f"{_SELECTORS}:select_random",
    ),
)

METHODS: dict[str, Method] = {m.name: m for m in _REGISTRY}
"""Every selection method by name, in the order the command line lists them."""


def method_names(*, auto: bool = False) -> tuple[str, ...]:
    """The selection methods' names (with ``auto`` first: an export's choices)."""
    return ((AUTO,) if auto else ()) + tuple(METHODS)


def method(name: str) -> Method:
    """The method called ``name``, or one sentence naming the choices."""
    check_method(name)
    return METHODS[name]


def check_method(name: Any, *, auto: bool = False) -> str:
    """``name`` when it names a selection method (or, with ``auto``, is ``auto``), else one
    sentence naming the choices."""
    choices = method_names(auto=auto)
    if name not in choices:
        raise MoescopeError(f"unknown selection method {name!r}; choose one of {', '.join(choices)}.")
    return name


def auto_candidates(*, backward: bool = True) -> tuple[Method, ...]:
    """The methods ``auto`` compares, in registry order; without ``backward`` (a model whose
    experts Taylor scores cannot take away), those needing no backward pass."""
    return tuple(m for m in METHODS.values() if m.auto_candidate and (backward or not m.backward))


def needs_of(methods: Iterable[Method]) -> frozenset[str]:
    """What a plan running ``methods`` gathers: the union of their needs."""
    return frozenset().union(*(m.needs for m in methods))
