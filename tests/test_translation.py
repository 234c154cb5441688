"""The Chinese edition's tooling (tools/i18n.py): the lint that a translation keeps its math, code, glue keys and
link targets, and the rewriting of glue roles for translated paragraphs. The catalogs' completeness and the built
Chinese pages are checked in test_book_site.py, beside the build they need."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="Sphinx is not installed (the book extra brings it): tools/i18n.py needs it")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import i18n  # noqa: E402


def test_translation_lint_catches_a_dropped_formula_and_a_changed_target():
    english = "The {ref}`KV cache <glossary-kv-cache>` keeps $K$ for {glue:text}`n_heads` heads (`k_cache`)."
    good = "{ref}`键值缓存 <glossary-kv-cache>` 为 {glue:text}`page.md::n_heads:s` 个头保存 $K$（`k_cache`）。"
    assert i18n.preserved(english, good) == []
    problems = i18n.preserved(english, good.replace("$K$", "K").replace("<glossary-kv-cache>", "<glossary-x>"))
    assert any(p.startswith("math differ") for p in problems) and any(p.startswith("roles differ") for p in problems)
    assert i18n.preserved(english, good.replace("n_heads", "n_kv_heads"))  # another glued value
    assert i18n.preserved(english, good.replace("`k_cache`", "`v_cache`"))  # another code span
    # a glued number printed with other digits than the English (found once: 0.012 for 0.0123)
    formatted = "The median is {glue:text}`median:.4f`."
    assert i18n.preserved(formatted, "中位数为 {glue:text}`page.md::median:.4f`。") == []
    assert any(p.startswith("glue formats differ")
               for p in i18n.preserved(formatted, "中位数为 {glue:text}`page.md::median:.3f`。"))


def test_translation_lint_catches_a_glue_role_that_reads_another_page():
    """A translated role must read its value from the page the English role reads (found once: a claims row's role
    pointed at claims.md for a key glued on the head-count chapter, which the key-only check let through)."""
    page = "book/appendix/claims"
    english = "One head is {glue:text}`../part3/head_count.md::hc_conv_worse:s` four; room {glue:text}`room:.2f`."
    good = "一个头与四个头相比{glue:text}`../part3/head_count.md::hc_conv_worse:s`；余量 {glue:text}`claims.md::room:.2f`。"
    assert i18n.preserved(english, good, page) == []
    wrong_page = good.replace("../part3/head_count.md::hc_conv_worse", "claims.md::hc_conv_worse")
    assert i18n.preserved(english, wrong_page) == []  # keys alone cannot see it
    assert any(p.startswith("glue pages differ") for p in i18n.preserved(english, wrong_page, page))
    elsewhere = good.replace("claims.md::room", "../part3/head_count.md::room")
    assert any(p.startswith("glue pages differ") for p in i18n.preserved(english, elsewhere, page))


def test_glue_roles_are_localised_for_a_translated_paragraph():
    text = "共 {glue:text}`n_heads` 个头，误差 {glue:text}`err:.1e`，已写 {glue:text}`other.md::x:d`"
    assert i18n.localise_glue(text, "book/part1/multi_head") == (
        "共 {glue:text}`multi_head.md::n_heads:s` 个头，误差 {glue:text}`multi_head.md::err:.1e`，"
        "已写 {glue:text}`multi_head.md::x:d`")
    # a role that pastes another page's glue keeps that page, as the English role names it
    english = "one head is {glue:text}`../part3/head_count.md::hc_dec_worse:s` four, {glue:text}`n:d` runs"
    assert i18n.localise_glue("一个头 {glue:text}`hc_dec_worse` 四个头，{glue:text}`n:d` 次", "book/appendix/claims",
                              english) == ("一个头 {glue:text}`../part3/head_count.md::hc_dec_worse:s` 四个头，"
                                           "{glue:text}`claims.md::n:d` 次")
    assert i18n.glue_page("book/appendix/claims", "../part3/head_count.md::") == "book/part3/head_count"
    assert i18n.glue_page("book/appendix/claims", None) == "book/appendix/claims"


def test_glued_text_measured_at_build_time_keeps_its_translation_when_only_its_numbers_change():
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    from i18n_glue import translate

    translations = {"at least 2 timed blocks": "至少计时 2 个块", "grew": "增加了",
                    "3.9 nats apart, 2 runs": "相距 3.9 奈特，2 次运行", "1 and 1": "1 与 1"}
    assert translate("grew", translations) == "增加了"
    assert translate("at least 13 timed blocks", translations) == "至少计时 13 个块"
    assert translate("4.25 nats apart, 7 runs", translations) == "相距 4.25 奈特，7 次运行"
    assert translate("shrank", translations) is None  # other words: no translation, the build says so
    assert translate("2 and 3", translations) is None  # "1 and 1" repeats a number: no unambiguous mapping


def test_only_glued_text_with_words_needs_a_translation():
    # the rule both the Chinese build (which translates) and tools/i18n.py (which lists for glue.po) apply
    assert i18n.has_words("grew") and i18n.has_words("at least 2 timed blocks")
    assert not i18n.has_words("4.7e-03") and not i18n.has_words("h = 4") and not i18n.has_words("")
    assert i18n.has_words("$d_k$ grows", markdown=True)
    assert not i18n.has_words("$d_k = 16$, `n_heads`", markdown=True)  # math and code are pasted as they are
    assert i18n.has_words("$d_k = 16$, `n_heads`")  # as plain text, the letters count


def test_catalogs_follow_the_term_sheet():
    # book/locales/zh_CN/terms.yaml: one Chinese name per concept; a retired variant in a translated msgstr fails,
    # once the sheet's allowed words (legitimate words that contain a variant) are cut out of it
    yaml = pytest.importorskip("yaml")
    from babel.messages.pofile import read_po

    sheet = yaml.safe_load((i18n.LOCALES / i18n.LANGUAGE / "terms.yaml").read_text(encoding="utf-8"))["terms"]
    found = []
    for path in sorted(i18n.CATALOGS.rglob("*.po")):
        with open(path, "rb") as f:
            catalog = read_po(f)
        for message in catalog:
            if not (message.id and isinstance(message.string, str) and message.string) or message.fuzzy:
                continue
            for term in sheet:
                text = message.string
                for allowed in term.get("allowed") or []:
                    text = text.replace(allowed, "")
                found += [f"{path.relative_to(ROOT)}: {str(message.id)[:60]!r}: {variant!r} (use {term['zh']!r})"
                          for variant in term["retired"] if variant in text]
    assert not found, "retired variants of the term sheet:\n" + "\n".join(found)


def test_words_inside_math_are_chinese_on_chinese_pages():
    """Issue 28: "\\text{bytes per number}" inside an equation was left in English. The lint lets a translation
    change only the words of a \\text{...}; every \\text of a Chinese catalog that holds an English phrase (two
    lowercase words), in an inline formula or a display equation (a message of its own), fails here. Names stay as
    they are (\\text{head}_i, \\text{post-LN}). book/_ext/i18n_glue.py puts a display equation's translation in
    place (test_book_site checks that every equation is on both editions)."""
    from babel.messages.pofile import read_po

    assert i18n.preserved(r"$M = 4 \text{ bytes per number}$", r"$M = 4 \text{ 每个数的字节数}$") == []
    assert i18n.preserved(r"$M = 4 \text{ bytes}$", r"$M = 8 \text{ 字节}$") != []  # the math itself must not change
    # two lowercase words, or one word with a space beside it (a connective: "\text{ as }", "\text{ and }")
    phrase = re.compile(r"\\text\{(?:[^{}]*\b[a-z]{2,}\b\s+[^{}]*\b[a-z]{2,}\b[^{}]*"
                        r"|\s+[a-z]{2,}\s*|\s*[a-z]{2,}\s+)\}")
    assert phrase.search(r"\text{a window of } w") and not phrase.search(r"\text{post-LN（笔记 000）}")
    assert phrase.search(r"\ \text{ as } L") and phrase.search(r"QK^\top\text{ and }AV")
    assert not phrase.search(r"\text{head}_i")
    found = []
    for path in sorted(i18n.CATALOGS.rglob("*.po")):
        with open(path, "rb") as f:
            catalog = read_po(f)
        for message in catalog:
            if message.id and isinstance(message.string, str) and path.name != "glue.po":
                for math in [message.string] if "$" not in message.id else i18n.MATH.findall(message.string):
                    found += [f"{path.relative_to(ROOT)}: {m!r}" for m in phrase.findall(math)]
    assert not found, "English phrases inside math on Chinese pages:\n" + "\n".join(found)


def test_a_quoted_notes_english_rendering_may_be_left_out_but_nothing_else():
    english = '「呈二次增长（$O(L^2 d)$）」 — "grows quadratically with $L$ ($O(L^2 d)$)" (note 004, `d` the head size)'
    assert i18n.preserved(english, "「呈二次增长（$O(L^2 d)$）」（笔记 004，`d` 为头维度）") == []  # rendering dropped
    assert i18n.preserved(english, "「呈二次增长（$O(L^2 d)$）」（笔记 004）")  # but the code after it is kept
    assert i18n.preserved(english, "「呈二次增长」（笔记 004，`d` 为头维度）")  # and the quote's own math
    assert i18n.preserved('— "Decoding memory: $1/h$"', "——解码显存")  # a rendering alone is no quote: its math stays


def test_diagram_labels_are_translated_before_the_chinese_diagram_is_drawn(tmp_path):
    """Issue 28: the Chinese edition draws each mermaid diagram with its labels from glue.po; a label with no words
    (a formula, markup) is left as it is, and a label with words but no translation is a build warning."""
    from types import SimpleNamespace

    from docutils import nodes
    from sphinxcontrib.mermaid import mermaid

    import i18n_glue

    assert i18n_glue.diagram_labels('A["head 1<br/>its own W₁<sup>Q</sup>"] -->|"N × L × d_k"| B["· W<sup>O</sup>"]'
                                    ' --> C["new label"]') == ["head 1<br/>its own W₁<sup>Q</sup>", "new label"]
    catalog = tmp_path / "zh_CN" / "LC_MESSAGES"
    catalog.mkdir(parents=True)
    (catalog / "glue.po").write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                                     'msgid "head 1<br/>its own W₁<sup>Q</sup>"\nmsgstr "头 1<br/>自己的 W₁<sup>Q</sup>"\n',
                                     encoding="utf-8")
    app = SimpleNamespace(config=SimpleNamespace(language="zh_CN", locale_dirs=["."]), confdir=str(tmp_path))
    doctree = nodes.section()
    doctree += mermaid(code='flowchart LR\n  A["head 1<br/>its own W₁<sup>Q</sup>"] -->|"N × L × d_k"| B["new label"]')
    warnings = []
    original = i18n_glue.logger.warning
    i18n_glue.logger.warning = lambda message, **kwargs: warnings.append(message)
    try:
        i18n_glue._translate_diagrams(app, doctree, "page")
    finally:
        i18n_glue.logger.warning = original
    code = next(iter(doctree.findall(mermaid)))["code"]
    assert code == 'flowchart LR\n  A["头 1<br/>自己的 W₁<sup>Q</sup>"] -->|"N × L × d_k"| B["new label"]'
    assert warnings == ["diagram label 'new label' has no translation in glue.po; run python tools/i18n.py update "
                        "and translate it"]
    # the book's own labels: each one glue.po must hold is listed, with the page that draws it
    labels = i18n.diagram_texts()
    assert labels["output"] == ["book/intro (diagram label)"] and "N × L × d_k" not in labels


def test_a_glued_word_may_have_its_own_chinese_for_one_key(tmp_path, monkeypatch):
    """Issue 28: a glued word written for English word order ("one head is {higher than} four heads") may get, for one
    key, the Chinese its sentence needs ("与四个头相比，一个头的损失{更高}"): an entry with the key as msgctxt wins over
    the text's own entry, for that key only, and survives `update`, which rewrites the rest of glue.po."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import read_po, write_po

    import i18n_glue

    translations = {"higher than": "高于", ("book/p::a_word", "higher than"): "更高",
                    ("book/p::a_word", "at least 2 runs"): "至少 2 次"}
    assert i18n_glue.translate("higher than", translations, "book/p::a_word") == "更高"
    assert i18n_glue.translate("higher than", translations, "book/p::other") == "高于"
    assert i18n_glue.translate("higher than", translations) == "高于"
    assert i18n_glue.translate("at least 3 runs", translations, "book/p::a_word") == "至少 3 次"
    assert i18n_glue.translate("at least 3 runs", translations, "book/p::other") is None

    glue_po = tmp_path / "glue.po"
    catalog = Catalog(locale="zh_CN")
    catalog.add("higher than", "高于", auto_comments=["book/p::a_word"])
    catalog.add("higher than", "更高", context="book/p::a_word")
    with open(glue_po, "wb") as f:
        write_po(f, catalog)
    monkeypatch.setattr(i18n, "GLUE_CATALOG", glue_po)
    i18n._update_glue_catalog({"lower than": ["book/p::b_word"]})
    with open(glue_po, "rb") as f:
        kept = {(m.context, m.id): m.string for m in read_po(f) if m.id}
    assert kept == {(None, "higher than"): "高于", ("book/p::a_word", "higher than"): "更高", (None, "lower than"): ""}


def test_a_text_the_data_picks_is_translated_for_every_text_it_could_pick(monkeypatch):
    """CI failed on a machine whose timings picked "shrank" where this one printed "grew": glue.po held the printed
    text only. `glue_one_of` glues the list of possible texts beside the chosen one, and `update` lists every one."""
    import myst_nb

    from mha.glued import CHOICES_SUFFIX, glue_one_of

    glued = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: glued.__setitem__(name, value))
    trends = {1: "grew", -1: "shrank", 0: "changed by no amount these rounds resolve"}
    assert glue_one_of("trend", trends[1], trends.values()) == "grew"
    assert glued == {"trend": "grew", "trend" + CHOICES_SUFFIX: list(trends.values())}
    with pytest.raises(ValueError, match="'trend'.*one of its choices.*got 'fell'"):
        glue_one_of("trend", "fell", trends.values())
    with pytest.raises(TypeError, match="choices"):
        glue_one_of("trend", "grew", "grew")  # a str is not a list of texts

    values = {("book/p", "trend"): repr("grew"), ("book/p", "trend" + CHOICES_SUFFIX): repr(list(trends.values())),
              ("book/p", "unpasted"): repr("fell")}
    texts = i18n.glue_texts(values, [("book/p", "The time {glue:text}`trend`.")])
    assert texts == {"grew": ["book/p::trend"],
                     "shrank": ["book/p::trend (another possible value)"],
                     "changed by no amount these rounds resolve": ["book/p::trend (another possible value)"]}


def test_the_chinese_build_fails_on_a_possible_text_without_a_translation(tmp_path, monkeypatch):
    """The build's side of the rule above: whichever text this machine's measurement picked, a glued text's other
    possible texts without a translation are a build warning (an error under -W), so that CI on another CPU cannot be
    the first to find them."""
    from types import SimpleNamespace

    from myst_nb.ext.glue import crossref
    from myst_nb.ext.glue.utils import PendingGlueReference

    import i18n_glue
    from mha.glued import CHOICES_SUFFIX

    catalog = tmp_path / "zh_CN" / "LC_MESSAGES"
    catalog.mkdir(parents=True)
    (catalog / "glue.po").write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                                     'msgid "grew"\nmsgstr "增加了"\n\nmsgid "shrank"\nmsgstr "减少了"\n',
                                     encoding="utf-8")
    app = SimpleNamespace(config=SimpleNamespace(language="zh_CN", locale_dirs=["."]), confdir=str(tmp_path),
                          env=SimpleNamespace(mystnb_config=SimpleNamespace(output_folder="unused")))
    choices = {"trend" + CHOICES_SUFFIX: {"data": {"text/plain": repr(["grew", "shrank", "stalled"])}},
               "both" + CHOICES_SUFFIX: {"data": {"text/plain": repr(["grew", "shrank"])}}}
    monkeypatch.setattr(crossref, "generate_text_nodes", crossref.generate_text_nodes)  # restored afterwards
    monkeypatch.setattr(crossref, "read_glue_cache", lambda folder, docname: choices)
    warnings = []
    monkeypatch.setattr(i18n_glue.logger, "warning", lambda message, **kwargs: warnings.append(message))
    i18n_glue._install(app)

    def paste(key):
        node = PendingGlueReference(refdoc="book/p", key=key, fmt_spec="")
        return crossref.generate_text_nodes(node, {"data": {"text/plain": repr("grew")}})[0].astext()

    assert paste("both") == "增加了" and warnings == []
    assert paste("trend") == "增加了"  # the picked text is translated, but another machine might pick "stalled"
    assert warnings == ["glued text book/p::trend may also be ['stalled'] on another machine, which glue.po does not "
                        "translate; run python tools/i18n.py update and translate it"]


def test_a_tagged_cells_printed_text_is_translated_and_only_its_own():
    """Issue 28: "The solution above passes check_softmax." and a checker's message were printed in English on the
    Chinese pages. A cell tagged translate-output shows its printed text from glue.po; an untagged cell's printed
    text (numbers, arrays) is left as it is, and a tagged text without a translation is reported."""
    from docutils import nodes

    import i18n_glue

    def cell(text, tags):
        node = nodes.container(nb_element="cell_code", cell_metadata={"tags": tags})
        node += nodes.literal_block(text, text, classes=["output", "stream"])
        return node

    document = nodes.section()
    document += cell("The solution above passes check_softmax.\n", ["remove-input", "translate-output"])
    document += cell("The solution above passes check_softmax.\n", ["remove-input"])
    document += cell("A new message.\n", ["translate-output"])
    missing = i18n_glue.translate_streams(document, {"The solution above passes check_softmax.":
                                                     "上面的解答通过了 check_softmax。"})
    printed = [block.astext() for block in document.findall(nodes.literal_block)]
    assert printed == ["上面的解答通过了 check_softmax。\n", "The solution above passes check_softmax.\n",
                       "A new message.\n"]
    assert [text for text, _ in missing] == ["A new message."]

    # a bold title the cell displays as Markdown (display(Markdown("**Runs**"))): its words, as update lists them
    shown = nodes.container(nb_element="cell_code", cell_metadata={"tags": ["translate-output"]})
    shown += nodes.container("", nodes.paragraph("", "", nodes.strong("", "Runs")), nb_element="cell_code_output")
    assert i18n.markdown_words("**Runs**") == "Runs"
    assert i18n_glue.translate_streams(shown, {"Runs": "运行记录"}) == []
    assert shown.astext() == "运行记录"
