"""Multi-Head Attention, Derived: the book's equations in executable form.

The core (book parts I and II)
------------------------------
``mha.reference``  NumPy float64 reference: softmax, attention, multi-head attention, hand-derived backward,
                   online-softmax attention.
``mha.attention``  ``MultiHeadAttention``: the PyTorch module (MHA, GQA, MQA; sdpa and naive paths).
``mha.latent``     ``MultiHeadLatentAttention``: multi-head latent attention (DeepSeek-V2/V3), its latent-only cache.
``mha.kv_cache``   ``KVCache``: a preallocated key/value cache for autoregressive decoding (a ring buffer for sliding
                   windows, with StreamingLLM's sink tokens).
``mha.rope``       RoPE ("half" and "interleaved" pairs), QK-norm's RMSNorm and the sliding-window mask, for tensors.
``mha.counting``   exact parameter, FLOP and memory counts (a forward pass, one cached decoding step).
``mha.convert``    conversions: an MHA layer pooled to GQA/MQA (Ainslie et al. 2023), GQA expanded back to MHA,
                   our layer's weights into ``torch.nn.MultiheadAttention``, Hugging Face's attention layers into
                   ours (``from_hf``).
``mha.exercises``  graded "write it yourself" checkers: ``check_softmax(my_softmax)`` and ten more, each naming the
                   book's equation and the known bug that a wrong result matches.
``mha.kernels``    ``flash_attention``: FlashAttention forward and backward in Triton (part II, "From the recurrence
                   to a kernel"). Needs the optional extra ``pip install "mha-derived[kernels]"`` (Triton); without
                   it, ``import mha`` still works and only ``mha.kernels`` raises ImportError.

The experiment harness (book part III)
--------------------------------------
``mha.experiments``  run configuration, model, tasks, data, trainer, studies, sweeps, results, analysis,
                     visualisation, benchmarks (see its docstring).

Two command lines: ``python -m mha.sweep`` (the sweep runner, :func:`mha.experiments.sweep.main`) and
``python -m mha.bench`` (the benchmarks, :func:`mha.experiments.bench.main`); ``mha.sweep`` and ``mha.bench`` are
only these entry points. The harness's modules are imported by their names, ``mha.experiments.<name>``.
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
    "MultiHeadLatentAttention": "mha.latent",
}
_SUBMODULES = {"reference", "attention", "kv_cache", "rope", "counting", "convert", "exercises", "kernels",
               "experiments", "latent"}

__all__ = sorted(_LAZY) + sorted(_SUBMODULES)


def __getattr__(name):
    # Lazy: `import mha` stays cheap (no torch import) until a torch object is asked for.
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return import_module(f"mha.{name}")
    raise AttributeError(f"module 'mha' has no attribute {name!r}")

