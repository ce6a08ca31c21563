"""Drive a notebook in JupyterLab the way a learner does, and read back what the page shows.

Cells are read from the page itself (prompts, images, text, error boxes); ``window.jupyterapp``
(JupyterLab's ``expose_app_in_browser``) is used only to list the cells in order and to see
whether the kernel is busy.
"""

from __future__ import annotations

import time

from nb_expectations import NOT_RUN_PROMPTS
from playwright.sync_api import Locator, Page

STDERR_MIME = "application/vnd.jupyter.stderr"  # JupyterLab shows errors and stderr this way

KERNEL_STATUS_JS = """() => {
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const session = panel && panel.sessionContext && panel.sessionContext.session;
  return session && session.kernel ? session.kernel.status : 'none';
}"""

READ_CELLS_JS = """(stderrMime) => {
  const panel = window.jupyterapp.shell.currentWidget;
  return panel.content.widgets.map(cell => {
    const node = cell.node;
    const area = node.querySelector('.jp-Cell-outputArea');
    const outputs = [...node.querySelectorAll('.jp-OutputArea-output')];
    // plots drawn by the cell itself, not those inside a widget's own output
    const images = [...node.querySelectorAll('.jp-OutputArea-output img')]
      .filter(img => !img.closest('.jupyter-widgets'));
    return {
      kind: cell.model.type,
      prompt: (node.querySelector('.jp-InputPrompt') || {innerText: ''}).innerText.trim(),
      errors: outputs.filter(o => o.dataset.mimeType === stderrMime)
        .map(o => o.innerText.trim().slice(-1500)),
      images: images.length,
      images_loaded: images.filter(img => img.complete && img.naturalWidth > 0).length,
      text: area ? area.innerText : '',
      sliders: node.querySelectorAll('.widget-slider').length,
      outputs: outputs.length,
    };
  });
}"""

PROMPTS_JS = """() => window.jupyterapp.shell.currentWidget.content.widgets.map(cell =>
  (cell.node.querySelector('.jp-InputPrompt') || {textContent: ''}).textContent.trim())"""

FINGERPRINT_JS = """(index) => {
  const cell = window.jupyterapp.shell.currentWidget.content.widgets[index];
  const copy = cell.node.querySelector('.jp-Cell-outputArea').cloneNode(true);
  copy.querySelectorAll('.widget-slider').forEach(slider => slider.remove());  // not its readout
  const images = [...copy.querySelectorAll('img')].map(img => img.getAttribute('src'));
  return copy.textContent + '\\n' + images.join('\\n');
}"""


IMAGES_READY_JS = """(index) => {
  const cell = window.jupyterapp.shell.currentWidget.content.widgets[index];
  return [...cell.node.querySelectorAll('.jp-Cell-outputArea img')]
    .every(img => img.complete && img.naturalWidth > 0);
}"""


PAINTED_JS = """async (index) => {
  const cell = window.jupyterapp.shell.currentWidget.content.widgets[index];
  // decoded images, then two frames: what the screenshot takes is painted
  await Promise.all([...cell.node.querySelectorAll('img')].map(i => i.decode().catch(() => 0)));
  await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));
}"""


def kernel_status(page: Page) -> str:
    return page.evaluate(KERNEL_STATUS_JS)


def wait_for_idle_kernel(page: Page, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while kernel_status(page) != "idle":
        if time.monotonic() > deadline:
            raise AssertionError(f"the kernel was not idle within {timeout_s:.0f} s "
                                 f"(status: {kernel_status(page)})")
        time.sleep(0.25)


def open_notebook(page: Page, url: str, name: str, timeout_s: float = 90) -> None:
    """Open ``name`` in a fresh JupyterLab workspace and wait for its kernel to be idle."""
    page.goto(f"{url}/lab/tree/{name}?reset")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=timeout_s * 1000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                           " && window.jupyterapp.shell.currentWidget.sessionContext",
                           timeout=timeout_s * 1000)
    wait_for_idle_kernel(page, timeout_s)  # Run All sent earlier can be lost


def read_cells(page: Page) -> list[dict]:
    """What the page shows for every cell, in notebook order."""
    return page.evaluate(READ_CELLS_JS, STDERR_MIME)


def clear_outputs(page: Page) -> None:
    """Edit > Clear Outputs of All Cells: saved outputs must not pass for new ones."""
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
    page.wait_for_function("() => document.querySelectorAll("
                           "'.jp-NotebookPanel .jp-OutputArea-output').length === 0")


def run_all_cells(page: Page) -> None:
    """Run > Run All Cells, through the menu bar."""
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


def read_prompts(page: Page) -> list[str]:
    """Every cell's prompt ("[3]:", "[*]:"), read without laying the page out: what the wait
    polls (reading every output's text twice a second kept Chromium busy)."""
    return page.evaluate(PROMPTS_JS)


def finished(prompts: list[str], must_run: list[int]) -> bool:
    return all(prompts[i] not in NOT_RUN_PROMPTS for i in must_run)


def wait_until_run_ends(page: Page, must_run: list[int], timeout_s: float) -> list[dict]:
    """Wait until every cell in ``must_run`` has run, or Run All has stopped; return the cells.

    Run All stops at a cell that raises: nothing is queued any more ("[*]") and the kernel is
    idle, yet some cells never ran. Seen for 3 s in a row, that ends the wait too.
    """
    deadline = time.monotonic() + timeout_s
    stopped_since = None
    while time.monotonic() < deadline:
        prompts = read_prompts(page)
        idle = kernel_status(page) == "idle"
        if idle and finished(prompts, must_run):
            return read_cells(page)
        queued = "[*]:" in prompts
        if idle and not queued:
            stopped_since = stopped_since or time.monotonic()
            if time.monotonic() - stopped_since > 3:
                return read_cells(page)
        else:
            stopped_since = None
        time.sleep(0.5)
    raise AssertionError(f"Run All did not finish within {timeout_s:.0f} s; cell prompts: "
                         f"{[c['prompt'] for c in read_cells(page)]}")


def cell(page: Page, index: int) -> Locator:
    return page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").nth(index)


def screenshot_cell(page: Page, index: int, path: str) -> None:
    """A picture of one cell, taken once the page has painted it in view."""
    target = cell(page, index)
    target.scroll_into_view_if_needed()
    page.evaluate(PAINTED_JS, index)
    view = page.viewport_size
    # a one-pixel resize makes headless Chromium repaint everything: an image that arrived
    # while the cell was in view is otherwise sometimes missing from the picture
    page.set_viewport_size({"width": view["width"], "height": view["height"] + 1})
    page.set_viewport_size(view)
    box = target.bounding_box()
    if box and 0 <= box["y"] and box["y"] + box["height"] <= view["height"]:
        page.screenshot(path=path, clip=box)  # what is on screen, as the learner sees it
    else:
        target.screenshot(path=path)  # taller than the window: Playwright stitches it


def output_fingerprint(page: Page, index: int) -> str:
    """Text and image sources of a cell's output, leaving out the sliders themselves."""
    return page.evaluate(FINGERPRINT_JS, index)


def settled_fingerprint(page: Page, index: int, before: str, timeout_s: float) -> str:
    """Wait for the output to differ from ``before``, then to hold still with an idle kernel and
    every image loaded."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        now = output_fingerprint(page, index)
        if (now != before and now == last and kernel_status(page) == "idle"
                and page.evaluate(IMAGES_READY_JS, index)):
            return now
        last = now
        time.sleep(0.5)
    return output_fingerprint(page, index)


def move_first_slider(page: Page, index: int, timeout_s: float = 30) -> tuple[str, str, str]:
    """Move the first slider of cell ``index``; return (output before, output after, how).

    First with the keyboard (focus the handle, press an arrow), then, if the output did not
    change, by dragging the handle with the mouse. A widget that waits for a button (a long
    run behind "Run Interact") gets the button clicked after each move.
    """
    area = cell(page, index)
    handle = area.locator(".widget-slider .noUi-handle").first
    buttons = area.locator("button.jupyter-button")
    handle.scroll_into_view_if_needed()
    before = output_fingerprint(page, index)
    at_end = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
    after, how = before, "nothing"
    for how, move in (("keyboard", lambda: press_arrow(page, handle, at_end)),
                      ("mouse drag", lambda: drag(page, handle, -60 if at_end else 60))):
        move()
        if buttons.count():
            buttons.first.click()
            how += " and a button click"
        after = settled_fingerprint(page, index, before, timeout_s)
        if after != before:
            break
    return before, after, how


def press_arrow(page: Page, handle: Locator, at_end: bool) -> None:
    handle.focus()
    page.keyboard.press("ArrowLeft" if at_end else "ArrowRight")  # one step of the slider


def drag(page: Page, handle: Locator, dx: float) -> None:
    box = handle.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + dx, y, steps=6)
    page.mouse.up()
