"""The documentation site: built as `make docs` builds it, warnings as errors, then read.

The site is built from a copy of ``docs/`` beside the repository's notebooks, with the tour
executed by the report pipeline (the full report takes minutes; the other tutorials are shown
as committed). The reference pages are generated from the code, so the checks here that they
list every command-line option, metric, fault, fix and architecture fail when a generator
drifts from its registry; every internal link of the built HTML must resolve; and chromium
opens the home page and the tour, whose charts must draw with nothing fetched from a network.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from moescope.report.pipeline import run_report

ROOT = Path(__file__).resolve().parents[1]
TOUR = "00_tour"
FEW_SAMPLES = {"n_eval": 2, "samples": 1}  # the tour's accuracy check, cut to what shows its charts
# Every image of the notebook's outputs (the charts, as SVG files) loaded and drawn.
DRAWN = "() => [...document.querySelectorAll('.cell_output img')].every(i => i.complete && i.naturalWidth)"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built site (its ``index.html`` directory)."""
    work = tmp_path_factory.mktemp("docs")
    report = run_report(
        "toy", work / "report", notebooks=[ROOT / "notebooks" / f"{TOUR}.ipynb"], progress=False
    )
    shutil.copytree(
        ROOT / "docs", work / "docs", ignore=shutil.ignore_patterns("_notebooks", "_static_widgets")
    )
    (work / "notebooks").symlink_to(ROOT / "notebooks")
    out = work / "html"
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q"]
    command += ["-d", str(work / "doctrees"), str(work / "docs"), str(out)]
    env = os.environ | {"MOESCOPE_DOCS_REPORT": str(report.out_dir)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr[-4000:]
    return out


class _Page(HTMLParser):
    """A page's ids, the local targets of its links and images, and its inline code texts."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.targets: list[str] = []
        self.code: set[str] = set()
        self._code: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(found["id"])
        if tag in ("a", "link") and found.get("href"):
            self.targets.append(found["href"])
        if tag in ("img", "script") and found.get("src"):
            self.targets.append(found["src"])
        if tag == "code":
            self._code = []

    def handle_data(self, data: str) -> None:
        if self._code is not None:
            self._code.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "code" and self._code is not None:
            self.code.add("".join(self._code))
            self._code = None


def _read(page: Path) -> _Page:
    parser = _Page()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


def test_every_internal_link_resolves(site: Path) -> None:
    pages = {page: _read(page) for page in site.rglob("*.html") if "_static" not in page.parts}
    broken = []
    for page, anchors in pages.items():
        for target in anchors.targets:
            url = urlsplit(target)
            if url.scheme or url.netloc:
                continue  # external: the site's pages link out, and load nothing from outside (below)
            path = (page.parent / unquote(url.path)).resolve() if url.path else page
            if not path.is_file():
                broken.append(f"{page.relative_to(site)}: {target}")
            elif url.fragment and path.suffix == ".html" and url.fragment not in pages[path].ids:
                broken.append(f"{page.relative_to(site)}: {target} (no such anchor)")
    assert len(pages) > 40 and not broken, broken


def _page_text(site: Path, name: str) -> str:
    return unescape((site / name).read_text(encoding="utf-8"))


def _options(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    """Each command's name and its long options, from the parser itself."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: {s for a in command._actions for s in a.option_strings if s.startswith("--")}
        for name, command in sub.choices.items()
    }


def test_cli_reference_is_the_parser(site: Path) -> None:
    from moescope.cli import build_parser

    text = _page_text(site, "reference/cli.html")
    missing = [
        f"{name} {option}"
        for name, options in _options(build_parser()).items()
        for option in {name, *options}
        if option not in text
    ]
    assert not missing, missing


def test_registry_tables_list_every_entry(site: Path) -> None:
    from moescope.analyze.fixes import FIXES
    from moescope.analyze.readers import KEY_MAP
    from moescope.models.table import ARCHITECTURES
    from moescope.replay.faults import KINDS
    from moescope.schema import METRICS

    expected = {
        "reference/metrics.html": list(METRICS),
        "reference/faults-fixes.html": [*KINDS, *FIXES],
        "reference/architectures.html": [spec.model_type for spec in ARCHITECTURES.values()],
        "howto/framework-logs/verl.html": list(KEY_MAP["verl"]),
    }
    missing = {page: sorted(set(keys) - _read(site / page).code) for page, keys in expected.items()}
    assert not any(missing.values()), missing


@pytest.mark.browser
def test_home_and_tour_render_offline_in_chromium(site: Path, chromium: str) -> None:
    from browser import chromium_page, local_only

    with chromium_page(chromium) as page:
        blocked = local_only(page, ("file:", "data:", "blob:"))
        page.goto((site / "index.html").as_uri())
        for section in ("Tutorials", "How-to guides", "Reference", "Explanation"):
            assert page.locator("nav a", has_text=section).count() > 0, section
        page.goto((site / "tutorials" / "_notebooks" / f"{TOUR}.html").as_uri())
        charts = page.locator(".cell_output img[src$='.svg']")
        assert charts.count() >= 2
        page.wait_for_function(DRAWN, timeout=30_000)
    assert blocked == []
