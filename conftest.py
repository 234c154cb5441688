"""Let nbval run the book's MyST Markdown notebooks in place.

nbval collects only ``.ipynb`` files. With ``--nbval`` or ``--nbval-lax``, this hook also collects every ``.md`` file
whose front matter has a Jupyter ``kernelspec`` (a jupytext text notebook), reading it with ``jupytext.read``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import types

import jupytext
from jupyter_client.manager import KernelManager
from nbval import kernel as nbval_kernel
from nbval import plugin


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

# nbval starts one Jupyter kernel per notebook. With jupyter_client's default TCP transport a kernel manager picks free
# ports by asking the OS and letting them go, so kernels started at the same moment in two xdist workers (or beside the
# book build's kernels) can pick the same port and one fails to start ("Address already in use"). nbval's kernels talk
# over Unix sockets in a private folder each instead, which cannot collide (the sweeps do the same,
# mha.experiments.sweep._private_kernel_sockets).
class _PrivateSocketKernelManager(KernelManager):
    def __init__(self, **kwargs):
        folder = tempfile.mkdtemp(prefix="mha-nbval-kernel-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        kwargs.setdefault("transport", "ipc")
        kwargs.setdefault("ip", os.path.join(folder, "kernel"))
        super().__init__(**kwargs)


nbval_kernel.KernelManager = _PrivateSocketKernelManager

# Executed notebooks that sweeps leave under experiments/<chapter>/<sweep>/runs/ are outputs, not notebooks to test.
collect_ignore_glob = ["experiments/*/*/runs/*"]


class MystNotebook(plugin.IPyNbFile):
    """An nbval notebook read from MyST Markdown by jupytext."""

    def collect(self):
        real = plugin.nbformat
        # nbval's collect() reads the file with nbformat.read; hand it jupytext's reader instead.
        plugin.nbformat = types.SimpleNamespace(read=lambda path, as_version: jupytext.read(path))
        try:
            yield from super().collect()
        finally:
            plugin.nbformat = real


def pytest_collect_file(file_path, parent):
    opt = parent.config.option
    if not (opt.nbval or opt.nbval_lax):
        return None
    if {"_build", ".venv", "node_modules"} & set(file_path.parts) or not _is_text_notebook(file_path):
        return None
    return MystNotebook.from_parent(parent, path=file_path)


# The book-site tests build the whole book (every chapter executed, both editions): by far the longest file. Run it
# first, so that under `-n 2 --dist loadfile --no-loadscope-reorder` (make test) one worker starts the build at once
# while the other takes every other file, instead of the build starting half-way through and running on alone.
def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.nodeid.split("::")[0] != "tests/test_book_site.py")  # stable: order kept
