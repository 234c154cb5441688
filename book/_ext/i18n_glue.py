"""Glued text in the Chinese edition: a word or phrase a cell chose from the data, translated at build time.

A chapter may glue text (``glue("verdict", "lower" if ... else "not distinguishable from")``) and paste it into a
paragraph. The Chinese edition pastes the same value, so that it follows the data too, but in Chinese: this extension
looks each glued text up in ``book/locales/<language>/LC_MESSAGES/glue.po`` (kept in step by
``python tools/i18n.py update``) when myst-nb resolves a pasted glue reference. A glued text with no translation is
a build warning (an error with ``-W``), so an untranslated word cannot slip into a Chinese page. A text the data
picks at build time (``mha.glued.glue_one_of``) needs a translation of every text it could have picked, so that the
build does not pass on one machine and fail on another. Numbers and other non-text values are pasted as they are.
Nothing happens in the English build.

A glued word sits in a sentence written for English word order ("one head is {higher than} four heads"). Where the
Chinese sentence is built differently ("与四个头相比，一个头的损失{更高}"), glue.po may hold an entry for that one
key, with the key as its context (``msgctxt "book/part3/head_count::hc_sh_fw_h1_word"``): it wins over the entry for
the text alone, so each sentence can take the Chinese its word order needs.

The labels of the mermaid diagrams are short texts too, and go through the same catalog: before a diagram is drawn,
each quoted label of its source (a node's ``["..."]`` or an edge's ``|"..."|``) that has words in it is replaced by
its translation, so the Chinese edition's diagrams are drawn with Chinese labels. ``tools/i18n.py update`` lists the
labels in glue.po (``diagram_labels``); a label with no translation is a build warning, as a glued text is.

The tables a cell shows or glues (pandas' HTML) go through it too: each string of a table cell with words in it
(a header, "solved", a model's source) is replaced by its translation (``TranslateTables``), so a Chinese page's
tables speak Chinese while every number stays the English build's. ``tools/i18n.py update`` lists the cells' texts
(``table_texts``). So do the printed text and the displayed Markdown of a code cell tagged ``translate-output``
(``TranslateStreams``), and the words of a display equation's ``\\text{...}`` (``TranslateMathBlocks``).
"""

from __future__ import annotations

import re
from ast import literal_eval
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging

logger = logging.getLogger(__name__)


def _load(app: Sphinx) -> dict:
    """glue.po as ``{english: chinese}``, and ``{(key, english): chinese}`` for the entries with a key as context."""
    from babel.messages.pofile import read_po

    for locale_dir in app.config.locale_dirs:
        path = Path(app.confdir, locale_dir, app.config.language, "LC_MESSAGES", "glue.po")
        if path.exists():
            with open(path, "rb") as f:
                return {((m.context, m.id) if m.context else m.id): m.string
                        for m in read_po(f) if m.id and m.string}
    return {}


WORD = re.compile(r"[A-Za-z]{2}")
MATH_OR_CODE = re.compile(r"\$[^$]*\$|`[^`]*`")


def has_words(text: str, markdown: bool = False) -> bool:
    """Whether a glued text needs a translation: it has a word in it (two letters in a row), outside math and code
    when it is Markdown. "4.7e-03", "h = 4" or "$d_k = 16$" is pasted as it is. tools/i18n.py uses the same rule to
    list the texts glue.po must translate."""
    return bool(WORD.search(MATH_OR_CODE.sub("", text) if markdown else text))


NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def translate(value: str, translations: dict, context: str | None = None) -> str | None:
    """The translation of a glued text: the entry for this key (``context``, ``page::key``) if glue.po has one, else
    the text's own entry, or else the entry of a text that differs from it only in its numbers ("at least 3 timed
    blocks" from "at least 2 timed blocks"), with the numbers carried over in order. A value measured at build time
    keeps its words and changes its numbers from machine to machine."""
    if context is not None and (context, value) in translations:
        return translations[(context, value)]
    if value in translations:
        return translations[value]
    shape = NUMBER.sub("#", value)
    for english, chinese in translations.items():
        if isinstance(english, tuple):
            if english[0] != context:
                continue
            english = english[1]
        if NUMBER.sub("#", english) == shape:
            old = NUMBER.findall(english)
            if len(set(old)) != len(old) or any(chinese.count(n) != 1 for n in old):
                continue  # a number repeated, or not found once in the translation: no unambiguous mapping
            new = dict(zip(old, NUMBER.findall(value)))
            return NUMBER.sub(lambda m: new.get(m.group(0), m.group(0)), chinese)
    return None


def glued_choices(plain: str | None, where: str) -> list[str]:
    """The texts of a glued list of choices (``mha.glued.glue_one_of``; ``plain`` its text/plain, None when the cell
    glued none: []). ValueError, naming ``where``, when it is not a list of str."""
    choices = literal_eval(plain) if plain else []
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise ValueError(f"{where}: the glued choices must be a list of str, got {plain!r}")
    return choices


def _install(app: Sphinx) -> None:
    if not app.config.language or app.config.language.startswith("en"):
        return
    from myst_nb.ext.glue import crossref

    translations = _load(app)
    original = crossref.generate_text_nodes

    def _choices(node) -> list[str]:
        """Every text the page's cell could have glued as this key (``mha.glued.glue_one_of``), or []."""
        from mha.glued import CHOICES_SUFFIX

        data = crossref.read_glue_cache(app.env.mystnb_config.output_folder, node.refdoc)
        return glued_choices(data.get(node.key + CHOICES_SUFFIX, {}).get("data", {}).get("text/plain"),
                             f"{node.refdoc}::{node.key}")

    def translated_text_nodes(node, output):
        nodes_out = original(node, output)
        plain = output.get("data", {}).get("text/plain")
        try:
            value = literal_eval(plain) if plain is not None else None
        except (ValueError, SyntaxError):
            value = None
        if isinstance(value, str) and nodes_out and has_words(value):
            missing = [choice for choice in _choices(node) if choice != value and has_words(choice)
                       and translate(choice, translations, f"{node.refdoc}::{node.key}") is None]
            if missing:
                logger.warning(f"glued text {node.get('refdoc')}::{node.get('key')} may also be {missing!r} on "
                               f"another machine, which glue.po does not translate; run python tools/i18n.py update "
                               f"and translate it", location=node)
            text = translate(value, translations, f"{node.refdoc}::{node.key}")
            if text is not None:
                nodes_out[0].children = []
                nodes_out[0] += crossref.nodes.Text(text)
            else:
                logger.warning(f"glued text {value!r} ({node.get('refdoc')}::{node.get('key')}) has no translation "
                               f"in glue.po; run python tools/i18n.py update and translate it", location=node)
        return nodes_out

    crossref.generate_text_nodes = translated_text_nodes


# A quoted label in a mermaid diagram's source: a node's ["..."], an edge's |"..."|.
LABEL = re.compile(r'"([^"\n]*)"')
MARKUP = re.compile(r"<(sup|sub)>[^<]*</\1>|<[^>]*>")  # a superscript or subscript with its content, any other tag


def _label_has_words(label: str) -> bool:
    return has_words(MARKUP.sub(" ", label), markdown=True)  # "W<sup>O</sup>" or "<br/>" has no words


def diagram_labels(code: str) -> list[str]:
    """The quoted labels of a mermaid diagram's source that need a translation (words outside HTML tags)."""
    return [label for label in LABEL.findall(code) if _label_has_words(label)]


def _translate_diagrams(app: Sphinx, doctree, docname: str) -> None:
    if not app.config.language or app.config.language.startswith("en"):
        return
    from sphinxcontrib.mermaid import mermaid

    diagrams = list(doctree.findall(mermaid))
    if not diagrams:  # most pages: glue.po is read only for a page that draws a diagram
        return
    translations = _load(app)
    for node in diagrams:
        def label(match, node=node):
            english = match.group(1)
            if not _label_has_words(english):
                return match.group(0)
            chinese = translations.get(english)
            if chinese is None:
                logger.warning(f"diagram label {english!r} has no translation in glue.po; run python tools/i18n.py "
                               "update and translate it", location=node)
                return match.group(0)
            return f'"{chinese}"'

        node["code"] = LABEL.sub(label, node["code"])


def _worded_cell_strings(soup):
    """Each string of a table cell (a cell may hold a link or markup around its text) that has a word in it."""
    return [text for table in soup.find_all("table") for cell in table.find_all(["th", "td"])
            for text in cell.find_all(string=True) if has_words(text.strip())]


def table_texts(html: str) -> list[str]:
    """The texts of the cells of an HTML output's tables (pandas' DataFrame or Styler) that need a translation, each
    stripped."""
    from bs4 import BeautifulSoup

    return [text.strip() for text in _worded_cell_strings(BeautifulSoup(html, "html.parser"))]


def checker_messages() -> dict:
    """The known bugs' descriptions in Chinese, from the checkers' own catalog (``mha.exercises.messages_zh``): the
    exercises appendix's table of known bugs shows them, and they are translated once, there."""
    from mha.exercises.catalogue import KNOWN_BUGS
    from mha.exercises.messages_zh import MESSAGES

    return {bug.description: MESSAGES[bug.description] for bug in KNOWN_BUGS.values() if bug.description in MESSAGES}


# The context of a glue.po entry that translates a table text on one page only (``msgctxt
# "book/appendix/reproducibility::table"``): there a sweep's name ("heads", "induction") is a name, kept as it is,
# while elsewhere the same word is a column's or a class's and is translated.
TABLE_CONTEXT = "table"


class TranslateTables(SphinxPostTransform):
    """The Chinese edition's tables: each cell's words from glue.po (numbers carried over as in glued text), in every
    HTML output that holds a table, the page's own entry (:data:`TABLE_CONTEXT`) first. Before the LaTeX builder
    turns those outputs into tables (latex_edition.py)."""

    default_priority = 800

    def run(self, **kwargs) -> None:
        app = self.app
        if not app.config.language or app.config.language.startswith("en"):
            return
        outputs = [node for node in self.document.findall(nodes.raw)
                   if "html" in node.get("format", "").split() and "<table" in node.astext()]
        if not outputs:
            return
        from bs4 import BeautifulSoup

        translations = {**checker_messages(), **_load(app)}
        for node in outputs:
            soup = BeautifulSoup(node.astext(), "html.parser")
            for text in _worded_cell_strings(soup):
                english = text.strip()
                chinese = translate(english, translations, context=f"{self.env.docname}::{TABLE_CONTEXT}")
                if chinese is None:
                    logger.warning(f"table text {english!r} has no translation in glue.po; run python tools/i18n.py "
                                   "update and translate it", location=node)
                    continue
                text.replace_with(text.replace(english, chinese))
            html = str(soup)
            node.replace_self(nodes.raw(html, html, format=node["format"], classes=node["classes"]))


# The tag of a code cell whose printed text (its stream output: "The solution above passes check_softmax.", a
# checker's message) the Chinese edition shows in Chinese, from glue.po. Other printed output (numbers, arrays, a
# listing's lines) is shown as the English build printed it.
TRANSLATED_OUTPUT_TAG = "translate-output"


def translated_output_cell(cell_metadata: dict) -> bool:
    return TRANSLATED_OUTPUT_TAG in (cell_metadata or {}).get("tags", [])


def translate_streams(document, translations: dict) -> list[tuple[str, nodes.Node]]:
    """Replace the printed text of every code cell of ``document`` tagged ``translate-output``, and the words of the
    Markdown it displays (a title in bold), by their translations; return (text, cell) for each text that has none."""
    missing = []

    def chinese_of(english, cell):
        chinese = translate(english, translations)
        if chinese is None:
            missing.append((english, cell))
        return chinese

    for cell in document.findall(nodes.container):
        if cell.get("nb_element") != "cell_code" or not translated_output_cell(cell.get("cell_metadata")):
            continue
        # the Markdown it displays: paragraphs of its output (myst-nb has chosen the Markdown of each output by now)
        outputs = [n for n in cell.findall(nodes.container) if n.get("nb_element") == "cell_code_output"]
        for shown in [paragraph for output in outputs for paragraph in output.findall(nodes.paragraph)]:
            for text in list(shown.findall(nodes.Text)):
                english = str(text).strip()
                if has_words(english) and (chinese := chinese_of(english, cell)) is not None:
                    text.parent.replace(text, nodes.Text(str(text).replace(english, chinese)))
        for block in list(cell.findall(nodes.literal_block)):
            if "stream" in block["classes"] and (chinese := chinese_of(block.astext().strip(), cell)) is not None:
                block.children = [nodes.Text(chinese + "\n")]
                block.rawsource = chinese + "\n"
    return missing


class TranslateStreams(SphinxPostTransform):
    """The Chinese edition's printed text and displayed Markdown of the cells tagged ``translate-output``
    (``translate_streams``), from glue.po (numbers carried over as in glued text); a text with no translation is a
    build warning."""

    default_priority = 800

    def run(self, **kwargs) -> None:
        app = self.app
        if not app.config.language or app.config.language.startswith("en"):
            return
        for english, cell in translate_streams(self.document, _load(app)):
            logger.warning(f"printed text {english!r} has no translation in glue.po; run python tools/i18n.py "
                           "update and translate it", location=cell)


class TranslateMathBlocks(SphinxTransform):
    """A display equation's translation (its \\text{...} words in Chinese), put in place before Sphinx's own
    translation, which parses a math block's translation as a literal block in reStructuredText ("::" and an indented
    block): the MyST parser reads that as a paragraph "::", and the equation was shown as "\\[::\\]"."""

    default_priority = 19  # before sphinx.transforms.i18n.Locale (20)

    def apply(self, **kwargs) -> None:
        if not self.config.language or self.config.language.startswith("en"):
            return
        from os import path

        from sphinx.locale import init as init_locale
        from sphinx.util.i18n import docname_to_domain

        domain = docname_to_domain(self.env.docname, self.config.gettext_compact)
        catalog, has_catalog = init_locale([path.join(self.env.srcdir, d) for d in self.config.locale_dirs],
                                           self.config.language, domain)
        if not has_catalog:
            return
        for node in self.document.findall(nodes.math_block):
            english = node.rawsource or node.astext()  # the message id, as sphinx.util.nodes.extract_messages has it
            chinese = catalog.gettext(english)
            if chinese and chinese != english:
                node.children = [nodes.Text(chinese)]
                node.rawsource = chinese
            node["translatable"] = False  # Locale leaves it as it is


def setup(app: Sphinx) -> dict:
    app.add_transform(TranslateMathBlocks)
    app.connect("builder-inited", _install)
    app.connect("doctree-resolved", _translate_diagrams)
    app.add_post_transform(TranslateTables)
    app.add_post_transform(TranslateStreams)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
