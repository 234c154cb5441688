"""Both editions as PDF: Sphinx's LaTeX builder, then xelatex (through latexmk), with xeCJK for Chinese.

Usage (from the repository root; ``make pdf`` runs the first form)::

    python tools/pdf.py                       # _build/pdf/multi-head-attention-derived{,-zh}.pdf
    python tools/pdf.py --lang zh             # one edition
    python tools/pdf.py --pages book/part1/intuition --out DIR   # the introduction, these chapters, the references

The pages' executed cells come from the English build's execution cache (``make book`` fills it; a page missing from
it is executed). The Chinese edition reads the same catalogs as its HTML (``tools/i18n.py``), so both PDFs show the
same computed numbers as the web pages. What print changes (hidden code left out, pandas tables as tables, fonts) is
``book/_ext/latex_edition.py``. It needs xelatex, latexmk and xeCJK (Debian: texlive-xetex, texlive-latex-extra,
texlive-lang-chinese, latexmk) and the fonts DejaVu and Noto CJK (fonts-dejavu-core, fonts-noto-cjk).

A whole-book build treats Sphinx's warnings as errors; a ``--pages`` build does not (its pages cite chapters it
leaves out). Either way a LaTeX error or a character missing from every font stops it: a PDF with boxes for glyphs
is a wrong answer, not a warning.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import i18n  # noqa: E402 - the Chinese edition's catalogs and options, and the book's Sphinx configuration

ROOT = i18n.ROOT
BUILD = i18n.BUILD
OUT = BUILD / "pdf"
NAMES = {"en": "multi-head-attention-derived.pdf", "zh": "multi-head-attention-derived-zh.pdf"}
ROOT_DOC = "book/intro"
REFERENCES = "book/references"
TOOLS = ("xelatex", "latexmk")
MISSING_GLYPH = re.compile(r"^Missing character: There is no (.+)$", re.M)


class PdfError(RuntimeError):
    """A PDF that could not be made, or only with missing glyphs."""


def _conf(language: str, pages: list[str] | None, work: Path) -> Path:
    """The book's Sphinx configuration (tools/i18n.py's), with the one LaTeX document and, for ``pages``, a table of
    contents holding only the introduction, those pages and the references; written to ``work``/conf."""
    text = i18n.write_conf().read_text()
    title = i18n.chinese_title() if language == "zh" else None
    author = i18n.CHINESE_AUTHOR if language == "zh" else None
    text += f"\n# Added by tools/pdf.py\nlatex_documents = [({ROOT_DOC!r}, 'book.tex', {title!r} or html_title, " \
            f"{author!r} or author, 'manual')]\n"
    if pages:
        toc = work / "toc.yml"
        kept = [page for page in pages if page != REFERENCES] + [REFERENCES]  # so that citations resolve
        toc.write_text(f"format: jb-book\nroot: {ROOT_DOC}\nchapters:\n" +
                       "".join(f"  - file: {page}\n" for page in kept))
        text += f"external_toc_path = {str(toc)!r}\n"
    conf_dir = work / "conf"
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "conf.py").write_text(text)
    return conf_dir


def _check_pages(pages: list[str]) -> None:
    for page in pages:
        if not isinstance(page, str) or not (ROOT / f"{page}.md").is_file():
            raise ValueError(f"pages: {page!r} is not a page of the book; expected a path like book/part1/intuition "
                             f"(a .md file under book/, without its suffix)")


def build(language: str, out: Path = OUT, pages: list[str] | None = None) -> Path:
    """The PDF of one edition (``language`` "en" or "zh"), written to ``out``; its path."""
    if language not in NAMES:
        raise ValueError(f"language must be one of {sorted(NAMES)}, got {language!r}")
    if pages is not None:
        _check_pages(pages)
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise PdfError(f"{', '.join(missing)} not found: install Debian's texlive-xetex, texlive-latex-extra, "
                       "texlive-lang-chinese and latexmk (.ci/run does)")
    work = BUILD / f"pdf-{language}" if pages is None else BUILD / f"pdf-{language}-pages"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    conf_dir = _conf(language, pages, work)
    options = i18n.chinese_options() if language == "zh" else ["-D", "language=en"]
    command = [str(Path(sys.executable).with_name("sphinx-build")), "-b", "latex", "-c", str(conf_dir), "-d",
               str(work / "doctrees"), "-q", *options, str(ROOT), str(work / "latex")]
    if pages is None:
        command[1:1] = ["-W", "-n", "--keep-going"]
    if subprocess.run(command, cwd=ROOT).returncode != 0:
        raise PdfError(f"Sphinx's LaTeX builder failed (its messages are above): {' '.join(command)}")
    latex = work / "latex"
    proc = subprocess.run(["latexmk", "-xelatex", "-interaction=nonstopmode", "-halt-on-error", "book.tex"],
                          cwd=latex, capture_output=True, text=True)
    log = (latex / "book.log").read_text(errors="replace") if (latex / "book.log").exists() else ""
    if proc.returncode != 0:
        errors = "\n".join(line for line in log.splitlines() if line.startswith("!")) or proc.stdout[-3000:]
        raise PdfError(f"xelatex failed on {latex / 'book.tex'} (exit {proc.returncode}):\n{errors}")
    glyphs = sorted(set(MISSING_GLYPH.findall(log)))
    if glyphs:
        raise PdfError(f"{len(glyphs)} character(s) are in no font of {latex / 'book.tex'}: {glyphs[:20]}")
    out.mkdir(parents=True, exist_ok=True)
    target = out / NAMES[language]
    shutil.copy(latex / "book.pdf", target)
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/pdf.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lang", nargs="+", choices=sorted(NAMES), default=["en", "zh"], help="the editions")
    parser.add_argument("--pages", nargs="+", metavar="PAGE",
                        help="only the introduction and these pages (book/part1/intuition ...)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the PDFs go (default {OUT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    try:
        for language in args.lang:
            print(build(language, args.out.resolve(), args.pages))
    except (PdfError, ValueError) as error:
        print(f"tools/pdf.py: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
