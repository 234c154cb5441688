"""A table pasted with ``{glue:figure}`` is numbered and captioned as a table ("Table 3", "表 3"), not as a figure.

myst-nb pastes a glued pandas table into a figure node, so Sphinx counted it among the figures and captioned it
"Fig. 12" ("图 12" in the Chinese edition). When a page is read, each such figure whose pasted output is an HTML table
becomes a ``TableFigure``, a figure node that Sphinx's numbering counts as a table (``add_enumerable_node`` with the
type ``table``): it takes the tables' numbers and their caption format, and is drawn as a figure. In print,
``latex_edition`` replaces it with a longtable and its caption.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.application import Sphinx


class TableFigure(nodes.figure):
    """A figure node whose content is a pasted table: numbered as a table."""


def _is_table(figure: nodes.figure) -> bool:
    return any(raw.get("format") == "html" and "<table" in raw.astext() for raw in figure.findall(nodes.raw))


def _tables_as_tables(app: Sphinx, doctree: nodes.document) -> None:
    for figure in list(doctree.findall(nodes.figure)):
        if type(figure) is nodes.figure and _is_table(figure):
            table = TableFigure(figure.rawsource, *figure.children, **figure.attributes)
            figure.replace_self(table)


def _visit(self, node):
    self.visit_figure(node)


def _depart(self, node):
    self.depart_figure(node)


def setup(app: Sphinx) -> dict:
    app.add_enumerable_node(TableFigure, "table", html=(_visit, _depart), latex=(_visit, _depart),
                            text=(_visit, _depart))
    app.connect("doctree-read", _tables_as_tables)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
