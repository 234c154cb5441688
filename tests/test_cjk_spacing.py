"""The Chinese edition's spacing around cross-references (book/_ext/cjk_spacing.py), on hand-built doctrees."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="Sphinx is not installed (the book extra brings it)")
from docutils import nodes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
from cjk_spacing import tighten  # noqa: E402


def paragraph(*parts) -> nodes.paragraph:
    """Strings become text, ("ref", text) a reference whose text is ``text``, ("math", latex) inline math."""
    para = nodes.paragraph()
    for part in parts:
        if isinstance(part, str):
            para += nodes.Text(part)
        elif part[0] == "math":
            para += nodes.math(part[1], part[1])
        else:
            para += nodes.reference("", part[1], refid="x")
    return para


@pytest.mark.parametrize("parts, expected, dropped", [
    (["因此由 ", ("ref", "式 (76)"), "，"], "因此由式 (76)，", 1),  # Chinese meets Chinese: before
    (["见 ", ("ref", "反向传播"), " 一节"], "见反向传播一节", 2),  # both sides
    (["见\n", ("ref", "反向传播"), "\n一节"], "见反向传播一节", 2),  # a line break of the catalog
    (["见 ", ("ref", "MQA 与 GQA"), "），"], "见 MQA 与 GQA），", 0),  # Latin starts the reference: kept
    (["用 ", ("ref", "RoPE"), " 的"], "用 RoPE 的", 0),  # Latin on both ends of the reference: kept
    (["see ", ("ref", "式 (3)"), " for"], "see 式 (3) for", 0),  # Latin neighbours: kept
    (["在 ", ("ref", "式 (3)"), " and"], "在式 (3) and", 1),
    (["把", ("ref", "式 (39)"), " ", "和 ", ("ref", "式 (40)"), " 相加"], "把式 (39) 和式 (40) 相加", 1),  # split texts
    # An equal text earlier in the paragraph is left alone (docutils' replace() would find it first):
    ([("math", "Q"), " 和 ", ("math", "V"), "。把 ", ("ref", "式 (39)"), " 和 ", ("ref", "式 (40)"), " 相加"],
     "Q 和 V。把式 (39) 和式 (40) 相加", 2),
    (["a", " 和 ", "b", ("ref", "式 (1)")], "a 和 b式 (1)", 0),
])
def test_spaces_dropped_only_where_chinese_meets_chinese(parts, expected, dropped):
    para = paragraph(*parts)
    assert tighten(para) == dropped
    assert para.astext() == expected
    assert sum(isinstance(c, nodes.reference) for c in para.children) == parts.count(("ref",)) + sum(
        isinstance(p, tuple) and p[0] == "ref" for p in parts)
