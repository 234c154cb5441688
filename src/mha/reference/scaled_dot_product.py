"""Softmax and scaled dot-product attention, ``softmax(Q K^T / sqrt(d_k)) V``, with masks.

The private ``_scores``, ``_masked_softmax`` and ``_attention`` compute on checked inputs (the book shows them); the
backward pass reuses ``_attention`` and the online softmax ``_scores``. ``_capped_scores``, ``_sink_softmax`` and
``_attention_general`` add two parts of today's models: logit soft-capping and attention sinks.

Book: part I, 'Scaled dot-product attention', 'Why divide by sqrt(d_k)'; part IV, 'Attention in today's models'.
"""

from __future__ import annotations

import numpy as np

from mha._checks import check_int
from mha.reference.checks import _as_float_array, _check_attention_args, _check_core_extras
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


def _capped_scores(q, k, scale, softcap):
    """``S = softcap * tanh(scale q k^T / softcap)``, or the plain scores for ``softcap=None``."""
    S = _scores(q, k, scale)  # (..., L_q, L_kv)
    if softcap is None:
        return S
    with np.errstate(over="ignore"):  # S / softcap may overflow for a tiny softcap: tanh(+-inf) = +-1 is right
        return softcap * np.tanh(S / softcap)


def _sink_softmax(S, mask, sinks):
    """Masked softmax of each row of ``S`` joined by one more logit, the row's sink, which is then dropped.

    ``Z = sum_{j allowed} exp(S_j) + exp(sink)``; returns ``(weights (..., L_q, L_kv), p_sink (..., L_q))`` with
    ``weights_j = exp(S_j) / Z`` and ``p_sink = exp(sink) / Z``; every row sums to ``1 - p_sink``. All exponents
    are taken after subtracting the row max of the allowed logits and the sink, so they are <= 0; a row with no
    allowed key has ``weights = 0`` and ``p_sink = 1``. No checks.
    """
    x = S if mask is None else np.where(mask, S, -np.inf)
    sink = np.broadcast_to(sinks[..., None, None], x.shape[:-1] + (1,))  # (..., L_q, 1): one logit per row
    shift = np.maximum(np.max(x, axis=-1, keepdims=True), sink)  # finite, since the sink logit is
    with np.errstate(under="ignore"):  # exponents <= 0: underflow to 0 is exact enough
        e, e_sink = np.exp(x - shift), np.exp(sink - shift)
    total = np.sum(e, axis=-1, keepdims=True) + e_sink  # >= 1: the largest term is exp(0)
    return e / total, (e_sink / total)[..., 0]


def _attention_general(q, k, v, mask, scale, softcap=None, sinks=None):
    """softmax(softcap(scale q k^T) with a sink per row) v on checked inputs: ``(out, weights, p_sink)``, p_sink
    None without sinks. With ``softcap = sinks = None`` it computes exactly ``_attention``. No checks."""
    S = _capped_scores(q, k, scale, softcap)  # (..., L_q, L_kv)
    if sinks is None:
        weights, p_sink = _masked_softmax(S, mask), None
    else:
        weights, p_sink = _sink_softmax(S, mask, sinks)
    return weights @ v, weights, p_sink  # (..., L_q, d_v), (..., L_q, L_kv), (..., L_q) or None


def scaled_dot_product_attention(q, k, v, mask=None, scale=None, is_causal=False, *, sinks=None, window=None,
                                 softcap=None):
    """``Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V``.

    q ``(..., L_q, d_k)``, k ``(..., L_kv, d_k)``, v ``(..., L_kv, d_v)``; leading axes broadcast. ``mask`` is
    boolean, broadcastable to ``(..., L_q, L_kv)``, True = may attend. ``scale`` defaults to ``1/sqrt(d_k)``
    (otherwise a finite number > 0). ``is_causal`` adds the bottom-right aligned causal mask (:func:`causal_mask`).
    Returns ``(out (..., L_q, d_v), weights (..., L_q, L_kv))``. A query row with no allowed key gets zero weights and
    a zero output row (never NaN).

    Three keywords of today's models (each None = off, and then the result is exactly the one above):

    * ``window`` (int >= 1): sliding-window attention, the mask of :func:`sliding_window_mask` joined to the others
      by logical and. It *implies* causal attention (the window is the ``window`` most recent keys, the query's own
      included, bottom-right aligned); ``is_causal`` may be True or False with it and adds nothing.
    * ``softcap`` (finite > 0): logit soft-capping (Gemma 2, Grok), the scores become
      ``softcap * tanh(scale q k^T / softcap)``: close to the plain scores while they are small, never beyond
      ``+-softcap``. Applied before the masks and the sinks.
    * ``sinks`` (finite, broadcastable to the leading axes ``...``, e.g. shape ``(h,)`` for ``(N, h, L, d)``
      inputs: one logit per head): a learned "attention sink" logit (gpt-oss) joins each row's softmax as one more
      column and is dropped afterwards, as if a key with a zero value vector and score = the sink logit (not scaled,
      not capped, never masked) were appended. Each row of weights then sums to ``1 - p_sink``, where ``p_sink =
      exp(sink) / (sum_j exp(S_j) + exp(sink))``: a head can put weight on "nothing". A row with no allowed key puts
      all its weight on the sink and gives a zero output row. The returned weights exclude the sink column.

    Book: part I, 'Scaled dot-product attention'; the scale: part I, 'Why divide by sqrt(d_k)'; the keywords: part
    IV, 'Attention in today's models'.
    """
    q, k, v, batch, mask, scale = _check_attention_args(q, k, v, mask, scale, is_causal)
    mask, sinks, softcap = _check_core_extras(batch, q.shape[-2], k.shape[-2], mask, sinks, window, softcap)
    if sinks is None and softcap is None:
        return _attention(q, k, v, mask, scale)
    out, weights, _ = _attention_general(q, k, v, mask, scale, softcap, sinks)
    return out, weights
