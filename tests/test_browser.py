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


def _report_page(results) -> str:
    """The offline HTML of a notebook showing the all-layer expert map and histogram and an ExpertMap."""
    import ipywidgets.embed

    from moescope._html import WIDGET_STATE_MIME, notebook_html
    from moescope._notebook import chart_mimebundle
    from moescope.charts import expert_map, routing_histogram
    from moescope.widgets import ExpertMap

    nb = nbformat.v4.new_notebook()
    for chart in (
        expert_map(results.embeddings, results.selection, results.stats),
        routing_histogram(results.stats, results.proxy, selection=results.selection),
    ):
        cell = nbformat.v4.new_code_cell("chart")
        cell.outputs = [nbformat.v4.new_output("display_data", data=chart_mimebundle(chart.to_dict()))]
        nb.cells.append(cell)
    widget = ExpertMap(results.embeddings, results.selection, results.stats)
    state = ipywidgets.embed.dependency_state([widget], drop_defaults=False)
    data = ipywidgets.embed.embed_data(views=[widget], state=state)
    cell = nbformat.v4.new_code_cell("ExpertMap(...)")
    view = {"application/vnd.jupyter.widget-view+json": data["view_specs"][0]}
    cell.outputs = [nbformat.v4.new_output("display_data", data=view)]
    nb.cells.append(cell)
    nb.metadata["widgets"] = {WIDGET_STATE_MIME: json.loads(json.dumps(data["manager_state"]))}
    return notebook_html(nb, title="charts")


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
