"""The widgets and charts in a real browser: JupyterLab on 127.0.0.1 and static report pages.

Both drive Debian's chromium through Playwright (the ``chromium`` fixture fails when it is
missing; ``.ci/run`` installs it). Nothing may reach the network: requests to any other host
are aborted and must not happen. The harness is ``tests/browser.py``; later widgets extend
:func:`test_notebook_01_widgets_in_jupyterlab` with their own checks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from browser import SLIDER_HANDLE, VEGA_SVG, LabPage, chromium_page, local_only

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOK_01 = "01_explore_clusters.ipynb"
EXPERT_MAP = ".moescope-expert-map"
ROUTING_HISTOGRAM = ".moescope-routing-histogram"

# What the expert map's chart shows: its title and where its points are.
_CHART_CONTENT = """(widget) => {
  const svg = widget.querySelector('.vega-embed svg');
  if (!svg) { return null; }
  const title = svg.querySelector('.role-title-text');
  const points = [...svg.querySelectorAll('.mark-symbol path')].map(p => p.getAttribute('transform'));
  return {title: title ? title.textContent : '', points: points.join(' ')};
}"""


def test_notebook_01_widgets_in_jupyterlab(lab_page: LabPage, tmp_path: Path) -> None:
    timings = _Stopwatch()
    lab_page.open(NOTEBOOK_01)
    timings.lap("open")
    lab_page.run_all()
    timings.lap("run all")

    expert_map = lab_page.wait_for(EXPERT_MAP)
    lab_page.wait_for(f"{EXPERT_MAP} {VEGA_SVG} .mark-symbol path")
    before = lab_page.poll(lambda: expert_map.evaluate(_CHART_CONTENT), lambda c: c and c["points"])
    assert before and "layer 0" in before["title"], before
    handle = expert_map.locator(SLIDER_HANDLE).first
    handle.focus()
    handle.press("ArrowRight")
    after = lab_page.poll(
        lambda: expert_map.evaluate(_CHART_CONTENT), lambda c: c and c["title"] != before["title"]
    )
    assert "layer 1" in after["title"], after
    assert after["points"] and after["points"] != before["points"], "the points did not move"
    timings.lap("expert map")

    histogram = lab_page.wait_for(ROUTING_HISTOGRAM)
    lab_page.wait_for(f"{ROUTING_HISTOGRAM} {VEGA_SVG} .mark-rect path")
    histogram.get_by_role("button", name="sort by load").click()
    titles = lab_page.poll(
        lambda: histogram.locator(".role-axis-title").all_text_contents(),
        lambda texts: "expert, busiest first" in texts,
    )
    assert "expert, busiest first" in titles, titles
    timings.lap("histogram")

    expert_map.scroll_into_view_if_needed()
    expert_map.screenshot(path=tmp_path / "expert_map.png")
    lab_page.page.screenshot(path=tmp_path / "jupyterlab.png")
    assert lab_page.blocked == []
    print(f"JupyterLab notebook 01: {timings}; screenshots in {tmp_path}")


def test_report_page_charts_and_widgets_offline(explore_results, chromium: str, tmp_path: Path) -> None:
    """A report page as ``moescope report`` writes it: all-layer charts whose own slider works
    without a kernel, and an ExpertMap widget from saved state."""
    page_path = tmp_path / "page.html"
    page_path.write_text(_report_page(explore_results), encoding="utf-8")

    with chromium_page(chromium) as page:
        remote = local_only(page, ("file:", "data:", "blob:"))
        page.goto(page_path.as_uri())
        page.wait_for_selector(f"{EXPERT_MAP} {VEGA_SVG} .mark-symbol path", timeout=60_000)
        first_chart = page.locator(".moescope-vega").first
        first_chart.locator("svg .mark-symbol path").first.wait_for(timeout=60_000)
        assert "layer 0" in first_chart.locator(".role-title-text").first.text_content()
        first_chart.locator("input[type=range]").focus()
        page.keyboard.press("ArrowRight")
        title = "document.querySelector('.moescope-vega .role-title-text').textContent"
        page.wait_for_function(f"() => {title}.includes('layer 1')", timeout=10_000)
        page.screenshot(path=tmp_path / "report_page.png", full_page=True)
    assert remote == []


TRACE_BOARD = ".moescope-trace-board"
ENTROPY_FLOW = ".moescope-entropy-flow"
TRACE_NOTEBOOK = "trace_widgets.ipynb"

# The trace widgets draw on a canvas (see moescope.display.widgets.TRACE_EMBED_OPTIONS): per colour
# ("#rrggbb"), how many of its pixels are near it, and a checksum of the whole image.
_CANVAS = """(widget, colours) => {
  const canvas = widget.querySelector('.vega-embed canvas');
  if (!canvas || !canvas.width) { return null; }
  const {data} = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height);
  const rgb = colours.map(c => [1, 3, 5].map(i => parseInt(c.slice(i, i + 2), 16)));
  const counts = rgb.map(() => 0);
  let sum = 0;
  for (let i = 0; i < data.length; i += 4) {
    sum = (sum * 31 + data[i] + 7 * data[i + 1] + 13 * data[i + 2]) % 1000000007;
    rgb.forEach((c, k) => {
      const off = Math.abs(data[i] - c[0]) + Math.abs(data[i + 1] - c[1]) + Math.abs(data[i + 2] - c[2]);
      if (off < 30) { counts[k] += 1; }
    });
  }
  return {counts, sum};
}"""
# The ``d`` of every line path of an SVG chart.
_LINES = "(el) => [...el.querySelectorAll('svg .mark-line path')].map(p => p.getAttribute('d'))"
# Where the first panel's plot area of a trace board is, from the chart's top-left corner (px).
_FIRST_PANEL = (170, 170)


def test_trace_widgets_in_jupyterlab(lab_page: LabPage, toy_trace, tmp_path: Path) -> None:
    """TraceBoard and EntropyFlow of a real replay drawn offline: both traces and the findings
    show, the wheel zooms the steps, the step-range slider redraws."""
    from moescope.display.charts import MODEL_COLOURS, NONFINITE_COLOUR

    timings = _Stopwatch()
    nbformat.write(_trace_notebook(toy_trace.path), lab_page.lab.root / TRACE_NOTEBOOK)
    lab_page.open(TRACE_NOTEBOOK)
    lab_page.run_all()
    timings.lap("open and run")

    canvas = lab_page.wait_for(f"{TRACE_BOARD} .vega-embed canvas")
    board = lab_page.page.locator(TRACE_BOARD).first
    colours = [*MODEL_COLOURS, NONFINITE_COLOUR]  # original, proxy, the error finding's rule
    drawn = lab_page.poll(lambda: board.evaluate(_CANVAS, colours), lambda c: c and min(c["counts"]) > 20)
    assert drawn and min(drawn["counts"]) > 20, drawn
    box = canvas.bounding_box()
    lab_page.page.mouse.move(box["x"] + _FIRST_PANEL[0], box["y"] + _FIRST_PANEL[1])
    lab_page.page.mouse.wheel(0, -400)
    zoomed = lab_page.poll(lambda: board.evaluate(_CANVAS, colours), lambda c: c["sum"] != drawn["sum"])
    assert zoomed["sum"] != drawn["sum"], "the wheel did not zoom"
    timings.lap("trace board")

    lab_page.wait_for(f"{ENTROPY_FLOW} .vega-embed canvas")
    flow = lab_page.page.locator(ENTROPY_FLOW).first
    red = lab_page.poll(lambda: flow.evaluate(_CANVAS, [NONFINITE_COLOUR]), lambda c: c and c["counts"][0])
    assert red and red["counts"][0] > 100, "the NaN step's heatmap column"
    handle = flow.locator(SLIDER_HANDLE).first  # the range's lower end
    handle.focus()
    handle.press("ArrowRight")  # steps 1-5: five columns share the width, the NaN one widens
    wider = lab_page.poll(
        lambda: flow.evaluate(_CANVAS, [NONFINITE_COLOUR]),
        lambda c: c["counts"][0] > 1.1 * red["counts"][0],
    )
    assert wider["counts"][0] > 1.1 * red["counts"][0], (red, wider)
    timings.lap("entropy flow")

    board.screenshot(path=tmp_path / "trace_board.png")
    flow.screenshot(path=tmp_path / "entropy_flow.png")
    assert lab_page.blocked == []
    print(f"JupyterLab trace widgets: {timings}; screenshots in {tmp_path}")


def test_report_page_trace_charts_and_widgets_offline(toy_trace, chromium: str, tmp_path: Path) -> None:
    """A report page with a trace board chart, whose wheel zoom moves every panel without a
    kernel, and TraceBoard and EntropyFlow widgets drawn from saved state."""
    from moescope.display.charts import MODEL_COLOURS, NONFINITE_COLOUR, trace_board
    from moescope.display.notebook import chart_mimebundle
    from moescope.display.widgets import EntropyFlow, TraceBoard
    from moescope.report.html import notebook_html

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("trace_board(trace)")
    cell.outputs = [
        nbformat.v4.new_output("display_data", data=chart_mimebundle(trace_board(toy_trace).to_dict()))
    ]
    nb.cells.append(cell)
    _show_saved_widgets(
        nb, {"TraceBoard(trace)": TraceBoard(toy_trace), "EntropyFlow(trace)": EntropyFlow(toy_trace)}
    )
    page_path = tmp_path / "traces.html"
    page_path.write_text(notebook_html(nb, title="traces"), encoding="utf-8")

    with chromium_page(chromium) as page:
        remote = local_only(page, ("file:", "data:", "blob:"))
        page.goto(page_path.as_uri())
        chart = page.locator(".moescope-vega .vega-embed").first
        chart.locator("svg .mark-line path").first.wait_for(timeout=60_000)
        before = chart.evaluate(_LINES)
        assert len(before) == 6, "one line per panel"
        box = chart.bounding_box()
        page.mouse.move(box["x"] + _FIRST_PANEL[0], box["y"] + _FIRST_PANEL[1])
        page.mouse.wheel(0, -400)
        page.wait_for_function(
            f"(before) => ({_LINES})(document.querySelector('.moescope-vega .vega-embed'))"
            ".every((d, i) => d !== before[i])",
            arg=before,
            timeout=10_000,
        )
        for selector, colour in ((TRACE_BOARD, MODEL_COLOURS[0]), (ENTROPY_FLOW, NONFINITE_COLOUR)):
            page.locator(f"{selector} .vega-embed canvas").first.wait_for(timeout=60_000)
            drawn = f"(w) => {{ const c = ({_CANVAS})(w, [{colour!r}]); return c && c.counts[0] > 20; }}"
            widget = page.locator(selector).first.element_handle()
            page.wait_for_function(drawn, arg=widget, timeout=30_000)
        page.screenshot(path=tmp_path / "traces_page.png", full_page=True)
    assert remote == []


def _trace_notebook(trace_path: Path) -> nbformat.NotebookNode:
    """Both trace widgets of a replay trace, with a proxy overlay made from its first steps."""
    cells = [
        "import moescope\n"
        "from moescope.analyze.findings import Finding\n"
        "from moescope.traces import Trace, read_trace\n"
        "from moescope.display.widgets import EntropyFlow, TraceBoard\n"
        "moescope.setup_notebook()",
        f"trace = read_trace({str(trace_path)!r})\n"
        "proxy = Trace({**trace.header, 'proxy': {'keep': 0.5}}, trace.steps[:5])\n"
        "findings = [Finding('nonfinite', 3, 'error', 'NaN loss at step 3')]",
        "TraceBoard(trace, proxy, findings, findings)",
        "EntropyFlow(trace, floor=0.3, findings=[Finding('entropy_surge', 4, 'warning', 'entropy jumps')])",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _report_page(results) -> str:
    """The offline HTML of a notebook showing the all-layer expert map and histogram and an ExpertMap."""
    from moescope.display.charts import expert_map, routing_histogram
    from moescope.display.notebook import chart_mimebundle
    from moescope.display.widgets import ExpertMap
    from moescope.report.html import notebook_html

    nb = nbformat.v4.new_notebook()
    for chart in (
        expert_map(results.embeddings, results.selection, results.stats),
        routing_histogram(results.stats, results.proxy, selection=results.selection),
    ):
        cell = nbformat.v4.new_code_cell("chart")
        cell.outputs = [nbformat.v4.new_output("display_data", data=chart_mimebundle(chart.to_dict()))]
        nb.cells.append(cell)
    _show_saved_widgets(
        nb, {"ExpertMap(...)": ExpertMap(results.embeddings, results.selection, results.stats)}
    )
    return notebook_html(nb, title="charts")


def _show_saved_widgets(nb: nbformat.NotebookNode, widgets: dict[str, Any]) -> None:
    """Append a cell per widget (source → widget) showing it from saved state, as papermill leaves it."""
    import ipywidgets.embed

    from moescope.report.html import WIDGET_STATE_MIME

    views = list(widgets.values())
    state = ipywidgets.embed.dependency_state(views, drop_defaults=False)
    data = ipywidgets.embed.embed_data(views=views, state=state)
    for source, spec in zip(widgets, data["view_specs"], strict=True):
        cell = nbformat.v4.new_code_cell(source)
        view = {"application/vnd.jupyter.widget-view+json": spec}
        cell.outputs = [nbformat.v4.new_output("display_data", data=view)]
        nb.cells.append(cell)
    nb.metadata["widgets"] = {WIDGET_STATE_MIME: json.loads(json.dumps(data["manager_state"]))}


class _Stopwatch:
    def __init__(self) -> None:
        self.start = self.last = time.monotonic()
        self.laps: list[str] = []

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps.append(f"{name} {now - self.last:.1f} s")
        self.last = now

    def __str__(self) -> str:
        return ", ".join(self.laps) + f" (total {time.monotonic() - self.start:.1f} s)"
