"""The book renders offline: MathJax 3 is served from the build itself, and every mermaid diagram is drawn as an
SVG file at build time, so a page needs no script and no network to show it (also from ``file://``).

Both come from npm (the committed ``package.json`` and ``package-lock.json``; ``npm ci`` fills ``node_modules``).

- MathJax: at build start this extension copies only the files the pages load into ``_build/offline_static/vendor``
  and adds that folder to ``html_static_path``; Sphinx then copies it to ``_build/html/_static/vendor``, where
  ``_config.yml``'s ``mathjax_path`` points.
- Diagrams: ``_config.yml`` sets ``mermaid_output_format: svg``, and sphinxcontrib-mermaid runs ``mermaid_cmd`` once
  per diagram. This extension points it at mermaid's own command-line renderer (``node_modules/.bin/mmdc``) with a
  puppeteer configuration that drives the system's Chromium (``$MHA_CHROMIUM``, else ``chromium`` on the PATH, else
  ``/usr/bin/chromium``: Debian's, which the browser tests use too). Puppeteer's own Chrome is never downloaded.

Nothing from the packages is committed; a missing package or Chromium stops the build with a message saying what to
install.
"""

from __future__ import annotations

import json
import os
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
]
MERMAID_FONTS = '"DejaVu Sans", "Noto Sans CJK SC", sans-serif'  # the diagrams' labels, in every edition
# Chromium flags for a headless run on a machine with no network and no display (as root, hence no sandbox).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def _missing(root: Path, what: str) -> ExtensionError:
    return ExtensionError(f"offline_assets: {what} is missing; run `npm ci` in {root} (the Makefile's `make book` "
                          "does) to install MathJax and mermaid's renderer from package-lock.json")


def chromium() -> str:
    """The Chromium that draws the diagrams: ``$MHA_CHROMIUM``, else ``chromium`` on the PATH, else Debian's."""
    for candidate in (os.environ.get("MHA_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and Path(candidate).is_file():
            return candidate
    raise ExtensionError("offline_assets: no Chromium to draw the mermaid diagrams with: install Debian's chromium "
                         "(`apt-get install chromium`; .ci/run does) or set MHA_CHROMIUM to a Chrome or Chromium binary")


def _stage(app: Sphinx) -> None:
    root = Path(app.srcdir)  # the repository root (the Chinese build keeps its conf.py elsewhere)
    modules = root / "node_modules"
    stage = Path(app.outdir).parent / "offline_static"
    for package, src, dest in ASSETS:
        source = modules / package / src
        if not source.exists():
            raise _missing(root, str(source))
        target = stage / "vendor" / dest
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)
    app.config.html_static_path = [*app.config.html_static_path, str(stage)]

    if app.config.mermaid_output_format != "raw":  # diagrams drawn now, by mermaid's CLI
        mmdc = modules / ".bin" / "mmdc"
        if not mmdc.exists():
            raise _missing(root, str(mmdc))
        puppeteer = stage / "mermaid-puppeteer.json"
        puppeteer.write_text(json.dumps({"executablePath": chromium(), "args": CHROMIUM_ARGS}), encoding="utf-8")
        # one font for the labels in every edition and in print: DejaVu Sans, with Noto Sans CJK SC for Chinese
        # (left to Chromium, the Chinese PDF's labels came out in a calligraphic Kai face)
        mermaid_config = stage / "mermaid-config.json"
        mermaid_config.write_text(json.dumps({"fontFamily": MERMAID_FONTS, "themeVariables": {
            "fontFamily": MERMAID_FONTS}}), encoding="utf-8")
        app.config.mermaid_cmd = [str(mmdc)]
        app.config.mermaid_params = ["--puppeteerConfigFile", str(puppeteer), "--configFile", str(mermaid_config),
                                     "--quiet"]
        if app.builder.format == "latex":  # a PDF page cut to the diagram (no pdfcrop needed)
            app.config.mermaid_params.append("--pdfFit")


def setup(app: Sphinx) -> dict:
    app.connect("builder-inited", _stage)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
