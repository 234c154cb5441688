"""Multi-Head Attention, Derived: the book's equations in executable form.

Submodules
----------
``mha.reference``  NumPy float64 reference: softmax, attention, multi-head attention, hand-derived backward,
                   online-softmax attention (book parts I and II).
``mha.attention``  ``MultiHeadAttention``: the PyTorch module (MHA, GQA, MQA; sdpa and naive paths).
``mha.kv_cache``   ``KVCache``: a preallocated key/value cache for autoregressive decoding.
``mha.counting``   exact parameter, FLOP and memory counts (a forward pass, one cached decoding step).
``mha.convert``    ``mha_to_gqa``: an MHA layer's parameters pooled to GQA/MQA (Ainslie et al. 2023).
``mha.model``, ``mha.tasks``, ``mha.train``, ``mha.sweep``, ``mha.bench``: the experiment suite.
``mha.analysis``   head scores, similarity, importance and pruning for trained models (book part III).
``mha.viz``        ``attention_explorer``: an interactive attention-map viewer for the static HTML book.
"""

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
_SUBMODULES = {"reference", "attention", "kv_cache", "counting", "convert", "model", "tasks", "train", "sweep", "bench",
               "analysis", "viz"}

__all__ = sorted(_LAZY) + sorted(_SUBMODULES)


def __getattr__(name):
    # Lazy: `import mha` stays cheap (no torch import) until a torch object is asked for.
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return import_module(f"mha.{name}")
    raise AttributeError(f"module 'mha' has no attribute {name!r}")
