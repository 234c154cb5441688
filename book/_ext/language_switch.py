"""A link on every page to the same page in the book's other edition (English at the root, Chinese under ``zh/``).

The English build writes ``_build/html/<page>.html``; the Chinese build (``language = "zh_CN"``) writes
``_build/html/zh/<page>.html``. Each page gets, above its content, a small bar with a link to its twin, as a relative
URL, so the site works from any static host and from ``file://``. The Chinese pages declare ``lang="zh-CN"``
(Sphinx sets it from ``language``).
"""

from __future__ import annotations

from html import escape

from sphinx.application import Sphinx

CHINESE = "zh_CN"
LABELS = {"en": ("中文", "zh-CN", "阅读本页的中文版"), CHINESE: ("English", "en", "Read this page in English")}


def _is_chinese(app: Sphinx) -> bool:
    return (app.config.language or "en") == CHINESE


def twin_url(pagename: str, chinese: bool) -> str:
    """The relative URL of ``pagename``'s twin in the other edition."""
    depth = pagename.count("/")
    if chinese:  # zh/<page>.html -> <page>.html: one level more to climb
        return "../" * (depth + 1) + pagename + ".html"
    return "../" * depth + "zh/" + pagename + ".html"


def _add_switch(app: Sphinx, pagename, templatename, context, doctree) -> None:
    if doctree is None or "body" not in context:
        return
    chinese = _is_chinese(app)
    label, hreflang, title = LABELS[CHINESE if chinese else "en"]
    link = (f'<div class="language-switch" style="text-align: right; font-size: 0.9em; margin-bottom: 0.5em;">'
            f'<a class="language-switch-link" href="{escape(twin_url(pagename, chinese))}" hreflang="{hreflang}" '
            f'lang="{hreflang}" title="{escape(title)}">{escape(label)}</a></div>')
    context["body"] = link + context["body"]


def setup(app: Sphinx) -> dict:
    app.connect("html-page-context", _add_switch)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
