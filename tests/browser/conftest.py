"""Fixtures of the browser test: one JupyterLab and one headless Chromium for the session.

Skipped, with the reason, when Chromium is not installed (``apt-get install chromium``; another
binary can be named with ``COURSE_CHROMIUM``). Both are always stopped at the end.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lab_server import start_lab, stop_lab

REPO_ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ARTIFACTS = REPO_ROOT / "test-artifacts" / "browser"  # screenshots and logs (git-ignored)
CHROMIUM = os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
ARTIFACTS_SHOWN = pytest.StashKey[Path]()


@pytest.fixture(scope="session")
def chromium() -> str:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"Chromium not found at {CHROMIUM}, so the JupyterLab browser test is "
                    "skipped; install it (apt-get install chromium) or set COURSE_CHROMIUM")
    return CHROMIUM


@pytest.fixture(scope="session")
def artifacts(request, chromium) -> Path:
    """test-artifacts/browser/ (each notebook's folder is emptied by its test); its path is
    printed at the end of the run."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    request.config.stash[ARTIFACTS_SHOWN] = ARTIFACTS
    return ARTIFACTS


@pytest.fixture(scope="session")
def lab(artifacts, tmp_path_factory):
    """JupyterLab serving a temporary copy of notebooks/ and of this folder's notebooks."""
    base = tmp_path_factory.mktemp("jupyterlab")
    server = start_lab(REPO_ROOT / "notebooks", sorted(HERE.glob("*.ipynb")), base, REPO_ROOT,
                       artifacts / "jupyterlab.log")
    try:
        yield server
    finally:
        left = stop_lab(server)
        assert not left, f"still running after JupyterLab was stopped: {left}"


@pytest.fixture(scope="module")
def browser(chromium):
    """Chromium, driven by Playwright's sync API, which runs an event loop of its own until it
    is closed: closed with this file, so that a later file in the same test process
    (tests/test_site.py) can start its own."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chrome = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield chrome
        finally:
            chrome.close()


def pytest_terminal_summary(terminalreporter, config):
    folder = config.stash.get(ARTIFACTS_SHOWN, None)
    if folder is not None:
        terminalreporter.write_line(f"[browser] screenshots and JupyterLab log: {folder}")
