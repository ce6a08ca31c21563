"""How an exercise's report reads in the page: its lines, and the contrast of its text on the
error box's background, in JupyterLab's light and dark themes.

Contrast is WCAG's: (L1 + 0.05) / (L2 + 0.05) of the relative luminances of the text colour
(blended over the background when it is translucent) and of the first opaque background
behind it (translucent ones blended on the way up). Body text needs at least 4.5:1.
"""

from __future__ import annotations

from playwright.sync_api import Page

MIN_CONTRAST = 4.5  # WCAG 2 AA for body text
THEMES = ("JupyterLab Light", "JupyterLab Dark")

ERROR_REPORTS_JS = """(stderrMime) => {
  const rgba = (text) => {
    const v = (text.match(/[\\d.]+/g) || []).map(Number);
    return v.length < 3 ? [0, 0, 0, 0] : [v[0], v[1], v[2], v.length > 3 ? v[3] : 1];
  };
  const over = (top, under) => [0, 1, 2].map(i => top[i] * top[3] + under[i] * (1 - top[3]))
    .concat([1]);
  const background = (node) => {  // the colour painted behind node, translucent layers blended
    const layers = [];
    for (let n = node; n && n.nodeType === 1; n = n.parentElement) {
      const c = rgba(getComputedStyle(n).backgroundColor);
      if (c[3] > 0) layers.push(c);
      if (c[3] >= 1) break;
    }
    let colour = [255, 255, 255, 1];
    if (layers.length && layers[layers.length - 1][3] >= 1) colour = layers.pop();
    for (const layer of layers.reverse()) colour = over(layer, colour);
    return colour;
  };
  const luminance = (c) => {
    const [r, g, b] = c.slice(0, 3).map(v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const panel = window.jupyterapp.shell.currentWidget;
  const reports = [];
  panel.content.widgets.forEach((cell, index) => {
    cell.node.querySelectorAll('.jp-OutputArea-output').forEach(output => {
      if (output.dataset.mimeType !== stderrMime) return;
      let worst = {contrast: Infinity, text: ''};
      const walker = document.createTreeWalker(output, NodeFilter.SHOW_TEXT);
      for (let t = walker.nextNode(); t; t = walker.nextNode()) {
        if (!t.textContent.trim()) continue;
        const element = t.parentElement;
        const bg = background(element);
        const fg = over(rgba(getComputedStyle(element).color), bg);
        const [a, b] = [luminance(fg), luminance(bg)].sort((x, y) => y - x);
        const contrast = (a + 0.05) / (b + 0.05);
        if (contrast < worst.contrast) {
          worst = {contrast, text: t.textContent.trim().slice(0, 80),
                   colour: getComputedStyle(element).color, background: bg.join(',')};
        }
      }
      reports.push({cell: index, lines: output.innerText.split('\\n'), worst});
    });
  });
  return reports;
}"""


def set_theme(page: Page, theme: str) -> None:
    """Switch JupyterLab's theme, then wait until its colours apply."""
    page.evaluate("(theme) => window.jupyterapp.commands.execute('apputils:change-theme', "
                  "{theme})", theme)
    page.wait_for_function("(theme) => document.body.dataset.jpThemeName === theme", arg=theme,
                           timeout=30_000)
    page.wait_for_timeout(500)  # the theme's stylesheet is in; let the page repaint


def error_reports(page: Page, stderr_mime: str) -> list[dict]:
    """Each error box of the page: its cell, its lines, and its text of lowest contrast."""
    return page.evaluate(ERROR_REPORTS_JS, stderr_mime)


def report_problems(page: Page, stderr_mime: str, must_show: dict[int, list[str]]) -> list[str]:
    """In each theme: every error box's text at ``MIN_CONTRAST`` or more, and each cell of
    ``must_show`` holding each of its lines as a line of its own."""
    problems = []
    try:
        for theme in THEMES:
            set_theme(page, theme)
            reports = error_reports(page, stderr_mime)
            for cell, lines in must_show.items():
                shown = [line.rstrip() for r in reports if r["cell"] == cell
                         for line in r["lines"]]
                problems += [f"{theme}, cell {cell}: no line of its own reads {line!r}; the "
                             f"report shows {shown}" for line in lines if line not in shown]
            for r in reports:
                worst = r["worst"]
                if worst["contrast"] < MIN_CONTRAST:
                    problems.append(
                        f"{theme}, cell {r['cell']}: {worst['text']!r} has contrast "
                        f"{worst['contrast']:.2f}:1 (text {worst['colour']} on "
                        f"rgb({worst['background']})), below {MIN_CONTRAST}:1")
    finally:
        set_theme(page, THEMES[0])
    return problems
