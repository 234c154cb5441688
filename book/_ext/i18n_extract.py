"""For ``tools/i18n.py extract`` only, which reads the pages without executing them: a ``{glue:figure}`` whose value
is missing still yields its caption, so that the caption reaches the page's catalog. (myst-nb's directive drops the
whole figure, caption included, when the glued value is missing; executing the pages instead would also put every
glued Markdown value into the catalogs.) The figure holds no output; the build never loads this extension."""

from __future__ import annotations

from docutils import nodes
from myst_nb.ext.glue.directives import PasteFigureDirective
from myst_nb.ext.glue.utils import RetrievalError, retrieve_glue_data
from sphinx.application import Sphinx


class CaptionOnlyFigure(PasteFigureDirective):
    def run(self):
        try:
            retrieve_glue_data(self.document, self.arguments[0])
        except RetrievalError:
            figure = nodes.figure()
            parsed = nodes.Element()
            self.state.nested_parse(self.content, self.content_offset, parsed)
            if parsed.children and isinstance(parsed[0], nodes.paragraph):
                first = parsed[0]
                caption = nodes.caption(first.rawsource, "", *first.children)
                caption.source, caption.line = first.source, first.line
                figure += caption
                if len(parsed) > 1:
                    figure += nodes.legend("", *parsed[1:])
            self.add_name(figure)
            return [figure]
        return super().run()


def setup(app: Sphinx) -> dict:
    app.add_directive_to_domain("glue", "figure", CaptionOnlyFigure, override=True)
    return {"parallel_read_safe": True}
