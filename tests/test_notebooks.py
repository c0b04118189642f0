"""Hygiene of every pipeline notebook: committed clean, parameterised the papermill way.

These tests read the notebooks as JSON and start no kernel; executing them is
``test_report.py``'s job.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import papermill
import pytest

from moescope.report.pipeline import default_notebooks

NOTEBOOKS = default_notebooks()
PIPELINE_PARAMETERS = {"model": "str", "output_dir": "str"}


def _code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def _parameter_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", [])]


@pytest.fixture(params=NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def notebook(request: pytest.FixtureRequest) -> tuple[Path, nbformat.NotebookNode]:
    path = request.param
    return path, nbformat.read(path, as_version=4)


def test_the_chain_starts_with_the_tour() -> None:
    names = [path.name for path in NOTEBOOKS]
    assert names[0] == "00_tour.ipynb"
    assert all(re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", name) for name in names)
    assert len({name[:2] for name in names}) == len(names), "two notebooks share a number"


def test_valid_nbformat_v4(notebook: tuple[Path, nbformat.NotebookNode]) -> None:
    _, nb = notebook
    nbformat.validate(nb)
    assert nb.nbformat == 4
    assert nb.metadata.kernelspec.name == "python3"
    assert nb.metadata.kernelspec.language == "python"


def test_committed_without_outputs(notebook: tuple[Path, nbformat.NotebookNode]) -> None:
    path, nb = notebook
    for i, cell in enumerate(_code_cells(nb)):
        assert cell.outputs == [], f"{path.name}: code cell {i} has outputs; clear them before committing"
        assert cell.execution_count is None, f"{path.name}: code cell {i} has an execution count"
    assert "widgets" not in nb.metadata, f"{path.name} carries saved widget state"
    assert "papermill" not in nb.metadata, f"{path.name} is an executed copy, not the source"


def test_exactly_one_parameters_cell(notebook: tuple[Path, nbformat.NotebookNode]) -> None:
    path, nb = notebook
    cells = _parameter_cells(nb)
    assert len(cells) == 1, f"{path.name}: {len(cells)} cells are tagged 'parameters'"
    assert cells[0].cell_type == "code"


def test_parameters_are_flat_annotated_literals(notebook: tuple[Path, nbformat.NotebookNode]) -> None:
    path, nb = notebook
    (cell,) = _parameter_cells(nb)
    for statement in ast.parse(cell.source).body:
        assert isinstance(statement, ast.AnnAssign), f"{path.name}: {ast.unparse(statement)!r}"
        ast.literal_eval(statement.value)  # a flat literal, nothing computed
    for line in filter(str.strip, cell.source.splitlines()):
        assert re.search(r"\S\s+#\s*\S", line), f"{path.name}: parameter line without a comment: {line!r}"


def test_papermill_lists_the_parameters(notebook: tuple[Path, nbformat.NotebookNode]) -> None:
    path, _ = notebook
    params = papermill.inspect_notebook(str(path))
    for name, type_name in PIPELINE_PARAMETERS.items():
        assert name in params, f"{path.name} lacks the {name!r} parameter the report passes"
        assert params[name]["inferred_type_name"] == type_name
    for name, param in params.items():
        assert param["inferred_type_name"] != "None", f"{path.name}: {name} has no type annotation"
        assert param["help"].strip(), f"{path.name}: {name} has no help comment"


def test_defaults_are_small_and_offline(notebook: tuple[Path, nbformat.NotebookNode]) -> None:
    path, _ = notebook
    params = papermill.inspect_notebook(str(path))
    assert params["model"]["default"] == '"toy"', f"{path.name}: the default model must be the toy"
    assert not Path(ast.literal_eval(params["output_dir"]["default"])).is_absolute()


def test_has_a_title_and_sets_up_offline_charts(notebook: tuple[Path, nbformat.NotebookNode]) -> None:
    path, nb = notebook
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), f"{path.name}: no title"
    sources = [cell.source for cell in _code_cells(nb)]
    setup = next((i for i, source in enumerate(sources) if "setup_notebook()" in source), None)
    assert setup is not None, f"{path.name} never calls setup_notebook() (offline charts, quiet logs)"
    assert not any("alt." in source or "altair" in source for source in sources[:setup]), (
        f"{path.name} uses altair before setup_notebook()"
    )
