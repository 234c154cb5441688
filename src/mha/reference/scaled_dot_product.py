"""Softmax and scaled dot-product attention, ``softmax(Q K^T / sqrt(d_k)) V``, with masks.

The private ``_scores``, ``_masked_softmax`` and ``_attention`` compute on checked inputs (the book shows them); the
backward pass reuses ``_attention`` and the online softmax ``_scores``.

Book: part I, 'Scaled dot-product attention' and 'Why divide by sqrt(d_k)'.
"""

from __future__ import annotations

import numpy as np

from mha._checks import check_int
from mha.reference.checks import _as_float_array, _check_attention_args
from mha.reference.masks import _check_mask


def _masked_softmax(x, mask=None, axis=-1):
    """softmax over ``axis`` of the allowed entries; masked entries and all-masked rows give 0. No checks."""
    if mask is not None:
        x = np.where(mask, x, -np.inf)
    row_max = np.max(x, axis=axis, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # all-masked row: any finite shift will do
    with np.errstate(over="ignore", under="ignore"):  # x - max <= 0: overflow to -inf / underflow are exact -> 0
        e = np.exp(x - row_max)
    total = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def softmax(x, axis=-1, mask=None):
    """Numerically stable softmax: ``softmax(x)_i = exp(x_i - max_j x_j) / sum_j exp(x_j - max_j x_j)``.

    Subtracting the row maximum changes nothing mathematically (numerator and denominator both gain
    ``exp(-max)``) but keeps every exponent <= 0, so any finite logits work (e.g. +-1e300).
    With ``mask`` (boolean, broadcastable to ``x.shape``, True = keep), masked entries get weight 0 and a row with
    nothing allowed is all zeros. Raises ValueError for NaN/inf in ``x``.

    Book: part I, 'Scaled dot-product attention'.
    """
    x = _as_float_array("x", x)
    if x.ndim == 0:
        raise ValueError(f"x must have at least 1 axis, got a scalar (shape {x.shape})")
    check_int(f"axis (for x of shape {x.shape})", axis, minimum=-x.ndim, maximum=x.ndim - 1)
    if x.shape[axis] == 0:  # an empty *batch* axis is fine: no rows, an empty result
        raise ValueError(f"softmax over an empty axis is undefined: x has shape {x.shape} and axis {axis} has length 0")
    mask = _check_mask(mask, x.shape, "(x.shape)")
    return _masked_softmax(x, mask, axis=axis)


def _scores(q, k, scale):
    """``S = scale * q k^T``; refuses to continue if the product overflowed float64."""
    with np.errstate(over="ignore", invalid="ignore"):  # checked just below
        S = scale * (q @ np.swapaxes(k, -1, -2))  # (..., L_q, L_kv)
    if not np.all(np.isfinite(S)):
        raise ValueError("q @ k^T * scale overflowed float64 (non-finite scores); q and k are too large")
    return S


def _attention(q, k, v, mask, scale):
    """softmax(scale q k^T) v on checked inputs."""
    weights = _masked_softmax(_scores(q, k, scale), mask)  # (..., L_q, L_kv)
    return weights @ v, weights  # (..., L_q, d_v), (..., L_q, L_kv)


def scaled_dot_product_attention(q, k, v, mask=None, scale=None, is_causal=False):
    """``Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V``.

    q ``(..., L_q, d_k)``, k ``(..., L_kv, d_k)``, v ``(..., L_kv, d_v)``; leading axes broadcast. ``mask`` is
    boolean, broadcastable to ``(..., L_q, L_kv)``, True = may attend. ``scale`` defaults to ``1/sqrt(d_k)``
    (otherwise a finite number > 0). ``is_causal`` adds the bottom-right aligned causal mask (:func:`causal_mask`).
    Returns ``(out (..., L_q, d_v), weights (..., L_q, L_kv))``. A query row with no allowed key gets zero weights and
    a zero output row (never NaN).

    Book: part I, 'Scaled dot-product attention'; the scale: part I, 'Why divide by sqrt(d_k)'.
    """
    q, k, v, _, mask, scale = _check_attention_args(q, k, v, mask, scale, is_causal)
    return _attention(q, k, v, mask, scale)
