"""The notebook pipeline behind ``moescope report`` and ``moescope demo``.

The notebooks in ``notebooks/`` (``NN_name.ipynb``, run in filename order) are executed with
papermill. Each gets two parameters, ``model`` and ``output_dir``; ``output_dir`` is one
artifacts directory shared by the whole run, so a notebook reads what the previous ones wrote.
Each executed notebook is also written as a standalone HTML page that renders offline (how:
:mod:`moescope.report.html`), and ``index.html`` links the pages in order::

    OUT/
      index.html          the pages in order, with model, timings and versions
      report.json         the same as data; it also marks OUT as a moescope report
      00_tour.ipynb       executed notebook (open it in JupyterLab from OUT to rerun it)
      00_tour.html        standalone offline page
      artifacts/          the notebooks' output_dir (e.g. artifacts/tour/summary.json)

Everything is written into a hidden sibling of OUT and renamed into place at the end, so OUT
never holds half a report. When a notebook fails, that directory is renamed to
``OUT.failed`` and the error says which notebook and cell failed and where the partially
executed notebook is.

Notebooks run on this interpreter (``sys.executable``), whatever ``python3`` kernelspec the
user has installed, so the kernel sees the same moescope and torch as the caller.

Examples
--------
>>> from moescope.report.pipeline import run_report
>>> report = run_report("toy", "moescope-demo", overwrite=True)  # doctest: +SKIP
>>> report.index_html  # doctest: +SKIP
PosixPath('.../moescope-demo/index.html')
"""

from __future__ import annotations

import datetime as dt
import functools
import html
import importlib.util
import json
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moescope._util.io import fresh_sibling, swap_into_place
from moescope._version import __version__
from moescope.display.notebook import QUIET_ENV
from moescope.errors import MoescopeError
from moescope.models.embedded import is_embedded
from moescope.models.loading import resolve_model
from moescope.report.html import notebook_html

__all__ = ["Report", "default_notebooks", "export_html", "run_report"]

ARTIFACTS = "artifacts"
MANIFEST = "report.json"
REPORT_KIND = "moescope-report"
NOTEBOOK_PATTERN = "[0-9][0-9]_*.ipynb"
# The parameters every notebook declares; the pipeline sets them, a user may not.
PIPELINE_PARAMETERS = ("model", "output_dir")
# The notebooks' kernel: offline (models are local directories), quiet, and without progress
# bars, which in a batch run would only put widget state into every page.
REPORT_KERNEL_ENV = {
    **QUIET_ENV,
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TQDM_DISABLE": "1",
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",
}


@dataclass(frozen=True)
class Report:
    """What one report run wrote; every path is inside ``out_dir``.

    Attributes
    ----------
    out_dir
        The report directory.
    notebooks, html
        Executed notebooks and their HTML pages, in run order.
    index_html
        The page linking the others.
    artifacts
        The ``output_dir`` the notebooks shared.
    durations
        Seconds each notebook took to execute, by file name.
    """

    out_dir: Path
    notebooks: tuple[Path, ...]
    html: tuple[Path, ...]
    index_html: Path
    artifacts: Path
    durations: dict[str, float]


def default_notebooks() -> list[Path]:
    """The pipeline's notebooks, ``NN_*.ipynb`` in filename order.

    A wheel ships them as ``moescope/notebooks``; a source checkout keeps them in the
    top-level ``notebooks/`` (not importable in an editable install, hence the path look-up).
    """
    package = Path(__file__).resolve().parents[1]
    for directory in (package / "notebooks", package.parent / "notebooks"):
        found = sorted(directory.glob(NOTEBOOK_PATTERN))
        if found:
            return found
    raise MoescopeError(
        f"no {NOTEBOOK_PATTERN} notebooks were found next to the moescope package ({package}); "
        "reinstall moescope or pass the notebooks to run explicitly."
    )


def run_report(
    model: str | Path = "toy",
    out_dir: str | Path = "moescope-report",
    *,
    overwrite: bool = False,
    notebooks: Sequence[Path] | None = None,
    parameters: Mapping[str, object] | None = None,
    progress: bool = True,
) -> Report:
    """Execute the notebooks in order on ``model`` and write notebooks plus offline HTML.

    Parameters
    ----------
    model
        ``"toy"``, ``"toy-v3"`` (the embedded models) or a local Hugging Face checkpoint directory.
    out_dir
        Report directory; it must not exist or be empty, unless ``overwrite``.
    overwrite
        Replace an existing report (only a directory an earlier report wrote is replaced).
    notebooks
        Notebooks to run instead of :func:`default_notebooks`, in the order given.
    parameters
        Extra notebook parameters, each passed to the notebooks that declare it.
    progress
        Show a progress bar per notebook on stderr.

    Raises
    ------
    MoescopeError
        For an unknown model, an occupied ``out_dir``, an unknown parameter, or a notebook
        that fails (the message names the notebook, the cell and where the partial run is).
    """
    _require_notebook_stack()
    out = Path(out_dir).expanduser().absolute()
    _check_out_dir(out, overwrite)
    model_param = _model_parameter(model)
    books = _notebook_list(notebooks)
    params = _parameters_per_notebook(books, model_param, parameters or {})
    work = fresh_sibling(out, f".{out.name}.partial-")
    try:
        (work / ARTIFACTS).mkdir()
        durations = _run_all(books, params, work, progress)
        _write_index(work, books, durations, model_param, parameters or {})
    except _NotebookFailed as failure:
        raise failure.to_error(_keep_failed(work, out, model_param)) from None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    swap_into_place(work, out)
    return _report(out, books, durations)


def export_html(notebook: str | Path, out: str | Path | None = None) -> Path:
    """Write an executed notebook as a standalone offline HTML page (default: beside it)."""
    import nbformat

    source = Path(notebook)
    target = Path(out) if out is not None else source.with_suffix(".html")
    nb = nbformat.read(source, as_version=4)
    target.write_text(notebook_html(nb, title=_title(nb, source.stem)), encoding="utf-8")
    return target


# ---------------------------------------------------------------------------------- checks


def _require_notebook_stack() -> None:
    for module in ("papermill", "nbconvert", "ipykernel", "vl_convert"):
        if importlib.util.find_spec(module) is None:
            raise MoescopeError(
                f"the report needs the notebook extras ({module} is not installed); install them "
                "with `pip install 'moescope[notebook]'`."
            )


def _check_out_dir(out: Path, overwrite: bool) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise MoescopeError(f"{out} exists and is not a directory; choose another output directory.")
    if not any(out.iterdir()):
        return
    if not overwrite:
        raise MoescopeError(
            f"{out} already exists and is not empty; choose another output directory or pass "
            "--overwrite (overwrite=True) to replace the report in it."
        )
    if _manifest(out).get("kind") != REPORT_KIND:
        raise MoescopeError(
            f"{out} is not empty and holds no moescope report ({MANIFEST}), so it is not "
            "replaced even with --overwrite; choose a new output directory."
        )


def _manifest(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _model_parameter(model: str | Path) -> str:
    """The ``model`` value the notebooks get: an embedded model's name or an absolute checkpoint path."""
    path = resolve_model(model)
    return str(model) if is_embedded(model) else str(path.absolute())


def _notebook_list(notebooks: Sequence[Path] | None) -> list[Path]:
    if notebooks is None:
        return default_notebooks()
    books = [Path(nb).expanduser().absolute() for nb in notebooks]
    for nb in books:
        if nb.suffix != ".ipynb" or not nb.is_file():
            raise MoescopeError(f"{nb} is not a notebook file; pass existing .ipynb files.")
    names = [nb.name for nb in books]
    if len(set(names)) != len(names):
        raise MoescopeError("two notebooks share a file name; give each notebook a distinct name.")
    if not books:
        raise MoescopeError("no notebooks to run; pass at least one .ipynb file.")
    return books


def _parameters_per_notebook(
    books: Sequence[Path], model: str, extra: Mapping[str, object]
) -> list[dict[str, object]]:
    """Each notebook's papermill parameters: the pipeline's plus the extras it declares."""
    import papermill

    reserved = sorted(set(extra) & set(PIPELINE_PARAMETERS))
    if reserved:
        raise MoescopeError(
            f"parameter {reserved[0]!r} is set by the report itself; pass the model as the model "
            "argument and the directory as out_dir."
        )
    declared = [set(papermill.inspect_notebook(str(nb))) for nb in books]
    unknown = sorted(set(extra) - set().union(*declared))
    if unknown:
        known = ", ".join(sorted(set().union(*declared) - set(PIPELINE_PARAMETERS)))
        raise MoescopeError(
            f"no notebook has a parameter named {unknown[0]!r}; use one of: {known or 'none'}."
        )
    base = {"model": model, "output_dir": ARTIFACTS}
    return [{**base, **{k: v for k, v in extra.items() if k in names}} for names in declared]


# ------------------------------------------------------------------------------- execution


def _run_all(
    books: Sequence[Path], params: Sequence[dict[str, object]], work: Path, progress: bool
) -> dict[str, float]:
    durations: dict[str, float] = {}
    for i, (book, book_params) in enumerate(zip(books, params, strict=True), start=1):
        label = f"[{i}/{len(books)}] {book.stem}"
        durations[book.name] = _execute(
            book, work / book.name, book_params, work, label if progress else None
        )
        export_html(work / book.name)
    return durations


def _execute(source: Path, target: Path, params: dict[str, object], cwd: Path, label: str | None) -> float:
    """Run one notebook with papermill into ``target``; return its wall time in seconds."""
    import papermill
    from nbclient.exceptions import DeadKernelError

    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(source),
            str(target),
            parameters=params,
            kernel_name="python3",
            language="python",
            progress_bar={"desc": label, "leave": True} if label else False,
            cwd=str(cwd),
            start_timeout=120,
            kernel_manager_class=_kernel_manager_class(),
        )
    except (papermill.PapermillExecutionError, DeadKernelError) as exc:
        raise _NotebookFailed(source.name, exc) from None
    return time.perf_counter() - start


@functools.cache
def _kernel_manager_class() -> type:
    """A kernel manager for papermill: this interpreter, and clients that cannot miss a message.

    papermill resolves ``python3`` through the kernelspec search path, where a user-wide spec
    (``~/.local/share/jupyter/kernels/python3``) wins over the venv's; fixing the spec here keeps
    the notebooks on the caller's interpreter and packages.
    """
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager

    # log_level: the kernel's start-up notice about loopback TCP, once per notebook, is not for
    # report readers; errors still show.
    argv = [sys.executable, "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = KernelSpec(
        argv=[*argv, "--IPKernelApp.log_level=ERROR"],
        display_name=f"Python {sys.version_info.major}.{sys.version_info.minor} (moescope)",
        language="python",
        env=dict(REPORT_KERNEL_ENV),
    )
    client_class = _wakeful_client_class()

    class SameInterpreterKernelManager(AsyncKernelManager):
        @property
        def kernel_spec(self) -> KernelSpec:
            return spec

        def client(self, **kwargs: Any) -> Any:
            self.client_factory = client_class  # nbclient sets its own class name before calling
            return super().client(**kwargs)

    return SameInterpreterKernelManager


# Longest wait in one poll of a kernel channel; see _wakeful_client_class.
_POLL_SLICE_S = 0.5


@functools.cache
def _wakeful_client_class() -> type:
    """An async kernel client whose channels poll in short slices instead of forever.

    A ``zmq.asyncio`` poll without a timeout can miss its wake-up when the kernel sends many
    messages at once (widgets do): the reply sits in the socket while nbclient waits forever
    with the kernel idle (seen here with ``EVENTS == POLLIN`` on the stalled shell socket;
    nbclient issue #312). A poll that times out re-checks the socket, so slices bound the delay.
    """
    from queue import Empty

    from jupyter_client.asynchronous import AsyncKernelClient
    from jupyter_client.channels import AsyncZMQSocketChannel
    from traitlets import Type

    class WakefulChannel(AsyncZMQSocketChannel):
        async def get_msg(self, timeout: float | None = None) -> dict[str, Any]:
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = _POLL_SLICE_S if deadline is None else max(0.0, deadline - time.monotonic())
                if await self.socket.poll(int(min(left, _POLL_SLICE_S) * 1000)):
                    return await self._recv()
                if deadline is not None and time.monotonic() >= deadline:
                    raise Empty

    class WakefulKernelClient(AsyncKernelClient):
        shell_channel_class = Type(WakefulChannel)
        iopub_channel_class = Type(WakefulChannel)
        stdin_channel_class = Type(WakefulChannel)
        control_channel_class = Type(WakefulChannel)

    return WakefulKernelClient


class _NotebookFailed(Exception):
    """A notebook stopped; becomes a MoescopeError once the partial run has been kept."""

    def __init__(self, name: str, cause: BaseException) -> None:
        super().__init__(name)
        self.name, self.cause = name, cause

    def to_error(self, kept: Path) -> MoescopeError:
        where = f"the partially executed notebook is kept at {kept / self.name}"
        cause = self.cause
        if not hasattr(cause, "exec_count"):
            return MoescopeError(
                f"the kernel died while running notebook {self.name} (often out of memory); {where}, "
                "so free memory or use a smaller model and run the report again."
            )
        first_line = next((ln.strip() for ln in cause.source.splitlines() if ln.strip()), "")
        message = (str(cause.evalue).strip().splitlines() or [""])[0][:200]
        return MoescopeError(
            f"notebook {self.name} failed at cell In [{cause.exec_count}] (`{first_line[:80]}`) with "
            f"{cause.ename}: {message}; {where}, so fix the cause and run the report again."
        )


# ---------------------------------------------------------------------------------- output


def _keep_failed(work: Path, out: Path, model: str) -> Path:
    """Rename the partial run to ``OUT.failed`` (replacing an earlier failed report only)."""
    _write_manifest(work, {"status": "failed", "model": model})
    kept = out.with_name(f"{out.name}.failed")
    if kept.exists() and _manifest(kept).get("status") == "failed":
        shutil.rmtree(kept)
    if kept.exists():
        kept = fresh_sibling(out, f"{out.name}.failed-")
        kept.rmdir()
    work.rename(kept)
    return kept


def _write_manifest(work: Path, fields: dict[str, Any]) -> None:
    manifest = {
        "kind": REPORT_KIND,
        "moescope_version": __version__,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        **fields,
    }
    (work / MANIFEST).write_text(json.dumps(manifest, indent=2, default=repr) + "\n")


def _write_index(
    work: Path, books: Sequence[Path], durations: Mapping[str, float], model: str, extra: Mapping[str, object]
) -> None:
    import nbformat

    entries = []
    for book in books:
        nb = nbformat.read(work / book.name, as_version=4)
        entries.append(
            {
                "name": book.name,
                "title": _title(nb, book.stem),
                "html": book.with_suffix(".html").name,
                "seconds": round(durations[book.name], 2),
            }
        )
    _write_manifest(
        work,
        {
            "status": "complete",
            "model": model,
            "artifacts": ARTIFACTS,
            "parameters": dict(extra),
            "notebooks": entries,
        },
    )
    (work / "index.html").write_text(_index_page(model, entries), encoding="utf-8")


def _title(nb: Any, fallback: str) -> str:
    """The first markdown heading, which is how a notebook names itself."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return fallback


_INDEX_CSS = """
body { font-family: system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; padding: 0 1rem; }
table { border-collapse: collapse; width: 100%; } td, th { padding: .4rem .6rem; text-align: left; }
tr + tr { border-top: 1px solid #ddd; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.meta { color: #666; font-size: .9rem; }
"""


def _index_page(model: str, entries: Sequence[Mapping[str, Any]]) -> str:
    rows = "\n".join(
        f'<tr><td><a href="{html.escape(e["html"])}">{html.escape(e["title"])}</a></td>'
        f'<td><a href="{html.escape(e["name"])}">{html.escape(e["name"])}</a></td>'
        f'<td class="num">{e["seconds"]:.1f} s</td></tr>'
        for e in entries
    )
    created = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return f"""<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>moescope report: {html.escape(model)}</title>
<style>{_INDEX_CSS}</style></head>
<body>
<h1>moescope report</h1>
<p class="meta">model <code>{html.escape(model)}</code> · {created} · moescope {__version__}
· artifacts in <a href="{ARTIFACTS}/"><code>{ARTIFACTS}/</code></a></p>
<table>
<tr><th>notebook</th><th>executed notebook</th><th class="num">run time</th></tr>
{rows}
</table>
</body>
</html>
"""


def _report(out: Path, books: Sequence[Path], durations: dict[str, float]) -> Report:
    return Report(
        out_dir=out,
        notebooks=tuple(out / b.name for b in books),
        html=tuple(out / b.with_suffix(".html").name for b in books),
        index_html=out / "index.html",
        artifacts=out / ARTIFACTS,
        durations=dict(durations),
    )
