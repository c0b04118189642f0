"""Charts of routing, expert embeddings, selections and replay traces: pure ``result → altair.Chart``.

Every function reads results (:class:`~moescope.explore.routing.RoutingStats`,
:class:`~moescope.explore.embeddings.ExpertEmbeddings`, :class:`~moescope.explore.selection.Selection`,
:class:`~moescope.traces.Trace`, :class:`~moescope.analyze.findings.Finding`), never a model, and
returns a chart of data already aggregated to one value per (layer, expert). The data travel
packed, one row per layer holding a list per column (``expert``, ``load_share``, ...), floats
rounded to three significant digits; the chart's first transform, a Vega-Lite ``flatten``,
turns them into long form, one row per (layer, expert). That keeps a 58-layer × 256-expert
heatmap near 150 kB of spec instead of 800 kB of repeated keys.

- :func:`expert_map` (:mod:`.embeddings`): the 2-D projection of a layer's experts; colour =
  cluster, kept experts filled diamonds, dropped ones hollow circles, size = token share.
- :func:`routing_histogram` (:mod:`.routing`): one layer's load share per expert, optionally
  beside a second model's (a proxy), aligned on original expert ids.
- :func:`routing_heatmap` (:mod:`.routing`): layers × experts overview of the load relative to
  a uniform router.
- :func:`trace_board` (:mod:`.traces`): small multiples of a replay's loss, gradient norm,
  entropy, reward, KL and load CV, a proxy's overlaid, findings marked; one step zoom for all panels.
- :func:`entropy_flow` (:mod:`.entropy`): token entropy by response position × step over the
  mean entropy line and the OPEFO floor.
- :func:`study_chart` (:mod:`.study`): the fidelity study per keep ratio and method.
- :func:`validation_board` (:mod:`.validation`): a targeted validation's faulted and fixed run of
  one model on one step axis, the fault's metrics first; :func:`validation_boards` reads a
  ``moescope validate`` directory.

Traces travel packed the same way, one row per (trace, metric) holding ``step`` and ``value``
lists; a series longer than ``max_points`` keeps each bucket's minimum and maximum, so a
100,000-step trace stays a few hundred kB and spikes survive.

With ``layer=None`` the expert map and the histogram carry every layer and a slider (a
Vega-Lite parameter bound to an input) that picks the layer inside the chart, so they stay
interactive in the static HTML report, with no kernel.

Examples
--------
>>> from moescope.display.charts import routing_heatmap
>>> chart = routing_heatmap(stats)  # doctest: +SKIP
>>> chart.save("heatmap.png")  # doctest: +SKIP
"""

from __future__ import annotations

from moescope.display.charts._common import MODEL_COLOURS
from moescope.display.charts.embeddings import BRUSH, PICK, expert_map
from moescope.display.charts.entropy import NONFINITE_COLOUR, entropy_flow
from moescope.display.charts.routing import routing_heatmap, routing_histogram
from moescope.display.charts.study import study_chart
from moescope.display.charts.traces import DEFAULT_METRICS, ZOOM, trace_board
from moescope.display.charts.validation import validation_board, validation_boards

__all__ = [
    "BRUSH",
    "DEFAULT_METRICS",
    "MODEL_COLOURS",
    "NONFINITE_COLOUR",
    "PICK",
    "ZOOM",
    "entropy_flow",
    "expert_map",
    "routing_heatmap",
    "routing_histogram",
    "study_chart",
    "trace_board",
    "validation_board",
    "validation_boards",
]
