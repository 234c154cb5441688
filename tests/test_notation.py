"""The book's prose and math use one notation: the retired symbols of the table below appear nowhere outside code.

`book/appendix/notation.md` is the source of the notation: sequence length L (L_q, L_kv), head size d_k, scaled
scores S = QK^T / sqrt(d_k) with entries s_ij. The symbols retired in its favour are:

    name                 catches (in prose or math)                         write instead
    -------------------  -------------------------------------------------  -----------------------------------
    head-size-d_h        d_h, d_{h}                                         d_k
    square-n-by-n        n \\times n, n × n, n x n, T \\times T             L \\times L (L_q \\times L_kv)
    shape-n-n            (n, n), (T, T)                                     (L, L)
    big-O-in-n           O(n), O(n^2 d_k), O(\\log n), O(\\sqrt{n}), O(T^2 d)  O(L), O(L^2 d_k), ...
    power-of-n           n^2, n^3, T^2 (a sequence length squared)          L^2
    n_q-n_k              n_q, n_k, n_{kv}, n_\\text{q}                        L_q, L_kv
    n-tokens             $n$ tokens, $T$ keys, $n = 37$ positions, ...       $L$ tokens, $L = 37$ positions
    length-n             sequence length $n$, context length $T$            sequence length $L$
    rows-in-R^n          X \\in \\mathbb{R}^{n \\times d}, R^{T \\times d}     \\mathbb{R}^{L \\times d}
    sum-to-n             \\sum_{j=1}^{n}, \\max_{k=1}^{T}                      \\sum_{j=1}^{L}
    list-to-n            s_1, \\dots, s_n;  x_1, \\ldots, x_T                 s_1, \\dots, s_L
    log-n                \\log n (the entropy bound over n keys)             \\log L
    unscaled-s_ij        s_ij = q_i \\cdot k_j, s_{ij} = (QK^T)_{ij}         s_ij = q_i \\cdot k_j / \\sqrt{d_k}

An index may still be i, j, t (or n for "sequence n of the batch"), N is the batch, n_layers a layer count, and
m \\times n a matrix of any size: the patterns only fire on the forms above. Quotations of the source notes keep the
notes' own symbols and are not checked: blockquotes (lines starting with >, as in the "What the notes say" boxes),
「…」 spans, *"…"* italic quotes and "…" quotes that contain Chinese. (An English translation outside these keeps
to the book's notation, or goes in *"…"*.)

The one place allowed to name the retired symbols is the notation page's own list of them, between the MyST
comments `% retired-symbols: begin` and `% retired-symbols: end`.

A title or heading naming an n × n (or T × T) matrix, in math or plain text, fails too (test_no_heading_names...).

Code is not prose: code cells, fenced blocks, inline code spans (and with them every role's target, e.g.
{glue:text}`name`), MyST targets, directive options, comments and link addresses are blanked before the scan, so
line numbers stay those of the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"

_NOT_SYM = r"(?<![\\A-Za-z_])"  # a symbol n or T that is not part of a word or a TeX command
_END_SYM = r"(?![A-Za-z0-9_])"
_TIMES = r"\s*(?:\\times|×|\bx\b)\s*"


@dataclass(frozen=True)
class Retired:
    name: str
    pattern: str
    replacement: str
    fires_on: tuple[str, ...]  # examples the pattern must catch (checked by test_pattern_examples)
    spares: tuple[str, ...] = ()  # legitimate uses it must not catch

    @property
    def regex(self):
        return re.compile(self.pattern)


RETIRED = [
    Retired("head-size-d_h", r"(?<![A-Za-z\\])d_\{?h\}?(?![A-Za-z0-9_{])", "d_k",
            (r"$d_h = 64$", r"$W \in \mathbb{R}^{d \times d_{h}}$"),
            (r"$d_k$", r"$d_\text{model}$", r"$d_{hid}$")),
    Retired("square-n-by-n", _NOT_SYM + r"([nT])" + _TIMES + r"\1" + _END_SYM, r"L \times L",
            (r"$n \times n$", "an n × n matrix", "an n x n matrix", r"$\mathbb{R}^{T \times T}$"),
            (r"$m \times n$", r"$L \times L$", r"$N \times h$", r"$d_k \times n_\text{layers}$")),
    Retired("shape-n-n", r"\(\s*([nT])\s*,\s*\1\s*\)", "(L, L)",
            (r"$(n, n)$", "a (T, T) matrix"), ("(N, L)", "(m, n)", "(i, j)")),
    Retired("big-O-in-n", r"O\((?:[^()]|\([^()]*\))*?" + _NOT_SYM + r"[nT]" + _END_SYM, r"O(L), O(L^2 d_k)",
            (r"$O(n^2)$", r"$O(n)$", r"$O(n^2 d_\text{model})$", r"$O(\log n)$", r"$O(\sqrt{n})$",
             r"$O(T^2 d)$", r"$O(n d_\text{model}^2)$"),
            (r"$O(L^2 d_k)$", r"$O(\log L)$", r"$O(N L d)$", r"$O(1)$", r"$O(L d_\text{model}^2)$")),
    Retired("power-of-n", _NOT_SYM + r"[nT]\^\{?[23]" + _END_SYM, "L^2",
            (r"$n^2$", r"$T^2(d-1)$", r"$2n^3$", r"$n^{2}$"), (r"$L^2$", r"$m^2$", r"$d_k^2$", r"$x_n^2$")),
    Retired("n_q-n_k", r"(?<![A-Za-z\\])n_(?:\{\s*)?(?:\\text\{|\\mathrm\{)?(?:q|k|kv)(?![A-Za-z0-9])",
            r"L_q, L_{kv}",
            (r"$n_q \times b$", r"$n_k$", r"$n_{kv}$", r"$n_\text{q}$", r"$\mathbb{R}^{n_q}$"),
            (r"$n_\text{layers}$", r"$L_q$", r"$n_\text{heads}$")),
    Retired("n-tokens",
            r"\$[nT](?:\s*=[^$]*)?\$\s*(?:\{glue:[a-z]+\}\s*)?(?:(?:cached|real|new|previous)\s+)?"
            r"(?:tokens?|keys?|quer(?:y|ies)|positions?|characters?|scores|values)\b",
            r"$L$ tokens",
            ("a sequence of $n$ tokens", "$T$ cached keys", "$n = 37$ tokens", "$n =$ {glue:text}`` keys",
             "$T$ positions", "its $n$ queries"),
            ("$L$ tokens", "$N$ sequences", "$n$ samples", "sequence $n$ of the batch", "$t$ tokens")),
    Retired("length-n", r"(?:sequence|context|prefix|window)\s+length\s+\$[nT](?:\s*=[^$]*)?\$", "sequence length $L$",
            ("sequence length $n$", "context length $T$", "at sequence length $n = 64$"),
            ("sequence length $L$", "sequence $n$ of the batch", "context length $L_{kv}$")),
    Retired("rows-in-R^n", r"\\mathbb\{R\}\^\{\s*[nT]" + _TIMES, r"\mathbb{R}^{L \times d}",
            (r"$X \in \mathbb{R}^{n \times d_\text{model}}$", r"$\mathbb{R}^{T\times d}$"),
            (r"$W \in \mathbb{R}^{k \times n}$", r"$\mathbb{R}^{L \times d}$")),
    Retired("sum-to-n", r"=\s*[01]\s*\}\s*\^\s*\{?\s*[nT]\s*\}?" + _END_SYM, r"\sum_{j=1}^{L}",
            (r"$\sum_{j=1}^{n} a_j$", r"$\sum_{k=1}^n e^{s_k}$", r"$\prod_{t=1}^{T}$"),
            (r"$\sum_{j=1}^{L} a_j$", r"$\sum_{n=1}^{N}$", r"$\sum_{i=1}^{h}$")),
    Retired("list-to-n", r"_\{?1\}?\s*,\s*\\(?:dots|ldots|cdots)\s*,\s*[A-Za-z](?:_\{?[nT]\}?)" + _END_SYM,
            r"s_1, \dots, s_L",
            (r"$s_1, \dots, s_n$", r"$x_1, \ldots, x_T$", r"$v_1, \dots, v_{n}$"),
            (r"$s_1, \dots, s_L$", r"$\text{head}_1, \dots, \text{head}_h$", r"$B_1, \dots, B_{T_c}$")),
    Retired("log-n", r"\\log\s*n" + _END_SYM, r"\log L",
            (r"$0 \le H(a) \le \log n$",), (r"$\log L$", r"$\log \ell$", r"$\log T$ (a matrix T)")),
    Retired("unscaled-s_ij",
            r"s_\{?ij\}?\s*=\s*(?:q_i|\(\s*QK)(?![^$,;]*(?:/|\\sqrt))",
            r"s_ij = q_i \cdot k_j / \sqrt{d_k}",
            (r"$s_{ij} = q_i \cdot k_j$", r"$s_{ij} = q_i k_j^T$", r"$s_{ij} = (QK^\top)_{ij}$"),
            (r"$s_{ij} = q_i \cdot k_j / \sqrt{d_k}$", r"$s_{ij} = (QK^\top)_{ij}/\sqrt{d_k}$")),
]

HEADING_N_BY_N = re.compile(r"(?<![\w\\])([nT])\s*(?:\\times|×|x|-by-|\s+by\s+)\s*\1(?![\w])")


# ---------------------------------------------------------------------------------------------------------------
# Which files, and what counts as prose.
# ---------------------------------------------------------------------------------------------------------------

def _toc_files() -> list[Path]:
    """Every page _toc.yml lists (root and chapters, at any depth), as paths to .md files."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    found = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                found.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(toc.get("parts", toc.get("chapters", [])))
    return [ROOT / (name if name.endswith(".md") else name + ".md") for name in found]


def _toc_titles() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    titles = []

    def walk(node):
        if isinstance(node, dict):
            titles.extend(str(node[key]) for key in ("title", "caption") if key in node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(toc)
    return titles


def _pages() -> list[Path]:
    pages = {p for p in BOOK.rglob("*.md") if "_build" not in p.parts and ".ipynb_checkpoints" not in p.parts}
    return sorted(pages | set(_toc_files()))


def _blank(match: re.Match) -> str:
    """The match with every character but newlines replaced by spaces (keeps line numbers and columns)."""
    return re.sub(r"[^\n]", " ", match.group(0))


def prose(text: str) -> str:
    """The text with everything that is not prose or math blanked out."""
    text = re.sub(r"\A---\n.*?\n---\n", _blank, text, flags=re.S)  # front matter
    text = re.sub(r"^% retired-symbols: begin$.*?^% retired-symbols: end$", _blank, text, flags=re.S | re.M)
    text = re.sub(r"^(`{3,}|~{3,})[^\n]*\n.*?^\1[ \t]*$", _blank, text, flags=re.S | re.M)  # code cells, fences
    text = re.sub(r"<!--.*?-->", _blank, text, flags=re.S)  # HTML comments
    text = re.sub(r"`(?:[^`\n]|\n(?![ \t]*\n))*`", _blank, text)  # code spans (may wrap a line), role targets
    text = re.sub(r"^\([\w-]+\)=[ \t]*$", _blank, text, flags=re.M)  # MyST targets
    text = re.sub(r"^:[\w-]+:.*$", _blank, text, flags=re.M)  # directive options (:label:, :class:, ...)
    text = re.sub(r"^%.*$", _blank, text, flags=re.M)  # MyST comments
    text = re.sub(r"\]\([^)\s]*\)", _blank, text)  # link addresses
    # Quotations of the source notes keep the notes' symbols.
    text = re.sub(r"^[ \t]*>.*$", _blank, text, flags=re.M)  # blockquotes
    text = re.sub(r"「[^」]*」", _blank, text)
    text = re.sub(r'\*"[^"\n]*"\*', _blank, text)
    text = re.sub(r'"(?:[^"\n]|\n(?![ \t]*\n))*[\u3000-\u9fff\uff00-\uffef](?:[^"\n]|\n(?![ \t]*\n))*"', _blank, text)
    return text


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def retired_hits(text: str) -> list[tuple[int, str, str]]:
    """(line, pattern name, matched text) for every retired symbol in the prose and math of a page."""
    clean = prose(text)
    hits = []
    for rule in RETIRED:
        for match in rule.regex.finditer(clean):
            hits.append((_line(clean, match.start()), rule.name, match.group(0)))
    return sorted(hits)


def heading_hits(text: str) -> list[tuple[int, str]]:
    clean = prose(text)
    return [(_line(clean, m.start()), m.group(0).strip()) for m in re.finditer(r"^#{1,6} .*$", clean, flags=re.M)
            if HEADING_N_BY_N.search(m.group(0))]


# ---------------------------------------------------------------------------------------------------------------
# The tests.
# ---------------------------------------------------------------------------------------------------------------

PAGES = _pages()
REPLACEMENT = {rule.name: rule.replacement for rule in RETIRED}


def test_the_toc_lists_pages_that_exist():
    missing = [str(p.relative_to(ROOT)) for p in _toc_files() if not p.exists()]
    assert not missing, missing
    assert len(PAGES) > 10


@pytest.mark.parametrize("rule", RETIRED, ids=[rule.name for rule in RETIRED])
def test_pattern_examples(rule):
    for example in rule.fires_on:
        assert rule.regex.search(prose(example)), f"{rule.name} misses {example!r}"
    for example in rule.spares:
        assert not rule.regex.search(prose(example)), f"{rule.name} fires on the legitimate {example!r}"


def test_quotations_and_code_are_not_prose():
    text = ("> 原文 $n \\times n$\n「计算一个大的 (n, n) 矩阵」 and *\"O(n^2)\"*\n`n_q` {glue:text}`n_k`\n"
            "```{code-cell} ipython3\nn_q = 3  # n x n\n```\n:label: d_h\n(n-tokens)=\n% n \\times n\n")
    assert retired_hits(text) == []
    assert retired_hits("x\n\nthe $n \\times n$ matrix") == [(3, "square-n-by-n", "n \\times n")]
    assert retired_hits("% retired-symbols: begin\n$d_h$\n% retired-symbols: end\n") == []


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_retired_symbol_in_prose(page):
    hits = retired_hits(page.read_text(encoding="utf-8"))
    rel = page.relative_to(ROOT)
    assert not hits, f"{len(hits)} retired symbol(s):\n" + "\n".join(
        f"{rel}:{line}: {name}: {found!r} -> write {REPLACEMENT[name]}" for line, name, found in hits)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_heading_names_an_n_by_n_matrix(page):
    hits = heading_hits(page.read_text(encoding="utf-8"))
    rel = page.relative_to(ROOT)
    assert not hits, "\n".join(f"{rel}:{line}: {heading!r} -> the L × L matrix" for line, heading in hits)


def test_no_toc_title_names_an_n_by_n_matrix():
    bad = [title for title in _toc_titles() if HEADING_N_BY_N.search(title)]
    assert not bad, bad
