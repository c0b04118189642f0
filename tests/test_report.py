"""The notebook pipeline: bad input, atomic output, offline HTML, and the real report on the toy.

Pipeline mechanics run on two tiny notebooks written here (a kernel each, ~2 s); the full report
on the toy is the one slow test. Nothing here needs a network.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from moescope.analyze.validation import read_validation
from moescope.cli import main
from moescope.display.notebook import chart_mimebundle
from moescope.errors import MoescopeError
from moescope.report import pipeline as report_mod
from moescope.report.html import notebook_html
from moescope.report.pipeline import run_report
from moescope.traces import read_trace

# Loading anything from the network: a script or stylesheet with a remote URL, or a CDN host.
REMOTE_LOAD = re.compile(r"<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=\s*[\"']?(https?:)?//", re.I)
CDN_HOSTS = ("cdn.jsdelivr.net", "unpkg.com", "cdnjs.cloudflare.com", "esm.sh", "googleapis.com")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]

PARAMS = 'model: str = "toy"  # model to study\noutput_dir: str = "out"  # artifacts directory\n'
FIRST = """\
import sys
from pathlib import Path
import ipywidgets
from moescope.display.notebook import setup_notebook
setup_notebook()
import altair as alt
out = Path(output_dir)
out.mkdir(parents=True, exist_ok=True)
(out / "first.json").write_text(json.dumps({"python": sys.executable, "model": model}))
"""
FIRST_DISPLAY = """\
display(ipywidgets.IntSlider(value=4, max=9, description="experts"))
alt.Chart(alt.Data(values=[{"x": 1, "y": 2}, {"x": 2, "y": 1}])).mark_bar().encode(x="x:O", y="y:Q")
"""
SECOND = """\
first = json.loads((Path(output_dir) / "first.json").read_text())
(Path(output_dir) / "second.json").write_text(json.dumps({"extra": extra, "first": first}))
"""


def write_notebook(path: Path, *cells: str, params: str = PARAMS) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    param_cell = nbformat.v4.new_code_cell(params)
    param_cell.metadata["tags"] = ["parameters"]
    nb.cells = [
        nbformat.v4.new_markdown_cell(f"# {path.stem} title"),
        param_cell,
        nbformat.v4.new_code_cell("import json\nfrom pathlib import Path"),
        *(nbformat.v4.new_code_cell(cell) for cell in cells),
    ]
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def books(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("notebooks")
    return {
        "first": write_notebook(d / "01_first.ipynb", FIRST, FIRST_DISPLAY),
        "second": write_notebook(
            d / "02_second.ipynb", SECOND, params=PARAMS + "extra: int = 1  # passed through\n"
        ),
        "lone": write_notebook(d / "03_lone.ipynb", "Path(output_dir, 'lone.txt').write_text('ok')"),
        "bad": write_notebook(d / "04_bad.ipynb", "x = 1", "raise ValueError('expert 7 is missing')"),
    }


@pytest.fixture(scope="module")
def model_dir(tiny_checkpoint) -> Path:
    return tiny_checkpoint("qwen3_moe")


@pytest.fixture(scope="module")
def fake_python3_kernelspec(tmp_path_factory: pytest.TempPathFactory):
    """A user-wide ``python3`` kernelspec for another interpreter, which the report must ignore."""
    share = tmp_path_factory.mktemp("jupyter-share")
    spec = share / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = ["/nonexistent/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Other", "language": "python"})
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", str(share))
        yield


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory, books, model_dir, fake_python3_kernelspec) -> report_mod.Report:
    out = tmp_path_factory.mktemp("reports") / "report"
    return run_report(
        model_dir, out, notebooks=[books["first"], books["second"]], parameters={"extra": 7}, progress=False
    )


def assert_offline(page: str) -> None:
    assert not REMOTE_LOAD.search(page), REMOTE_LOAD.search(page)
    assert not [host for host in CDN_HOSTS if host in page]


def no_partial_dirs(parent: Path) -> bool:
    return not [p for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name]


# ------------------------------------------------------------------------------ bad input


def test_unknown_model_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(MoescopeError, match=r"no such model directory.*'toy'"):
        run_report(tmp_path / "missing", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_non_empty_output_needs_overwrite(tmp_path: Path, model_dir: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(MoescopeError, match=r"not empty.*--overwrite"):
        run_report(model_dir, out)
    with pytest.raises(MoescopeError, match="holds no moescope report"):
        run_report(model_dir, out, overwrite=True)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_output_that_is_a_file_is_refused(tmp_path: Path, model_dir: Path) -> None:
    (tmp_path / "out").write_text("x")
    with pytest.raises(MoescopeError, match="not a directory"):
        run_report(model_dir, tmp_path / "out", overwrite=True)


def test_unknown_and_reserved_parameters(tmp_path: Path, model_dir: Path, books: dict[str, Path]) -> None:
    with pytest.raises(MoescopeError, match="no notebook has a parameter named 'n_evall'"):
        run_report(model_dir, tmp_path / "out", notebooks=[books["second"]], parameters={"n_evall": 3})
    with pytest.raises(MoescopeError, match="'output_dir' is set by the report"):
        run_report(model_dir, tmp_path / "out", notebooks=[books["second"]], parameters={"output_dir": "x"})
    with pytest.raises(MoescopeError, match="not a notebook file"):
        run_report(model_dir, tmp_path / "out", notebooks=[tmp_path / "nope.ipynb"])
    assert not (tmp_path / "out").exists()


def test_cli_prints_one_sentence_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("moescope: error: no such model directory") and "\n" not in err


def test_interrupt_leaves_nothing_behind(tmp_path: Path, model_dir: Path, books, monkeypatch) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_mod, "_execute", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_report(model_dir, tmp_path / "out", notebooks=[books["first"]])
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ pipeline (tiny)


def test_report_layout_and_index(tiny_report: report_mod.Report) -> None:
    out = tiny_report.out_dir
    assert [p.name for p in tiny_report.notebooks] == ["01_first.ipynb", "02_second.ipynb"]
    assert all(p.is_file() for p in (*tiny_report.notebooks, *tiny_report.html, tiny_report.index_html))
    assert set(tiny_report.durations) == {"01_first.ipynb", "02_second.ipynb"}
    index = tiny_report.index_html.read_text()
    assert index.index('href="01_first.html"') < index.index('href="02_second.html"')
    assert "01_first title" in index
    manifest = json.loads((out / "report.json").read_text())
    assert manifest["kind"] == "moescope-report" and manifest["status"] == "complete"
    assert [e["name"] for e in manifest["notebooks"]] == ["01_first.ipynb", "02_second.ipynb"]
    assert no_partial_dirs(out.parent)


def test_notebooks_share_artifacts_and_get_parameters(tiny_report: report_mod.Report, model_dir) -> None:
    second = json.loads((tiny_report.artifacts / "second.json").read_text())
    assert second["extra"] == 7
    assert second["first"]["model"] == str(model_dir.absolute())
    nb = nbformat.read(tiny_report.notebooks[1], as_version=4)
    assert nb.metadata.papermill.parameters == {
        "model": str(model_dir.absolute()),
        "output_dir": "artifacts",
        "extra": 7,
    }


def test_kernel_is_this_interpreter_despite_another_python3_spec(tiny_report: report_mod.Report) -> None:
    first = json.loads((tiny_report.artifacts / "first.json").read_text())
    assert Path(first["python"]) == Path(sys.executable)


def test_html_pages_are_offline_and_carry_widgets_and_charts(tiny_report: report_mod.Report) -> None:
    page = tiny_report.html[0].read_text()
    assert_offline(page)
    assert 'class="moescope-vega"' in page and "window.vegaEmbed" in page
    assert "application/vnd.jupyter.widget-state+json" in page and "var requirejs, require, define" in page
    assert_offline(tiny_report.html[1].read_text())
    assert "vegaEmbed" not in tiny_report.html[1].read_text(), "a page without charts carries no bundle"


def test_failing_notebook_keeps_the_old_report_and_the_partial_run(
    tmp_path: Path, tiny_report: report_mod.Report, model_dir: Path, books: dict[str, Path]
) -> None:
    out = tmp_path / "report"
    shutil.copytree(tiny_report.out_dir, out)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(MoescopeError) as info:
        run_report(model_dir, out, overwrite=True, notebooks=[books["lone"], books["bad"]], progress=False)
    message = str(info.value)
    failed = tmp_path / "report.failed" / "04_bad.ipynb"
    assert "notebook 04_bad.ipynb failed at cell In [5]" in message
    assert "ValueError: expert 7 is missing" in message and str(failed) in message
    assert sorted(p.name for p in out.iterdir()) == before, "a failed run must not touch the old report"
    executed = nbformat.read(failed, as_version=4)
    assert any(o.get("ename") == "ValueError" for cell in executed.cells for o in cell.get("outputs", []))
    assert (tmp_path / "report.failed" / "artifacts" / "lone.txt").is_file(), (
        "earlier notebooks' output is kept"
    )
    assert no_partial_dirs(tmp_path)


def test_overwrite_replaces_a_previous_report(
    tmp_path: Path, tiny_report: report_mod.Report, model_dir: Path, books: dict[str, Path]
) -> None:
    out = tmp_path / "report"
    shutil.copytree(tiny_report.out_dir, out)
    with pytest.raises(MoescopeError, match="already exists"):
        run_report(model_dir, out, notebooks=[books["lone"]])
    new = run_report(model_dir, out, overwrite=True, notebooks=[books["lone"]], progress=False)
    assert sorted(p.name for p in out.glob("*.ipynb")) == ["03_lone.ipynb"]
    assert new.durations.keys() == {"03_lone.ipynb"} and (new.artifacts / "lone.txt").is_file()
    assert no_partial_dirs(tmp_path)


@pytest.mark.browser
def test_pages_render_offline_in_chromium(tiny_report: report_mod.Report, chromium: str) -> None:
    from playwright import sync_api

    remote: list[str] = []

    def local_only(route) -> None:
        if route.request.url.startswith(("file:", "data:", "blob:")):
            route.continue_()
        else:
            remote.append(route.request.url)
            route.abort()

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            page.route("**/*", local_only)
            page.goto(tiny_report.html[0].as_uri())
            page.wait_for_selector(".widget-slider .noUi-handle", timeout=60_000)  # widget manager ran
            page.wait_for_selector(".moescope-vega svg .mark-rect path", timeout=60_000)  # vega ran
            assert page.locator(".moescope-vega img").count() == 0, "static SVG was not replaced"
            page.goto(tiny_report.index_html.as_uri())
            assert page.locator("a[href='02_second.html']").count() == 1
        finally:
            browser.close()
    assert remote == []


# ----------------------------------------------------------------------------- HTML unit


def test_notebook_html_inlines_local_assets_only() -> None:
    spec = {
        "mark": "bar",
        "data": {"values": [{"a": 1}]},
        "encoding": {"x": {"field": "a", "type": "ordinal"}},
    }
    esm = "import vegaEmbed from 'https://esm.sh/vega-embed@6'; " + "x" * 100_000
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("chart")
    cell.outputs = [nbformat.v4.new_output("display_data", data=chart_mimebundle(spec))]
    nb.cells = [cell]
    nb.metadata["widgets"] = {
        "application/vnd.jupyter.widget-state+json": {
            "version_major": 2,
            "version_minor": 0,
            "state": {
                "m1": {
                    "model_module": "anywidget",
                    "model_name": "AnyModel",
                    "model_module_version": "~0.9.*",
                    "state": {"_anywidget_id": "altair.jupyter.jupyter_chart.JupyterChart", "_esm": esm},
                }
            },
        }
    }
    page = notebook_html(nb, title="unit")
    assert_offline(page)
    assert "<title>unit</title>" in page
    assert 'define("anywidget"' in page and "var requirejs, require, define" in page
    assert '"./jupyter-widget-modules/"' in page, "the widget manager's CDN fallback must be local"
    assert esm not in page and "const vegaEmbed = window.vegaEmbed;" in page
    assert 'src="data:image/svg+xml;base64,' in page and "moescope-vega-spec" in page


# ------------------------------------------------------------------------ the real report


# Lighter than the demo's defaults where a default only buys precision: fewer calibration and
# held-out tokens, and no healing rounds toward the capability target (healing and targeting are
# tested in test_healing.py and test_targeting.py); shorter replays, of fewer prompts per step in
# 05's validation: 8 steps keep 03's lr_spike@6 and the step after it, and 05's routing_mismatch
# raises its finding from step 0. Every notebook and artifact still runs.
LIGHT = {"n_tokens": 2000, "fidelity_tokens": 1024, "min_capability": 0.0, "steps": 8, "prompts_per_step": 2}


@pytest.mark.slow
def test_report_on_the_toy_end_to_end(tmp_path: Path) -> None:
    report = run_report("toy", tmp_path / "demo", progress=False, parameters=LIGHT)
    assert report.notebooks[0].name == "00_tour.ipynb"
    for notebook, page in zip(report.notebooks, report.html, strict=True):
        nb = nbformat.read(notebook, as_version=4)
        assert nb.metadata.papermill.parameters["model"] == "toy"
        assert all(nb.metadata.papermill.parameters.get(k, v) == v for k, v in LIGHT.items())
        assert not [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
        assert_offline(page.read_text())
    summary = json.loads((report.artifacts / "tour" / "summary.json").read_text())
    assert summary["routed_experts"] > summary["top_k"] > 0
    accuracy = (report.artifacts / "tour" / "accuracy.csv").read_text().splitlines()
    assert accuracy[0].startswith("task,mode,") and len(accuracy) > 1
    # the journey ends with a replay of the original and of 02's proxy, and a verdict
    assert [nb.name for nb in report.notebooks][-3:] == [
        "03_analyze_replay.ipynb",
        "04_fidelity_study.ipynb",
        "05_validate_fix.ipynb",
    ]
    original = read_trace(report.artifacts / "replay" / "original.jsonl")
    proxy = read_trace(report.artifacts / "replay" / "proxy.jsonl")
    assert len(original.steps) == len(proxy.steps) > 0 and proxy.header["proxy"]["keep"] == 8
    assert "verdict: " in report.html[-3].read_text()
    # with the proxy's and the toy's runs without the fault as the verdict's baseline
    assert "without the fault the proxy raises " in report.html[-3].read_text()
    healthy = read_trace(report.artifacts / "replay" / "proxy-healthy.jsonl")
    assert healthy.header["faults"] == [] and len(healthy.steps) == len(proxy.steps)
    assert (report.artifacts / "study" / "summary.csv").read_text().startswith("keep,method,hit,")
    assert (report.artifacts / "study" / "baseline.csv").read_text().startswith("keep,method,own,verdicts,")
    targeting = (report.artifacts / "study" / "targeting.csv").read_text()  # the committed targeted study
    assert targeting.startswith("keep,method,hit_unhealed,hit_healed,")
    assert (
        (report.artifacts / "study" / "no_signal.csv")
        .read_text()
        .startswith("keep,method,no_signal,original")
    )
    # ... then validates a fix on 02's proxy and on the toy, and draws both runs of each
    validation = read_validation(report.artifacts / "validation")
    assert validation.fault.startswith("routing_mismatch") and validation.fixes == ("routing_replay",)
    assert validation.original is not None and validation.agrees() is not None
    assert report.html[-1].read_text().count('class="moescope-vega-spec"') == 2  # two boards
    assert no_partial_dirs(tmp_path)
