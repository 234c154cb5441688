"""Heading anchors in the Chinese edition: the same ``#slug`` as the English page.

MyST gives every heading an anchor from its text (``myst_heading_anchors``), and chapters link to them
(``[text](../part1/multi_head.md#the-shapes-at-every-step)``). In a translated build the headings are Chinese, and
each translated heading is parsed on its own, which replaces the page's table of slugs with the Chinese ones: the
English links would find nothing. After the translation has been applied, this extension puts the English slugs
back (every section keeps the ``slug`` MyST gave it when it parsed the English source) and makes each one an id of
its section, so a link written in English resolves in both editions. Nothing happens in the English build.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.nodes import clean_astext


def _restore(app: Sphinx, doctree: nodes.document) -> None:
    if not app.config.language or app.config.language.startswith("en"):
        return
    slugs = {}
    for section in doctree.findall(nodes.section):
        slug = section.get("slug")
        if not slug:
            continue
        if slug not in section["ids"]:
            section["ids"].append(slug)
        title = section[0] if section.children and isinstance(section[0], nodes.title) else section
        slugs[slug] = (section.line, slug, clean_astext(title))
    if slugs:
        app.env.metadata[app.env.docname]["myst_slugs"] = slugs


def setup(app: Sphinx) -> dict:
    app.connect("doctree-read", _restore)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
