"""The PDF editions' print layout (book/_ext/latex_edition.py): pandas' HTML tables become docutils tables, checked
against the DataFrame pandas rendered them from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="Sphinx is not installed (the book extra brings it)")
pd = pytest.importorskip("pandas")
from docutils import nodes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
from latex_edition import (_breakable_paths, _keep_space_before_title_math, _landscape, _size_table,  # noqa: E402
                           html_table, unboxed_in_print)


def _grid(container):
    table = container.next_node(nodes.table)
    group = table.next_node(nodes.tgroup)
    head = [[(e.astext(), e.get("morecols", 0), e.get("morerows", 0)) for e in row.findall(nodes.entry)]
            for row in (group.next_node(nodes.thead) or nodes.thead()).findall(nodes.row)]
    body = [[e.astext() for e in row.findall(nodes.entry)] for row in group.next_node(nodes.tbody).findall(nodes.row)]
    return group["cols"], head, body


@pytest.mark.parametrize("styled", [False, True])
def test_a_dataframe_with_merged_headers_keeps_every_cell(styled):
    df = pd.DataFrame([[1, 2.5, "a"], [3, 4.5, "b"]], index=pd.Index(["r1", "r2"], name="run"),
                      columns=pd.MultiIndex.from_tuples([("x", "p"), ("x", "q"), ("y", "r")]))
    html = df.style.format(precision=1).to_html() if styled else df.to_html()
    cols, head, body = _grid(html_table(html))
    assert cols == 1 + df.shape[1]  # the index and the three columns
    assert [row[1:] for row in body] == [[f"{v:.1f}" if isinstance(v, float) else str(v) for v in values]
                                         for values in df.itertuples(index=False)]
    assert [row[0] for row in body] == list(df.index)
    merged = [cell for row in head for cell in row if cell[0] == "x"]
    assert merged and merged[0][1] == 1, f"the 'x' header should span two columns, got {head}"


def test_a_table_with_row_spans_places_the_next_cells_after_them():
    df = pd.DataFrame({"v": [1, 2, 3]}, index=pd.MultiIndex.from_tuples([("a", 1), ("a", 2), ("b", 1)]))
    cols, head, body = _grid(html_table(df.to_html()))
    assert cols == 3
    assert body[0] == ["a", "1", "1"] and body[1] == ["2", "2"] and body[2] == ["b", "1", "3"]


def test_column_widths_follow_each_column_past_merged_rows():
    """A cell after a row-spanning one sizes its own column: the long second-level labels widen column 1 only."""
    df = pd.DataFrame({"v": [1, 2]}, index=pd.MultiIndex.from_tuples([("a", "short"),
                                                                        ("a", "a-very-long-unbreakable-label")]))
    group = html_table(df.to_html()).next_node(nodes.tgroup)
    widths = [spec["colwidth"] for spec in group.findall(nodes.colspec)]
    assert widths[1] == len("a-very-long-unbreakable-label") + 2 and widths[2] < widths[1], widths


def test_a_named_index_shares_the_column_names_row():
    """pandas puts a named index in a header row of its own (the name over empty cells); printed, it is one row."""
    df = pd.DataFrame({"runs": [20, 30], "CPU": ["AMD", "Intel"]}, index=pd.Index(["heads", "gqa"], name="sweep"))
    cols, head, body = _grid(html_table(df.to_html()))
    assert head == [[("sweep", 0, 0), ("runs", 0, 0), ("CPU", 0, 0)]]
    assert body == [["heads", "20", "AMD"], ["gqa", "30", "Intel"]]
    # A row of the columns' own name (a crosstab's) is not folded: its first cells are not empty.
    crossed = pd.crosstab(pd.Series(["a", "b"], name="task"), pd.Series(["x", "y"], name="class"))
    _, crossed_head, _ = _grid(html_table(crossed.to_html()))
    assert len(crossed_head) == 2 and crossed_head[0][0][0] == "class" and crossed_head[1][0][0] == "task"


def test_html_without_a_table_gives_none():
    assert html_table("<div><select name='head'></select></div>") is None


def _markdown_table(rows):
    group = nodes.tgroup(cols=len(rows[0]))
    group += [nodes.colspec(colwidth=1) for _ in rows[0]]
    body = nodes.tbody()
    body += [nodes.row("", *[nodes.entry("", nodes.paragraph(text, text)) for text in row]) for row in rows]
    group += body
    return nodes.table("", group)


def test_a_markdown_table_gets_widths_so_that_its_columns_wrap():
    """The claims appendix's tables (more than 30 rows: a longtable) had ``l`` columns, which never wrap, and ran off
    the page: given widths, the column of long text is wider than the column of short identifiers."""
    long = _markdown_table([["N001-01", "「每个头都要独立计算，显存占用大」 every head computes independently " * 3]] * 31)
    nodes.section("", long)  # a table sits in its page, where the smaller type is put around it
    _size_table(long)
    assert [n.astext() for n in long.parent.children if isinstance(n, nodes.raw)][0].startswith(r"\begingroup")
    widths = [spec["colwidth"] for spec in long.findall(nodes.colspec)]
    assert "colwidths-given" in long["classes"] and widths[1] > widths[0] >= len("N001-01") + 2
    verdict = _markdown_table([["N001-01", "成立，但有保留"]] * 3)  # Chinese: each character two letters wide
    nodes.section("", verdict)
    _size_table(verdict)
    assert [spec["colwidth"] for spec in verdict.findall(nodes.colspec)] == [9, 8]  # 8: the least


def test_exercises_with_solutions_and_solutions_are_not_boxed_in_print():
    """A box cannot break across pages: an exercise whose solution's code is long ran over the footer."""
    solution = nodes.admonition("", nodes.title("", "Solution"), nodes.literal_block("", "x = 1\n" * 80),
                                classes=["dropdown"])
    exercise = nodes.admonition("", nodes.title("", "Write it yourself"), nodes.paragraph("", "Write it."), solution)
    note = nodes.admonition("", nodes.title("", "What the notes say"), nodes.paragraph("", "A quotation."))
    assert unboxed_in_print(exercise) and unboxed_in_print(solution) and not unboxed_in_print(note)


def test_a_path_in_a_bibliography_entry_may_break_after_its_slashes_and_underscores():
    """src/transformers/models/llama/convert_llama_weights_to_hf.py, as one word, ran 113 pt off the page."""
    link = nodes.reference("", "https://example.org/a/b_c", refuri="https://example.org/a/b_c")
    entry = nodes.citation("", nodes.paragraph("", "", nodes.Text("Transformers: src/models/convert_llama.py, "), link))
    _breakable_paths(entry)
    paragraph = entry.children[0]
    assert [n.astext() for n in paragraph.children if isinstance(n, nodes.Text)] == [
        "Transformers: src/", "models/", "convert_", "llama.py, "]
    assert sum(isinstance(n, nodes.raw) for n in paragraph.children) == 3
    assert link.astext() == "https://example.org/a/b_c" and link.parent is paragraph  # the link as it was


def test_a_table_whose_columns_need_more_than_a_portrait_page_is_set_in_landscape():
    """The reproducibility appendix's runs: a column of 37-letter sweep names beside seven columns of numbers, whose
    numbers ran into each other on a portrait page."""
    wide = pd.DataFrame({"sweep": ["head-count-fixed-head-dim-shakespeare"], "run_id": ["68d7a3be6343"],
                         "committed val loss": [1.386193], "val loss here": [0.837000],
                         "relative move": [3.961879e-01], "metrics compared": [30], "before = after": [True]})
    assert "wide-table" in html_table(wide.to_html())["classes"]
    narrow = pd.DataFrame({"heads": [1, 2], "loss": [1.38, 1.21]})
    assert "wide-table" not in html_table(narrow.to_html())["classes"]


def test_a_space_between_chinese_and_math_in_a_title_survives_xecjk():
    """xeCJK dropped the space before a title's ``\\protect\\(h\\protect\\)`` ("一次融合投影就是h 次逐头投影", measured with
    xelatex): such a space becomes a no-break space, which it keeps; spaces elsewhere are left alone."""
    def title(*children):
        node = nodes.title("", "", *children)
        for math in list(node.findall(nodes.math)):
            _keep_space_before_title_math(math)
        return [child.astext() for child in node.children]

    assert title(nodes.Text("一次融合投影就是 "), nodes.math("", "h"), nodes.Text(" 次逐头投影")) == [
        "一次融合投影就是\u00a0", "h", " 次逐头投影"]
    assert title(nodes.Text("Concatenation and "), nodes.math("", "W^O")) == ["Concatenation and ", "W^O"]
    assert title(nodes.Text("随"), nodes.math("", "h")) == ["随", "h"]  # no space: none added
    paragraph = nodes.paragraph("", "", nodes.Text("就是 "), nodes.math("", "h"))  # body text: Sphinx writes no \\protect
    _keep_space_before_title_math(paragraph.children[1])
    assert paragraph.children[0].astext() == "就是 "


def test_a_landscape_table_takes_its_heading_or_bold_title_along():
    """A landscape page starts a new page: the heading (or bold title) printed right before a wide table goes on it
    too, past hidden cells that print nothing; a table after other text starts the landscape pages itself."""
    def wide():
        return nodes.container("", nodes.table(), classes=["output-table", "wide-table"])

    def where(section):  # the printed order, with the raw LaTeX marked
        return [n.astext() if isinstance(n, nodes.raw) else n.tagname for n in section.children]

    table = wide()
    section = nodes.section("", nodes.title("", "The runs on file"),
                            nodes.container("", nodes.container(classes=["cell_output"])),  # a hidden cell
                            nodes.container("", nodes.container("", table, classes=["cell_output"])))
    parent = nodes.section("", nodes.title("", "Benchmarks"), section)
    _landscape(table)
    assert where(parent) == ["title", "\\begin{landscape}", "section"]
    # the end after the outermost container that holds the table: LaTeX's environments must nest
    assert where(section) == ["title", "container", "container", "\\end{landscape}"]

    table = wide()
    section = nodes.section("", nodes.title("", "Every measured number"), nodes.paragraph("", "Text."),
                            nodes.paragraph("", "", nodes.strong("", "Runs")), nodes.container("", table))
    _landscape(table)
    assert where(section) == ["title", "paragraph", "\\begin{landscape}", "paragraph", "container", "\\end{landscape}"]

    table = wide()  # a cell's Markdown output: the bold title in a container of its own, with spaces around it
    title = nodes.container("", nodes.paragraph("", "", nodes.Text("\n"), nodes.strong("", "Runs"), nodes.Text("\n")))
    output = nodes.container("", title, nodes.container("", table), classes=["cell_output"])
    section = nodes.section("", nodes.title("", "Every measured number"), nodes.paragraph("", "Text."), output)
    _landscape(table)
    assert where(output) == ["\\begin{landscape}", "container", "container", "\\end{landscape}"]

    table = wide()
    section = nodes.section("", nodes.title("", "Text first"), nodes.paragraph("", "Some text."), table)
    _landscape(table)
    assert where(section) == ["title", "paragraph", "\\begin{landscape}", "container", "\\end{landscape}"]
