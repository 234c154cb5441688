"""A link on every page to the same page in the book's other edition (English at the root, Chinese under ``zh/``).

The English build writes ``_build/html/<page>.html``; the Chinese build (``language = "zh_CN"``) writes
``_build/html/zh/<page>.html``. Each page gets, above its content, a small bar with a link to its twin, as a relative
URL, so the site works from any static host and from ``file://``. The Chinese pages declare ``lang="zh-CN"``
(Sphinx sets it from ``language``).

The themes' own Chinese for a few interface strings is Taiwanese usage ("列印成 PDF"); :data:`THEME_ZH` gives the
Chinese edition the mainland usage d2l-zh uses, ahead of the theme's catalog (the rest of the theme's strings keep
its translations). The search box's placeholder and the toggle hints are configuration values, set by
``tools/i18n.py build``. The Chinese pages also load ``book/_static/zh.css``: a Chinese font stack, emphasis set
upright with emphasis dots instead of faux italics, and table columns that do not break Chinese one character per
line.
"""

from __future__ import annotations

import gettext
from html import escape
from pathlib import Path

from sphinx import locale
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


THEME_ZH = {"booktheme": {"Print to PDF": "打印为 PDF"}}
"""The Chinese edition's own words for theme strings: {message catalog: {English: Chinese}}."""


class _Overrides(gettext.NullTranslations):
    """A few messages of a catalog replaced; every other one goes to the catalog it wraps."""

    def __init__(self, table: dict, wrapped: gettext.NullTranslations | None):
        super().__init__()
        self._table = table
        if wrapped is not None:
            self.add_fallback(wrapped)

    def gettext(self, message: str) -> str:
        return self._table[message] if message in self._table else super().gettext(message)


STATIC = Path(__file__).resolve().parents[1] / "_static"
ZH_CSS = "zh.css"  # the Chinese edition's typesetting: a CJK font stack, upright emphasis, table column widths


def _override_theme_words(app: Sphinx) -> None:
    if not _is_chinese(app):
        return
    app.config.html_static_path = [*app.config.html_static_path, str(STATIC)]
    app.add_css_file(ZH_CSS)
    for catalog, table in THEME_ZH.items():  # after the themes registered their catalogs (builder-inited)
        key = ("general", catalog)
        locale.translators[key] = _Overrides(table, locale.translators.get(key))


def setup(app: Sphinx) -> dict:
    app.connect("html-page-context", _add_switch)
    app.connect("builder-inited", _override_theme_words)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
