"""Set-up every moescope notebook runs first: offline charts and a quiet kernel.

Altair's default renderer loads vega from a CDN, so offline a chart is an empty box. The
``moescope`` renderer registered here returns a mimebundle with two entries:

* ``image/svg+xml`` drawn in the kernel by vl-convert: it shows in JupyterLab (trusted or
  not), in VS Code, on GitHub and in nbconvert output, with no JavaScript and no network;
* the Vega-Lite spec under ``application/vnd.vegalite.v6+json`` (nbformat stores JSON only
  under ``+json`` keys; JupyterLab 4.6 renders v3-v5 specs, so it shows the SVG), which
  :mod:`moescope.report.html` turns into an interactive vega view (tooltips, selections) in the
  report's HTML pages, with the vega bundle inlined once per page.

For charts that talk back to Python (``alt.JupyterChart`` inside ipywidgets), the set-up also
switches ``JupyterChart`` to its offline bundle (on first use: building it takes ~2 s), so those
work in JupyterLab without a network.

Examples
--------
>>> from moescope.display.notebook import setup_notebook
>>> setup_notebook()  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from typing import Any

from moescope.errors import MoescopeError

RENDERER = "moescope"

# Quiet library defaults; they take effect for libraries imported after setup_notebook().
QUIET_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# Libraries whose warnings are about their own internals, not about the user's analysis.
_QUIET_MODULES = ("transformers", "torch", "huggingface_hub", "umap", "sklearn", "numba", "tqdm")


def setup_notebook(*, charts: bool = True, quiet: bool = True) -> None:
    """Prepare a kernel for moescope notebooks; call it in a notebook's first code cell.

    Parameters
    ----------
    charts
        Enable the offline ``moescope`` altair renderer and offline ``JupyterChart``.
    quiet
        Silence third-party warnings, logs and download progress bars.
    """
    if quiet:
        _quiet()
    if charts:
        enable_offline_charts()


def enable_offline_charts() -> None:
    """Render altair charts without a CDN, as static SVG plus the spec for the HTML report."""
    alt = _import_altair()
    if RENDERER not in alt.renderers.names():
        alt.renderers.register(RENDERER, chart_mimebundle)
    alt.renderers.enable(RENDERER)
    _offline_jupyter_chart_on_first_use(alt.JupyterChart)


def _offline_jupyter_chart_on_first_use(cls: Any) -> None:
    """Switch ``JupyterChart`` to its offline bundle when the first one is made.

    Building that bundle takes ~2 s, which most notebooks, having no JupyterChart, need not pay.
    """
    if getattr(cls, "_moescope_offline_hook", False) or cls._is_offline:
        return
    original_init = cls.__init__

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        cls.enable_offline()
        original_init(self, *args, **kwargs)

    cls.__init__ = __init__
    cls._moescope_offline_hook = True


def chart_mimebundle(spec: dict, **metadata: Any) -> dict[str, Any]:
    """Mimebundle of one chart: vl-convert SVG, the Vega-Lite spec and a text fallback."""
    from altair.vegalite.v6 import display

    bundle: dict[str, Any] = dict(display.svg_renderer(spec, **metadata))
    bundle[f"application/vnd.vegalite.v{display.VEGALITE_VERSION.split('.')[0]}+json"] = spec
    bundle["text/plain"] = "<altair chart: shown as SVG by a rich front end>"
    return bundle


def _quiet() -> None:
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for module in _QUIET_MODULES:
        warnings.filterwarnings("ignore", module=rf"{module}(\.|$)")
    # The environment only counts before transformers is imported; once it is, quiet its loggers.
    # Looked up, not imported: the display stage never loads model code itself.
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None:
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def _import_altair() -> Any:
    try:
        import altair as alt
        import vl_convert  # noqa: F401  (the SVG renderer and the offline bundle need it)
    except ImportError as exc:
        raise MoescopeError(
            f"charts need the notebook extras ({exc.name} is missing); "
            "install them with `pip install 'moescope[notebook]'`."
        ) from exc
    return alt
