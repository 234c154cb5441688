"""The book builds with warnings as errors, and every page renders offline in headless Chromium.

The build is `jupyter-book build . -W -n --keep-going` (the Makefile's `make book`): with `execute_notebooks: cache`
it executes every chapter that changed. The browser check serves `_build/html` on 127.0.0.1, blocks every request
to any other host (so nothing may come from a CDN), and loads each page: display math typeset by MathJax, every
mermaid block an SVG, every image loaded, every relative link (and its #fragment) resolving, no JavaScript error.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.book


@pytest.fixture(scope="module")
def build():
    """Build the book once for this module; return the build log."""
    jb = Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run(
        [str(jb), "build", ".", "-W", "-n", "--keep-going"],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"book build failed (exit {proc.returncode}):\n{log[-6000:]}"
    return log


def test_book_builds_with_zero_warnings(build):
    # Sphinx's own messages ("WARNING: ...", "ERROR: ..."); the kernel's "[IPKernelApp] WARNING | Kernel is running
    # over TCP" notice is not a build warning.
    warnings = [line for line in build.splitlines() if re.search(r"\b(WARNING|ERROR|CRITICAL):", line)]
    assert not warnings, "\n".join(warnings)
    assert (HTML / "index.html").exists()


_OUTPUT = re.compile(r'<div class="output (?P<kind>[a-z_]+)[^"]*"[^>]*>(?P<body>.*?)</div>', re.S)
_BARE_VALUE = re.compile(r"^\s*[-+]?[0-9][0-9.,eE+%-]*\s*$|^\s*'[^'\n]{0,40}'\s*$|^\s*(True|False|None)\s*$")


def test_no_page_shows_warnings_or_stray_output(build):
    """No executed cell shows a warning (stderr output, or any output mentioning a *Warning), and no cell shows a
    bare value (a number, a short string, True/False/None) as its output: that is a stray ``glue`` without
    ``display=False`` or a last expression left in a cell, not part of the lesson."""
    problems = []
    for page in _pages():
        html = page.read_text(encoding="utf-8", errors="replace")
        for match in _OUTPUT.finditer(html):
            kind = match.group("kind")
            text = re.sub(r"<[^>]+>", "", match.group("body"))
            where = f"{page.relative_to(HTML)}: {kind} output {text.strip()[:80]!r}"
            if kind == "stderr" or re.search(r"\w*Warning\b", text):
                problems.append(where)
            elif kind == "text_plain" and _BARE_VALUE.match(text):
                problems.append(where)
    assert not problems, "\n".join(problems)


def _pages():
    skip = {"genindex.html", "search.html"}
    return sorted(p for p in HTML.rglob("*.html") if "_static" not in p.parts and p.name not in skip)


class _Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key in ("id", "name") and value:
                self.ids.add(value)


@functools.lru_cache(maxsize=None)
def _ids_of(path: Path) -> frozenset:
    parser = _Ids()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return frozenset(parser.ids)


@pytest.fixture(scope="module")
def server(build):
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript",
                      ".js": "text/javascript"}

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (`apt-get install chromium`; .ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
                  "--no-first-run", "--disable-component-update", "--disable-sync"],
        )
        yield b
        b.close()


# Text that only un-typeset TeX leaves behind in the visible page (code blocks excluded).
RAW_TEX = re.compile(r"\$\$|\\begin\{|\\frac|\\mathbb|\\sqrt")

REDIRECT = re.compile(r'<meta http-equiv="Refresh" content="0; url=([^"]+)"', re.I)

PAGE_STATE_JS = """
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  const deadline = Date.now() + 20000;
  const mermaidDone = () => [...document.querySelectorAll('pre.mermaid, div.mermaid')]
      .every(el => el.querySelector('svg'));
  while (!mermaidDone() && Date.now() < deadline) { await new Promise(r => setTimeout(r, 100)); }
  const clone = document.body.cloneNode(true);
  clone.querySelectorAll('pre, code, script, style, mjx-container, .mermaid').forEach(el => el.remove());
  return {
    mathBlocks: document.querySelectorAll('div.math, .math.notranslate').length,
    untypesetMath: [...document.querySelectorAll('div.math, span.math')]
        .filter(el => !el.querySelector('mjx-container')).map(el => el.textContent.slice(0, 80)),
    mermaidBlocks: document.querySelectorAll('pre.mermaid, div.mermaid').length,
    mermaidWithoutSvg: [...document.querySelectorAll('pre.mermaid, div.mermaid')]
        .filter(el => !el.querySelector('svg')).length,
    brokenImages: [...document.images].filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.src),
    links: [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
    text: clone.innerText,
  };
}
"""


def _check_link(page_path: Path, href: str) -> str | None:
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:")):
        return None  # external links are not ours to check offline
    target = page_path if not parts.path else (page_path.parent / unquote(parts.path)).resolve()
    if target.is_dir():
        target = target / "index.html"
    if not target.exists():
        return f"{href} -> missing file {target.relative_to(HTML) if HTML in target.parents else target}"
    if parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in _ids_of(target):
        return f"{href} -> no element with id {parts.fragment!r} in {target.name}"
    return None


def test_every_page_renders_offline(server, browser):
    pages = _pages()
    assert len(pages) >= 2, f"expected the book's pages under {HTML}, found {pages}"
    problems: dict[str, list[str]] = {}
    totals = {"math": 0, "mermaid": 0}
    for path in pages:
        rel = path.relative_to(HTML).as_posix()
        found: list[str] = []
        redirect = REDIRECT.search(path.read_text(encoding="utf-8", errors="replace"))
        if redirect:  # the root index.html only forwards to the first chapter: check where it points
            if msg := _check_link(path, redirect.group(1)):
                problems[rel] = [f"redirect broken: {msg}"]
            continue
        context = browser.new_context()
        page = context.new_page()

        def route(r, found=found):
            url = r.request.url
            if url.startswith(server):
                return r.continue_()
            found.append(f"request to an outside host (must be offline): {url}")
            return r.abort()

        page.route("**/*", route)
        page.on("pageerror", lambda exc, found=found: found.append(f"JavaScript error: {exc}"))
        page.on("console", lambda msg, found=found: found.append(f"console error: {msg.text}")
                if msg.type == "error" else None)
        page.on("response", lambda resp, found=found: found.append(f"HTTP {resp.status}: {resp.url}")
                if resp.status >= 400 else None)
        page.goto(urljoin(server, rel), wait_until="load")
        state = page.evaluate(PAGE_STATE_JS)
        context.close()
        totals["math"] += state["mathBlocks"]
        totals["mermaid"] += state["mermaidBlocks"]
        found += [f"math not typeset: {t!r}" for t in state["untypesetMath"]]
        if state["mermaidWithoutSvg"]:
            found.append(f"{state['mermaidWithoutSvg']} mermaid block(s) did not become an SVG")
        found += [f"image did not load: {src}" for src in state["brokenImages"]]
        raw = RAW_TEX.findall(state["text"])
        if raw:
            found.append(f"raw TeX left in the page text: {sorted(set(raw))}")
        found += [msg for href in state["links"] if (msg := _check_link(path, href))]
        if found:
            problems[rel] = found
    assert not problems, "\n".join(f"{page}:\n  " + "\n  ".join(msgs) for page, msgs in problems.items())
    assert totals["mermaid"] >= 1, "no mermaid diagram was found in the whole book"
    assert totals["math"] >= 1, "no display equation was found in the whole book"
