"""Serve MathJax 3 and mermaid 11 from the build itself, so the book renders offline.

Both come from npm (the committed ``package.json`` and ``package-lock.json``; ``npm ci`` fills ``node_modules``).
At build start this extension copies only the files the pages load into ``_build/offline_static/vendor`` and adds
that folder to ``html_static_path``; Sphinx then copies it to ``_build/html/_static/vendor``. ``_config.yml`` points
``mathjax_path`` and ``mermaid_use_local`` there. Nothing from the packages is committed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

# (package, path inside the package, destination under vendor/): what the pages load at run time.
ASSETS = [
    ("mathjax", "es5/tex-chtml.js", "mathjax/tex-chtml.js"),
    ("mathjax", "es5/output/chtml", "mathjax/output/chtml"),  # web fonts, loaded relative to the script
    ("mathjax", "es5/input/tex/extensions", "mathjax/input/tex/extensions"),  # autoloaded TeX packages
    ("mathjax", "es5/ui", "mathjax/ui"),  # the context menu
    ("mathjax", "es5/a11y", "mathjax/a11y"),
    ("mathjax", "es5/sre", "mathjax/sre"),  # speech rule engine, loaded by the menu's accessibility options
    ("mermaid", "dist/mermaid.esm.min.mjs", "mermaid/mermaid.esm.min.mjs"),
    ("mermaid", "dist/chunks/mermaid.esm.min", "mermaid/chunks/mermaid.esm.min"),
]


def _stage(app: Sphinx) -> None:
    root = Path(app.srcdir)  # the repository root (the Chinese build keeps its conf.py elsewhere)
    modules = root / "node_modules"
    stage = Path(app.outdir).parent / "offline_static"
    for package, src, dest in ASSETS:
        source = modules / package / src
        if not source.exists():
            raise ExtensionError(
                f"offline_assets: {source} is missing; run `npm ci` in {root} "
                "(the Makefile's `make book` does) to install MathJax and mermaid from package-lock.json"
            )
        target = stage / "vendor" / dest
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)
    app.config.html_static_path = [*app.config.html_static_path, str(stage)]


def setup(app: Sphinx) -> dict:
    app.connect("builder-inited", _stage)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
