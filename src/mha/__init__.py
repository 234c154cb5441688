"""Multi-Head Attention, Derived: the book's equations in executable form.

The core (book parts I and II)
------------------------------
``mha.reference``  NumPy float64 reference: softmax, attention, multi-head attention, hand-derived backward,
                   online-softmax attention.
``mha.attention``  ``MultiHeadAttention``: the PyTorch module (MHA, GQA, MQA; sdpa and naive paths).
``mha.kv_cache``   ``KVCache``: a preallocated key/value cache for autoregressive decoding.
``mha.counting``   exact parameter, FLOP and memory counts (a forward pass, one cached decoding step).
``mha.convert``    conversions: an MHA layer pooled to GQA/MQA (Ainslie et al. 2023), GQA expanded back to MHA,
                   our layer's weights into ``torch.nn.MultiheadAttention``.
``mha.exercises``  graded "write it yourself" checkers: ``check_softmax(my_softmax)`` and ten more, each naming the
                   book's equation and the known bug that a wrong result matches.
``mha.kernels``    ``flash_attention``: FlashAttention forward and backward in Triton (part II, "From the recurrence
                   to a kernel"). Needs the optional extra ``pip install "mha-derived[kernels]"`` (Triton); without
                   it, ``import mha`` still works and only ``mha.kernels`` raises ImportError.

The experiment harness (book part III)
--------------------------------------
``mha.experiments``  run configuration, model, tasks, data, trainer, studies, sweeps, results, analysis,
                     visualisation, benchmarks (see its docstring).

Earlier names of the harness modules still import: ``mha.model``, ``mha.tasks``, ``mha.train``, ``mha.sweep``,
``mha.bench``, ``mha.analysis`` and ``mha.viz`` are ``mha.experiments.<name>``, and ``python -m mha.sweep`` and
``python -m mha.bench`` run the harness's command lines.
"""

import importlib.abc
import importlib.util
import sys
from importlib import import_module

from mha._compat import check_versions as _check_versions

__version__ = "0.1.0"

# Python, NumPy and PyTorch older than supported: a clear ImportError now (what is needed, how to fix it), not an
# obscure failure later. Cheap: reads version metadata, imports neither torch nor numpy (see mha/_compat.py).
_check_versions()

_LAZY = {
    "MultiHeadAttention": "mha.attention",
    "KVCache": "mha.kv_cache",
}
_SUBMODULES = {"reference", "attention", "kv_cache", "counting", "convert", "exercises", "kernels", "experiments"}
_MOVED = {name: f"mha.experiments.{name}" for name in ("model", "tasks", "train", "sweep", "bench", "analysis",
                                                        "viz")}

__all__ = sorted(_LAZY) + sorted(_SUBMODULES)


def __getattr__(name):
    # Lazy: `import mha` stays cheap (no torch import) until a torch object is asked for.
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    if name in _SUBMODULES or name in _MOVED:
        return import_module(f"mha.{name}")
    raise AttributeError(f"module 'mha' has no attribute {name!r}")


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``mha.<old name>`` -> the module ``mha.experiments.<old name>`` itself (one module object under two names).

    ``python -m mha.sweep`` works too: runpy asks the loader for the code, which is the new module's code.
    """

    @staticmethod
    def _target(fullname: str) -> str | None:
        package, _, name = fullname.partition(".")
        return _MOVED.get(name) if package == "mha" else None

    def find_spec(self, fullname, path=None, target=None):
        new_name = self._target(fullname)
        if new_name is None:
            return None
        origin = importlib.util.find_spec(new_name).origin  # the file: ``python -m`` sets __file__ from it
        return importlib.util.spec_from_loader(fullname, self, origin=origin)

    def create_module(self, spec):
        return import_module(self._target(spec.name))

    def exec_module(self, module):
        pass  # already executed under its new name

    def get_code(self, fullname):
        target = importlib.util.find_spec(self._target(fullname))
        return target.loader.get_code(target.name)


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())
