"""Executed notebook → one standalone HTML page that renders offline.

nbconvert's pages load require.js, MathJax, mermaid and the Jupyter widget manager from CDNs,
so offline they lose every widget. This module renders with ``_static/report.html.j2`` (the
lab template without remote scripts) and inlines, once per page and only when the page needs
it:

* ``require.js`` (87 kB) and ``embed-amd.js`` (3.6 MB), the ``@jupyter-widgets/html-manager``
  build that draws saved widget state (sliders, HTML, Output widgets), when the notebook has
  widget state. They are vendored in ``_static/`` (licences in ``THIRD_PARTY_NOTICES.txt``)
  because no Python package ships them; its CDN fallback for unknown widget modules is pointed
  at a local path, so a page never reaches out to the network.
* anywidget's AMD module (33 kB, read from the installed ``anywidget`` wheel) when a widget is
  an anywidget, e.g. ``alt.JupyterChart``. Each offline JupyterChart carries the whole vega
  bundle in its state; the page swaps that for a few lines that use the page's one bundle.
* the vega-embed bundle (0.9 MB) built by ``vl_convert.javascript_bundle()`` when the page has
  altair charts from the ``moescope`` renderer (:mod:`moescope.display.notebook`). Each chart is
  written as its vl-convert SVG (so it shows even with scripts off) plus its Vega-Lite spec,
  which the bundle turns into an interactive view.

Inlining, rather than files beside the page, keeps each page a single file that opens on its
own (mailed, attached to a CI run), at the price of size: about 5 MB for a page with widgets,
1.2 MB with charts only, 0.3 MB (the lab CSS) with neither. Left out: MathJax (markdown math
shows as source; the notebooks avoid it) and the widget manager's Font Awesome files (icon
buttons lose their icons).
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import re
from pathlib import Path
from typing import Any

STATIC = Path(__file__).with_name("_static")
TEMPLATE = STATIC / "report.html.j2"

WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"
_VEGALITE_MIME = re.compile(r"application/vnd\.vegalite\.v\d+[.+]json")
# Edits to the inlined widget manager, each (text, replacement). Its CDN fallback for widget
# modules it was not given now points at a local path where nothing is, so an unknown widget
# shows an error in its place instead of the page fetching code; the other is a commented-out
# font import, dropped so that no page names a remote host.
_EMBED_EDITS = (
    ('"https://cdn.jsdelivr.net/npm/"', '"./jupyter-widget-modules/"'),
    ("@import url('https://fonts.googleapis.com/css?family=Roboto+Mono');", ""),
)
_JUPYTER_CHART = "altair.jupyter.jupyter_chart.JupyterChart"

_VEGA_UPGRADE = """
document.querySelectorAll("div.moescope-vega").forEach(function (el) {
  var spec = JSON.parse(el.querySelector("script.moescope-vega-spec").textContent);
  var view = document.createElement("div");
  el.appendChild(view);
  window.vegaEmbed(view, spec, {renderer: "svg", actions: false}).then(function () {
    var img = el.querySelector("img");
    if (img) { el.removeChild(img); }
  }).catch(function (err) {
    el.removeChild(view);
    console.warn("moescope: chart kept as static SVG", err);
  });
});
"""


def notebook_html(nb: Any, title: str = "Notebook") -> str:
    """Render an executed notebook (``nbformat.NotebookNode``) as one offline HTML page."""
    from nbconvert import HTMLExporter

    nb = copy.deepcopy(nb)
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE_MIME, {}).get("state", {})
    has_charts = _charts_to_html(nb)
    has_jupyter_charts = _slim_jupyter_charts(state)
    scripts = list(_vega_scripts()) if has_charts or has_jupyter_charts else []
    if state:
        scripts += _widget_scripts(state)
    exporter = HTMLExporter(template_file=str(TEMPLATE))
    resources = {"metadata": {"name": title}, "moescope_scripts": [_inline(script) for script in scripts]}
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    return body


def _charts_to_html(nb: Any) -> bool:
    """Replace each (spec, SVG) chart output by a container the page's vega bundle upgrades."""
    found = False
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            spec_key = next((key for key in data if _VEGALITE_MIME.fullmatch(key)), None)
            if spec_key is None or "image/svg+xml" not in data:
                continue
            output["data"] = {"text/html": _chart_container(data[spec_key], data["image/svg+xml"])}
            found = True
    return found


def _chart_container(spec: Any, svg: str) -> str:
    svg_b64 = base64.b64encode(svg.encode()).decode()
    spec_json = json.dumps(spec).replace("</", "<\\/").replace("<!--", "<\\u0021--")
    return (
        '<div class="moescope-vega">'
        f'<img alt="chart" src="data:image/svg+xml;base64,{svg_b64}">'
        f'<script type="application/json" class="moescope-vega-spec">{spec_json}</script>'
        "</div>"
    )


def widget_scripts() -> dict[str, str]:
    """The scripts that draw saved widget state offline, by file name, in load order: require.js,
    anywidget's AMD module (empty where anywidget's notebook extension is not installed) and the
    widget manager; a page inlines them, a documentation site serves them as files."""
    return {
        "require.js": _static_text("require.js"),
        "anywidget.js": _anywidget_amd() or "",
        "embed-amd.js": _embed_amd(),
    }


def _widget_scripts(state: dict[str, Any]) -> list[str]:
    scripts = widget_scripts()
    if not any(model.get("model_module") == "anywidget" for model in state.values()):
        scripts.pop("anywidget.js")
    return [script for script in scripts.values() if script]


def _slim_jupyter_charts(state: dict[str, Any]) -> bool:
    """Point offline JupyterCharts at the page's vega bundle instead of a copy each (0.9 MB)."""
    charts = [m for m in state.values() if m.get("state", {}).get("_anywidget_id") == _JUPYTER_CHART]
    for model in charts:
        model["state"]["_esm"] = _jupyter_chart_esm()
    return bool(charts)


@functools.cache
def _jupyter_chart_esm() -> str:
    from altair.jupyter.jupyter_chart import load_js_src

    lines = load_js_src().split("\n")
    while lines and (not lines[0].strip() or lines[0].startswith(("import", "//"))):
        lines.pop(0)
    preamble = "const vegaEmbed = window.vegaEmbed;\nconst lodashDebounce = window.lodashDebounce;\n"
    return preamble + "\n".join(lines)


@functools.cache
def _vega_scripts() -> tuple[str, str]:
    """The vega-embed bundle with its globals (JupyterChart's module also wants debounce)."""
    import vl_convert

    exports = "window.vegaEmbed = vegaEmbed; window.vega = vega; window.vegaLite = vegaLite;"
    bundle = vl_convert.javascript_bundle(exports + " window.lodashDebounce = lodashDebounce;")
    return bundle, _VEGA_UPGRADE


@functools.cache
def _embed_amd() -> str:
    source = _static_text("embed-amd.js")
    for text, replacement in _EMBED_EDITS:
        if text not in source:  # pragma: no cover - guards a future vendored version
            raise RuntimeError(f"embed-amd.js no longer contains {text!r}; update moescope.report.html")
        source = source.replace(text, replacement)
    return source


@functools.cache
def _anywidget_amd() -> str | None:
    """anywidget's AMD build, renamed so it can be inlined (an anonymous define needs a file)."""
    from jupyter_core.paths import jupyter_path

    for directory in jupyter_path("nbextensions", "anywidget"):
        path = Path(directory) / "index.js"
        if path.is_file():
            source = path.read_text(encoding="utf-8")
            if source.count("define([") == 1:
                return source.replace("define([", 'define("anywidget", [')
    return None


def _static_text(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


def _inline(script: str) -> str:
    """Make a script safe between ``<script>`` tags (no early ``</script>``)."""
    return script.replace("</script", "<\\/script").replace("<!--", "<\\!--")
