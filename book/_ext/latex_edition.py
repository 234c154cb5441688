"""The PDF editions (``make pdf``; ``tools/pdf.py``): Sphinx's LaTeX builder, compiled by xelatex.

What print needs that the web pages do not:

- Hidden code is left out: a cell tagged ``hide-input`` (the web page's "show code" toggle) keeps its output and
  loses its input.
- An admonition inside another (an exercise's dropdown solution) is set as a titled block of the outer one. LaTeX's
  framed boxes cannot break a nested box across pages, and a solution longer than a page sent xelatex into a loop of
  ten thousand pages.
- Tables: the book's tables are pandas' HTML (a DataFrame or Styler shown or glued), which LaTeX cannot take, and its
  plain-text form is a repr ("<pandas.io.formats.style.Styler at 0x...>"). The LaTeX builder is told to prefer an
  output's HTML (``nb_mime_priority_overrides``), and each HTML table becomes a docutils table (merged header cells
  kept). HTML that holds no table (the interactive attention explorer) becomes a note pointing to the web edition.
- The parts of the table of contents are part pages, and the appendices are lettered.
- sphinx-proof's boxes get their translated names in the Chinese edition (定理 1, not "Theorem 1"), and its "Proof
  Index" of raw labels is left out.
- A pandas table is a longtable whose columns wrap, in proportion to their text; one pasted by ``{glue:figure}``
  leaves its figure float (which cannot break across pages), its caption following it; a wide one gets landscape
  pages.
- A citation inside a caption is set as plain text ("[Kimi Team, 2025]"): hyperref's \\caption cannot take a
  \\hyperlink in its argument ("Argument of \\Hy@tempa has an extra }").
- Fonts. Sphinx's default xelatex fonts (GNU FreeFont) are not on a Debian machine with texlive; DejaVu
  (``fonts-dejavu-core``) is, and covers the arrows, Greek and symbols the prose uses. Both editions load xeCJK with
  Noto Serif/Sans CJK SC (``fonts-noto-cjk``, which the browser tests need too): the English one quotes the
  source notes and the glossary's Chinese terms.
"""

from __future__ import annotations

import re

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.transforms.post_transforms import SphinxPostTransform

HYPERLINK = re.compile(r"\\hyperlink\{[^{}]*\}\{")  # \hyperlink{target}{text} -> {text}
LATIN = r"""
\setmainfont{DejaVu Serif}
\setsansfont{DejaVu Sans}
\setmonofont{DejaVu Sans Mono}[Scale=0.9]
"""
CJK = r"""
\usepackage{xeCJK}
\setCJKmainfont{Noto Serif CJK SC}[BoldFont={Noto Serif CJK SC Bold}]
\setCJKsansfont{Noto Sans CJK SC}[BoldFont={Noto Sans CJK SC Bold}]
\setCJKmonofont{Noto Sans Mono CJK SC}
"""

# The references page is the bibliography's chapter: Sphinx's sphinxthebibliography would open a second one, titled
# "Bibliography", right after it. Its running head says References, as the page does. The contents are "Contents":
# Sphinx names them after the root page's first captioned table of contents, which here is part I's, in babel's
# English captions (which babel applies after \AtBeginDocument's hooks, so the name is added to them after Sphinx's).
# Its entries hang: each label at the margin and its text after it, the following lines indented by a few letters,
# ragged right (labels such as [HuggingFaceQwenTeam25] are far wider than the eight letters Sphinx sizes the label
# column by, and pushed their first lines apart; the URLs and paths left loose justified lines).
BIBLIOGRAPHY = r"""
\makeatletter
\renewenvironment{sphinxthebibliography}[1]{\let\chapter\@gobbletwo\raggedright
  \begin{thebibliography}{MMM}\labelwidth\z@\itemindent\labelsep\advance\itemindent-\leftmargin}{\end{thebibliography}}
\makeatother
\AtBeginDocument{\renewcommand{\bibname}{References}}
\ifdefined\captionsenglish\addto\captionsenglish{\renewcommand{\contentsname}{Contents}%
  \renewcommand{\bibname}{References}}\fi
"""
LANDSCAPE = r"\usepackage{pdflscape}"  # the landscape pages of wide tables
# Inline code may also break after an underscore: a long identifier in a table cell
# (``_scaled_dot_product_flash_attention_for_cpu``) ran past the edge of the page.
UNDERSCORE_BREAKS = r"""
\makeatletter
\let\mha@sphinxupquote\sphinxupquote
\protected\def\sphinxupquote#1{\mha@sphinxupquote{\def\_{\textunderscore\allowbreak}#1}}
\makeatother
"""
# A table's columns of given width (sphinxlatextables.sty's \X) set ragged right: justified in a narrow column, a
# line of Chinese was stretched letter by letter ("缓 存 相 同 的").
RAGGED_COLUMNS = r"""
\makeatletter
\newcolumntype{\X}[2]{>{\raggedright\arraybackslash}p{\dimexpr
      (\linewidth-\spx@arrayrulewidth)*#1/#2-\tw@\tabcolsep-\spx@arrayrulewidth\relax}}
\makeatother
"""
# A box's title may wrap: Sphinx sets it in \makebox[\linewidth][l], which does not break, so a long proposition
# title ran past the box into the margin.
WRAPPING_TITLES = r"""
\usepackage{etoolbox}
\makeatletter
\newcommand\mha@titlebox[1]{\parbox[t]{\linewidth}{\raggedright#1}}
\patchcmd{\sphinxdotitlerowwithicon}{\makebox[\linewidth][l]}{\mha@titlebox}{}
  {\PackageError{latex_edition}{Sphinx's box title macro changed: titles would not wrap}{}}
\makeatother
"""
# A box starts on a new page unless its title and a few lines of its body fit: a box may break across pages, and four
# titles were left alone at the foot of a page, their text on the next.
KEEP_TITLES = r"\AtBeginEnvironment{sphinxadmonition}{\needspace{8\baselineskip}}"
# Room for two-digit numbers in the contents: "11.10" touched its title ("11.10Exercises") in the 2.6em Sphinx's
# hook gives a section number, and "12" its chapter's title in report's 1.5em (the Chinese edition's ctex headings
# set their own chapter lines; there the patch finds nothing to change).
CONTENTS_NUMBERS = r"""
\makeatletter
\renewcommand{\@pnumwidth}{2.2em}\renewcommand{\@tocrmarg}{3.2em}% room for three-digit page numbers
\renewcommand{\sphinxtableofcontentshook}{%
  \renewcommand*\l@section{\@dottedtocline{1}{1.5em}{3.4em}}%
  \renewcommand*\l@subsection{\@dottedtocline{2}{4.9em}{3.8em}}%
  \patchcmd{\l@chapter}{\setlength\@tempdima{1.5em}}{\setlength\@tempdima{2em}}{}{}}
\makeatother
"""
# Western punctuation for xeCJK: the curly quotes, the apostrophe, the em dash and the ellipsis as Latin letters.
WESTERN_CLASS = r'\xeCJKDeclareCharClass{Default}{"2014,"2018,"2019,"201C,"201D,"2026}'
# The Chinese edition's headings and names: ctex's headings (第一章) instead of fncychap's "CHAPTER 1", and Chinese
# names where the class has English ones (after babel's English names, set at \begin{document}); its fonts stay the
# ones above (fontset=none). Its bibliography, whose entries are English, sets quotes and dashes as the English
# edition does (WESTERN_PUNCTUATION), not full width.
CHINESE = r"""
\usepackage[heading=true,fontset=none]{ctex}
\AtBeginDocument{\renewcommand{\contentsname}{目录}\renewcommand{\bibname}{参考文献}\renewcommand{\appendixname}{附录}}
\AtBeginEnvironment{sphinxthebibliography}{""" + WESTERN_CLASS + """}
"""


# In the English edition, which loads xeCJK only for its few Chinese words, the curly quotes, the apostrophe, the em
# dash and the ellipsis stay Western punctuation: xeCJK took them for Chinese, set them full width and dropped the
# space beside them ("today’ s", "Part I —Deriving").
WESTERN_PUNCTUATION = "\n" + WESTERN_CLASS + "\n"


def _configure(app: Sphinx, config: Config) -> None:
    chinese = (config.language or "").startswith("zh")
    elements = {"papersize": "a4paper", "fontpkg": LATIN + CJK + ("" if chinese else WESTERN_PUNCTUATION),
                "preamble": BIBLIOGRAPHY + LANDSCAPE + UNDERSCORE_BREAKS + RAGGED_COLUMNS + WRAPPING_TITLES
                + KEEP_TITLES + CONTENTS_NUMBERS + (CHINESE if chinese else "")}
    if chinese:
        elements["fncychap"] = ""
    config.latex_elements = {**elements, **(config.latex_elements or {})}
    # HTML after LaTeX and images, before Markdown and plain text (myst-nb's latex priorities: 40, 50, 60)
    config.nb_mime_priority_overrides = [*config.nb_mime_priority_overrides, ("latex", "text/html", 45)]
    config.latex_domain_indices = False  # sphinx-proof's "Proof Index" listed raw labels (bench-rem-pairs)


WIDE_COLUMNS = 10
PORTRAIT_LETTERS = 100  # the most letters of column widths (_column_widths) a portrait page holds in small type
CJK_RANGES = "\u3000-\u303f\u4e00-\u9fff\uff00-\uffef"  # CJK punctuation, ideographs, full-width forms
CJK_CHARACTER = re.compile(f"[{CJK_RANGES}]")
UNBREAKABLE = re.compile(rf"[^\s{CJK_RANGES}]+")  # a run that LaTeX will not break


def html_table(html: str) -> nodes.container | None:
    """A docutils table from the first ``<table>`` of ``html`` (None if it has none): ``<thead>`` rows become the
    header, ``colspan``/``rowspan`` merged cells, each cell its text."""
    from bs4 import BeautifulSoup

    table = BeautifulSoup(html, "html.parser").find("table")
    if table is None:
        return None
    head = [row for section in table.find_all("thead") for row in section.find_all("tr")]
    if _fold_index_names(head):
        head[-1].decompose()
        head = head[:-1]
    body = [row for row in table.find_all("tr") if row not in head]
    if not body and not head:
        return None
    taken: dict[tuple[int, int], bool] = {}  # grid cells covered by a merged cell above or to the left
    grid_rows, placed = [], []  # placed: (entry, its first column)
    for r, row in enumerate(head + body):
        entries, c = [], 0
        for cell in row.find_all(["th", "td"], recursive=False):
            while taken.get((r, c)):
                c += 1
            span_c, span_r = int(cell.get("colspan", 1)), int(cell.get("rowspan", 1))
            entry = nodes.entry()
            if span_c > 1:
                entry["morecols"] = span_c - 1
            if span_r > 1:
                entry["morerows"] = span_r - 1
            text = cell.get_text(" ", strip=True)
            entry += nodes.paragraph(text, text) if text else nodes.paragraph()
            entries.append(entry)
            placed.append((entry, c))
            for dr in range(span_r):
                for dc in range(span_c):
                    taken[(r + dr, c + dc)] = True
            c += span_c
        grid_rows.append(entries)
    n_cols = max(c + 1 for (_, c) in taken)
    widths = _column_widths([(entry.astext(), c) for entry, c in placed if not entry.get("morecols")], n_cols)
    group = nodes.tgroup(cols=n_cols)
    group += [nodes.colspec(colwidth=width) for width in widths]
    for rows, section in ((grid_rows[:len(head)], nodes.thead()), (grid_rows[len(head):], nodes.tbody())):
        if rows:
            section += [nodes.row("", *entries) for entries in rows]
            group += section
    # a table of more than ten columns, or whose columns need more than a portrait page's width, is set smaller, on a
    # landscape page (PrintLayout): on a portrait page its columns were cut off at the right edge, its rows ran past
    # the foot of the page, or its numbers ran into each other (a column of 37-letter sweep names beside seven more)
    wide = n_cols > WIDE_COLUMNS or sum(widths) > PORTRAIT_LETTERS
    size = (r"\scriptsize" if wide else r"\footnotesize") + r"\setlength{\tabcolsep}{2pt}"
    return nodes.container("", nodes.raw("", r"\begingroup" + size, format="latex"),
                           nodes.table("", group, classes=["colwidths-given"]),
                           nodes.raw("", r"\endgroup", format="latex"),
                           classes=["output-table"] + (["wide-table"] if wide else []))


def _fold_index_names(head: list) -> bool:
    """pandas writes a named index as a header row of its own, the index's names over empty cells, under the column
    names' row, whose cells above the index are empty: put the names into those empty cells (one header row, as the
    HTML reads it). Returns whether it did, so that the caller drops that row."""
    if len(head) < 2:
        return False
    above, names = (row.find_all(["th", "td"], recursive=False) for row in head[-2:])
    texts = [cell.get_text(strip=True) for cell in names]
    k = next((i for i, text in enumerate(texts) if not text), len(texts))  # the index's names come first
    if k == 0 or any(texts[k:]) or len(above) < k or any(cell.get_text(strip=True) for cell in above[:k]):
        return False
    if any(cell.get("colspan") or cell.get("rowspan") for cell in above[:k] + names[:k]):
        return False
    for cell, text in zip(above[:k], texts):
        cell.string = text
    return True


def _column_widths(cells: list[tuple[str, int]], n_cols: int, word_cap: int | None = None) -> list[int]:
    """Relative column widths from the (text, column) of a table's one-column cells (LaTeX wraps each column's cells):
    wide enough for the longest word that cannot break ("131,072", a file name; Chinese breaks between any two
    characters), counted up to ``word_cap`` letters if given, and more for long text, up to a cap."""
    unbreakable, lengths = [1] * n_cols, [1] * n_cols
    for text, c in cells:
        words = UNBREAKABLE.findall(text) or [""]
        longest = max(len(word) for word in words)
        unbreakable[c] = max(unbreakable[c], min(longest, word_cap) if word_cap else longest)
        lengths[c] = max(lengths[c], len(text) + len(CJK_CHARACTER.findall(text)))  # a Chinese character: 2 wide
    # a column is at least 8 wide (a narrower one left no room for a word of three digits beside wide ones)
    return [max(word + 2, round(0.6 * min(length, 24)), 8) for word, length in zip(unbreakable, lengths)]


def _size_table(table: nodes.table) -> None:
    """A Markdown table in print: column widths, a longtable (outside a box), smaller type. Without widths Sphinx set a
    table of more than 30 rows as a longtable of ``l`` columns, which never wrap (the claims appendix's tables ran off
    the page), and a shorter one as a tabulary, which gave a column of identifiers ("N000-01") less than its width
    beside columns of Chinese text, and which cannot break across pages."""
    group = table.next_node(nodes.tgroup)
    specs = [child for child in group.children if isinstance(child, nodes.colspec)]
    rows = list(table.findall(nodes.row))
    if "colwidths-given" in table["classes"] or not specs:
        return
    cells = []
    for row in rows:
        c = 0
        for entry in row.children:
            if not entry.get("morecols"):
                cells.append((entry.astext(), c))
            c += 1 + entry.get("morecols", 0)
    # a formula or a line of code in a cell of prose counts as at most 20 letters: it may overrun its column a little
    # rather than take the width of the columns of text beside it
    for spec, width in zip(specs, _column_widths(cells, len(specs), word_cap=20)):
        spec["colwidth"] = width
    table["classes"].append("colwidths-given")
    if not _in_a_box(table):
        table["classes"].append("longtable")  # it may break across pages between rows (a tabular cannot break)
    # set smaller, as the pandas tables are: in the body's size a row of the claims appendix (a quotation, a verdict
    # and a comment) grew taller than what was left of its page and ran over the footer (a row cannot break)
    parent, index = table.parent, table.parent.index(table)
    parent.insert(index + 1, nodes.raw("", r"\endgroup", format="latex"))
    parent.insert(index, nodes.raw("", r"\begingroup\footnotesize\setlength{\tabcolsep}{3pt}", format="latex"))


class PrintLayout(SphinxPostTransform):
    """For the LaTeX builder only: Markdown tables given column widths, HTML tables as tables, hidden cell inputs
    removed, nested admonitions and solutions unboxed, citations in captions unlinked."""

    default_priority = 900  # after the citations are resolved (sphinxcontrib-bibtex) and glue pasted
    builders = ("latex",)

    def run(self, **kwargs) -> None:
        for table in list(self.document.findall(nodes.table)):
            _size_table(table)
        for raw in list(self.document.findall(nodes.raw)):
            if "html" not in raw.get("format", "").split() or "text_html" not in raw["classes"]:
                continue
            table = html_table(raw.astext())
            if table is None:
                note = ("An interactive figure: it runs in the web edition of this page." if not self.config.language
                        or self.config.language.startswith("en") else "交互式图表：请在本页的网页版中查看。")
                table = nodes.paragraph(note, "", nodes.emphasis(note, note))
            raw.replace_self(table)
            if isinstance(table, nodes.container):
                _place_table(table)
        for cell in list(self.document.findall(nodes.container)):
            if "tag_hide-input" in cell["classes"]:
                for child in [c for c in cell.children if "cell_input" in c.get("classes", [])]:
                    cell.remove(child)
        for block in list(self.document.findall(nodes.container)):
            if "wide-table" in block["classes"]:
                _landscape(block)
        # unboxed: a box inside a box, a solution (a dropdown on the web) and an exercise that holds one, whose code
        # can be longer than a page: such a box did not break across pages and ran over the footer
        for inner in [box for box in self.document.findall(nodes.Admonition) if unboxed_in_print(box)]:
            block = nodes.container(classes=["unboxed-admonition"])
            for child in inner.children:
                if isinstance(child, nodes.title):
                    block += nodes.rubric("", "", *child.children)
                else:
                    block += child
            inner.replace_self(block)
        for citation in list(self.document.findall(nodes.citation)):
            _breakable_paths(citation)
        for math in list(self.document.findall(nodes.math)):
            _keep_space_before_title_math(math)
        for caption in list(self.document.findall(nodes.caption)):
            for link in list(caption.findall(nodes.reference)):
                link.replace_self(nodes.inline("", "", *link.children))
            for raw in caption.findall(lambda node: node.tagname == "raw_latex"):
                raw.rawsource = HYPERLINK.sub("{", raw.rawsource)  # sphinxcontrib-bibtex's citations, written as is


def _bold_title(node: nodes.Node) -> bool:
    """A paragraph that is one bold phrase (``**Runs**``), alone or in containers that hold nothing else."""
    while isinstance(node, nodes.container) and len(node.children) == 1:
        node = node.children[0]
    if not isinstance(node, nodes.paragraph):
        return False
    printed = [child for child in node.children if not (isinstance(child, nodes.Text) and not child.strip())]
    return len(printed) == 1 and isinstance(printed[0], nodes.strong)


def _keep_space_before_title_math(math: nodes.math) -> None:
    """A space between a Chinese character and math in a title, as a no-break space: Sphinx writes a title's math as
    ``\\protect\\(...\\protect\\)``, and xeCJK drops a space that a Chinese character and ``\\protect`` enclose
    ("一次融合投影就是h 次逐头投影"); it keeps ``~``."""
    parent = math.parent
    if not isinstance(parent, (nodes.title, nodes.rubric)):
        return
    index = parent.index(math)
    before = parent[index - 1] if index else None
    if isinstance(before, nodes.Text) and CJK_CHARACTER.search(before.astext()[-2:-1] or "") and \
            before.astext().endswith(" "):
        parent[index - 1] = nodes.Text(before.astext()[:-1] + "\u00a0")


def _place_table(block: nodes.container) -> None:
    """A pandas table in print: a longtable (it breaks across pages) unless it sits in a box. Pasted by
    ``{glue:figure}``, it was a figure float, which cannot break across pages (a table longer than a page lost its
    last rows): it takes the figure's place and labels, its caption a paragraph after it. A wide one (``wide-table``)
    gets landscape pages later (:func:`_landscape`)."""
    table = block.next_node(nodes.table)
    figure = next((a for a in _ancestors(block) if isinstance(a, nodes.figure)), None)
    if not _in_a_box(figure or block):
        table["classes"].append("longtable")  # not in a box: it may break across pages
    if figure is not None:  # the caption follows the table as a paragraph (in longtable's \caption it broke LaTeX)
        caption = figure.next_node(nodes.caption)
        after = [nodes.paragraph(caption.rawsource, "", *caption.children)] if caption is not None else []
        table["ids"] += figure["ids"]
        table["names"] += figure["names"]
        legend = figure.next_node(nodes.legend)
        figure.replace_self([block, *after, *(legend.children if legend is not None else [])])


def _landscape(block: nodes.container) -> None:
    """A wide table on landscape pages (pdflscape), with the heading or bold title that introduces it: a landscape page
    starts a new page, and a section's heading or a table's bold title right before the table was left alone at the
    foot of the portrait page before it. Call it once hidden code is gone (what counts as right before is what
    prints)."""
    top = block  # the outermost container whose first printed thing is the table (LaTeX environments, all of them)
    while True:
        parent = top.parent
        before = [node for node in parent.children[:parent.index(top)] if node.astext().strip()]
        if before or isinstance(parent, (nodes.section, nodes.document)) or parent.parent is None:
            break
        top = parent
    start = top
    if before and isinstance(before[-1], nodes.title) and isinstance(parent, nodes.section):
        start = parent  # the section's first content: its heading goes on the landscape page too (not an environment)
    elif before and _bold_title(before[-1]):
        start = before[-1]  # a bold title (a cell's Markdown output, say)
    start.parent.insert(start.parent.index(start), nodes.raw("", r"\begin{landscape}", format="latex"))
    # after the outermost container, so that the environments nest
    top.parent.insert(top.parent.index(top) + 1, nodes.raw("", r"\end{landscape}", format="latex"))


PATH_BREAK = re.compile(r"(?<=[/_])(?=\w)")  # after a slash or an underscore inside a path or a name


def _breakable_paths(citation: nodes.citation) -> None:
    """A bibliography entry's file paths (``src/transformers/models/llama/convert_llama_weights_to_hf.py``) may break
    after a slash or an underscore: as one word, such a path ran off the page. Links are left as they are."""
    for text in list(citation.findall(nodes.Text)):
        if any(isinstance(a, nodes.reference) for a in _ancestors(text)) or not PATH_BREAK.search(str(text)):
            continue
        pieces = PATH_BREAK.split(str(text))
        parts = [nodes.Text(pieces[0])]
        for piece in pieces[1:]:
            parts += [nodes.raw("", r"\allowbreak{}", format="latex"), nodes.Text(piece)]
        text.parent.replace(text, parts)


def unboxed_in_print(box: nodes.Admonition) -> bool:
    """Whether a box is printed as a titled block instead: a box inside a box, a solution (a dropdown on the web) and
    an exercise that holds one (a box does not break across pages, and a long solution's code ran over the footer)."""
    return (_inside_admonition(box) or "dropdown" in box["classes"]
            or any("dropdown" in inner["classes"] for inner in box.findall(nodes.Admonition) if inner is not box))


def _ancestors(node: nodes.Node):
    parent = node.parent
    while parent is not None:
        yield parent
        parent = parent.parent


def _in_a_box(node: nodes.Node) -> bool:
    """Inside an admonition or a table, where a longtable cannot go."""
    return any(isinstance(a, (nodes.Admonition, nodes.table)) for a in _ancestors(node))


def _inside_admonition(node: nodes.Node) -> bool:
    return any(isinstance(a, nodes.Admonition) for a in _ancestors(node))


def _proof_titles(app: Sphinx) -> None:
    """sphinx-proof writes a LaTeX box's title in English ("Definition 1") where its HTML translates it (定义 1): the
    LaTeX writer's departure is wrapped to translate it with sphinx-proof's own catalog."""
    from sphinx_proof import nodes as proof

    def translated(depart):
        def depart_translated(self, node):
            depart(self, node)
            title = node.attributes.get("realtype", "").title()
            for i in range(len(self.body) - 1, -1, -1):
                if self.body[i] == title or self.body[i].startswith(title + " "):
                    self.body[i] = proof._(title) + self.body[i][len(title):]
                    break
        return depart_translated

    for node_type in proof.NODE_TYPES.values():
        app.add_node(node_type, override=True, latex=(proof.visit_enumerable_node,
                                                      translated(proof.depart_enumerable_node)))
    app.add_node(proof.unenumerable_node, override=True,
                 latex=(proof.visit_unenumerable_node, translated(proof.depart_unenumerable_node)))


def _parts(app: Sphinx, doctree) -> None:
    """The book's parts in print: before each captioned table of contents of the root page (a part of _toc.yml), an
    unnumbered part page with its caption, already translated in the Chinese edition, and a line in the contents;
    before the appendices, ``\\appendix`` (their chapters lettered A, B, ...). Sphinx's LaTeX builder drops the
    captions when it inlines the pages. The root page's own sections come first, as unnumbered chapters."""
    from sphinx import addnodes
    from sphinx.util.texescape import escape

    if app.builder.format != "latex" or app.env.docname != app.config.root_doc:
        return
    # the root page's own sections are front matter: unnumbered (the first part's first chapter is chapter 1), still
    # in the contents
    front = doctree.next_node(nodes.section)
    if front is not None:
        # its first pages' running heads: the book's title (they carried the contents' name, or part I's)
        title = escape(app.config.latex_documents[0][2]) if app.config.latex_documents else ""
        front.insert(1, nodes.raw("", r"\edef\mhasecnumdepth{\the\value{secnumdepth}}\setcounter{secnumdepth}{-1}"
                                      + (r"\markboth{" + title + "}{" + title + "}" if title else ""), format="latex"))
    tocs = list(doctree.findall(addnodes.toctree))
    if front is not None and tocs:  # numbered again from the first chapter the contents hold
        tocs[0].parent.insert(tocs[0].parent.index(tocs[0]),
                              nodes.raw("", r"\setcounter{secnumdepth}{\mhasecnumdepth}", format="latex"))
    for toc in tocs:
        caption = toc.get("caption")
        if not caption:
            continue
        # the appendices: lettered (their equations, figures and tables keep the book-wide numbers the HTML shows:
        # numfig_secnum_depth 0)
        latex = (r"\appendix" if any(doc.startswith("book/appendix/") for _, doc in toc["entries"]) else "")
        title = escape(caption)
        # the contents line is written on the part's own page (written after \part*, it named the next page)
        latex += r"\cleardoublepage\phantomsection\addcontentsline{toc}{part}{" + title + r"}\part*{" + title + "}"
        toc.parent.insert(toc.parent.index(toc), nodes.raw("", latex, format="latex"))


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", _configure)
    app.connect("doctree-read", _parts)
    _proof_titles(app)
    app.add_post_transform(PrintLayout)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
