"""Hand-written GPU kernels: FlashAttention in Triton (forward and backward), and its benchmark.

``flash_attention(q, k, v, is_causal=False, scale=None)``: q (N, h, L_q, d), k and v (N, g, L_kv, d), g dividing
h; differentiable. ``flash_attention_forward`` / ``flash_attention_backward``: the kernels alone (the forward also
returns the per-row log-sum-exp). ``mha.kernels.benchmark``: timings against PyTorch's flash backend.

Triton is an optional extra (about 1 GB): ``pip install "mha-derived[kernels]"``. Without it, ``import mha`` works
and only ``import mha.kernels`` fails, with an ImportError that says so. On a machine without a GPU the kernels
run through Triton's interpreter: set ``TRITON_INTERPRET=1`` before this package is first imported.

Book: part II, "From the recurrence to a kernel".
"""

try:
    import triton  # noqa: F401  (the optional dependency; imported here so a missing one fails with advice)
except ImportError as err:  # pragma: no cover - exercised in a subprocess by tests/test_kernels.py
    raise ImportError(
        'mha.kernels needs Triton, an optional extra of this package: pip install "mha-derived[kernels]" '
        f'(or pip install triton). Importing triton failed: {err}') from err

from mha.kernels.flash import (FlashAttentionFunction, flash_attention, flash_attention_backward,
                                         flash_attention_forward, is_interpreted)

__all__ = ["flash_attention", "flash_attention_forward", "flash_attention_backward", "FlashAttentionFunction",
           "is_interpreted"]
