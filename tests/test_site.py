"""The course's website: scripts/build_site.sh builds it once, and every page is read in headless
Chromium (Playwright over the system Chromium, as tests/browser does), 400 px wide, served from
127.0.0.1. Each page must show its math typeset by the site's own MathJax 3, every widget the
notebook saved rendered as a widget, every plot loaded; it must make no request to any address
but 127.0.0.1 (every request is routed, and any other is refused and reported), log no console
error and not scroll sideways. The pages never show a solution or a solution marker, and each
exercise is open. Skipped, with the reason, when Chromium is not installed, or npm is not and
the site's scripts were never vendored.

The site's environment (.venv-site) is installed by .ci/run before the suite; when it is
missing, the build installs it first (about a minute). The last tests, not slow, check what
scripts/build_site.sh refuses before it installs or builds anything, and how site/stage.py
rewrites links and widget state.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import posixpath
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import nbformat
import pytest

from course_lib.check.student_copy import make_student_copy, marked_line

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]  # as tests/browser/conftest.py
WIDTH = 400  # a phone's width: no page may scroll sideways
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
MARKERS = ("BEGIN SOLUTION", "END SOLUTION")


def browser_test(test):
    """Slow: the first of these tests builds the site and opens every page (once for all)."""
    return pytest.mark.slow(pytest.mark.timeout(900)(test))


READY_JS = """async () => {
  const viewsShown = () => [...document.querySelectorAll(
      'script[type="application/vnd.jupyter.widget-view+json"]')].every(script => {
    const area = script.previousElementSibling;
    return area && area.classList.contains('widget-subarea')
      && area.querySelector('.jupyter-widgets');
  });
  for (let waited = 0; !viewsShown() && waited < 60000; waited += 100) {
    await new Promise(done => setTimeout(done, 100));
  }
  if (document.querySelector('.math') && window.MathJax && MathJax.startup) {
    await MathJax.startup.promise;
  }
  await Promise.all([...document.images].map(img => img.decode().catch(() => 0)));
}"""

FACTS_JS = """() => {
  const maths = [...document.querySelectorAll('.math')];
  const views = [...document.querySelectorAll(
      'script[type="application/vnd.jupyter.widget-view+json"]')];
  const widget = script => {
    const area = script.previousElementSibling;
    const view = area && area.classList.contains('widget-subarea')
      && area.querySelector('.jupyter-widgets');
    return !!view && view.getBoundingClientRect().height > 0;
  };
  const plots = [...document.querySelectorAll('.cell_output img')]
    .filter(img => !img.closest('.jupyter-widgets'));
  const page = document.scrollingElement;
  const clipped = el => {  // inside a box that scrolls or clips sideways, or a closed drawer
    if (el.closest('.bd-sidebar-primary, .bd-sidebar-secondary')) return true;
    for (let up = el.parentElement; up && up !== document.body; up = up.parentElement) {
      if (['auto', 'scroll', 'hidden', 'clip'].includes(getComputedStyle(up).overflowX)) {
        return true;
      }
    }
    return false;
  };
  const wide = [...document.querySelectorAll('body *')]
    .filter(el => el.getBoundingClientRect().right > page.clientWidth + 1 && !clipped(el))
    .slice(0, 5).map(el => el.tagName.toLowerCase() + '.' + [...el.classList].join('.'));
  return {
    url: location.href,
    maths: maths.length,
    typeset: maths.filter(m => m.querySelector('mjx-container')
                               && !m.querySelector('mjx-merror')).length,
    mathjax: window.MathJax ? String(MathJax.version) : null,
    mathjaxFrom: [...document.scripts].map(s => s.src.split('?')[0])
      .filter(src => /tex-chtml/.test(src)),
    views: views.length,
    widgets: views.filter(widget).length,
    widgetImages: [...document.querySelectorAll('.jupyter-widgets img')]
      .filter(img => !(img.complete && img.naturalWidth > 0)).length,
    plots: plots.length,
    plotsLoaded: plots.filter(img => img.complete && img.naturalWidth > 0).length,
    scrollWidth: page.scrollWidth,
    clientWidth: page.clientWidth,
    wide: wide,
    text: (document.querySelector('main') || document.body).textContent,
  };
}"""


def expected(notebook: Path) -> dict:
    """What the page of ``notebook`` must show: from its student copy, the source of the site."""
    made = make_student_copy(nbformat.read(notebook, as_version=4), str(notebook))
    outputs = [out for cell in made.notebook.cells for out in cell.get("outputs", [])]
    prose = "\n".join(re.sub(r"`[^`]*`", "", cell.source) for cell in made.notebook.cells
                      if cell.cell_type == "markdown")
    return {
        "plots": sum("image/png" in out.get("data", {}) for out in outputs),
        "views": sum(WIDGET_VIEW in out.get("data", {}) for out in outputs),
        "math": bool(re.search(r"\$[^$\n]+\$", prose)),
        "solutions": ["\n".join(block.lines) for block in made.blocks if not block.given],
        "fixes": [line for block in made.blocks for line in fix_lines(block)],
        "open": sorted({max(block.given, key=len).strip() if block.given else
                        marked_line(block.exercise_id) for block in made.blocks}),
    }


def fix_lines(block) -> list[str]:
    """Where the learner starts from given code (a student version), the lines of the fix that
    the given code lacks: no line of the page may be one of them."""
    given = {line.strip() for line in block.given or []}
    return [line.strip() for line in block.lines if block.given and line.strip()
            and line.strip() not in given]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"Chromium not found at {CHROMIUM}, so the website test is skipped; install "
                    "it (apt-get install chromium) or set COURSE_CHROMIUM")
    venv = Path(os.environ.get("COURSE_SITE_VENV", ROOT / ".venv-site"))
    if not shutil.which("npm") and not (venv / "vendor").is_dir():
        pytest.skip("npm not found, so the site's scripts (MathJax, the widgets' HTML manager) "
                    "cannot be vendored and the website test is skipped; install Node.js and npm")
    base = tmp_path_factory.mktemp("site")
    run = subprocess.run(["bash", "scripts/build_site.sh", str(base / "html")], cwd=ROOT,
                         capture_output=True, text=True, timeout=800,
                         env={**os.environ, "COURSE_SITE_WORK": str(base / "work")})
    print(run.stdout[-2000:])
    assert run.returncode == 0, f"scripts/build_site.sh failed:\n{run.stdout[-3000:]}" \
                                f"\n{run.stderr[-5000:]}"
    return base / "html"


class QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # a page left before a file was sent
        pass


@pytest.fixture(scope="module")
def server(site):
    """The built site over HTTP on 127.0.0.1 (a free port), as a web host serves it."""
    quiet = type("Quiet", (http.server.SimpleHTTPRequestHandler,),
                 {"log_message": lambda *args: None})
    httpd = QuietServer(
        ("127.0.0.1", 0), functools.partial(quiet, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def settled_facts(page, site: Path, server: str, name: str) -> dict:
    """What page ``name`` shows once its widgets, math and images are done. A page that only
    sends the browser on (index.html, to the front page) is read where it lands."""
    moves_on = re.search(r'http-equiv="refresh" content="0; url=([^"]+)"',
                         (site / name).read_text(encoding="utf-8"), re.I)
    if moves_on:
        page.goto(server + name, wait_until="commit")
        page.wait_for_url(server + posixpath.join(posixpath.dirname(name), moves_on[1]),
                          wait_until="load")
    else:
        page.goto(server + name, wait_until="load")
    page.evaluate(READY_JS)
    return page.evaluate(FACTS_JS)


@pytest.fixture(scope="module")
def pages(site, server) -> dict[str, dict]:
    """Every page of the site, opened one after the other in one browser context: what it
    showed, and each request refused and console error it logged."""
    from playwright.sync_api import sync_playwright

    names = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                   if not p.relative_to(site).parts[0].startswith("_"))
    seen: dict[str, dict] = {}
    with sync_playwright() as playwright:
        chrome = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = chrome.new_context(viewport={"width": WIDTH, "height": 900})
            current = {"name": ""}

            def route(route):
                url = route.request.url
                if url.startswith(("file://", "http://127.0.0.1:", "https://127.0.0.1:")):
                    route.continue_()
                else:
                    seen[current["name"]]["remote"].append(url)
                    route.abort()

            context.route("**/*", route)
            page = context.new_page()
            page.set_default_timeout(120_000)  # a loaded 2-core machine, not a hang
            page.on("console", lambda msg: msg.type == "error" and seen[current["name"]][
                "errors"].append(f"{msg.text} ({msg.location.get('url', '')})"))
            page.on("pageerror", lambda error: seen[current["name"]]["errors"].append(
                f"uncaught: {error}"))
            for name in names:
                current["name"] = name
                seen[name] = {"remote": [], "errors": []}
                seen[name].update(settled_facts(page, site, server, name))
        finally:
            chrome.close()
    return seen


@browser_test
def test_the_site_has_every_page_in_course_order(site, pages):
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    for nb in notebooks:
        assert f"notebooks/{nb.stem}.html" in pages, f"no page for {nb.name}"
    front = (site / "README.html").read_text(encoding="utf-8")
    nav = re.search(r'<nav class="[^"]*bd-docs-nav.*?</nav>', front, re.S)
    assert nav, "the front page has no navigation"
    linked = [m for m in re.findall(r'href="(notebooks/[^"#]+)\.html"', nav.group(0))
              if re.match(r"notebooks/\d\d", m)]
    assert linked == [f"notebooks/{nb.stem}" for nb in notebooks], \
        "the navigation does not list the notebooks in course order"
    assert "index.html" in pages and "README.html" in pages


@browser_test
def test_no_page_requests_a_remote_address(pages):
    remote = {name: seen["remote"] for name, seen in pages.items() if seen["remote"]}
    assert not remote, f"pages asked for non-local addresses (refused): {remote}"


@browser_test
def test_no_page_logs_a_console_error(pages):
    errors = {name: seen["errors"] for name, seen in pages.items() if seen["errors"]}
    assert not errors, f"console errors: {errors}"


@browser_test
def test_no_page_scrolls_sideways_at_400_px(pages):
    wide = {name: (seen["scrollWidth"], seen["wide"]) for name, seen in pages.items()
            if seen["scrollWidth"] > seen["clientWidth"]}
    assert not wide, f"pages wider than {WIDTH} px (page width, widest elements): {wide}"


@browser_test
def test_math_is_typeset_by_the_sites_own_mathjax(pages, server):
    with_math = {name: seen for name, seen in pages.items() if seen["maths"]}
    assert with_math, "no page has math: the check would prove nothing"
    for name, seen in with_math.items():
        assert seen["mathjax"] and seen["mathjax"].startswith("3."), \
            f"{name}: MathJax 3 did not load (window.MathJax.version: {seen['mathjax']})"
        assert seen["mathjaxFrom"] == [server + "_vendor/mathjax/es5/tex-chtml.js"], \
            f"{name}: MathJax loaded from {seen['mathjaxFrom']}, not the site's _vendor/"
        assert seen["typeset"] == seen["maths"], \
            f"{name}: {seen['maths'] - seen['typeset']} of {seen['maths']} formulas not typeset"
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")):
        if expected(nb)["math"]:
            assert pages[f"notebooks/{nb.stem}.html"]["maths"], f"{nb.name}'s math not shown"


@browser_test
def test_saved_widgets_and_plots_are_shown(pages):
    views = 0
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")):
        want, seen = expected(nb), pages[f"notebooks/{nb.stem}.html"]
        assert seen["views"] == want["views"], \
            f"{nb.name}: {seen['views']} widget outputs on the page, {want['views']} saved"
        assert seen["widgets"] == seen["views"], \
            f"{nb.name}: {seen['views'] - seen['widgets']} saved widgets not rendered"
        assert not seen["widgetImages"], f"{nb.name}: a plot inside a widget did not load"
        assert seen["plots"] == want["plots"], \
            f"{nb.name}: {seen['plots']} plots on the page, {want['plots']} saved"
        assert seen["plotsLoaded"] == seen["plots"], \
            f"{nb.name}: {seen['plots'] - seen['plotsLoaded']} plots did not load"
        views += seen["views"]
    assert views, "no notebook saved a widget: the check would prove nothing"


@browser_test
def test_pages_show_no_solution_and_open_exercises(site, pages):
    for path in site.rglob("*"):
        if path.is_file() and path.suffix in (".html", ".ipynb", ".txt", ".md", ".js") \
                and "_vendor" not in path.parts:
            text = path.read_text(encoding="utf-8", errors="replace")
            assert not any(marker in text for marker in MARKERS), \
                f"{path.relative_to(site)} shows a solution marker"
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")):
        want, text = expected(nb), pages[f"notebooks/{nb.stem}.html"]["text"]
        for solution in want["solutions"]:
            assert solution not in text, f"{nb.name} shows a solution:\n{solution}"
        shown = {line.strip() for line in text.split("\n")}
        for line in want["fixes"]:
            assert line not in shown, f"{nb.name} shows a line of a fix: {line}"
        for line in want["open"]:
            assert line in text, f"{nb.name} does not show the open exercise: {line}"


def build_site(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/build_site.sh", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [["--bogus"], ["out", "extra"]])
def test_build_site_refuses_what_it_does_not_know(args):
    done = build_site(*args)
    assert done.returncode == 2 and "usage: scripts/build_site.sh" in done.stderr, done.stderr


def test_build_site_never_replaces_a_folder_it_did_not_build(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    done = build_site(str(tmp_path))
    assert done.returncode == 2 and "is not a site this script built" in done.stderr, done.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"


def load_stage():
    """site/stage.py, which lays out the site's source (not a package: loaded from its file)."""
    spec = importlib.util.spec_from_file_location("site_stage", ROOT / "site" / "stage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stage_takes_an_option_for_no_folder(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "site" / "stage.py"), "--help"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.startswith("usage: python site/stage.py SRC")
    assert not list(tmp_path.iterdir())  # no folder named --help laid out


def test_stage_rewrites_a_jupyterlab_anchor_to_the_sites():
    stage = load_stage()
    other = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "## 4. What a message costs: latency and bandwidth")])
    anchors = {"05_x.ipynb": stage.headings(other)}
    text = "see [notebook 05](05_x.ipynb#4.-What-a-message-costs:-latency-and-bandwidth)"
    assert stage.fix_anchors(text, {}, anchors) == \
        "see [notebook 05](05_x.ipynb#4-what-a-message-costs-latency-and-bandwidth)"


def test_stage_links_a_file_off_the_site_to_the_repository(monkeypatch):
    stage = load_stage()
    text = "a [guide](README.md) and [00](00_a.ipynb), [web](https://example.org/x)"
    on_site = {"notebooks/00_a.ipynb"}
    monkeypatch.setenv("SITE_REPOSITORY_URL", "https://github.com/o/r")
    assert stage.fix_links(text, "notebooks/07.ipynb", on_site) == \
        "a [guide](https://github.com/o/r/blob/HEAD/notebooks/README.md) and [00](00_a.ipynb)," \
        " [web](https://example.org/x)"
    monkeypatch.setenv("SITE_REPOSITORY_URL", "")
    assert stage.fix_links(text, "notebooks/07.ipynb", on_site).startswith("a guide and [00]")


def test_stage_keeps_only_the_widget_state_a_saved_widget_shows():
    stage = load_stage()
    state = {"5e1": {"model_name": "IntSliderModel", "state": {"layout": "IPY_MODEL_1a7"}},
             "1a7": {"model_name": "LayoutModel", "state": {}},
             "ba5": {"model_name": "IntProgressModel", "state": {"layout": "IPY_MODEL_1a8"}},
             "1a8": {"model_name": "LayoutModel", "state": {}}}  # model ids are hexadecimal
    nb = nbformat.v4.new_notebook(metadata={"widgets": {stage.WIDGET_STATE: {"state": state}}})
    cell = nbformat.v4.new_code_cell(outputs=[nbformat.v4.new_output(
        "display_data", data={WIDGET_VIEW: {"model_id": "5e1"}})])
    nb.cells.append(cell)
    assert set(stage.shown_widgets(nb)) == {"5e1", "1a7"}  # the progress bar's left out
    cell.outputs = []
    assert stage.shown_widgets(nb) == {}
