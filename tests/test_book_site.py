"""The book builds with warnings as errors, and every page renders offline in headless Chromium.

The build is `jupyter-book build . --all -W -n --keep-going` (`make book`'s build, with every page read afresh):
with `execute_notebooks: cache` it executes every chapter it finds no current record of in the execution cache
(`_build/.jupyter_cache`). `make test` runs the notebooks with nbval first, which writes each page that passed into
that cache (the root conftest.py), and exports MHA_NBVAL_RUN: the build then keeps only that run's records, so it
executes only what nbval did not pass (and fails on it), and every output it shows was computed in this run. Run
alone, the build keeps only records newer than every file of the package (src/mha) and than their page.

The browser check serves `_build/html` on 127.0.0.1, blocks every request to any other host (so nothing may come
from a CDN), and loads each page: display math typeset by MathJax, every mermaid diagram an SVG drawn at build time
(no diagram left as source for a script), every image loaded,
every relative link (and its #fragment) resolving, no JavaScript error.
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
from collections import Counter
from datetime import timezone
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

pytest.importorskip("sphinx", reason="Sphinx is not installed (the book extra brings it): the book tests need it")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import i18n  # noqa: E402
import i18n_figures  # noqa: E402 - on the path through tools/i18n.py
from i18n_glue import TABLE_CONTEXT  # noqa: E402 - the page-level context of table texts
from latex_edition import CJK_RANGES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
ZH = HTML / "zh"  # the Chinese edition
CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.book


@pytest.fixture(scope="module")
def build():
    """Build the book once for this module, both editions (as `make book` does, but with every page read afresh: an
    incremental build re-reads only the pages whose source changed, so it would show an unchanged page's old outputs
    though the cache holds this run's, and would not repeat its warnings); return the two build logs."""
    _drop_stale_executions()
    _BUILD["handed_over"] = _handed_over()
    shutil.rmtree(ROOT / "_build" / "doctrees-zh", ignore_errors=True)  # the Chinese edition's environment: afresh
    jb = Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run(
        [str(jb), "build", ".", "--all", "-W", "-n", "--keep-going"],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"book build failed (exit {proc.returncode}):\n{log[-6000:]}"
    proc = subprocess.run([sys.executable, "tools/i18n.py", "build"], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200)
    zh_log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"Chinese edition build failed (exit {proc.returncode}):\n{zh_log[-6000:]}"
    return log + "\n" + zh_log


def _drop_stale_executions():
    """Remove from the execution cache every executed page this build must not reuse. Under `make test`
    (MHA_NBVAL_RUN set), every record but those nbval wrote in this run: the build executes the rest itself. Otherwise,
    every record older than a file of the package or than its page (the cache's key is the page's code cells alone:
    a change to the package, or to the prose a page reads, would not miss it)."""
    from jupyter_cache import get_cache

    folder = ROOT / "_build" / ".jupyter_cache"
    if not folder.is_dir():
        return
    run = os.environ.get("MHA_NBVAL_RUN")
    package = [p for p in (ROOT / "src" / "mha").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    newest = max((p.stat().st_mtime for p in package), default=0.0)
    cache = get_cache(str(folder))
    for record in cache.list_cache_records():
        if run:
            stale = (record.data or {}).get("nbval_run") != run
        else:
            created = record.created.replace(tzinfo=record.created.tzinfo or timezone.utc).timestamp()
            page = Path(record.uri)
            stale = created < newest or (page.is_file() and created < page.stat().st_mtime)
        if stale:
            cache.remove_cache(record.pk)


_BUILD: dict = {}  # what the build fixture found before building


def _handed_over() -> set[Path]:
    """The pages whose execution nbval handed to this build (`make test`: this run's records in the cache)."""
    from jupyter_cache import get_cache

    folder = ROOT / "_build" / ".jupyter_cache"
    run = os.environ.get("MHA_NBVAL_RUN")
    if not run or not folder.is_dir():
        return set()
    return {Path(r.uri) for r in get_cache(str(folder)).list_cache_records() if (r.data or {}).get("nbval_run") == run}


def test_the_build_executes_no_page_nbval_ran(build):
    """Issue 23: under `make test`, every page nbval passed is rendered from nbval's run, not executed again (a page
    whose front matter forces execution, mystnb execution_mode: force, excepted). If this fails, the build no longer
    finds nbval's records under its own key (conftest.py computes it as myst-nb reads a page)."""
    if not _BUILD["handed_over"]:
        pytest.skip("no page was handed over: only under `make test`, which runs the notebooks with nbval first")
    executed = {Path(m[1]) for m in re.finditer(r"^(\S+\.md): Executing notebook", build, re.M)}
    again = sorted(str(p.relative_to(ROOT)) for p in executed & _BUILD["handed_over"]
                   if not re.search(r"^\s*execution_mode:\s*force", p.read_text().split("\n---", 1)[0], re.M))
    assert not again, f"the build executed again pages nbval had run and passed: {again}"


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


_NUMPY_REPR = re.compile(r"np\.(?:int64|float64)\(")


def test_no_page_shows_a_numpy_scalar_repr(build):
    """A NumPy scalar glued into the prose shows its repr, "np.int64(8) of 8", where the reader should see "8 of 8":
    no built page (either edition) contains "np.int64(" or "np.float64(". Glue Python ints and floats."""
    problems = [f"{page.relative_to(HTML)}: {match.group(0)}..." for page in _pages()
                for match in _NUMPY_REPR.finditer(page.read_text(encoding="utf-8", errors="replace"))]
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
  const diagrams = () => [...document.querySelectorAll('object[type="image/svg+xml"]')]
      .filter(el => /mermaid-[0-9a-f]+[.]svg$/.test(el.getAttribute('data') || ''));
  const drawn = el => !!(el.contentDocument && el.contentDocument.querySelector('svg'));
  while (!diagrams().every(drawn) && Date.now() < deadline) { await new Promise(r => setTimeout(r, 100)); }
  const clone = document.body.cloneNode(true);
  clone.querySelectorAll('pre, code, script, style, mjx-container, .mermaid').forEach(el => el.remove());
  return {
    mathBlocks: document.querySelectorAll('div.math, .math.notranslate').length,
    untypesetMath: [...document.querySelectorAll('div.math, span.math')]
        .filter(el => !el.querySelector('mjx-container')).map(el => el.textContent.slice(0, 80)),
    mermaidBlocks: diagrams().length,
    mermaidWithoutSvg: diagrams().filter(el => !drawn(el)).length,
    mermaidSource: document.querySelectorAll('pre.mermaid, div.mermaid').length,
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


OBJECT_DATA = re.compile(r'<object data="([^"]*mermaid-[0-9a-f]+\.svg)" type="image/svg\+xml">')


def test_diagrams_are_drawn_at_build_time_in_both_editions(build):
    """Issue 28: every mermaid diagram of the sources is an SVG file in the built pages of both editions, drawn at
    build time by mermaid's CLI, so a page shows it with no script (also from file://); the SVG carries the diagram's
    first node label as text, in English on the English page and in its glue.po translation on the Chinese one, and
    no page loads mermaid's script or keeps a diagram as source."""
    from babel.messages.pofile import read_po

    with open(i18n.GLUE_CATALOG, "rb") as f:
        chinese = {m.id: m.string for m in read_po(f) if m.id and m.string}
    sources = {md: i18n.MERMAID_BLOCK.findall(md.read_text(encoding="utf-8")) for md in (ROOT / "book").rglob("*.md")}
    sources = {md: blocks for md, blocks in sources.items() if blocks}
    assert sources, "no mermaid diagram in the book's sources"
    for md, blocks in sources.items():
        rel = md.relative_to(ROOT).with_suffix(".html")
        for html, language in ((HTML / rel, "en"), (ZH / rel, "zh")):
            text = html.read_text(encoding="utf-8")
            svgs = [(html.parent / unquote(src)).resolve() for src in OBJECT_DATA.findall(text)]
            assert len(svgs) == len(blocks), f"{html}: {len(blocks)} diagram(s) in the source, {len(svgs)} drawn"
            for svg, block in zip(svgs, blocks):
                drawing = svg.read_text(encoding="utf-8")
                assert drawing.lstrip().startswith("<svg"), f"{svg} is not an SVG"
                label = re.search(r'\["([A-Za-z][^"]*)"', block).group(1)  # the first node label with a word
                if language == "zh":
                    assert chinese.get(label, label) != label, f"glue.po has no Chinese for the label {label!r}"
                    label = chinese[label]
                shown = label.split("<br/>")[0]  # its first line, as the SVG writes it
                assert shown in drawing, f"{svg} does not show the label {shown!r} of its diagram in {md.name}"
            assert 'class="mermaid"' not in text and "mermaid.esm" not in text, f"{html} still draws with a script"


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
            found.append(f"{state['mermaidWithoutSvg']} mermaid diagram(s) did not load their SVG")
        if state["mermaidSource"]:
            found.append(f"{state['mermaidSource']} mermaid block(s) left as source for a script to draw")
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


# The Chinese edition (issue 17) ------------------------------------------------------------------------------

@pytest.mark.book
def test_every_paragraph_has_a_current_translation():
    """Extract the English messages as they are now and compare them with the catalogs."""
    proc = subprocess.run([sys.executable, "tools/i18n.py", "extract"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    problems = i18n.problems() + i18n.lint()
    assert not problems, (f"{len(problems)} problem(s) in the Chinese catalogs; after editing English prose run "
                          f"`make translations`, translate the entries listed in book/locales/zh_CN/LC_MESSAGES/"
                          f"<page>.po, then `make book`:\n" + "\n".join(problems[:60]))


_PASTED = re.compile(r'<span class="pasted-text">(.*?)</span>', re.S)
class _CellOutputs(HTMLParser):
    """The visible text of every cell output (``div.output`` of kind text_plain, text_html or stream), whole, with its
    kind: an output may hold nested elements, so the parser follows the nesting to its closing tag."""

    KINDS = {"text_plain", "text_html", "stream"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.outputs, self._depth, self._skip, self._text, self._kind = [], 0, 0, [], None
        self._divs, self._translated_cell = 0, None  # open divs; the depth of an open translate-output cell

    def handle_starttag(self, tag, attrs):
        if tag in ("style", "script"):
            self._skip += 1
        if tag != "div":
            return
        self._divs += 1
        classes = (dict(attrs).get("class") or "").split()
        if "tag_translate-output" in classes and self._translated_cell is None:
            self._translated_cell = self._divs
        if self._depth:
            self._depth += 1
        elif {"output"} <= set(classes) and self.KINDS & set(classes):
            self._depth, self._text, self._kind = 1, [], (self.KINDS & set(classes)).pop()
            if self._kind == "stream" and self._translated_cell is not None:
                self._kind = "translated stream"  # printed text the Chinese edition translates (i18n_glue.py)

    def handle_endtag(self, tag):
        if tag in ("style", "script"):
            self._skip -= 1
        if tag != "div":
            return
        if self._translated_cell == self._divs:
            self._translated_cell = None
        self._divs -= 1
        if self._depth:
            self._depth -= 1
            if not self._depth:
                self.outputs.append((self._kind, " ".join("".join(self._text).split())))

    def handle_data(self, data):
        if self._depth and not self._skip:
            self._text.append(data)


def _cell_outputs(html: str) -> Counter:
    """Each cell output as it must be the same on both editions: printed text whole; an HTML output (a table, whose
    words the Chinese edition translates) and the printed text of a translate-output cell by the numbers they show."""
    parser = _CellOutputs()
    parser.feed(html)
    return Counter((kind, tuple(sorted(_NUMBER.findall(text))))
                   if kind in ("text_html", "translated stream") else (kind, text) for kind, text in parser.outputs)


# "1,234" is one number, "1, 2" two; a sign only where no word or number precedes it ("0-15", a range, is 0 and 15,
# which a translation may write "0 到 15")
_NUMBER = re.compile(r"(?:(?<![\w.)])[-+])?\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?")


def _text(html: str) -> str:
    """The visible text (a styled table's CSS carries random ids, so style and script are dropped)."""
    html = re.sub(r"<(style|script)\b.*?</\1>", "", html, flags=re.S)
    return unescape(re.sub(r"<[^>]+>", "", html)).strip()


def _twins():
    if not ZH.is_dir():
        pytest.fail(f"{ZH} is missing: `make book` builds the Chinese edition there")
    pairs = []
    for page in sorted(HTML.rglob("*.html")):
        rel = page.relative_to(HTML)
        if rel.parts[0] in ("zh", "_static", "_sources") or rel.name in ("genindex.html", "search.html"):
            continue
        if 'http-equiv="Refresh"' in page.read_text(encoding="utf-8", errors="replace")[:2000]:
            continue
        if not any((HTML / "_sources" / rel).with_suffix(suffix).exists() for suffix in (".md", ".ipynb")):
            continue  # a generated page (an index of the proof domain), not a page of the book
        pairs.append((page, ZH / rel))
    return pairs


@pytest.mark.book
def test_chinese_pages_exist_declare_their_language_and_link_to_their_twins(build):
    problems = []
    for english, chinese in _twins():
        rel = english.relative_to(HTML).as_posix()
        if not chinese.exists():
            problems.append(f"{rel}: no Chinese twin at zh/{rel}")
            continue
        en_html, zh_html = (p.read_text(encoding="utf-8") for p in (english, chinese))
        if not re.search(r'<html[^>]*\blang="zh-CN"', zh_html):
            problems.append(f"zh/{rel}: does not declare lang=\"zh-CN\"")
        if not re.search(r'<html[^>]*\blang="en"', en_html):
            problems.append(f"{rel}: does not declare lang=\"en\"")
        for html, here, there in ((en_html, english, chinese), (zh_html, chinese, english)):
            link = re.search(r'class="language-switch-link" href="([^"]+)"', html)
            if not link:
                problems.append(f"{here.relative_to(HTML)}: no link to the other edition")
            elif (here.parent / link.group(1)).resolve() != there.resolve():
                problems.append(f"{here.relative_to(HTML)}: language link {link.group(1)} does not lead to its twin")
        if not re.search(r"[\u4e00-\u9fff]{4}", re.sub(r"<(script|style)\b.*?</\1>", "", zh_html, flags=re.S)):
            problems.append(f"zh/{rel}: no Chinese text")
    assert not problems, "\n".join(problems)


# The interface words the themes would show in English, or in Taiwanese usage, on the Chinese edition: the theme's
# print button, the search box's placeholder and sphinx-togglebutton's hints (set by tools/i18n.py build and
# book/_ext/language_switch.py).
THEME_WORDS_EN = ("Search this book", "Click to show", "Click to hide", "Print to PDF", "列印")
EQ_REF_EN = re.compile(r'href="[^"]*#equation-[^"]*"[^>]*>(?:<[^>]+>)*Eq\.')  # an {eq} reference set as "Eq. 25"


@pytest.mark.book
def test_chinese_pages_show_the_themes_interface_words_in_chinese(build):
    problems = []
    for _, chinese in _twins():
        if chinese.exists():
            html = chinese.read_text(encoding="utf-8")
            found = [word for word in THEME_WORDS_EN if word in html] + EQ_REF_EN.findall(html)[:1]
            if found:
                problems.append(f"zh/{chinese.relative_to(HTML / 'zh').as_posix()}: {found}")
    assert not problems, "interface words not in Chinese:\n" + "\n".join(problems[:10])


@pytest.mark.book
def test_the_translated_outputs_are_shown_in_chinese(build):
    """The printed text and displayed Markdown of cells tagged translate-output (a checker's message, the benchmarks
    appendix's section titles): glue.po's Chinese on the Chinese page, and its English nowhere on it. (The titles had
    translations that never reached the page: myst-nb had unwrapped the Markdown before the translation looked.)"""
    from babel.messages.pofile import read_po

    with open(i18n.GLUE_CATALOG, "rb") as f:
        entries = [m for m in read_po(f) if m.id and not m.context
                   and any(c.endswith(("(printed)", "(shown)")) for c in m.auto_comments)]
    assert entries, "glue.po lists no printed or shown text"
    problems = []
    for m in entries:
        for comment in m.auto_comments:
            page = ZH / (comment.rsplit(" (", 1)[0] + ".html")
            text = " ".join(_text(page.read_text(encoding="utf-8")).split())
            if " ".join(m.string.split()) not in text or " ".join(m.id.split()) in text:
                problems.append(f"zh/{page.relative_to(ZH).as_posix()}: {m.id[:80]!r}")
    assert not problems, "outputs not shown in Chinese:\n" + "\n".join(problems)


DISPLAY_MATH = re.compile(r'<div class="math notranslate nohighlight"[^>]*>(.*?)</div>', re.S)
MATH_WORDS = re.compile(r"\\text\{[^{}]*\}")


def _display_equations(html: str) -> list[str]:
    """The TeX of each display equation (its number dropped), without its \\text{...} (words a translation may write
    in its own order around the symbols) and without spaces."""
    return sorted("".join(MATH_WORDS.sub("", unescape(re.sub(r'<span class="eqno">.*?</span>', "", m, flags=re.S)))
                          .split()) for m in DISPLAY_MATH.findall(html))


@pytest.mark.book
def test_every_display_equation_is_on_both_editions(build):
    """A display equation whose catalog entry differs from its English came out of Sphinx's translation of math
    blocks as "\\[::\\]" (a session translated the words of twenty of them, and they vanished): each Chinese page
    shows its English twin's equations."""
    problems = []
    for english, chinese in _twins():
        if chinese.exists():
            want, got = (_display_equations(p.read_text(encoding="utf-8")) for p in (english, chinese))
            if want != got:
                lost = [e[:60] for e in want if e not in got][:2]
                problems.append(f"{english.relative_to(HTML)}: equations differ on the Chinese twin, e.g. {lost}")
    assert not problems, "\n".join(problems)


# A figure element of a page (myst-nb pastes a glued output into one) and the number its caption shows.
FIGURE = re.compile(r'<figure\b.*?</figure>', re.S)
CAPTION_NUMBER = re.compile(r'<span class="caption-number">([^<]*)</span>')


@pytest.mark.book
def test_glued_tables_are_numbered_as_tables_in_both_editions(build):
    """book/_ext/glued_tables.py: a table pasted by {glue:figure} is "Table N" ("表 N"), not "Fig. N" ("图 N")."""
    problems, seen = [], 0
    for english, chinese in _twins():
        for page, word in ((english, "Table"), (chinese, "表")):
            if not page.exists():
                continue
            for figure in FIGURE.findall(page.read_text(encoding="utf-8")):
                number = CAPTION_NUMBER.search(figure)
                if "<table" in figure and number:
                    seen += 1
                    if not number.group(1).startswith(word):
                        problems.append(f"{page.relative_to(HTML)}: a glued table captioned {number.group(1)!r}")
    assert seen >= 2 * 6, f"only {seen} glued tables found in the two editions"  # 6 {glue:figure} tables per edition
    assert not problems, "\n".join(problems)


# A link whose text ends in a parenthesis ("旋转位置编码（RoPE）", a chapter's title) set inside another one:
# "RoPE（旋转位置编码（RoPE））". The catalog gives such a reference a title of its own (`{doc}`该章 <rope>``).
NESTED_LINK = re.compile(r"<a [^>]*>(?:<[^>]+>)*([^<]*（[^<]*）)(?:</[^>]+>)*</a>\s*）")


@pytest.mark.book
def test_chinese_cross_references_do_not_nest_parentheses(build):
    problems = []
    for _, chinese in _twins():
        if chinese.exists():
            for title in NESTED_LINK.findall(chinese.read_text(encoding="utf-8")):
                problems.append(f"zh/{chinese.relative_to(HTML / 'zh').as_posix()}: （…{title}）")
    assert not problems, "a reference's title nested in parentheses:\n" + "\n".join(problems)


_CJK = CJK_RANGES  # CJK punctuation, ideographs, full-width forms (book/_ext/latex_edition.py)
_REFERENCE = r'<a class="reference internal"[^>]*>(?:<span[^>]*>)?([^<]*)(?:</span>)?</a>'
SPACE_AFTER_REFERENCE = re.compile(f"{_REFERENCE}[ \n]+([{_CJK}])")
SPACE_BEFORE_REFERENCE = re.compile(f"([{_CJK}])[ \n]+{_REFERENCE}")


@pytest.mark.book
def test_no_space_between_chinese_and_a_chinese_reference(build):
    """Where a cross-reference's text and the word beside it are both Chinese, nothing separates them ("由式 (76)",
    not "由 式 (76)"; book/_ext/cjk_spacing.py); beside Latin letters the space stays."""
    problems = []
    for _, chinese in _twins():
        if not chinese.exists():
            continue
        html = chinese.read_text(encoding="utf-8")
        rel = chinese.relative_to(HTML / "zh").as_posix()
        problems += [f"zh/{rel}: …{text[-6:]} {after}…" for text, after in SPACE_AFTER_REFERENCE.findall(html)
                     if re.search(f"[{_CJK}]$", text)]
        problems += [f"zh/{rel}: …{before} {text[:6]}…" for before, text in SPACE_BEFORE_REFERENCE.findall(html)
                     if re.search(f"^[{_CJK}]", text)]
    assert not problems, f"{len(problems)} space(s) between Chinese and a reference:\n" + "\n".join(problems[:20])


@pytest.mark.book
def test_numbers_on_each_chinese_page_equal_its_english_twin(build):
    """Every glued number and every cell output (a table's numbers; its words are translated): the same on both
    editions (in any order within the page)."""
    problems = []
    for english, chinese in _twins():
        rel = english.relative_to(HTML).as_posix()
        if not chinese.exists():
            continue
        found = {}
        for edition, path in (("en", english), ("zh", chinese)):
            html = path.read_text(encoding="utf-8")
            pasted = [_text(m) for m in _PASTED.findall(html)]
            found[edition] = (Counter(n for value in pasted for n in _NUMBER.findall(value)),
                              _cell_outputs(html))
        (en_numbers, en_outputs), (zh_numbers, zh_outputs) = found["en"], found["zh"]
        if en_numbers != zh_numbers:
            missing, extra = en_numbers - zh_numbers, zh_numbers - en_numbers
            problems.append(f"{rel}: glued numbers differ: only in English {dict(missing)}, only in Chinese "
                            f"{dict(extra)}")
        if en_outputs != zh_outputs:
            problems.append(f"{rel}: {sum((en_outputs - zh_outputs).values())} cell output(s) differ")
    assert not problems, "\n".join(problems)


def _output_table_texts(html: str) -> list[str]:
    """The cell strings of the tables pandas wrote on a page (a DataFrame's class="dataframe", a Styler's
    id="T_..."), in order; the prose's own tables (translated by the page's catalog) are left out."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    tables = soup.select('table.dataframe, table[id^="T_"]')
    return [text.strip() for table in tables for cell in table.find_all(["th", "td"])
            for text in cell.find_all(string=True) if text.strip()]


@pytest.mark.book
def test_tables_on_chinese_pages_show_their_words_in_chinese(build):
    """Issue 28 item 1 (tables): every word-bearing string of a table a cell prints or glues on an English page shows,
    on its Chinese twin, glue.po's translation of it (numbers carried over), and every other string (a number) is
    the same, string for string."""
    from babel.messages.pofile import read_po

    with open(i18n.GLUE_CATALOG, "rb") as f:
        entries = [m for m in read_po(f) if m.id and m.string]
    chinese = {**i18n.checker_messages(),  # the known bugs' descriptions, from the checkers' own catalog
               **{m.id: m.string for m in entries if not m.context},
               **{(m.context, m.id): m.string for m in entries if m.context}}  # a page's own table texts
    problems, pages, translated = [], 0, 0
    for english, twin in _twins():
        if not twin.exists():
            continue
        en_texts = _output_table_texts(english.read_text(encoding="utf-8"))
        zh_texts = _output_table_texts(twin.read_text(encoding="utf-8"))
        context = f"{english.relative_to(HTML).with_suffix('').as_posix()}::{TABLE_CONTEXT}"  # as the build looks up
        expected = [(i18n.translate(text, chinese, context) or f"(no translation of {text!r})")
                    if i18n.has_words(text) else text for text in en_texts]
        pages += any(i18n.has_words(text) for text in en_texts)
        translated += sum(re.search(r"[\u4e00-\u9fff]", text) is not None for text in zh_texts)
        if zh_texts != expected:
            wrong = [(e, z) for e, z in zip(expected, zh_texts) if e != z][:3]
            problems.append(f"{twin.relative_to(HTML)}: {len(en_texts)} English cell texts, {len(zh_texts)} Chinese; "
                            f"first differences (expected, shown): {wrong}")
    assert pages >= 10 and translated >= 100, f"only {pages} pages with tables, {translated} Chinese cell texts"
    assert not problems, "\n".join(problems)


@pytest.mark.book
def test_figures_on_chinese_pages_are_their_chinese_drawings(build):
    """Issue 28 item 1 (figures): every figure with words that an English page shows (its PNG, named by the hash of
    its bytes) is shown on the Chinese twin as the drawing the executing kernel made with glue.po's translations
    (book/_ext/i18n_figures.py), not as the English one."""
    import base64
    import hashlib

    def name(data: str) -> str:
        return hashlib.sha256(base64.b64decode(data)).hexdigest() + ".png"

    problems, checked, pages = [], 0, {}
    for page, output in i18n._executed_outputs():
        figure = i18n.figure_output(output)
        data = output.get("data") or {}
        if figure is None or "image/png" not in data or all(figure["drawn"].get(t) == t for t in figure["texts"]):
            continue  # not a figure, or one whose texts all stay as they are ("half", n_heads): the same drawing
        if page not in pages:
            pages[page] = tuple((root / f"{page}.html").read_text(encoding="utf-8") for root in (HTML, ZH))
        english, chinese = pages[page]
        en_png, zh_png = name(data["image/png"]), name(data[i18n_figures.MIME])
        if en_png not in english:
            continue  # not shown on its page (a removed output, an old record)
        checked += 1
        if zh_png not in chinese or en_png in chinese:
            problems.append(f"{page}: the figure with {figure['texts'][:3]} is shown in English on the Chinese page")
    assert checked >= 30, f"only {checked} figures with words found on the English pages"
    assert not problems, "\n".join(problems)


GLYPHS_JS = """
() => {
  const where = document.querySelector('main') || document.body;
  const font = getComputedStyle(where).fontFamily;
  const canvas = document.createElement('canvas');
  canvas.width = 48; canvas.height = 48;
  const g = canvas.getContext('2d');
  const draw = ch => { g.clearRect(0, 0, 48, 48); g.font = `36px ${font}`; g.fillText(ch, 4, 40);
                       return g.getImageData(0, 0, 48, 48).data.join(','); };
  const chars = ['多', '头', '注', '意', '力', '键', '值'];
  const bitmaps = chars.map(draw);
  const missing = draw(String.fromCodePoint(0x10FFFD));  // a private-use code point: no font has a glyph for it
  return {font, distinct: new Set(bitmaps).size, asMissing: bitmaps.filter(b => b === missing).length,
          blank: bitmaps.filter(b => !/[1-9]/.test(b)).length, chars: chars.length,
          lang: document.documentElement.lang};
}
"""


@pytest.mark.book
def test_chinese_text_renders_with_real_glyphs(server, browser):
    """Drawn in the page's own font, seven different Chinese characters give seven different bitmaps, none of them
    the missing-glyph box: a CJK font is installed and used (without one, Chromium draws every character as the same
    box). Checked on a Chinese page and on the English glossary, whose terms are Chinese too."""
    results = {}
    for rel in ("zh/book/part1/multi_head.html", "book/appendix/glossary.html"):
        page = browser.new_page()
        page.goto(server + rel)
        results[rel] = page.evaluate(GLYPHS_JS)
        page.close()
    for rel, r in results.items():
        assert r["distinct"] == r["chars"] and r["asMissing"] == 0 and r["blank"] == 0, (
            f"{rel}: Chinese characters do not render as real glyphs in the font {r['font']!r} "
            f"({r['distinct']} distinct bitmaps for {r['chars']} characters, {r['asMissing']} drawn as the "
            f"missing-glyph box): install a CJK font, e.g. `apt-get install fonts-noto-cjk` (.ci/run does)")
    assert results["zh/book/part1/multi_head.html"]["lang"] == "zh-CN"


TYPESETTING_JS = """() => {
  const cjk = /[\\u4e00-\\u9fff]/;
  const size = parseFloat(getComputedStyle(document.body).fontSize);
  const cells = [...document.querySelectorAll('article table td, article table th')].filter(c => cjk.test(c.innerText));
  return {
    font: getComputedStyle(document.body).fontFamily,
    emphasis: [...document.querySelectorAll('article em')].map(e => getComputedStyle(e).fontStyle),
    cells: cells.length,
    narrow: cells.filter(c => c.getBoundingClientRect().width < 3 * size).map(c => c.innerText.slice(0, 20)),
  };
}"""


def test_chinese_pages_are_typeset_for_chinese(server, browser):
    """Issue 28: the Chinese pages declare a Chinese font stack, set emphasis upright (CJK fonts have no italic: a
    slanted character is a faux italic), and give table columns room, so a Chinese cell never breaks one character
    per line (the claims table did). The English pages keep their italics."""
    states = {}
    for rel in ("zh/book/appendix/claims.html", "zh/book/appendix/exercises.html", "book/appendix/claims.html"):
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(server + rel)
        states[rel] = page.evaluate(TYPESETTING_JS)
        page.close()
    for rel in ("zh/book/appendix/claims.html", "zh/book/appendix/exercises.html"):
        state = states[rel]
        assert "Noto Sans CJK SC" in state["font"] and "PingFang SC" in state["font"], f"{rel}: {state['font']}"
        assert state["emphasis"] and set(state["emphasis"]) == {"normal"}, f"{rel}: emphasis set {state['emphasis']}"
        assert state["cells"] and not state["narrow"], f"{rel}: Chinese table cells under 3 characters wide: " \
                                                       f"{state['narrow'][:5]}"
    assert set(states["book/appendix/claims.html"]["emphasis"]) == {"italic"}


@pytest.mark.book
def test_each_edition_has_its_own_search_index_with_its_own_words(build):
    """Sphinx writes one search index per build; the Chinese one must index Chinese words (split by jieba), or a
    search for 注意力 on a Chinese page finds nothing."""
    import json

    def terms(index: Path) -> dict:
        text = index.read_text(encoding="utf-8")
        return json.loads(text[text.index("(") + 1: text.rindex(")")])["terms"]

    english, chinese = terms(HTML / "searchindex.js"), terms(ZH / "searchindex.js")
    assert "attent" in english or "attention" in english, "the English search index lacks 'attention'"
    missing = [word for word in ("注意力", "多头", "缓存") if word not in chinese]
    assert not missing, (f"the Chinese search index lacks {missing}: install jieba (the book extra has it), then "
                         f"rebuild the Chinese edition")


# ------------------------------------------------------------------------------------------------ PDF editions
PDF_PAGE = "book/part1/intuition"  # a chapter with a diagram, figures, numbered equations, glue and hidden code
PDF_TOOLS = ("xelatex", "latexmk", "pdftotext", "pdfimages", "pdfinfo")
PDF_WIDE_PAGE = "book/appendix/benchmarks"  # wide tables on landscape pages, each after a bold title (English build)


def _pdf_text(pdf: Path) -> str:
    return subprocess.run(["pdftotext", "-enc", "UTF-8", str(pdf), "-"], capture_output=True, text=True,
                          check=True).stdout


def _squeezed(text: str) -> str:
    """Text without spaces and line breaks: pdftotext breaks lines (and spaces Chinese) where the PDF does."""
    return re.sub(r"\s+", "", text)


def test_pdf_editions_of_one_chapter_read_back(build, tmp_path):
    """Issue 28 item 5: tools/pdf.py (`make pdf`) makes the English and the Chinese PDF, here of the introduction and
    one chapter, and their text reads back: the chapter's title in each language (from its source and from its
    catalog), its glued numbers in both, its diagram's first label in each language, its equations numbered as on
    the web, its figures as images, and none of its hidden code (a `hide-input` cell's first line). The English build
    also takes the benchmarks appendix, whose wide tables go on landscape pages with the heading or bold title before
    them (a full `make pdf` once stopped on landscape environments that did not nest)."""
    missing = [tool for tool in PDF_TOOLS if shutil.which(tool) is None]
    if missing:
        message = (f"{', '.join(missing)} not installed (Debian: texlive-xetex texlive-latex-extra texlive-lang-chinese "
                   "latexmk poppler-utils; .ci/run installs them)")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    import pdf  # tools/pdf.py
    from babel.messages.pofile import read_po

    with pytest.raises(ValueError, match="is not a page of the book"):
        pdf.build("en", tmp_path, pages=["book/part1/no_such_page"])
    with pytest.raises(ValueError, match="language must be one of"):
        pdf.build("fr", tmp_path, pages=[PDF_PAGE])

    source = (ROOT / f"{PDF_PAGE}.md").read_text(encoding="utf-8")
    with open(i18n.CATALOGS / f"{PDF_PAGE}.po", "rb") as f:
        catalog = {m.id: m.string for m in read_po(f) if m.id}
    with open(i18n.GLUE_CATALOG, "rb") as f:
        chinese_labels = {m.id: m.string for m in read_po(f) if m.id and m.string}
    title = re.search(r"^# (.+)$", source, re.M).group(1)
    label = re.search(r'\["([A-Za-z][^"]*)"', i18n.MERMAID_BLOCK.findall(source)[0]).group(1)  # a whole label
    hidden = re.findall(r"```\{code-cell\}[^\n]*\n:tags: \[hide-input\]\n\n([^\n]+)", source)
    assert hidden, f"{PDF_PAGE} has no hide-input cell to check"
    glued = i18n.glue_values()
    numbers = {glued.get((PDF_PAGE, role["key"])) for role in i18n.GLUE_ROLE.finditer(source)
               if role["fmt"] in (None, ":d")} - {None}
    numbers = sorted(value for value in numbers if re.fullmatch(r"-?\d+", value))
    assert numbers, f"{PDF_PAGE} pastes no glued integer to look for"

    for language, expected_title, expected_label in (("en", title, label.split("<br/>")[0]),
                                                    ("zh", catalog[title], chinese_labels[label].split("<br/>")[0])):
        path = pdf.build(language, tmp_path, pages=[PDF_PAGE] + ([PDF_WIDE_PAGE] if language == "en" else []))
        assert path == tmp_path / pdf.NAMES[language] and path.stat().st_size > 0
        text = _pdf_text(path)
        flat = _squeezed(text)
        assert _squeezed(expected_title) in flat, f"{path}: no chapter title {expected_title!r}"
        assert _squeezed(expected_label) in flat, f"{path}: the diagram's label {expected_label!r} is not in it"
        # equations are numbered through the book, as on the web (numfig_secnum_depth 0), not per chapter; the
        # introduction has none, so the first chapter's numbers here are the full HTML build's
        web_numbers = re.findall(r'<span class="eqno">\((\d+)\)', (HTML / f"{PDF_PAGE}.html").read_text())
        assert web_numbers, f"{PDF_PAGE} has no numbered equation to look for"
        missing_numbers = [n for n in web_numbers if f"({n})" not in text]
        assert not missing_numbers, f"{path}: equations numbered on the web {missing_numbers} are not in the PDF"
        assert "(1.1)" not in text, f"{path}: an equation numbered per chapter (1.1), unlike the web's"
        for line in hidden:
            assert _squeezed(line) not in flat, f"{path}: hidden code is printed: {line!r}"
        images = subprocess.run(["pdfimages", "-list", str(path)], capture_output=True, text=True, check=True)
        assert len(images.stdout.splitlines()) > 2, f"{path}: no figure (pdfimages lists no image)"
        for value in numbers:
            assert re.search(rf"(?<![\d.]){re.escape(value)}(?![\d.])", text), f"{path}: glued {value} is missing"
        if language == "en":  # the wide tables: landscape pages (their LaTeX environments nest, or nothing is built),
            # and the bold title printed right before such a table is on its landscape page, not left behind
            info = subprocess.run(["pdfinfo", "-f", "1", "-l", "9999", str(path)], capture_output=True, text=True,
                                  check=True).stdout
            turned = [int(m.group(1)) for m in re.finditer(r"Page\s+(\d+)\s+rot:\s+90", info)]
            assert turned, f"{path}: {PDF_WIDE_PAGE}'s wide tables are not on landscape pages"
            lines = {line.strip() for page in turned for line in subprocess.run(
                ["pdftotext", "-enc", "UTF-8", "-f", str(page), "-l", str(page), str(path), "-"],
                capture_output=True, text=True, check=True).stdout.splitlines()}
            assert "Runs" in lines, f"{path}: the bold title 'Runs' is not on its table's landscape page"
            assert any(line.endswith("The runs on file") for line in lines), (
                f"{path}: the heading 'The runs on file' is not on its table's landscape page")
    assert catalog[title] != title, f"the catalog of {PDF_PAGE} does not translate its title"
