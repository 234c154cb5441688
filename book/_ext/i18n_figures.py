"""The Chinese edition's figures: each matplotlib figure is drawn a second time, with its words in Chinese, when the
English build executes the page; the Chinese build shows that drawing.

Both sides live here.

- In the kernel (``install``, run at kernel start by an IPython startup file, ``write_startup``): a display
  formatter for the MIME type ``MIME`` draws every figure the page shows or glues once more, its texts that have
  words (titles, axis labels, legends, annotations, categorical tick labels) replaced by their translations in
  ``glue.po`` (``i18n_glue.translate``: numbers carried over), with Noto Sans CJK SC as the fallback font. Every
  number the figure draws, and the data, stay the English drawing's. The output's metadata lists the figure's texts
  (``tools/i18n.py update`` puts them in glue.po), the Chinese each was drawn with, and those with no translation.
  A drawing is made when its page executes: after glue.po changes, ``tools/i18n.py refresh-figures`` (run by
  ``make book``) sends the pages whose drawings no longer match glue.po back to execution.
- In the Chinese build (``setup``, a Sphinx extension): that MIME type comes first, and myst-nb renders it as the
  PNG it is. A figure drawn with a text that had no translation is a build warning (an error with ``-W``), and
  ``tools/i18n.py build`` stops on a figure with no Chinese drawing (a page executed without the startup file).
  The English build never selects it.

``make book`` and ``make test`` set ``IPYTHONDIR`` to ``_build/ipython`` and write the startup file there (the
root conftest.py does the same for a bare ``pytest``), so the kernels that execute the pages load it.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
import sys
import warnings
from pathlib import Path

MIME = "application/vnd.mha.zh-figure+png"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GLUE_PO = ROOT / "book" / "locales" / "zh_CN" / "LC_MESSAGES" / "glue.po"
CJK_FONT = "Noto Sans CJK SC"
IPYTHONDIR = ROOT / "_build" / "ipython"
STARTUP = f"""# Written by book/_ext/i18n_figures.py: the Chinese drawing of every figure (the book's Chinese edition).
import sys
sys.path.insert(0, {str(HERE)!r})
import i18n_figures
i18n_figures.install(get_ipython())
"""


# ------------------------------------------------------------------------------------------------ kernel side
def translations() -> dict:
    """glue.po's translations the drawings use: ``{English: Chinese}`` (entries keyed to one glued value left out)."""
    from babel.messages.pofile import read_po

    if not GLUE_PO.exists():
        return {}
    with open(GLUE_PO, "rb") as f:
        return {m.id: m.string for m in read_po(f) if m.id and m.string and not m.context}


def _worded(text: str) -> bool:
    from i18n_glue import has_words

    return has_words(text, markdown=True)  # words outside $math$: "$d_k$" alone is drawn as it is


def chinese_drawing(fig, png_formatter, translations: dict):
    """(base64 PNG, metadata) of ``fig`` drawn with its worded texts translated (a figure with none is drawn as it
    is: every figure has its Chinese drawing, so that a missing one means a kernel without the formatter). The figure
    is left as it was."""
    import matplotlib
    from matplotlib.text import Text
    from matplotlib.ticker import FixedFormatter, FixedLocator
    from matplotlib.transforms import BboxTransformFrom

    from i18n_glue import translate

    fig.canvas.draw()  # tick labels exist only once drawn
    # A legend placed "best" would move to dodge the longer or shorter Chinese texts: it stays where English put it
    # (measured now, before any text changes: measuring places a "best" legend again)
    legends = [(legend, legend._loc) for legend in _legends(fig) if legend._loc == 0]
    for legend, _ in legends:  # its lower-left corner, as a fraction of the box it is anchored to
        corner = legend.get_window_extent()
        legend._loc = tuple(BboxTransformFrom(legend.get_bbox_to_anchor()).transform((corner.x0, corner.y0)))
    texts, missing, drawn, swapped, axes_saved = [], [], {}, [], []

    def chinese(english: str) -> str:
        if english not in texts:
            texts.append(english)
        found = translate(english, translations)
        if found is None:
            if english not in missing:
                missing.append(english)
            return english
        drawn[english] = found
        return found

    for ax in fig.axes:  # tick labels: a fixed formatter for this drawing (drawing recomputes them)
        for axis in (ax.xaxis, ax.yaxis):
            labels = [label.get_text() for label in axis.get_ticklabels()]
            if any(_worded(label) for label in labels):
                axes_saved.append((axis, axis.get_major_locator(), axis.get_major_formatter()))
                axis.set_major_locator(FixedLocator(axis.get_ticklocs()))
                axis.set_major_formatter(FixedFormatter([chinese(lab) if _worded(lab) else lab for lab in labels]))
    tick_labels = {id(label) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) for label in axis.get_ticklabels()}
    for text in fig.findobj(Text):
        english = text.get_text()
        if id(text) not in tick_labels and text.get_visible() and _worded(english):
            swapped.append((text, english))
            text.set_text(chinese(english))
    # Font fallback goes along a text's own list of families ("sans-serif" alone resolves to its first font). A text
    # with $math$ is set by mathtext, whose plain parts take one font only: the CJK font first there (its Latin
    # letters and digits are fine); the math keeps mathtext's own fonts.
    families = [(text, text.get_fontfamily()) for text in fig.findobj(Text)]
    for text, family in families:
        text.set_fontfamily([CJK_FONT, *family] if "$" in text.get_text() else [*family, CJK_FONT])
    mathtext_log, boxes = logging.getLogger("matplotlib.mathtext"), _Collect()
    try:
        mathtext_log.addHandler(boxes)
        with matplotlib.rc_context({"font.family": [*matplotlib.rcParams["font.family"], CJK_FONT]}), \
                warnings.catch_warnings():
            # a glyph no font has would be drawn as a box: an error, not a warning lost in the output (Agg warns;
            # mathtext logs)
            warnings.filterwarnings("error", message=r"Glyph .* missing from font")
            data = png_formatter(fig)
        if boxes.messages:
            raise ValueError(f"the Chinese drawing of a figure lacks glyphs: {boxes.messages[:3]}")
    finally:
        mathtext_log.removeHandler(boxes)
        _restore(swapped, axes_saved, families)
        for legend, loc in legends:
            legend._loc = loc
    if data is None:
        return None
    if isinstance(data, bytes):
        data = base64.b64encode(data).decode("ascii")
    return data, {"texts": texts, "untranslated": missing, "drawn": drawn}


class _Collect(logging.Handler):
    """The messages of mathtext's "does not have a glyph" warnings while a drawing is made."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record) -> None:
        if "does not have a glyph" in record.getMessage():
            self.messages.append(record.getMessage())


def _legends(fig) -> list:
    return [legend for legend in [*(ax.get_legend() for ax in fig.axes), *fig.legends] if legend is not None]


def _restore(swapped, axes_saved, families) -> None:
    for text, english in swapped:
        text.set_text(english)
    for text, family in families:
        text.set_fontfamily(family)
    for axis, locator, formatter in axes_saved:
        axis.set_major_locator(locator)
        axis.set_major_formatter(formatter)


def install(shell) -> None:
    """Register the Chinese drawing of matplotlib figures as a display format of this IPython shell (nothing where
    the book's tools are not installed: Sphinx, babel; then tools/i18n.py build says which pages lack the drawing)."""
    if shell is None:
        return
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    try:
        import i18n_glue  # noqa: F401 - translate and has_words, with Sphinx
        from IPython.core.formatters import BaseFormatter
        from traitlets import Unicode

        catalog = translations()
    except ImportError:
        return
    formatters = shell.display_formatter.formatters

    class ChineseFigureFormatter(BaseFormatter):
        """Not by type registration: matplotlib's inline backend removes every formatter's Figure printer when it
        is first configured (``select_figure_formats``), after this startup file ran. An error here is the cell's
        error, not a warning lost in the output."""

        format_type = Unicode(MIME)
        _return_type = (str, bytes)

        def __call__(self, obj):
            figure = sys.modules.get("matplotlib.figure")
            if not self.enabled or figure is None or not isinstance(obj, figure.Figure):
                return None
            return chinese_drawing(obj, formatters["image/png"], catalog)

    formatters[MIME] = ChineseFigureFormatter(parent=shell.display_formatter)
    if MIME not in shell.display_formatter.active_types:  # the formats computed for a display (set at start)
        shell.display_formatter.active_types.append(MIME)


def write_startup(ipython_dir: Path = IPYTHONDIR) -> Path:
    """The IPython startup file that installs the formatter, under ``ipython_dir``; its path."""
    startup = Path(ipython_dir) / "profile_default" / "startup" / "50-mha-chinese-figures.py"
    startup.parent.mkdir(parents=True, exist_ok=True)
    if not startup.exists() or startup.read_text() != STARTUP:
        startup.write_text(STARTUP)
    return startup


def figure_output(output: dict) -> dict | None:
    """For a notebook output that shows a matplotlib figure (its text/plain is "<Figure size ...>"), plain or glued:
    ``{"chinese": whether it has the Chinese drawing, "texts": its worded texts, "untranslated": those glue.po
    lacked, "drawn": {English: the Chinese drawn}}``; None for any other output."""
    data, metadata = output.get("data") or {}, output.get("metadata") or {}
    for prefix in ("", "application/papermill.record/"):
        plain = data.get(prefix + "text/plain")
        plain = "".join(plain) if isinstance(plain, list) else plain
        if plain and plain.startswith("<Figure size"):
            found = metadata.get(prefix + MIME) or {}
            return {"chinese": prefix + MIME in data, "texts": found.get("texts", []),
                    "untranslated": found.get("untranslated", []), "drawn": found.get("drawn", {})}
    return None


# ------------------------------------------------------------------------------------------------ build side
def _configure(app, config) -> None:
    if config.language and not config.language.startswith("en"):
        config.nb_mime_priority_overrides = [*config.nb_mime_priority_overrides, ("html", MIME, 1),
                                             ("latex", MIME, 1)]


def _install_renderer(app) -> None:
    if not app.config.language or app.config.language.startswith("en"):
        return
    from myst_nb.core.render import NbElementRenderer
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    if getattr(NbElementRenderer, "_mha_chinese_figures", False):
        return
    block, inline = NbElementRenderer.render_mime_type, NbElementRenderer.render_mime_type_inline

    def chinese(render):
        def render_mime(self, data):
            if data.mime_type == MIME:
                missing = (data.output_metadata.get(MIME) or {}).get("untranslated") or []
                if missing:
                    logger.warning(f"figure texts with no translation in glue.po: {missing}; run python "
                                   "tools/i18n.py update and translate them", location=(self.current_node.source,
                                                                                       data.line))
                return render(self, dataclasses.replace(data, mime_type="image/png"))
            return render(self, data)
        return render_mime

    NbElementRenderer.render_mime_type = chinese(block)
    NbElementRenderer.render_mime_type_inline = chinese(inline)
    NbElementRenderer._mha_chinese_figures = True


def setup(app) -> dict:
    app.connect("config-inited", _configure)
    app.connect("builder-inited", _install_renderer)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":  # python book/_ext/i18n_figures.py [IPYTHONDIR]: write the startup file
    print(write_startup(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(os.environ.get("IPYTHONDIR", IPYTHONDIR))))
