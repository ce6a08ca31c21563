"""Sphinx extension of the course's website: every script and font a page loads is on the site.

- MathJax 3 and the widgets' embed bundle (@jupyter-widgets/html-manager), fetched from the npm
  registry when scripts/build_site.sh installs the site's environment, are copied from
  ``$SITE_VENDOR_DIR`` into ``_vendor/`` of the built site. They stay out of ``_static/``:
  Jupyter Book adds every ``.js`` file under ``_static/`` to every page.
- Pages load MathJax from there (``mathjax_path``) and, when a notebook saved widgets, the
  embed bundle (``nb_ipywidgets_js``); ``_static/mathjax2_api.js`` gives MathJax 3 the one
  MathJax 2 call the bundle makes.
- ``$SITE_REPOSITORY_URL``, when set (the Pages workflow sets it), adds a link to the
  repository to every page's header.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

VENDOR = "_vendor"
MATHJAX = f"{VENDOR}/mathjax/es5/tex-chtml.js"
WIDGETS = f"{VENDOR}/html-manager/dist/embed.js"


def vendor_dir() -> Path:
    folder = Path(os.environ.get("SITE_VENDOR_DIR", ""))
    missing = [name for name in (MATHJAX, WIDGETS)
               if not (folder / name.removeprefix(VENDOR + "/")).is_file()]
    if not os.environ.get("SITE_VENDOR_DIR") or missing:
        raise RuntimeError(f"SITE_VENDOR_DIR={str(folder)!r} lacks {missing}: build the site "
                           "with scripts/build_site.sh, which installs them")
    return folder


def configure(app, config) -> None:
    vendor_dir()
    # Relative paths are taken from _static/, so "../" reaches the site's root.
    config.mathjax_path = "../" + MATHJAX
    config.nb_ipywidgets_js = {"../" + WIDGETS: {"defer": "defer"}}
    url = os.environ.get("SITE_REPOSITORY_URL", "")
    if url:
        config.html_theme_options = {**config.html_theme_options, "repository_url": url,
                                     "use_repository_button": True}


def copy_vendor(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        shutil.copytree(vendor_dir(), Path(app.outdir) / VENDOR, dirs_exist_ok=True)


def setup(app):
    app.connect("config-inited", configure)
    app.connect("build-finished", copy_vendor)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
