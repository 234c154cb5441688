"""No space between a Chinese word and a cross-reference whose text is Chinese.

A catalog writes a role apart from the words around it (``由 {eq}`bwd-attn-ds`，``, ``见 {doc}`mqa_gqa` 的``), and
the space stays on the page once the reference is resolved to its Chinese text: "由 式 (76)" should read "由式 (76)".
A space (or a line break) is dropped where a Chinese character and a reference's own text meet with a Chinese
character, and kept where either side is Latin ("见 MQA 与 GQA", "RoPE 的"), as Chinese typesetting spaces Latin
words. Runs in the Chinese edition only, on the resolved doctree (HTML and LaTeX alike).
"""

from __future__ import annotations

import re

from docutils import nodes
from sphinx.application import Sphinx

from latex_edition import CJK_RANGES as CJK  # one home for the ranges

ENDS_CJK = re.compile(f"[{CJK}]$")
STARTS_CJK = re.compile(f"^[{CJK}]")
SPACE_THEN_CJK = re.compile(f"^[ \t\n]+(?=[{CJK}])")
CJK_THEN_SPACE = re.compile(f"(?<=[{CJK}])[ \t\n]+$")


def _merge_texts(element: nodes.Element) -> None:
    """Join each run of adjacent text children of ``element`` into one text."""
    i = 0
    while i + 1 < len(element.children):
        first, second = element.children[i], element.children[i + 1]
        if isinstance(first, nodes.Text) and isinstance(second, nodes.Text):
            element[i] = nodes.Text(str(first) + str(second))  # by position: texts compare equal by their strings
            del element[i + 1]
        else:
            i += 1


def tighten(paragraph: nodes.Element) -> int:
    """Drop the spaces between each cross-reference of ``paragraph`` (its direct children) and a Chinese neighbour
    where the reference's own text meets it with a Chinese character; return how many were dropped."""
    _merge_texts(paragraph)  # a translated paragraph may hold "和" and " " as two texts
    dropped = 0
    children = paragraph.children
    for i, child in enumerate(children):
        if not isinstance(child, nodes.reference):
            continue
        text = child.astext()
        if i + 1 < len(children) and isinstance(children[i + 1], nodes.Text) and ENDS_CJK.search(text):
            after = str(children[i + 1])
            tightened = SPACE_THEN_CJK.sub("", after)
            if tightened != after:
                paragraph[i + 1] = nodes.Text(tightened)  # by position (replace() finds the first equal text)
                dropped += 1
        if i > 0 and isinstance(children[i - 1], nodes.Text) and STARTS_CJK.search(text):
            before = str(children[i - 1])
            tightened = CJK_THEN_SPACE.sub("", before)
            if tightened != before:
                paragraph[i - 1] = nodes.Text(tightened)
                dropped += 1
    return dropped


def _tighten_document(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    if not (app.config.language or "").startswith("zh"):
        return
    for element in list(doctree.findall(nodes.TextElement)):
        if any(isinstance(child, nodes.reference) for child in element.children):
            tighten(element)


def setup(app: Sphinx) -> dict:
    app.connect("doctree-resolved", _tighten_document)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
