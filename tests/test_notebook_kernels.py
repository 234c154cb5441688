"""nbval's notebook kernels talk over Unix sockets in private folders (set up by the root conftest.py), so kernels
started at the same moment in two test workers cannot pick the same TCP port."""

import os

import pytest

kernel = pytest.importorskip("nbval.kernel", reason="nbval is not installed (the test extra brings it)")


def test_nbval_kernels_use_private_unix_sockets_and_run_code():
    kernels = [kernel.RunningKernel("python3"), kernel.RunningKernel("python3")]  # started while the other runs
    try:
        info = [running.km.get_connection_info() for running in kernels]
        assert [entry["transport"] for entry in info] == ["ipc", "ipc"], info
        folders = [os.path.dirname(entry["ip"]) for entry in info]
        assert folders[0] != folders[1] and all(os.path.isdir(folder) for folder in folders), folders
        for running in kernels:  # each kernel answers on its sockets
            msg_id = running.execute_cell_input("print(6 * 7)", allow_stdin=False)
            outputs = []
            while True:
                message = running.get_message("iopub", timeout=30)
                if message["parent_header"].get("msg_id") != msg_id:
                    continue
                if message["msg_type"] == "stream":
                    outputs.append(message["content"]["text"])
                if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                    break
            assert "".join(outputs).strip() == "42"
    finally:
        for running in kernels:
            running.stop()



PAGE = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# A page
NESTED
```{code-cell} ipython3
:tags: [remove-input]
from pathlib import Path

from myst_nb import glue
print("one")
print("two")
glue("answer", 42, display=False)
```

Text between cells.

```{code-cell} ipython3
int(Path("value.txt").read_text())  # the same code fails when the file changes, as a page does when the package does
```
"""


def test_a_book_page_that_passed_nbval_is_cached_for_the_book_build(tmp_path):
    """The root conftest.py writes a book page that passed nbval into `_build/.jupyter_cache` under the key the book
    build computes (the page as myst-nb reads it), with nbval's outputs, when `make test` names its run
    (MHA_NBVAL_RUN). When the same page fails, its record is removed (the cache's key is the code alone, so the old
    record would match). A page whose code cells myst-nb and jupytext read differently is not cached, with a
    warning."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from jupyter_cache import get_cache
    from myst_nb.core.read import read_myst_markdown_notebook
    from myst_parser.config.main import MdParserConfig

    root = Path(__file__).resolve().parents[1]
    for name in ("conftest.py", "_config.yml"):
        shutil.copy(root / name, tmp_path / name)
    book = tmp_path / "book"
    book.mkdir()
    page, nested = book / "page.md", book / "nested.md"
    page.write_text(PAGE.replace("NESTED", ""))
    # A code cell in a colon fence: jupytext makes it a cell (nbval runs it), myst-nb does not (the build would not).
    nested.write_text(PAGE.replace("NESTED", "\n:::{note}\nA note.\n```{code-cell} ipython3\nprint(1)\n```\n:::\n\n"
                                             "```{code-cell} ipython3\nname = 'nested'\n```\n"))

    def run(value, *pages, run_name="run-1"):
        (book / "value.txt").write_text(value)
        env = {key: value for key, value in os.environ.items() if key != "MHA_NBVAL_RUN"}
        return subprocess.run([sys.executable, "-m", "pytest", *pages, "--nbval-lax", "-q", "-p", "no:cacheprovider"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env={**env, "MHA_NBVAL_RUN": run_name} if run_name else env)

    def as_the_build_reads(path):
        config = MdParserConfig(enable_extensions={"colon_fence", "dollarmath", "amsmath"})
        return read_myst_markdown_notebook(path.read_text(), config=config, add_source_map=True, path=path)

    proc = run("42", "book/page.md", run_name=None)  # outside `make test`, nbval leaves the cache alone
    assert proc.returncode == 0 and not (tmp_path / "_build").exists(), proc.stdout + proc.stderr

    proc = run("42", "book/page.md", "book/nested.md")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cache = get_cache(str(tmp_path / "_build" / ".jupyter_cache"))
    assert cache.match_cache_notebook(as_the_build_reads(page)).data["nbval_run"] == "run-1"
    _, merged = cache.merge_match_into_notebook(as_the_build_reads(page))  # what the build renders
    code = [cell for cell in merged.cells if cell.cell_type == "code"]
    assert len(code) == 2 and code[0].metadata["tags"] == ["remove-input"]
    first, second = code[0].outputs, code[1].outputs
    assert [o.output_type for o in first] == ["stream", "display_data"] and first[0].text == "one\ntwo\n"
    assert first[1].metadata["scrapbook"]["name"] == "answer"  # glue's output, where myst-nb looks for it
    assert [o.output_type for o in second] == ["execute_result"] and second[0].data["text/plain"] == "42"
    assert merged.metadata["language_info"]["name"] == "python"
    assert "nested.md: nbval's run is not handed to the book build" in proc.stdout, proc.stdout
    with pytest.raises(KeyError):
        cache.match_cache_notebook(as_the_build_reads(nested))

    proc = run("forty-two", "book/page.md")  # the same code fails now
    assert proc.returncode != 0 and "ValueError" in proc.stdout, proc.stdout
    with pytest.raises(KeyError):
        cache.match_cache_notebook(as_the_build_reads(page))
