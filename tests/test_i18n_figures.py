"""The Chinese drawing of the book's figures (book/_ext/i18n_figures.py): what is drawn is the figure with its worded
texts translated, every number left as it is, and the figure itself is left as it was."""

from __future__ import annotations

import io
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="Sphinx is not installed (the book extra brings it)")
matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.text import Text  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
import i18n_figures  # noqa: E402

TRANSLATIONS = {"one head": "一个头", "two heads": "两个头", "loss (nats)": "损失（奈特）", "at step 3": "第 3 步时"}


def _figure():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.bar(["one head", "two heads"], [1.25, 2.5], label="one head")
    ax.set_ylabel("loss (nats)")
    ax.set_title("at step 7")  # a translation of "at step 3" with the number carried over
    ax.set_xlabel("$d_k$")  # math alone: nothing to translate
    ax.legend()
    fig.suptitle("not in the catalog")
    return fig


def _drawn_texts(fig) -> list[str]:
    return sorted(t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text())


def test_the_drawing_shows_the_translations_and_the_figure_is_left_as_it_was():
    fig = _figure()
    fig.canvas.draw()
    before = _drawn_texts(fig)
    seen = {}

    def formatter(figure):  # stands in for IPython's PNG formatter: what would be drawn now
        figure.canvas.draw()
        seen["texts"] = _drawn_texts(figure)
        seen["families"] = {tuple(t.get_fontfamily()) for t in figure.findobj(Text)}
        return b"\x89PNG"

    data, metadata = i18n_figures.chinese_drawing(fig, formatter, TRANSLATIONS)
    assert data == "iVBORw=="  # base64 of what the formatter drew
    for chinese in ("一个头", "两个头", "损失（奈特）", "第 7 步时", "$d_k$", "not in the catalog"):
        assert chinese in seen["texts"], f"{chinese!r} not drawn; drawn: {seen['texts']}"
    assert not {"one head", "two heads", "loss (nats)", "at step 7"} & set(seen["texts"])
    assert all(i18n_figures.CJK_FONT in family for family in seen["families"])
    assert sorted(metadata["texts"]) == sorted({"one head", "two heads", "loss (nats)", "at step 7",
                                                "not in the catalog"})
    assert metadata["untranslated"] == ["not in the catalog"]
    fig.canvas.draw()
    assert _drawn_texts(fig) == before
    assert all(i18n_figures.CJK_FONT not in t.get_fontfamily() for t in fig.findobj(Text))
    plt.close(fig)


def test_the_chinese_drawing_finds_a_font_for_every_character():
    from matplotlib import font_manager

    if not any(f.name == i18n_figures.CJK_FONT for f in font_manager.fontManager.ttflist):
        pytest.skip(f"{i18n_figures.CJK_FONT} is not installed (Debian: fonts-noto-cjk)")
    fig = _figure()

    def png(figure):
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        return buffer.getvalue()

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Glyph .* missing from font")
        data, _ = i18n_figures.chinese_drawing(fig, png, TRANSLATIONS)
    assert data and data != png(fig)
    plt.close(fig)


def test_figure_output_reads_plain_and_glued_figures():
    mime = i18n_figures.MIME
    shown = {"data": {"text/plain": "<Figure size 300x200 with 1 Axes>", "image/png": "x", mime: "y"},
             "metadata": {mime: {"texts": ["one head"], "untranslated": []}}}
    prefix = "application/papermill.record/"
    glued = {"data": {prefix + "text/plain": "<Figure size 300x200 with 1 Axes>", prefix + "image/png": "x"},
             "metadata": {}}
    assert i18n_figures.figure_output(shown) == {"chinese": True, "texts": ["one head"], "untranslated": [],
                                                 "drawn": {}}
    assert i18n_figures.figure_output(glued) == {"chinese": False, "texts": [], "untranslated": [], "drawn": {}}
    assert i18n_figures.figure_output({"data": {"text/plain": "3"}}) is None


def test_mathtext_labels_and_best_legends():
    """A label mixing Chinese and $math$ is drawn with no missing glyph (mathtext's plain parts take the CJK font), and
    a legend placed "best" keeps the place the English drawing gave it."""
    from matplotlib import font_manager

    if not any(f.name == i18n_figures.CJK_FONT for f in font_manager.fontManager.ttflist):
        pytest.skip(f"{i18n_figures.CJK_FONT} is not installed (Debian: fonts-noto-cjk)")
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1], label="one head")
    ax.plot([0, 1], [1, 0], label="two heads")
    ax.set_xlabel("key $j$")
    ax.legend()
    fig.canvas.draw()
    english_corner = ax.get_legend().get_window_extent().p0
    seen = {}

    def png(figure):
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        seen["corner"] = figure.axes[0].get_legend().get_window_extent().p0
        return buffer.getvalue()

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Glyph .* missing from font")
        i18n_figures.chinese_drawing(fig, png, {**TRANSLATIONS, "key $j$": "键 $j$", "one head": "一个头很长很长很长"})
    assert abs(seen["corner"] - english_corner).max() < 2, (seen["corner"], english_corner)
    assert ax.get_legend()._loc == 0  # "best" again afterwards
    plt.close(fig)


def test_a_glyph_no_font_has_stops_the_drawing():
    """A character no font has would be drawn as a box: the drawing raises instead (mathtext logs it, Agg warns)."""
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.set_title("one head")
    ax.set_xlabel("key $j$")

    def png(figure):
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        return buffer.getvalue()

    with pytest.raises((ValueError, UserWarning), match="glyph|Glyph"):
        i18n_figures.chinese_drawing(fig, png, {"key $j$": "键 $j$ \U0010fffd", "one head": "一个头"})
    with pytest.raises((ValueError, UserWarning), match="glyph|Glyph"):
        i18n_figures.chinese_drawing(fig, png, {"key $j$": "键 $j$", "one head": "一个头 \U0010fffd"})
    assert ax.get_title() == "one head" and ax.get_xlabel() == "key $j$"  # restored after the failure
    plt.close(fig)
