"""The Chinese edition: the same sources, translated paragraph by paragraph through gettext catalogs.

Usage (from the repository root; ``make book`` runs ``build``, ``make translations`` runs ``extract`` and
``update``)::

    python tools/i18n.py extract   # the English messages -> _build/i18n-extract/gettext/**/*.pot (nothing executed)
    python tools/i18n.py update    # the catalogs book/locales/zh_CN/LC_MESSAGES/<page>.po follow the .pot files
    python tools/i18n.py build     # the Chinese edition -> _build/html/zh (reuses the English build's executed cells)
    python tools/i18n.py check     # every message translated, none fuzzy, no catalog out of date (exit 1 otherwise)
    python tools/i18n.py lint [PO...]  # every translation keeps its English's math, code, glue keys and link targets
    python tools/i18n.py refresh-figures  # pages whose figures were drawn with older translations: executed again

One catalog per page. Only prose is translated (paragraphs, headings, captions, admonitions, exercises, solutions);
code cells, their outputs, math and glued values are the English build's, so a Chinese page shows the same computed
numbers as its English twin. Messages that contain nothing to translate (a formula, a glued value, a code span) are
filled with themselves by ``update``. In a translation, a glue role must name its page and carry a format
(``{glue:text}`scaling.md::scaling_num_keys:d` ``): a translated paragraph is parsed apart from its notebook, and
only that form finds the glued value. ``update`` rewrites every glue role of a translation into that form (with
``:s``, myst-nb's default, where the author gave no format). Glued *text* (a word or phrase chosen by the data) is
translated through ``book/locales/zh_CN/LC_MESSAGES/glue.po`` (``book/_ext/i18n_glue.py``), which ``update`` keeps
in step with the values the English build glued, the diagrams' labels, the words of the tables cells print and the
texts of the figures (drawn in Chinese as each page executes: ``book/_ext/i18n_figures.py``).

Two rules keep a build on another machine from meeting an untranslated text. A text that a measurement picks at build
time is glued with ``mha.glued.glue_one_of(name, value, choices)``: glue.po holds every choice, and the Chinese build
fails on a missing one whichever was picked. A code cell whose printed text a Chinese reader should read in Chinese
(a checker's message) is tagged ``translate-output``: its printed text goes through glue.po; other printed output
(numbers, arrays) is shown as the English build printed it. Math is kept as written, but for the words of its
``\text{...}``, which a translation may write in Chinese (``book/_ext/i18n_glue.py``'s ``TranslateMathBlocks`` puts a
display equation's translation in place).
"""

from __future__ import annotations

import argparse
import ast
import os
import posixpath
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANGUAGE = "zh_CN"
LOCALES = ROOT / "book" / "locales"
CATALOGS = LOCALES / LANGUAGE / "LC_MESSAGES"
BUILD = ROOT / "_build"
CONF_DIR = BUILD / "i18n-conf"
# Its own folder: myst-nb writes each page it reads into jupyter_execute beside the output folder, and the English
# build's executed pages in _build/jupyter_execute must not be overwritten by unexecuted ones.
POT_DIR = BUILD / "i18n-extract" / "gettext"
HTML_ZH = BUILD / "html" / "zh"
CACHE = BUILD / ".jupyter_cache"  # the English build's execution cache (jupyter-book's default place)
EXECUTED = BUILD / "jupyter_execute"  # the English build's executed notebooks, one per page
GLUE_CATALOG = CATALOGS / "glue.po"

sys.path.insert(0, str(ROOT / "book" / "_ext"))
# the Chinese drawing of each figure, made as a page executes, and the translations it is drawn with
from i18n_figures import figure_output, translations as figure_translations  # noqa: E402
from i18n_glue import (checker_messages, diagram_labels, glued_choices, has_words,  # noqa: E402 - the build's
                       table_texts, translate, translated_output_cell)  # own rules: which texts, how
from mha.glued import CHOICES_SUFFIX  # noqa: E402 - the key of a glued text's possible values

GLUE_ROLE = re.compile(r"\{glue:(?P<kind>text|md|math)\}`(?P<path>[^`:]*?::)?(?P<key>[A-Za-z_][\w]*)(?P<fmt>:[^`]*)?`")
NOTHING_TO_TRANSLATE = re.compile(r"^(\s|\$\$?[^$]*\$\$?|\{[\w:-]+\}`[^`]*`|`[^`]*`|[-+*/=.,;:()\[\]0-9%×·\\|]|"
                                  r"\\[A-Za-z]+|[A-Za-z](?![A-Za-z]))*$", re.S)


def _python() -> str:
    return sys.executable


def write_conf() -> Path:
    """The English book's Sphinx configuration (``jupyter-book config sphinx``), with absolute paths, the local
    extensions on ``sys.path`` and the gettext settings, in ``_build/i18n-conf/conf.py``."""
    jb = Path(_python()).with_name("jupyter-book")
    generated = ROOT / "conf.py"
    if generated.exists():
        raise FileExistsError(f"{generated} exists; this tool writes it for a moment and would overwrite it")
    subprocess.run([str(jb), "config", "sphinx", str(ROOT)], check=True, capture_output=True)
    text = generated.read_text()
    generated.unlink()
    text = text.replace("bibtex_bibfiles = ['book/references.bib']",
                        f"bibtex_bibfiles = [{str(ROOT / 'book' / 'references.bib')!r}]")
    text = text.replace("external_toc_path = '_toc.yml'", f"external_toc_path = {str(ROOT / '_toc.yml')!r}")
    text = text.replace("nb_execution_cache_path = ''", f"nb_execution_cache_path = {str(CACHE)!r}")
    text += (f"\n# Added by tools/i18n.py\nimport sys\nsys.path.insert(0, {str(ROOT / 'book' / '_ext')!r})\n"
             f"locale_dirs = [{str(LOCALES)!r}]\ngettext_compact = False\ngettext_uuid = False\n"
             f"gettext_location = False\n")
    CONF_DIR.mkdir(parents=True, exist_ok=True)
    (CONF_DIR / "conf.py").write_text(text)
    return CONF_DIR / "conf.py"


def _sphinx(builder: str, out: Path, doctrees: Path, *options: str, warnings_as_errors: bool = False,
            extra_extensions: list[str] = ()) -> None:
    conf = write_conf()
    if extra_extensions:
        conf.write_text(conf.read_text() + f"extensions = [*extensions, *{list(extra_extensions)!r}]\n")
    command = [str(Path(_python()).with_name("sphinx-build")), "-b", builder, "-c", str(CONF_DIR), "-d",
               str(doctrees), *options, str(ROOT), str(out)]
    if warnings_as_errors:
        command[1:1] = ["-W", "-n", "--keep-going"]
    subprocess.run(command, check=True, cwd=ROOT)


def extract() -> None:
    """The English messages of every page into ``_build/i18n-extract/gettext`` (no notebook is executed;
    book/_ext/i18n_extract.py keeps the captions of glued figures and tables, which myst-nb drops when their value
    is missing)."""
    _sphinx("gettext", POT_DIR, BUILD / "doctrees-gettext", "-q", "-D", "nb_execution_mode=off",
            extra_extensions=["i18n_extract"])


def glue_values(mime: str = "text/plain") -> dict:
    """``{(page, key): value}`` of every glued value (its ``mime`` form: text/plain, or text/markdown for what
    ``{glue:md}`` pastes), from the glue data the English build wrote beside each executed page
    (``_build/jupyter_execute/<page>.glue.json``, for cached and force-executed pages alike)."""
    import json

    values = {}
    for path in sorted(EXECUTED.rglob("*.glue.json")):
        page = path.relative_to(EXECUTED).as_posix()[: -len(".glue.json")]
        for name, output in json.loads(path.read_text()).items():
            values[(page, name)] = output.get("data", {}).get(mime)
    return values


def localise_glue(text: str, page: str, english: str | None = None) -> str:
    """Every glue role of a translation in the form a translated paragraph needs: ``<file>::key:format``
    (myst-nb splits the format off at the last colon, so ``file::key`` alone would lose its key; ``s``, myst-nb's
    own default, prints the value as the English page does). The role's kind (text, md) is the English one's."""
    own = Path(page).name + ".md"
    english_roles = {m["key"]: m for m in GLUE_ROLE.finditer(english or "")}

    def rewrite(match):
        source = english_roles.get(match["key"], match)
        english_path = english_roles[match["key"]]["path"] if match["key"] in english_roles else None
        file = (english_path or f"{own}::")[:-2]  # the English role's page: its own, or the one its path names
        if source["kind"] == "md":  # inlined from the execution cache at build time (see stage_catalogs)
            return f"{{glue:md}}`{file}::{match['key']}{source['fmt'] or ''}`"
        return f"{{glue:{source['kind']}}}`{file}::{match['key']}{match['fmt'] or ':s'}`"

    return GLUE_ROLE.sub(rewrite, text)


def glue_page(page: str, path: str | None) -> str:
    """The page (``book/part3/head_count``) whose glue a role pastes: ``page`` itself, or the one that the role's
    ``path::`` (``../part3/head_count.md::``, relative to ``page``'s folder) names."""
    if not path:
        return page
    target = posixpath.normpath(posixpath.join(posixpath.dirname(page), path[:-2]))
    return target[:-3] if target.endswith(".md") else target


def glue_choices(values: dict, page: str, key: str) -> list[str]:
    """Every text ``page``'s cell could have glued as ``key`` (``mha.glued.glue_one_of``): [] when it glued no list."""
    return glued_choices(values.get((page, key + CHOICES_SUFFIX)), f"{page}::{key}{CHOICES_SUFFIX}")


def glue_texts(values: dict, catalogs, markdown: dict | None = None) -> dict:
    """``{english text: [page::key, ...]}`` for every glued *text* value (a word or phrase chosen by the data) that
    a paragraph of the catalogs pastes, and every Markdown value a ``{glue:md}`` role pastes: these need a
    translation in glue.po."""
    used, used_md = set(), set()
    for page, message_id in catalogs:
        for match in GLUE_ROLE.finditer(message_id):
            (used_md if match["kind"] == "md" else used).add((glue_page(page, match["path"]), match["key"]))
    texts = {}
    for (page, key), plain in values.items():
        if (page, key) not in used or plain is None:
            continue
        try:
            value = ast.literal_eval(plain)
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, str) and has_words(value):
            texts.setdefault(value, []).append(f"{page}::{key}")
        for choice in glue_choices(values, page, key):  # what another machine's measurement would paste there
            if choice != value and has_words(choice):
                texts.setdefault(choice, []).append(f"{page}::{key} (another possible value)")
    for (page, key), value in (markdown or {}).items():
        if (page, key) in used_md and value and has_words(value, markdown=True):
            texts.setdefault(value, []).append(f"{page}::{key} (markdown)")
    return texts


def update() -> None:
    """Catalogs follow the .pot files (sphinx-intl: new messages added, changed ones marked fuzzy); messages with
    nothing to translate are filled with themselves; every translation's glue roles are localised."""
    from babel.messages.pofile import read_po, write_po

    subprocess.run([str(Path(_python()).with_name("sphinx-intl")), "update", "-p", str(POT_DIR), "-l", LANGUAGE,
                    "-d", str(LOCALES)], check=True, cwd=ROOT, capture_output=True)
    messages = []
    for path in sorted(CATALOGS.rglob("*.po")):
        if path == GLUE_CATALOG:
            continue
        page = path.relative_to(CATALOGS).with_suffix("").as_posix()
        with open(path, "rb") as f:
            catalog = read_po(f)
        catalog.obsolete.clear()  # paragraphs that no longer exist (sphinx-intl keeps them as #~ entries)
        for message in catalog:
            if not message.id:
                continue
            messages.append((page, message.id))
            if not message.string and NOTHING_TO_TRANSLATE.match(message.id):
                message.string = message.id
            if message.string:
                message.string = localise_glue(message.string, page, message.id)
        with open(path, "wb") as f:
            write_po(f, catalog, width=120)
    texts = glue_texts(glue_values(), messages, glue_values("text/markdown"))
    for label, where in diagram_texts().items():
        texts.setdefault(label, []).extend(where)
    covered = checker_messages()  # the known bugs' descriptions: translated in mha.exercises.messages_zh
    for text, where in output_texts().items():
        if text not in covered:
            texts.setdefault(text, []).extend(where)
    _update_glue_catalog(texts, drop=set(covered))


MERMAID_BLOCK = re.compile(r"^```\{mermaid\}\n(.*?)^```", re.M | re.S)


def diagram_texts() -> dict:
    """The labels of the book's mermaid diagrams that need a translation, each with where it appears (glue.po
    translates them too: book/_ext/i18n_glue.py draws the Chinese edition's diagrams with them)."""
    texts = {}
    for md in sorted((ROOT / "book").rglob("*.md")):
        page = md.relative_to(ROOT).with_suffix("").as_posix()
        for block in MERMAID_BLOCK.findall(md.read_text(encoding="utf-8")):
            for label in diagram_labels(block):
                where = f"{page} (diagram label)"
                if where not in texts.setdefault(label, []):
                    texts[label].append(where)
    return texts


def _executed_cells():
    """(page, cell) for every code cell of the English build's executed pages. The cells come from the execution
    cache (the latest record of each page; ``_build/jupyter_execute`` holds a page's outputs only when the build
    executed it, not when it took them from the cache), or from ``_build/jupyter_execute`` for a page the cache does
    not keep (one executed with ``execution_mode: force``)."""
    import json

    from jupyter_cache import get_cache

    latest = {}
    if CACHE.is_dir():
        cache = get_cache(str(CACHE))
        for record in cache.list_cache_records():
            page = _page_of(record)
            if page is not None and (page not in latest or record.created > latest[page].created):
                latest[page] = record
        for page, record in sorted(latest.items()):
            for cell in cache.get_cache_bundle(record.pk).nb.cells:
                yield page, cell
    for path in sorted(EXECUTED.rglob("*.ipynb")):
        page = path.relative_to(EXECUTED).with_suffix("").as_posix()
        if page not in latest:
            for cell in json.loads(path.read_text()).get("cells", []):
                yield page, cell


def _glued_outputs():
    """(page, output) for every value the English build's executed pages glued."""
    import json

    for path in sorted(EXECUTED.rglob("*.glue.json")):
        page = path.relative_to(EXECUTED).as_posix()[: -len(".glue.json")]
        for output in json.loads(path.read_text()).values():
            yield page, output


def _executed_outputs():
    """(page, output) for every output of the English build's executed pages (``_executed_cells``) and every value
    they glued."""
    for page, cell in _executed_cells():
        for output in cell.get("outputs", []):
            yield page, output
    yield from _glued_outputs()


def _page_of(record) -> str | None:
    """The book page (``book/part1/scaling``) an execution-cache record was made from; None for another notebook."""
    path = Path(record.uri).resolve()
    return path.relative_to(ROOT).with_suffix("").as_posix() if ROOT in path.parents else None


def output_texts() -> dict:
    """The texts of the tables and figures the English build's cells show or glue that need a translation (a table's
    cells, a figure's titles, labels, legends and tick labels), each with the pages it appears on: glue.po
    translates them for the Chinese edition (book/_ext/i18n_glue.py, book/_ext/i18n_figures.py)."""
    texts = {}

    def add(found, where):
        for text in found:
            if where not in texts.setdefault(text, []):
                texts[text].append(where)

    def add_shown(page, output):
        for key, html in (output.get("data") or {}).items():
            if key.endswith("text/html") and html:
                add(table_texts("".join(html) if isinstance(html, list) else html), f"{page} (table)")
        figure = figure_output(output)
        if figure:
            add(figure["texts"], f"{page} (figure)")

    tagged = []  # the cells tagged translate-output, whose printed text and shown Markdown follow the tables
    for page, cell in _executed_cells():  # the execution cache read once
        for output in cell.get("outputs", []):
            add_shown(page, output)
        if translated_output_cell(cell.get("metadata")):
            tagged.append((page, cell.get("outputs", [])))
    for page, output in _glued_outputs():
        add_shown(page, output)
    for page, outputs in tagged:
        add(["".join(o["text"]).strip() for o in outputs if o.get("output_type") == "stream"], f"{page} (printed)")
        add([markdown_words(o["data"]["text/markdown"]) for o in outputs
             if "text/markdown" in (o.get("data") or {})], f"{page} (shown)")
    return texts


def markdown_words(markdown) -> str:
    """The text of a cell's Markdown output as the build's nodes hold it: a bold title without its asterisks."""
    text = ("".join(markdown) if isinstance(markdown, list) else markdown).strip()
    return text[2:-2].strip() if text.startswith("**") and text.endswith("**") else text


def figures_without_chinese() -> list[str]:
    """The executed pages' figures that have no Chinese drawing: executed by a kernel without
    book/_ext/i18n_figures.py's formatter (IPYTHONDIR not set as make sets it)."""
    found = {}
    for page, output in _executed_outputs():
        figure = figure_output(output)
        if figure is not None and not figure["chinese"]:
            found[page] = found.get(page, 0) + 1
    return [f"{page}: {count} figure(s)" for page, count in found.items()]


def _update_glue_catalog(texts: dict, drop: set = frozenset()) -> None:
    """glue.po holds one entry per glued English text a paragraph pastes. Translations already there are kept even
    when the current build did not paste their text: a value measured at build time (a timing's verdict) may take
    another of its possible texts on another machine, and each of those texts is translated in advance. Entries with
    a key as context (one sentence's own Chinese for a glued word, book/_ext/i18n_glue.py) are kept as written. Texts
    in ``drop`` (those the checkers' own catalog translates) leave it."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import read_po, write_po

    old, keyed = {}, []
    if GLUE_CATALOG.exists():
        with open(GLUE_CATALOG, "rb") as f:
            for m in read_po(f):
                if m.id and m.context:
                    keyed.append(m)  # one key's own translation (book/_ext/i18n_glue.py): kept as written
                elif m.id and m.id not in drop:
                    old[m.id] = m
    catalog = Catalog(locale=LANGUAGE, project="Multi-Head Attention, Derived: glued text")
    for text in sorted(set(texts) | {t for t, m in old.items() if m.string}):
        where = texts.get(text) or list(old[text].auto_comments)
        catalog.add(text, old[text].string if text in old else "", auto_comments=where)
    for m in sorted(keyed, key=lambda m: (m.context, m.id)):
        catalog.add(m.id, m.string, auto_comments=list(m.auto_comments), context=m.context)
    with open(GLUE_CATALOG, "wb") as f:
        write_po(f, catalog, width=120)


def stage_catalogs() -> Path:
    """The catalogs the Chinese build reads, in ``_build/i18n-locales``: the committed ones with every ``{glue:md}``
    role replaced by the Markdown it pastes (from the English build's execution cache; translated through glue.po
    where that has an entry). myst-nb parses a translated paragraph apart from its notebook, and only ``{glue:text}``
    can look a value up from there; pasted Markdown (a formula, a sentence with emphasis) is inlined instead."""
    from babel.messages.pofile import read_po, write_po

    markdown = glue_values("text/markdown")
    translations = {}
    if GLUE_CATALOG.exists():
        with open(GLUE_CATALOG, "rb") as f:
            translations = {m.id: m.string for m in read_po(f) if m.id and m.string}

    untranslated = []
    staged = BUILD / "i18n-locales"
    shutil.rmtree(staged, ignore_errors=True)
    for path in sorted(CATALOGS.rglob("*.po")):
        target = staged / path.relative_to(LOCALES)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path == GLUE_CATALOG:
            shutil.copy(path, target)
            continue
        page = path.relative_to(CATALOGS).with_suffix("").as_posix()
        with open(path, "rb") as f:
            catalog = read_po(f)

        def inline(match, page=page):
            if match["kind"] != "md":
                return match[0]
            value = markdown.get((page, match["key"]))
            if value is None:  # not in the cache: left as it is, and the build says so
                return match[0]
            if not has_words(value, markdown=True):
                return value  # a formula or a number: nothing to translate
            chinese = translate(value, translations)
            if chinese is None:
                untranslated.append(f"{page}::{match['key']}: {value[:100]!r}")
                return value
            return chinese

        for message in catalog:
            if message.id and message.string:
                message.string = GLUE_ROLE.sub(inline, message.string)
        with open(target, "wb") as f:
            write_po(f, catalog, width=120)
    if untranslated:
        raise SystemExit("glued Markdown without a translation in glue.po (run python tools/i18n.py update and "
                         "translate it):\n" + "\n".join(untranslated))
    return staged


def stale_figure_pages() -> list[str]:
    """The pages whose figures were drawn in Chinese with translations glue.po no longer gives (a text translated,
    or its translation changed, since the page executed)."""
    translations = figure_translations()  # what the kernels draw with
    stale = set()
    for page, output in _executed_outputs():
        figure = figure_output(output)
        if figure and figure["chinese"] and any(translate(text, translations) != figure["drawn"].get(text)
                                                 for text in figure["texts"]):
            stale.add(page)
    return sorted(stale)


def refresh_figures() -> list[str]:
    """Send the pages of :func:`stale_figure_pages` back to execution: their records leave the execution cache and
    their sources are touched, so that the next build (``make book``) reads and executes them again."""
    import os

    from jupyter_cache import get_cache

    pages = stale_figure_pages()
    if pages and CACHE.is_dir():
        cache = get_cache(str(CACHE))
        for record in cache.list_cache_records():
            if _page_of(record) in pages:
                cache.remove_cache(record.pk)
    for page in pages:
        os.utime(ROOT / f"{page}.md")
    return pages


def check_figures() -> None:
    """Stop when an executed page's figure has no Chinese drawing: the Chinese edition would show the English one."""
    missing = figures_without_chinese()
    if missing:
        raise SystemExit("figures executed without their Chinese drawing (book/_ext/i18n_figures.py; make book "
                         "sets IPYTHONDIR so that the kernels draw it; re-execute these pages, e.g. make book-all "
                         "after removing _build/.jupyter_cache):\n" + "\n".join(missing))


def chinese_title() -> str:
    """The book's title in the Chinese edition (intro.po's translation of it)."""
    from babel.messages.pofile import read_po

    with open(CATALOGS / "book" / "intro.po", "rb") as f:
        return {m.id: m.string for m in read_po(f)}.get("Multi-Head Attention, Derived") or "Multi-Head Attention"


CHINESE_AUTHOR = "《推导多头注意力》编写组"  # "The Multi-Head Attention, Derived team"


def chinese_options() -> list[str]:
    """sphinx-build's options for the Chinese edition (HTML and PDF): the language, the staged catalogs, the title and
    the interface words the theme and myst-nb take from configuration rather than from Sphinx's own catalogs."""
    staged = stage_catalogs()
    title = chinese_title()
    return ["-D", f"language={LANGUAGE}", "-D", f"locale_dirs={staged}", "-D", f"html_title={title}",
            "-D", f"author={CHINESE_AUTHOR}",  # the footer's and the PDF's author line
            "-D", "nb_code_prompt_show=显示代码单元", "-D", "nb_code_prompt_hide=隐藏代码单元",
            "-D", "html_theme_options.search_bar_text=搜索本书……", "-D", "togglebutton_hint=点击显示",
            "-D", "togglebutton_hint_hide=点击隐藏",
            "-D", "math_eqref_format=式 ({number})"]  # {eq} references: 式 (25), not Eq. 25


def build() -> None:
    """The Chinese edition into ``_build/html/zh``, warnings as errors, reusing the English build's executed cells."""
    check_figures()
    _sphinx("html", HTML_ZH, BUILD / "doctrees-zh", "-q", *chinese_options(), warnings_as_errors=True)


def problems() -> list[str]:
    """What keeps the catalogs from matching the English pages: untranslated, fuzzy or obsolete messages, and
    English messages with no entry (an edited paragraph). Needs ``extract`` first."""
    from babel.messages.pofile import read_po

    found = []
    for pot in sorted(POT_DIR.rglob("*.pot")):
        page = pot.relative_to(POT_DIR).with_suffix("")
        po = CATALOGS / page.with_suffix(".po")
        with open(pot, "rb") as f:
            english = {m.id for m in read_po(f) if m.id}
        if not po.exists():
            found.append(f"{page}.md: no catalog {po.relative_to(ROOT)} ({len(english)} messages to translate)")
            continue
        with open(po, "rb") as f:
            catalog = read_po(f)
        translated = {m.id: m for m in catalog if m.id}
        for message_id in sorted(english - set(translated)):
            found.append(f"{page}.md: paragraph without a translation (new or edited): {message_id[:100]!r}")
        for message in translated.values():
            if message.id not in english:
                found.append(f"{page}.md: translation of a paragraph that no longer exists: {message.id[:100]!r}")
            elif not message.string:
                found.append(f"{page}.md: untranslated: {message.id[:100]!r}")
            elif message.fuzzy:
                found.append(f"{page}.md: fuzzy (the English changed; check the translation): {message.id[:100]!r}")
        obsolete = getattr(catalog, "obsolete", {})
        if obsolete:
            found.append(f"{page}.md: {len(obsolete)} obsolete entries (run python tools/i18n.py update)")
    if GLUE_CATALOG.exists():
        with open(GLUE_CATALOG, "rb") as f:
            for message in read_po(f):
                if message.id and not message.string:
                    found.append(f"glue.po: glued text without a translation: {message.id!r} "
                                 f"({', '.join(message.auto_comments)})")
    return found


MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+?\$", re.S)
MATH_TEXT = re.compile(r"\\text\{[^{}]*\}")  # words inside math: "\text{bytes per number}"
ROLE = re.compile(r"\{(?P<role>[\w:-]+)\}`(?P<body>[^`]*)`")
CODE = re.compile(r"(?<![}`])``?(?!`)(?P<code>[^`]+?)``?(?!`)")
LINK_TARGET = re.compile(r"\]\((?P<target>[^)\s]+)\)")
FOOTNOTE = re.compile(r"\[\^[\w-]+\]")
DOUBLE_CODE = re.compile(r"``.+?``", re.S)  # code that may itself show a role: ``{ref}`text <target>` ``


def _role_keys(text: str) -> list[str]:
    """What a role points at: the glue key, the target of ``text <target>``, or the whole body (cite, eq, ...)."""
    keys = []
    for match in ROLE.finditer(text):
        role, body = match["role"], match["body"]
        if role.startswith("glue"):
            glue = GLUE_ROLE.match(match[0])
            keys.append(f"glue:{glue['key'] if glue else body}")
        elif role in ("ref", "doc", "numref", "term", "download", "prf:ref") and body.rstrip().endswith(">") and "<" in body:
            keys.append(f"{role}:{body[body.rindex('<') + 1:-1].strip()}")
        else:
            keys.append(f"{role}:{body}")
    return sorted(keys)


# A quoted Chinese note followed by its English rendering: 「…」 — "…". The Chinese edition may leave the rendering out
# (a Chinese reader needs no English gloss of a Chinese note), so its math and code need not reappear.
NOTE_GLOSS = re.compile(r'(?<=[\u3000-\u9fff\uff00-\uffef])(?P<between>[^"]*?)\s+—\s+"[^"]*"')


def preserved(english: str, translation: str, page: str | None = None) -> list[str]:
    """What a translation changed that it must keep: math, code spans, role keys and targets, link targets; with
    ``page`` (the message's page, e.g. "book/appendix/claims"), also the page each glue role reads from (the English
    role's own page or the page its path names; the translation's always names one, relative to ``page``). Where
    the English quotes a Chinese note and renders it in English (NOTE_GLOSS), the translation may drop the
    rendering."""
    differences = _preserved(english, translation, page)
    if differences and NOTE_GLOSS.search(english) and not _preserved(NOTE_GLOSS.sub(r"\g<between>", english),
                                                                     translation, page):
        return []  # the translation keeps everything but the rendering
    return differences


def _glue_pages(text: str, page: str) -> list[tuple[str, str]]:
    """(key, page it is glued on) of every glue role of ``text`` on ``page``: a role without a path reads its own
    page; a path is relative to the page's folder."""
    found = []
    for m in GLUE_ROLE.finditer(MATH.sub("", text)):
        path = m["path"][:-2] if m["path"] else None  # "../part3/x.md::" -> "../part3/x.md"
        target = page if not path else posixpath.normpath(posixpath.join(posixpath.dirname(page), path))
        found.append((m["key"], target.removesuffix(".md")))
    return sorted(found)


def _preserved(english: str, translation: str, page: str | None = None) -> list[str]:
    differences = []
    double = [sorted(DOUBLE_CODE.findall(t)) for t in (english, translation)]
    english, translation = (DOUBLE_CODE.sub("", t) for t in (english, translation))
    without_roles = [ROLE.sub("", MATH.sub("", t)) for t in (english, translation)]
    checks = {
        "quoted code": double,
        # math is kept as it is, but for the words of its \text{...}, which a Chinese page writes in Chinese
        "math": [sorted(MATH_TEXT.sub(r"\\text{}", m) for m in MATH.findall(t)) for t in (english, translation)],
        "roles": [_role_keys(MATH.sub("", t)) for t in (english, translation)],
        # a glued number's format: the Chinese page must print the digits the English one prints
        "glue formats": [sorted((m["key"], m["fmt"] or ":s") for m in GLUE_ROLE.finditer(MATH.sub("", t)))
                         for t in (english, translation)],
        "code": [sorted(m["code"] for m in CODE.finditer(t)) for t in without_roles],
        "links": [sorted(LINK_TARGET.findall(t)) for t in (english, translation)],
        "footnotes": [sorted(FOOTNOTE.findall(t)) for t in (english, translation)],
    }
    if page is not None:
        checks["glue pages"] = [_glue_pages(t, page) for t in (english, translation)]
    for what, (want, got) in checks.items():
        if want != got:
            missing = [x for x in want if x not in got]
            extra = [x for x in got if x not in want]
            differences.append(f"{what} differ: missing {missing[:3]}, unexpected {extra[:3]}")
    return differences


def lint(paths=None) -> list[str]:
    """Every translated message against its English: see ``preserved``."""
    from babel.messages.pofile import read_po

    found = []
    for path in [Path(p) for p in paths] if paths else sorted(CATALOGS.rglob("*.po")):
        if path.resolve() == GLUE_CATALOG.resolve():
            continue
        with open(path, "rb") as f:
            catalog = read_po(f)
        for message in catalog:
            if message.id and message.string:
                page = path.resolve().relative_to(CATALOGS.resolve()).with_suffix("").as_posix()
                for difference in preserved(message.id, message.string, page):
                    found.append(f"{path}: {message.id[:80]!r}: {difference}")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/i18n.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("conf", "extract", "update", "build", "check", "lint",
                                            "refresh-figures"))
    parser.add_argument("catalogs", nargs="*", help="lint: the .po files to check (default: all)")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    if args.command == "conf":
        print(write_conf())
    elif args.command == "extract":
        extract()
    elif args.command == "update":
        update()
    elif args.command == "build":
        build()
    elif args.command == "refresh-figures":
        pages = refresh_figures()
        print(f"to execute again (figures drawn with older translations): {', '.join(pages)}" if pages else
              "every figure's Chinese drawing matches glue.po")
    elif args.command == "lint":
        found = lint(args.catalogs)
        for line in found:
            print(line)
        print(f"{len(found)} translation(s) changed what they must keep" if found else "translations keep math, "
              "code, glue keys and link targets")
        return 1 if found else 0
    else:
        found = problems() + lint()
        for line in found:
            print(line)
        print(f"{len(found)} problem(s) in the Chinese catalogs" if found else "catalogs complete and up to date")
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
