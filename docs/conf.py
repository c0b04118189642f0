"""Sphinx configuration of moescope's documentation site (``make docs``).

Why Sphinx with MyST-NB and the PyData theme: moescope's API is documented in numpy-style
docstrings, which ``autodoc`` + ``napoleon`` render (``_ext`` reshapes their ``name : what``
fields first); MyST-NB renders the executed
notebooks (their SVG charts included) as tutorial pages and lets every page be Markdown; the
PyData theme is what scikit-learn, pandas and xarray readers already know, and it needs no
network at build or at read time. The reference tables (command line, metric vocabulary,
faults and fixes, architectures, log keys) are generated at build time from the code's own
parser and registries by ``_ext/moescope_docs.py``, so none is copied by hand.

The tutorials are the notebooks of ``notebooks/`` as a ``moescope report`` run executed them:
``MOESCOPE_DOCS_REPORT`` names that report directory (``make docs`` reuses ``moescope-demo``,
the directory ``make demo`` writes, and runs the report first when it is missing or older than
the notebooks). A notebook the report lacks is shown unexecuted. Nothing is executed here.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE / "_ext"), str(ROOT)]

import moescope  # noqa: E402
from moescope.report import html as report_html  # noqa: E402

project = "moescope"
author = "the moescope authors"
copyright = "the moescope authors"
release = version = moescope.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
    "moescope_docs",
]

# Where the executed notebooks come from, and where their copies go (git-ignored).
REPORT = Path(os.environ.get("MOESCOPE_DOCS_REPORT", ROOT / "moescope-demo")).resolve()
TUTORIALS = HERE / "tutorials" / "_notebooks"


def _copy_tutorials() -> None:
    """The report's executed notebook where it has one, else the source notebook; a copy that
    is already the same is left alone, so an unchanged tutorial is not read again."""
    TUTORIALS.mkdir(parents=True, exist_ok=True)
    sources = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for stale in set(TUTORIALS.glob("*.ipynb")) - {TUTORIALS / s.name for s in sources}:
        stale.unlink()
    for source in sources:
        executed = REPORT / source.name
        chosen, copy = executed if executed.is_file() else source, TUTORIALS / source.name
        if not copy.is_file() or copy.read_bytes() != chosen.read_bytes():
            shutil.copyfile(chosen, copy)


_copy_tutorials()

exclude_patterns = ["_build", "**.ipynb_checkpoints", "_ext", "_static_widgets"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
# The bench scripts' study pages open at their own heading level; the Vega-Lite spec beside
# each chart's SVG has no renderer here (the SVG is shown, see nb_mime_priority_overrides).
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]

nb_execution_mode = "off"
# The moescope renderer stores each chart as SVG and as its Vega-Lite spec; the SVG is shown.
nb_mime_priority_overrides = [
    ("html", "application/vnd.vegalite.v6+json", None),
    ("html", "application/vnd.vegalite.v5+json", None),
]
# Saved widget state (sliders, JupyterCharts) is drawn by the local widget manager and anywidget
# module that the report's offline pages inline (moescope.report.html), written here as files, so
# a page never reaches out to a CDN.
WIDGET_JS = HERE / "_static_widgets"


def _write_widget_scripts() -> dict[str, dict[str, str]]:
    WIDGET_JS.mkdir(exist_ok=True)
    scripts = report_html.widget_scripts()
    for name, text in scripts.items():
        (WIDGET_JS / name).write_text(text, encoding="utf-8")
    return {name: {} for name in scripts}


nb_ipywidgets_js = _write_widget_scripts()
html_static_path = [str(WIDGET_JS)]

autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_preserve_defaults = True
napoleon_google_docstring = False
napoleon_numpy_docstring = True

html_theme = "pydata_sphinx_theme"
html_title = "moescope"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_sidebars = {"index": []}
