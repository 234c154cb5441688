"""Heading anchors in the Chinese edition: the same ``#slug`` as the English page.

MyST gives every heading an anchor from its text (``myst_heading_anchors``), and chapters link to them
(``[text](../part1/multi_head.md#the-shapes-at-every-step)``). In a translated build the headings are Chinese, and
each translated heading is parsed on its own, which replaces the page's table of slugs with the Chinese ones: the
English links would find nothing. After the translation has been applied, this extension puts the English slugs
back (every section keeps the ``slug`` MyST gave it when it parsed the English source) and makes each one an id of
its section, so a link written in English resolves in both editions.

It also translates the table of contents' part captions (``_toc.yml``'s ``caption:``), which sphinx-external-toc
adds after the translation step has run; their translations are in the catalogs like any other message. Nothing
happens in the English build.
"""

from __future__ import annotations

from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.util.nodes import clean_astext


def _catalog_messages(app: Sphinx) -> dict:
    """Every translated message of the book's catalogs (msgid -> msgstr), read once."""
    if not hasattr(app.env, "_i18n_messages"):
        from babel.messages.pofile import read_po

        messages = {}
        for locale_dir in app.config.locale_dirs:
            for path in sorted(Path(app.confdir, locale_dir, app.config.language).rglob("*.po")):
                with open(path, "rb") as f:
                    messages.update({m.id: m.string for m in read_po(f) if m.id and m.string and not m.fuzzy})
        app.env._i18n_messages = messages
    return app.env._i18n_messages


def _restore(app: Sphinx, doctree: nodes.document) -> None:
    if not app.config.language or app.config.language.startswith("en"):
        return
    for toctree in doctree.findall(addnodes.toctree):
        caption = toctree.get("caption")
        if caption:
            toctree["caption"] = _catalog_messages(app).get(caption, caption)
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
