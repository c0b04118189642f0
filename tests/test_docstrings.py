"""Every runnable ``>>>`` example in moescope's docstrings runs and prints what it shows.

An example marked ``# doctest: +SKIP`` is prose (it needs a browser, a notebook or a file the
reader has); a docstring whose examples are all marked so is not collected, so nothing here is
reported as skipped. Each example is meant to run in about a second on a laptop CPU.
"""

from __future__ import annotations

import doctest
import importlib
import io
import pkgutil

import pytest

import moescope


def _module_names() -> list[str]:
    found = pkgutil.walk_packages(moescope.__path__, "moescope.")
    return ["moescope", *sorted(m.name for m in found if not m.name.endswith("__main__"))]


def _runnable(test: doctest.DocTest) -> bool:
    return any(not example.options.get(doctest.SKIP) for example in test.examples)


def _docstrings() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder()
    tests = []
    for name in _module_names():
        tests += [t for t in finder.find(importlib.import_module(name), name) if _runnable(t)]
    return sorted(tests, key=lambda t: t.name)


@pytest.mark.parametrize("test", _docstrings(), ids=lambda t: t.name)
def test_docstring_examples(test: doctest.DocTest) -> None:
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = io.StringIO()
    try:
        result = runner.run(test, out=report.write)
    finally:
        test.globs.clear()
    assert result.attempted > 0
    assert result.failed == 0, report.getvalue()


def test_docstring_examples_are_found() -> None:
    """The finder sees the examples of nested modules and of methods, not only module docstrings."""
    names = {t.name for t in _docstrings()}
    assert "moescope.keep.parse_keep" in names
    assert "moescope.explore.stats.RoutingStats.layer_frame" in names
