"""JupyterLab driven by Debian's chromium through Playwright: the harness of the browser tests.

:class:`JupyterLab` starts a server on a free port of 127.0.0.1 with a fixed token, every
Jupyter directory and ``IPYTHONDIR`` inside the test's temporary directory, and a ``python3``
kernel that is this interpreter. :class:`LabPage` drives one notebook in it: open, run all,
wait for the kernel, poll the DOM. :func:`local_only` aborts and records every request to
another host (a CDN, fonts), so a test can assert that nothing left the machine;
:func:`chromium_page` is a page of a fresh chromium, also for static report pages.

The fixtures in ``conftest.py`` wrap these: ``jupyter_lab`` (one server per test module,
serving a copy of ``notebooks/``) and ``lab_page`` (a :class:`LabPage` on it). A widget's
browser check looks like::

    def test_x(lab_page):
        lab_page.open("01_explore_clusters.ipynb")
        lab_page.run_all()
        widget = lab_page.wait_for(".moescope-expert-map")
        assert lab_page.blocked == []
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
TOKEN = "moescope-browser-test"
# First waits are generous: a loaded 2-core machine needs ~60 s for server, page and kernel.
START_TIMEOUT_S = 90
RUN_TIMEOUT_S = 240

# Selectors of the notebook and of ipywidgets / vega-embed in JupyterLab 4.
KERNEL_IDLE = (
    "() => window.jupyterapp?.shell?.currentWidget?.sessionContext?.session?.kernel?.status === 'idle'"
)
SLIDER_HANDLE = ".widget-slider .noUi-handle"
VEGA_SVG = ".vega-embed svg"

# Code cells still to run, and the first error output, read from the notebook model.
_NOTEBOOK_STATE = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const cells = panel.content.widgets.map(c => c.model)
    .filter(m => m.type === 'code' && m.sharedModel.getSource().trim() !== '');
  const errors = cells.flatMap(m => m.outputs.toJSON()).filter(o => o.output_type === 'error');
  return {
    pending: cells.filter(m => m.executionCount === null).length,
    error: errors.length ? errors[0].ename + ': ' + errors[0].evalue : null,
  };
}"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class JupyterLab:
    """A JupyterLab server of this test session, serving ``root``."""

    root: Path
    port: int
    process: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?reset&token={TOKEN}"

    @classmethod
    @contextlib.contextmanager
    def serve(cls, root: Path, home: Path) -> Iterator[JupyterLab]:
        """Start a server on ``root`` with its Jupyter directories under ``home``; stop it on exit."""
        env = _lab_environment(home)
        port = free_port()
        log = home / "jupyterlab.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "jupyterlab", *_lab_arguments(root, port)],
                cwd=root,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its kernels die with its process group
            )
        lab = cls(root=root, port=port, process=process, log=log)
        try:
            lab._wait_until_up()
            yield lab
        finally:
            lab.stop()

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"JupyterLab exited with status {self.process.returncode}:\n{self.log_tail()}"
                )
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/api/status?token={TOKEN}", timeout=2) as reply,
            ):
                if reply.status == 200:
                    return
            time.sleep(0.3)
        raise TimeoutError(f"JupyterLab did not answer within {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Ask the server to shut down (it stops its kernels), then end its process group."""
        if self.process.poll() is None:
            request = urllib.request.Request(f"{self.url}/api/shutdown?token={TOKEN}", method="POST")
            with contextlib.suppress(OSError, urllib.error.URLError):
                urllib.request.urlopen(request, timeout=5).close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=15)
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _lab_arguments(root: Path, port: int) -> list[str]:
    return [
        "--no-browser",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={TOKEN}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=None",
        "--LabApp.extension_manager=readonly",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]


def _lab_environment(home: Path) -> dict[str, str]:
    """Jupyter and IPython directories under ``home``; a ``python3`` kernel running this interpreter."""
    dirs = {
        name: home / name.lower()
        for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR")
    }
    dirs["IPYTHONDIR"] = home / "ipython"
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    labconfig = dirs["JUPYTER_CONFIG_DIR"] / "labconfig"
    labconfig.mkdir(exist_ok=True)
    announcements = {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}
    (labconfig / "page_config.json").write_text(json.dumps(announcements))
    kernel = dirs["JUPYTER_DATA_DIR"] / "kernels" / "python3"
    kernel.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (moescope tests)",
        "language": "python",
    }
    (kernel / "kernel.json").write_text(json.dumps(spec))
    env = {**os.environ, **{name: str(path) for name, path in dirs.items()}}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TQDM_DISABLE="1", PYDEVD_DISABLE_FILE_VALIDATION="1"
    )
    return env


@dataclass
class LabPage:
    """A Playwright page on a :class:`JupyterLab`; requests to other hosts are aborted and listed."""

    lab: JupyterLab
    page: Any
    blocked: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.blocked = local_only(self.page, (self.lab.url, "data:", "blob:"))

    def open(self, notebook: str) -> None:
        """Open ``notebook`` (relative to the server root) and wait for its kernel to be idle."""
        self.page.goto(self.lab.notebook_url(notebook))
        self.page.wait_for_function(KERNEL_IDLE, timeout=START_TIMEOUT_S * 1000)

    def run_all(self, timeout_s: float = RUN_TIMEOUT_S) -> None:
        """Run every cell; return once each code cell has run and the kernel is idle, or raise on an error."""
        self.page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.page.evaluate(_NOTEBOOK_STATE)
            if state["error"]:
                raise AssertionError(f"a notebook cell failed: {state['error']}")
            if state["pending"] == 0 and self.page.evaluate(KERNEL_IDLE):
                return
            self.page.wait_for_timeout(500)
        raise TimeoutError(f"the notebook did not finish within {timeout_s} s: {state}")

    def wait_for(self, selector: str, timeout_s: float = START_TIMEOUT_S) -> Any:
        """The first element matching ``selector``, once it is visible."""
        locator = self.page.locator(selector).first
        locator.wait_for(state="visible", timeout=timeout_s * 1000)
        return locator

    def poll(self, read: Any, until: Any, timeout_s: float = 30) -> Any:
        """Call ``read()`` until ``until(value)`` holds; returns the last value (checked by the caller)."""
        deadline = time.monotonic() + timeout_s
        value = read()
        while not until(value) and time.monotonic() < deadline:
            self.page.wait_for_timeout(250)
            value = read()
        return value


def local_only(page: Any, allowed: tuple[str, ...]) -> list[str]:
    """Abort every request of ``page`` whose URL does not start with one of ``allowed``.

    Returns the list the aborted URLs are appended to, so a test can assert it stays empty.
    """
    blocked: list[str] = []

    def route(request_route: Any) -> None:
        url = request_route.request.url
        if url.startswith(allowed):
            request_route.continue_()
        else:
            blocked.append(url)
            request_route.abort()

    page.route("**/*", route)
    return blocked


@contextlib.contextmanager
def chromium_page(executable: str) -> Iterator[Any]:
    """A Playwright page of a fresh chromium (its own new profile), closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            yield browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        finally:
            browser.close()
