"""Let nbval run the book's MyST Markdown notebooks in place, and hand what it executed to the book build.

nbval collects only ``.ipynb`` files. With ``--nbval`` or ``--nbval-lax``, this hook also collects every ``.md`` file
whose front matter has a Jupyter ``kernelspec`` (a jupytext text notebook), reading it with ``jupytext.read``.

Under ``make test`` (which names its run in ``MHA_NBVAL_RUN``), when every cell of a book page passed, the outputs
nbval got are written into the book build's execution cache (``_build/.jupyter_cache``, the jupyter-cache that
``execute_notebooks: cache`` reads), keyed exactly as the build keys the page, so that the build in ``make test``'s
second pass executes it no more. When a cell failed, any record of the page is removed instead, so that the build
runs it and fails too. Without ``MHA_NBVAL_RUN`` nbval leaves the cache alone (a build may be reading it).
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import sys
import tempfile
import types
import warnings
from pathlib import Path

import pytest

# nbval, jupytext and jupyter_client come with the test extra, but the unit tests do not need them: on an environment
# without them (a stock GPU image: python -m mha.experiments.gpu_run runs the CUDA tests there) this file only sets
# up Triton's interpreter below, and the notebooks are not collected (--nbval does not exist without nbval).
try:
    import jupytext
    from jupyter_client.manager import KernelManager
    from nbval import kernel as nbval_kernel
    from nbval import plugin
except ImportError as _error:
    HAS_NBVAL = False
    NBVAL_MISSING = f"nbval, jupytext or jupyter_client is not installed ({_error})"
else:
    HAS_NBVAL = True
    NBVAL_MISSING = None


def _is_text_notebook(path) -> bool:
    if path.suffix != ".md":
        return False
    text = path.read_text(encoding="utf-8")
    return text.startswith("---") and "kernelspec:" in text.split("\n---", 1)[0]


# Triton reads TRITON_INTERPRET when triton.language is first imported, and torch may import triton on its own (its
# FLOP counter and compiler probe for it), long before tests/test_kernels.py runs in the same worker. Without CUDA the
# kernels can only run interpreted, so the whole session runs with the interpreter selected, set before any test
# module is imported. (With CUDA this is left alone and the kernels compile.)
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

# Executed notebooks that sweeps leave under experiments/<chapter>/<sweep>/runs/ are outputs, not notebooks to test.
collect_ignore_glob = ["experiments/*/*/runs/*"]

# The Chinese edition's figures: every kernel started here (nbval's, the book build's) loads an IPython startup file
# that draws each figure a second time in Chinese (book/_ext/i18n_figures.py). make sets IPYTHONDIR; a bare pytest
# gets the same folder.
if (Path(__file__).resolve().parent / "book" / "_ext" / "i18n_figures.py").exists():  # not in a test's scratch copy
    os.environ.setdefault("IPYTHONDIR", str(Path(__file__).resolve().parent / "_build" / "ipython"))
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parent / "book" / "_ext"))
        import i18n_figures
    finally:
        sys.path.pop(0)
    i18n_figures.write_startup(Path(os.environ["IPYTHONDIR"]))

if HAS_NBVAL:  # everything below needs nbval (and jupytext, jupyter_client); see the imports
    # nbval starts one Jupyter kernel per notebook. With jupyter_client's default TCP transport a kernel manager picks
    # free ports by asking the OS and letting them go, so kernels started at the same moment in two xdist workers (or
    # beside the book build's kernels) can pick the same port and one fails to start ("Address already in use").
    # nbval's kernels talk over Unix sockets in a private folder each instead, which cannot collide (the sweeps do the
    # same, mha.experiments.sweep._private_kernel_sockets).
    class _PrivateSocketKernelManager(KernelManager):
        def __init__(self, **kwargs):
            folder = tempfile.mkdtemp(prefix="mha-nbval-kernel-")
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            kwargs.setdefault("transport", "ipc")
            kwargs.setdefault("ip", os.path.join(folder, "kernel"))
            super().__init__(**kwargs)


    nbval_kernel.KernelManager = _PrivateSocketKernelManager


    class MystNotebook(plugin.IPyNbFile):
        """An nbval notebook read from MyST Markdown by jupytext; a book page's passing run fills the build's cache."""

        def collect(self):
            real = plugin.nbformat
            # nbval's collect() reads the file with nbformat.read; hand it jupytext's reader instead.
            plugin.nbformat = types.SimpleNamespace(read=lambda path, as_version: jupytext.read(path))
            self.cell_results = {}  # cell number -> (passed, seconds, outputs), from pytest_runtest_makereport
            self.unhandled = set()  # iopub message types nbval drops (clear_output, update_display_data, ...)
            try:
                yield from super().collect()
            finally:
                plugin.nbformat = real

        def get_kernel_message(self, timeout=None, stream="iopub"):
            msg = super().get_kernel_message(timeout=timeout, stream=stream)
            if stream == "iopub" and msg["msg_type"] not in _NBVAL_KEEPS:
                self.unhandled.add(msg["msg_type"])
            return msg

        def teardown(self):
            try:
                _BookCache.record(self)
            finally:
                super().teardown()


    # The iopub messages whose content nbval keeps as a cell's outputs, or which carry none. Any other (clear_output,
    # update_display_data) would change what a notebook client shows, so such a page is not cached.
    _NBVAL_KEEPS = {"status", "execute_input", "execute_reply", "display_data", "execute_result", "stream", "error",
                    "comm_open", "comm_msg", "comm_close"}


    class _BookCache:
        """nbval's run of a book page, written where the book build looks for it: the jupyter-cache in
        ``_build/.jupyter_cache``, under the key the build computes (the code cells and the kernelspec of the page as
        myst-nb reads it), with nbval's outputs in place of each code cell's. A page is written only when nbval ran every
        one of its code cells, each passed within the book's cell time limit (``execute.timeout``), nbval kept every
        output message, and myst-nb reads the same code cells from the page as jupytext did; otherwise the build executes
        the page itself, as it did before. A failed page's record is removed, so an old record cannot stand in for it.
        Each record carries ``MHA_NBVAL_RUN``: the book test of the same run keeps only that run's records."""

        ROOT = Path(__file__).resolve().parent
        CACHE = ROOT / "_build" / ".jupyter_cache"

        @classmethod
        def record(cls, notebook: MystNotebook) -> None:
            path = Path(str(notebook.fspath)).resolve()
            if (not os.environ.get("MHA_NBVAL_RUN") or cls.ROOT / "book" not in path.parents
                    or not getattr(notebook, "cell_results", None)):
                return
            try:
                page = cls._myst_nb_notebook(path)
                code = [cell for cell in page.cells if cell.cell_type == "code"]
                ran = [cell for cell in notebook.nb.cells if cell.cell_type == "code"]
                results = notebook.cell_results
                limit = cls._timeout(page)
                passed = len(results) == len(ran) and all(ok for ok, _, _ in results.values())
                problem = None
                slow = {number: seconds for number, (_, seconds, _) in results.items() if seconds >= limit}
                if slow:  # nbval has no such limit by default; the build has (raise_on_error: a build error)
                    passed, problem = False, f"cells over the book's time limit of {limit:g} s: {slow}"
                elif [cell.source for cell in code] != [cell.source for cell in ran]:
                    problem = (f"myst-nb reads {len(code)} code cells from it, jupytext (nbval) {len(ran)}, or different "
                               f"code")
                elif notebook.unhandled:
                    problem = f"its kernel sent messages nbval does not keep: {sorted(notebook.unhandled)}"
                language_info = None
                if passed and not problem:
                    reply = notebook.kernel.kc.kernel_info(reply=True, timeout=30)
                    language_info = reply["content"]["language_info"]
                with cls._locked() as cache:
                    if passed and not problem:
                        from jupyter_cache.base import CacheBundleIn

                        page.metadata["language_info"] = language_info
                        for number, cell in enumerate(code):
                            cell.outputs = [_plain(output) for output in results[number][2]]
                            cell.execution_count = number + 1
                        cache.cache_notebook_bundle(
                            CacheBundleIn(page, str(path), data={
                                "execution_seconds": sum(seconds for _, seconds, _ in results.values()),
                                "nbval_run": os.environ.get("MHA_NBVAL_RUN")}),
                            check_validity=False, overwrite=True)
                    else:
                        cls._forget(cache, page)
            except Exception as exc:
                problem = repr(exc)
            if problem:  # the build will execute the page itself: slower, still right
                warnings.warn(f"{path.name}: nbval's run is not handed to the book build ({problem}); the build will "
                              f"execute the page again", stacklevel=1)

        @staticmethod
        def _forget(cache, page) -> None:
            try:
                record = cache.match_cache_notebook(page)
            except KeyError:
                return
            cache.remove_cache(record.pk)

        @classmethod
        def _myst_nb_notebook(cls, path: Path):
            """The page as the book build reads it (myst-nb's reader, with the book's MyST extensions)."""
            import yaml
            from myst_nb.core.read import read_myst_markdown_notebook
            from myst_parser.config.main import MdParserConfig

            parse = yaml.safe_load((cls.ROOT / "_config.yml").read_text()).get("parse", {})
            config = MdParserConfig(enable_extensions=set(parse.get("myst_enable_extensions", [])))
            return read_myst_markdown_notebook(path.read_text(encoding="utf-8"), config=config, add_source_map=True,
                                               path=path)

        @classmethod
        def _timeout(cls, page) -> float:
            import yaml

            execute = yaml.safe_load((cls.ROOT / "_config.yml").read_text()).get("execute", {})
            limit = page.metadata.get("mystnb", {}).get("execution_timeout", execute.get("timeout", 30))
            return float("inf") if limit in (None, -1) else float(limit)

        @classmethod
        def _locked(cls):
            """The cache, with a lock held: two test workers may write it at once (and create its database)."""
            import contextlib

            from jupyter_cache import get_cache

            @contextlib.contextmanager
            def locked():
                cls.CACHE.parent.mkdir(parents=True, exist_ok=True)
                with open(cls.CACHE.parent / ".jupyter_cache.lock", "w") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    try:
                        yield get_cache(str(cls.CACHE))
                    finally:
                        fcntl.flock(lock, fcntl.LOCK_UN)

            return locked()


    def _plain(output):
        """One of nbval's outputs as nbformat writes it (nbval leaves its execute_result without a count)."""
        from nbformat import from_dict

        output = from_dict(dict(output))
        if output.output_type == "execute_result":
            output.setdefault("execution_count", None)
        return output


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    notebook = getattr(item, "parent", None)
    if HAS_NBVAL and isinstance(notebook, MystNotebook) and isinstance(item, plugin.IPyNbCell):
        results = notebook.cell_results
        if report.when == "call":
            results[item.cell_num] = (report.passed, report.duration, list(item.test_outputs or []))
        elif report.failed or report.skipped:  # a setup or teardown that failed, or a skipped cell
            results[item.cell_num] = (False, report.duration, [])
    return report


def pytest_collect_file(file_path, parent):
    opt = parent.config.option
    if not HAS_NBVAL or not (getattr(opt, "nbval", False) or getattr(opt, "nbval_lax", False)):
        return None
    if {"_build", ".venv", "node_modules"} & set(file_path.parts) or not _is_text_notebook(file_path):
        return None
    return MystNotebook.from_parent(parent, path=file_path)


# The book-site tests build the whole book (both editions; under `make test` from the executions nbval cached in its
# first pass) and load every page in a browser: the longest file of `make test`'s second pass. Run it first, so that
# under `-n 2 --dist loadfile --no-loadscope-reorder` one worker starts the build at once while the other takes every
# other file, instead of the build starting half-way through and running on alone.
def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.nodeid.split("::")[0] != "tests/test_book_site.py")  # stable: order kept
