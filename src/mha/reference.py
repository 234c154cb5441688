"""NumPy float64 reference for multi-head attention, written to be read next to the book.

Every function is short and carries the equation it computes. Conventions (shared with ``mha.attention``):

* Row vectors, ``Y = X W``. ``x`` is ``(N, L, d_model)``; a 2-D ``(L, d_model)`` input (no batch) is also accepted.
* ``params`` is a dict: ``W_q (d_model, h*head_dim)``, ``W_k`` and ``W_v (d_model, g*head_dim)``,
  ``W_o (h*head_dim, d_model)``, optional biases ``b_q (h*head_dim,)``, ``b_k``, ``b_v (g*head_dim,)``,
  ``b_o (d_model,)``. ``head_dim`` and ``g = n_kv_heads`` are read from the shapes.
* Query head ``j`` uses key/value head ``j // (h/g)`` (``g = h``: MHA, ``g = 1``: MQA, between: GQA).
* Masks are boolean, ``True`` = may attend, broadcastable to the weights' shape ``(..., L_q, L_kv)``.
  ``is_causal=True`` adds the causal mask, bottom-right aligned (:func:`causal_mask`), combined with ``mask`` by
  logical and, as in ``mha.MultiHeadAttention``: the same names, order, defaults and errors.
* A query row with no allowed key gets all-zero weights and an all-zero output row (and zero gradient),
  never NaN. (Softmax over an empty set is undefined; zero is the "attends to nothing" convention.)
* Inputs containing NaN or inf are rejected with ``ValueError("<name> contains NaN or inf ...")``; every check
  runs before any computation. All arithmetic is float64 (inputs are converted). ``split_heads``, ``merge_heads``
  and ``repeat_kv`` do no arithmetic (they only move numbers) and let NaN and inf through.

Book: part I, 'Scaled dot-product attention' and 'From one head to h heads'; part II, 'The backward pass',
'MQA and GQA' and 'Exact attention without the L × L matrix (online softmax)'.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

from mha._checks import attention_scale, check_bool, check_int, head_shape

__all__ = [
    "softmax",
    "softmax_backward",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_grad",
    "multi_head_attention",
    "multi_head_attention_per_head",
    "multi_head_attention_grad",
    "online_softmax_attention",
    "split_heads",
    "merge_heads",
    "repeat_kv",
    "causal_mask",
    "head_weights",
    "check_params",
    "Dims",
    "init_params",
]

_WEIGHT_KEYS = ("W_q", "W_k", "W_v", "W_o")
_BIAS_KEYS = ("b_q", "b_k", "b_v", "b_o")


# ---------------------------------------------------------------------------------------------------------------
# Input checks: small helpers, all run before any computation.
# ---------------------------------------------------------------------------------------------------------------


class Dims(NamedTuple):
    """The sizes of a layer, read from its ``params`` dict by :func:`check_params`."""

    d_model: int  # model width, W_q.shape[0]
    n_heads: int  # h, query heads
    n_kv_heads: int  # g, key/value heads (divides h)
    head_dim: int  # width of one head, W_q.shape[1] // h


def _as_float_array(name, x, finite=True):
    """``x`` as a float64 array; TypeError for non-numeric data, ValueError for NaN/inf (unless ``finite=False``)."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    if finite and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf (shape {arr.shape}); inputs must be finite")
    return arr


def _check_flag(name, value):
    return check_bool(name, value)


def _check_scale(scale, d_k):
    """Default ``1/sqrt(d_k)``; otherwise a finite real number > 0 (the rule ``mha.MultiHeadAttention`` applies)."""
    return attention_scale(scale, d_k)


def causal_mask(l_q, l_kv):
    """Boolean ``(l_q, l_kv)``, bottom-right aligned: query i (of the *last* l_q positions) may attend to key j iff
    ``j <= l_kv - l_q + i``. For ``l_q == l_kv`` the lower triangle; with a KV cache (l_q new queries after
    ``l_kv - l_q`` cached positions) each new query sees every cached key and itself. A query with ``l_kv - l_q + i
    < 0`` (possible when l_q > l_kv) sees no key.

    Book: part I, 'Scaled dot-product attention' (masks); part II, 'Autoregressive decoding and the KV cache'.
    """
    l_q, l_kv = check_int("l_q", l_q), check_int("l_kv", l_kv)
    return np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q)  # (l_q, l_kv)


def _with_causal(mask, is_causal, l_q, l_kv):
    """``mask`` and (when ``is_causal``) the causal mask, by logical and; None when neither."""
    if not _check_flag("is_causal", is_causal):
        return mask
    causal = causal_mask(l_q, l_kv)  # (l_q, l_kv), broadcasts against any mask
    return causal if mask is None else np.logical_and(mask, causal)


def _check_mask(mask, target_shape, target_desc):
    """A boolean mask broadcastable *to* ``target_shape`` (the weights' shape), or None."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"mask must be a boolean array (True = may attend), got dtype {mask.dtype}")
    try:
        broadcast = np.broadcast_shapes(mask.shape, target_shape)
    except ValueError:
        broadcast = None
    if broadcast != tuple(target_shape):
        raise ValueError(
            f"mask shape {mask.shape} is not broadcastable to the attention weights shape "
            f"{tuple(target_shape)} {target_desc}"
        )
    return mask


def _check_nonempty(name, arr):
    if 0 in arr.shape:
        raise ValueError(f"{name} has an empty axis (shape {arr.shape}); every axis must have length >= 1")


def _check_qkv(q, k, v):
    """Shapes for attention: q (..., L_q, d_k), k (..., L_kv, d_k), v (..., L_kv, d_v), leading axes broadcast."""
    q, k, v = (_as_float_array(n, a) for n, a in (("q", q), ("k", k), ("v", v)))
    for name, arr in (("q", q), ("k", k), ("v", v)):
        if arr.ndim < 2:
            raise ValueError(f"{name} must have at least 2 axes (..., L, d), got shape {arr.shape}")
        _check_nonempty(name, arr)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the last axis d_k: q shape {q.shape}, k shape {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must share the key axis L_kv: k shape {k.shape}, v shape {v.shape}")
    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(
            f"leading (batch) axes of q {q.shape}, k {k.shape}, v {v.shape} do not broadcast"
        ) from None
    return q, k, v, batch


def check_params(params, n_heads):
    """Check a ``params`` dict (the convention of the module docstring) for a layer with ``n_heads`` query heads.

    Returns ``(p, dims)``: ``p`` a new dict of float64 arrays (a bias given as None is left out) and ``dims`` the
    layer's :class:`Dims` (d_model, n_heads, n_kv_heads, head_dim), read from the shapes. TypeError/ValueError, naming
    the key and the shapes, for a missing or unexpected key, a non-numeric or non-finite entry, shapes that do not fit
    together, ``n_heads`` not dividing W_q's width, or ``n_kv_heads`` not dividing ``n_heads``. Every function of this
    module that takes ``params`` starts with it, and so does ``mha.convert``.
    """
    if not isinstance(params, dict):
        raise TypeError(
            f"params must be a dict with keys {_WEIGHT_KEYS} (+ optional biases), got {type(params).__name__}"
        )
    missing = [key for key in _WEIGHT_KEYS if key not in params]
    if missing:
        raise ValueError(
            f"params is missing key(s) {missing}; expected W_q, W_k, W_v, W_o (and optional b_q, b_k, b_v, b_o)"
        )
    unknown = sorted(set(params) - set(_WEIGHT_KEYS) - set(_BIAS_KEYS), key=repr)  # keys of any type
    if unknown:
        raise ValueError(f"params has unexpected key(s) {unknown}; allowed: {_WEIGHT_KEYS + _BIAS_KEYS}")
    p = {key: _as_float_array(f"params['{key}']", value) for key, value in params.items() if value is not None}
    for key in _WEIGHT_KEYS:
        if p[key].ndim != 2:
            raise ValueError(f"params['{key}'] must be a 2-D matrix, got shape {p[key].shape}")
        _check_nonempty(f"params['{key}']", p[key])
    d_model, q_width = p["W_q"].shape
    if p["W_k"].shape[0] != d_model:
        raise ValueError(
            f"params['W_k'] must have d_model = {d_model} rows (W_q.shape[0]), got shape {p['W_k'].shape}"
        )
    if p["W_v"].shape != p["W_k"].shape:
        raise ValueError(f"params['W_v'] shape {p['W_v'].shape} must equal params['W_k'] shape {p['W_k'].shape}")
    if p["W_o"].shape != (q_width, d_model):
        raise ValueError(
            f"params['W_o'] must have shape (h*head_dim, d_model) = {(q_width, d_model)}, got {p['W_o'].shape}"
        )
    n_heads = check_int("n_heads", n_heads)
    if q_width % n_heads:
        raise ValueError(
            f"n_heads = {n_heads} must divide W_q's width h*head_dim = {q_width} (params['W_q'] shape {p['W_q'].shape})"
        )
    head_dim = q_width // n_heads
    kv_width = p["W_k"].shape[1]
    if kv_width % head_dim:
        raise ValueError(
            f"n_kv_heads = W_k width / head_dim = {kv_width} / {head_dim} is not an integer "
            f"(params['W_k'] shape {p['W_k'].shape}, head_dim = W_q width {q_width} / n_heads {n_heads})"
        )
    n_kv_heads = kv_width // head_dim
    if n_heads % n_kv_heads:
        raise ValueError(
            f"n_kv_heads = {n_kv_heads} (W_k width {kv_width} / head_dim {head_dim}) must divide n_heads = {n_heads}"
        )
    bias_shapes = {"b_q": (q_width,), "b_k": (kv_width,), "b_v": (kv_width,), "b_o": (d_model,)}
    for key, shape in bias_shapes.items():
        if key in p and p[key].shape != shape:
            raise ValueError(f"params['{key}'] must have shape {shape}, got {p[key].shape}")
    return p, Dims(d_model, n_heads, n_kv_heads, head_dim)


def _check_mha_inputs(x_q, x_kv, params, n_heads, mask, is_causal=False):
    """All checks for the multi-head functions. Returns 3-D x_q, x_kv, params, dims, mask (the causal mask
    included), unbatched flag."""
    p, dims = check_params(params, n_heads)
    x_q = _as_float_array("x_q", x_q)
    if x_q.ndim not in (2, 3):
        raise ValueError(f"x_q must be 2-D (L, d_model) or 3-D (N, L, d_model), got shape {x_q.shape}")
    _check_nonempty("x_q", x_q)
    if x_kv is None:
        x_kv = x_q
    else:
        x_kv = _as_float_array("x_kv", x_kv)
        if x_kv.ndim != x_q.ndim:
            raise ValueError(
                f"x_kv must have the same rank as x_q ({x_q.ndim}-D, shape {x_q.shape}), got shape {x_kv.shape}"
            )
        _check_nonempty("x_kv", x_kv)
    for name, x in (("x_q", x_q), ("x_kv", x_kv)):
        if x.shape[-1] != dims.d_model:
            raise ValueError(
                f"{name} last dimension must be d_model = {dims.d_model} (params['W_q'].shape[0]), got shape {x.shape}"
            )
    if x_q.ndim == 3 and x_kv.shape[0] != x_q.shape[0]:
        raise ValueError(
            f"x_kv batch size {x_kv.shape[0]} must equal x_q batch size {x_q.shape[0]} "
            f"(x_q shape {x_q.shape}, x_kv shape {x_kv.shape})"
        )
    unbatched = x_q.ndim == 2
    if unbatched:
        target, desc = (dims.n_heads, x_q.shape[0], x_kv.shape[0]), "(h, L_q, L_kv)"
        x_q, x_kv = x_q[None], x_kv[None]  # (1, L, d_model)
    else:
        target, desc = (x_q.shape[0], dims.n_heads, x_q.shape[1], x_kv.shape[1]), "(N, h, L_q, L_kv)"
    mask = _check_mask(mask, target, desc)
    mask = _with_causal(mask, is_causal, x_q.shape[1], x_kv.shape[1])
    return x_q, x_kv, p, dims, mask, unbatched


# ---------------------------------------------------------------------------------------------------------------
# Softmax and scaled dot-product attention.
# ---------------------------------------------------------------------------------------------------------------


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


def _check_softmax_output(weights, grad_weights):
    """The checks of ``softmax_backward``: real finite arrays of one shape, with a non-empty last axis, and
    ``weights`` a (masked) softmax output along it: entries >= 0, each row summing to 1, or to 0 (fully masked).

    Those rows are exactly the outputs of a masked softmax (a row with entries > 0 summing to 1 is softmax(log A)),
    the only points where ``A * (dA - rowsum(dA * A))`` is a gradient. The sum may be off by ``max(1e-6, n eps)``
    (n = row length, eps of the input's float type: rounding of a float32 softmax of a long row).
    """
    raw = np.asarray(weights)
    A, dA = _as_float_array("weights", raw), _as_float_array("grad_weights", grad_weights)
    if A.ndim == 0:
        raise ValueError(f"weights must have at least 1 axis (..., n), got a scalar (shape {A.shape})")
    if A.shape != dA.shape:
        raise ValueError(f"grad_weights shape {dA.shape} must equal weights shape {A.shape}")
    if A.shape[-1] == 0:
        raise ValueError(f"softmax over an empty axis is undefined: weights has shape {A.shape}, last axis of length 0")
    rule = ("weights must be a softmax output along the last axis (entries >= 0, each row summing to 1, or to 0 "
            "for a fully masked row)")
    negative = np.argwhere(A < 0)
    if negative.size:
        index = tuple(int(i) for i in negative[0])
        raise ValueError(f"{rule}, but weights[{', '.join(map(str, index))}] = {A[index]:.6g} < 0")
    eps = np.finfo(raw.dtype if raw.dtype.kind == "f" else np.float64).eps
    tol = max(1e-6, A.shape[-1] * float(eps))
    sums = A.sum(axis=-1)  # (...,): one per row
    bad = np.flatnonzero((np.abs(sums - 1.0) > tol) & (sums != 0))  # flat row numbers (sums is 0-d for 1-D A)
    if bad.size:
        row = tuple(int(i) for i in np.unravel_index(bad[0], sums.shape))
        raise ValueError(f"{rule}, but weights[{', '.join(map(str, row + (':',)))}] sums to {sums[row]:.6g} "
                         f"(rows failing: {bad.size} of {sums.size}; tolerance {tol:.3g})")


def softmax_backward(weights, grad_weights):
    """Backward of softmax along the last axis: ``dS = A * (dA - sum_j(dA * A))``.

    From the Jacobian ``dA_i/dS_j = A_i (delta_ij - A_j)``. ``weights`` = A (the softmax output, last axis
    normalised), ``grad_weights`` = dL/dA, same shape. Masked entries (A = 0) and all-masked rows get zero gradient.
    The formula holds only at a softmax output, so ``weights`` is checked to be one (entries >= 0, rows summing to
    1 or, fully masked, to 0): the scores, or weights normalised along another axis, raise ValueError instead of
    giving a wrong gradient. TypeError for non-real data, ValueError for NaN/inf, a scalar or an empty last axis.

    Book: part II, 'The backward pass'.
    """
    _check_softmax_output(weights, grad_weights)
    A = np.asarray(weights, dtype=np.float64)
    dA = np.asarray(grad_weights, dtype=np.float64)
    return A * (dA - np.sum(dA * A, axis=-1, keepdims=True))


def _scores(q, k, scale):
    """``S = scale * q k^T``; refuses to continue if the product overflowed float64."""
    with np.errstate(over="ignore", invalid="ignore"):  # checked just below
        S = scale * (q @ np.swapaxes(k, -1, -2))  # (..., L_q, L_kv)
    if not np.all(np.isfinite(S)):
        raise ValueError("q @ k^T * scale overflowed float64 (non-finite scores); q and k are too large")
    return S


def _check_attention_args(q, k, v, mask, scale, is_causal=False):
    """Checks shared by the attention functions; returns float64 q, k, v, batch axes, mask (the causal mask
    included), scale."""
    q, k, v, batch = _check_qkv(q, k, v)
    scale = _check_scale(scale, q.shape[-1])
    mask = _check_mask(mask, batch + (q.shape[-2], k.shape[-2]), "(..., L_q, L_kv)")
    mask = _with_causal(mask, is_causal, q.shape[-2], k.shape[-2])
    return q, k, v, batch, mask, scale


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


def _sum_to_shape(grad, shape):
    """Sum ``grad`` over the axes that broadcasting added or stretched, so it has ``shape``."""
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra))) if extra else grad
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=stretched, keepdims=True) if stretched else grad


def scaled_dot_product_attention_grad(q, k, v, grad_out, mask=None, scale=None, is_causal=False):
    """Gradients of ``sum(out * grad_out)`` for ``out = softmax(scale q k^T) v``: returns ``(dq, dk, dv)``.

    With ``A = softmax(S)``, ``S = scale q k^T``, ``dO = grad_out``::

        dV = A^T dO            dA = dO V^T            dS = A * (dA - rowsum(dA * A))
        dQ = scale dS K        dK = scale dS^T Q

    Gradients of broadcast inputs are summed over the broadcast axes. Masked/all-masked rows contribute zero.

    Book: part II, 'The backward pass'.
    """
    q, k, v, batch, mask, scale = _check_attention_args(q, k, v, mask, scale, is_causal)
    dO = _as_float_array("grad_out", grad_out)
    expected = batch + (q.shape[-2], v.shape[-1])
    if dO.shape != expected:
        raise ValueError(f"grad_out shape {dO.shape} must equal the output shape {expected} (..., L_q, d_v)")
    _, A = _attention(q, k, v, mask, scale)  # (..., L_q, L_kv)
    dV = np.swapaxes(A, -1, -2) @ dO  # (..., L_kv, d_v)
    dS = softmax_backward(A, dO @ np.swapaxes(v, -1, -2))  # (..., L_q, L_kv)
    dQ = scale * (dS @ k)  # (..., L_q, d_k)
    dK = scale * (np.swapaxes(dS, -1, -2) @ q)  # (..., L_kv, d_k)
    return _sum_to_shape(dQ, q.shape), _sum_to_shape(dK, k.shape), _sum_to_shape(dV, v.shape)


# ---------------------------------------------------------------------------------------------------------------
# Multi-head attention: fused form, per-head form, backward.
# ---------------------------------------------------------------------------------------------------------------


def _linear(x, W, b=None):
    """``x W (+ b)``: row-vector convention."""
    y = x @ W
    return y if b is None else y + b


def _heads_array(y, shape_desc):
    """``y`` as a float64 array of rank ``len(shape_desc)``. NaN and inf are let through: the head helpers only move
    numbers, and a NaN moved is still the same NaN."""
    y = _as_float_array("y", y, finite=False)
    if y.ndim != len(shape_desc):
        raise ValueError(f"y must be {len(shape_desc)}-D ({', '.join(shape_desc)}), got shape {y.shape}")
    return y


def split_heads(y, n_heads):
    """``(N, L, n_heads*head_dim) -> (N, n_heads, L, head_dim)``: head i is column block i of ``y``.

    A reshape cuts each position's row into ``n_heads`` blocks of ``head_dim`` columns, ``(N, L, n_heads, head_dim)``;
    swapping axes 1 and 2 then puts the heads before the positions (Theorem multihead-thm-fused). Used with
    ``n_heads = h`` on the queries and ``n_heads = g`` on the keys and values (a view of ``y`` if it is float64).
    ``n_heads`` must be an integer >= 1 dividing ``y``'s last axis.

    Book: part I, 'From one head to h heads'.
    """
    y = _heads_array(y, ("N", "L", "n_heads*head_dim"))
    n_heads = check_int("n_heads", n_heads)
    N, L, width = y.shape
    if width % n_heads:
        raise ValueError(f"n_heads = {n_heads} must divide y's last axis n_heads*head_dim = {width} "
                         f"(y shape {y.shape})")
    head_dim = width // n_heads
    return y.reshape(N, L, n_heads, head_dim).transpose(0, 2, 1, 3)  # (N, L, n, head_dim) -> (N, n, L, head_dim)


def merge_heads(y):
    """``(N, n_heads, L, head_dim) -> (N, L, n_heads*head_dim)``: the concatenation of the heads, the inverse of
    :func:`split_heads` (head i's output fills column block i).

    Book: part I, 'From one head to h heads' (Eq. multihead-output).
    """
    y = _heads_array(y, ("N", "n_heads", "L", "head_dim"))
    N, n_heads, L, head_dim = y.shape
    return y.transpose(0, 2, 1, 3).reshape(N, L, n_heads * head_dim)  # (N, L, n, head_dim) -> (N, L, n*head_dim)


def repeat_kv(y, n_rep):
    """``(N, g, L, head_dim) -> (N, g*n_rep, L, head_dim)``: each key/value head copied to the ``n_rep = h/g`` query
    heads of its group, in place, so that query head j reads key/value head ``j // n_rep`` (``np.repeat``, not
    ``np.tile``). ``n_rep`` must be an integer >= 1; ``n_rep = 1`` (MHA) returns a copy.

    Book: part II, 'MQA and GQA' (Eq. gqa-map).
    """
    y = _heads_array(y, ("N", "g", "L", "head_dim"))
    n_rep = check_int("n_rep", n_rep)
    return np.repeat(y, n_rep, axis=1)  # (N, h, L, head_dim)


def _project(x_q, x_kv, p, dims):
    """Q, K, V of every head: (N, h, L_q, head_dim), (N, g, L_kv, head_dim), (N, g, L_kv, head_dim)."""
    q = split_heads(_linear(x_q, p["W_q"], p.get("b_q")), dims.n_heads)  # (N, h, L_q, head_dim)
    k = split_heads(_linear(x_kv, p["W_k"], p.get("b_k")), dims.n_kv_heads)  # (N, g, L_kv, head_dim)
    v = split_heads(_linear(x_kv, p["W_v"], p.get("b_v")), dims.n_kv_heads)  # (N, g, L_kv, head_dim)
    return q, k, v


def multi_head_attention(x_q, x_kv, params, n_heads, mask=None, is_causal=False, need_weights=True):
    """``MultiHead(X_q, X_kv) = Concat(head_1, ..., head_h) W^O + b^O``, ``head_i = Attention(Q_i, K_i, V_i)``.

    Fused form: one projection per Q/K/V, reshaped to ``(N, h, L, head_dim)``; with GQA each key/value head is
    repeated for the ``h/g`` query heads of its group (query head j uses kv head ``j // (h/g)``).

    x_q ``(N, L_q, d_model)`` or ``(L_q, d_model)``; x_kv the same rank, or None for self-attention (x_kv = x_q).
    ``mask`` boolean, True = may attend, broadcastable to ``(N, h, L_q, L_kv)`` (``(h, L_q, L_kv)`` for 2-D input),
    so ``(L_q, L_kv)`` causal and ``(N, 1, 1, L_kv)`` padding masks both work; ``is_causal=True`` adds the
    bottom-right aligned causal mask. Returns ``(out (N, L_q, d_model), weights (N, h, L_q, L_kv))``, without the N
    axis for 2-D input; ``weights`` is None with ``need_weights=False`` (as ``mha.MultiHeadAttention``).
    All-masked query rows give zero weights; their output row is ``b_o`` (zero before the output projection).

    Book: part I, 'From one head to h heads'; GQA/MQA: part II, 'MQA and GQA'.
    """
    x_q, x_kv, p, dims, mask, unbatched = _check_mha_inputs(x_q, x_kv, params, n_heads, mask, is_causal)
    need_weights = _check_flag("need_weights", need_weights)
    q, k, v = _project(x_q, x_kv, p, dims)
    n_rep = dims.n_heads // dims.n_kv_heads  # query heads per key/value head
    heads, weights = scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask)
    out = _linear(merge_heads(heads), p["W_o"], p.get("b_o"))  # (N, L_q, d_model)
    if unbatched:
        out, weights = out[0], weights[0]
    return out, weights if need_weights else None


def head_weights(params, n_heads):
    """The per-head matrices hidden in the fused ones: a list with one dict per query head i.

    Each dict has ``W_q_i = W_q[:, i*head_dim:(i+1)*head_dim]``, ``W_k_i``/``W_v_i`` = the columns of key/value head
    ``kv_head = i // (h/g)``, ``W_o_i = W_o[i*head_dim:(i+1)*head_dim, :]`` (row block i of W_o), the matching bias
    slices ``b_q_i``, ``b_k_i``, ``b_v_i`` (None when params has no such bias) and ``kv_head`` (an int).
    ``b_o`` is not per head: it is added once after the sum over heads. Arrays are views (float64).

    Book: part I, 'From one head to h heads'.
    """
    p, dims = check_params(params, n_heads)
    head_dim, n_rep = dims.head_dim, dims.n_heads // dims.n_kv_heads

    def block(j):  # columns (or bias entries) of head j
        return slice(j * head_dim, (j + 1) * head_dim)

    def bias(key, j):
        return p[key][block(j)] if key in p else None

    heads = []
    for i in range(dims.n_heads):
        kv = i // n_rep  # the key/value head that query head i reads
        heads.append(
            {
                "W_q_i": p["W_q"][:, block(i)],  # (d_model, head_dim)
                "W_k_i": p["W_k"][:, block(kv)],  # (d_model, head_dim)
                "W_v_i": p["W_v"][:, block(kv)],  # (d_model, head_dim)
                "W_o_i": p["W_o"][block(i), :],  # (head_dim, d_model): row block i
                "b_q_i": bias("b_q", i),
                "b_k_i": bias("b_k", kv),
                "b_v_i": bias("b_v", kv),
                "kv_head": kv,
            }
        )
    return heads


def multi_head_attention_per_head(x_q, x_kv, params, n_heads, mask=None, is_causal=False, need_weights=True):
    """The literal per-head form: ``out = sum_i Attention(X_q W_i^Q, X_kv W_i^K, X_kv W_i^V) W_i^O + b^O``.

    A Python loop over heads with the separate matrices of ``head_weights``. Concatenating heads and multiplying by
    W^O equals summing ``head_i W_i^O`` over the row blocks W_i^O of W^O, so this equals ``multi_head_attention``
    (same arguments, same return shapes); the book proves it, the tests check it.

    Book: part I, 'From one head to h heads'.
    """
    x_q, x_kv, p, dims, mask, unbatched = _check_mha_inputs(x_q, x_kv, params, n_heads, mask, is_causal)
    need_weights = _check_flag("need_weights", need_weights)
    N, L_q, L_kv = x_q.shape[0], x_q.shape[1], x_kv.shape[1]
    if mask is not None:
        mask = np.broadcast_to(mask, (N, dims.n_heads, L_q, L_kv))  # (N, h, L_q, L_kv)
    out = np.zeros((N, L_q, dims.d_model))
    weights = np.zeros((N, dims.n_heads, L_q, L_kv))
    for i, head in enumerate(head_weights(p, n_heads)):
        q_i = _linear(x_q, head["W_q_i"], head["b_q_i"])  # (N, L_q, head_dim)
        k_i = _linear(x_kv, head["W_k_i"], head["b_k_i"])  # (N, L_kv, head_dim)
        v_i = _linear(x_kv, head["W_v_i"], head["b_v_i"])  # (N, L_kv, head_dim)
        head_i, weights[:, i] = scaled_dot_product_attention(q_i, k_i, v_i, None if mask is None else mask[:, i])
        out += head_i @ head["W_o_i"]  # (N, L_q, d_model)
    if "b_o" in p:
        out += p["b_o"]
    if unbatched:
        out, weights = out[0], weights[0]
    return out, weights if need_weights else None


def multi_head_attention_grad(x_q, x_kv, params, n_heads, grad_out, mask=None, is_causal=False):
    """Hand-derived gradients of ``sum(multi_head_attention(...)[0] * grad_out)``.

    Returns a dict with ``'x_q'``, ``'x_kv'`` and one entry per key of ``params`` (same shapes as the inputs; a bias
    given as None counts as absent and gets no entry).
    Chain rule, from the output back (dO = grad_out, M = the concatenated heads)::

        dW_o = M^T dO, db_o = sum dO, dM = dO W_o^T      -> per-head dO_i (reshape)
        (dQ_i, dK_i, dV_i) = scaled_dot_product_attention_grad(...)
        GQA: dK, dV of a shared kv head = sum over the h/g query heads of its group
        dW_q = X_q^T dQ, db_q = sum dQ, dX_q = dQ W_q^T  (same for K, V with X_kv)

    Self-attention (``x_kv is None``): ``'x_q'`` is the *total* gradient wrt x (query path + key/value path) and
    ``'x_kv'`` is None. All-masked query rows contribute zero gradient through attention.
    No autograd: every step is written out. Book: part II, 'The backward pass' (and 'MQA and GQA').
    """
    self_attention = x_kv is None
    x_q, x_kv, p, dims, mask, unbatched = _check_mha_inputs(x_q, x_kv, params, n_heads, mask, is_causal)
    N, L_q = x_q.shape[:2]
    dO = _as_float_array("grad_out", grad_out)
    expected = (L_q, dims.d_model) if unbatched else (N, L_q, dims.d_model)
    if dO.shape != expected:
        raise ValueError(f"grad_out shape {dO.shape} must equal the output shape {expected}")
    dO = dO.reshape(N, L_q, dims.d_model)  # (N, L_q, d_model)

    q, k, v = _project(x_q, x_kv, p, dims)
    n_rep = dims.n_heads // dims.n_kv_heads  # query heads per key/value head
    heads, _ = scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask)
    M = merge_heads(heads)  # (N, L_q, h*head_dim)

    grads = {"W_o": np.einsum("nlc,nld->cd", M, dO)}
    dM = dO @ p["W_o"].T  # (N, L_q, h*head_dim)
    dq, dk_rep, dv_rep = scaled_dot_product_attention_grad(
        q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), split_heads(dM, dims.n_heads), mask
    )
    # (N, h, L_kv, head_dim) -> (N, g, h/g, L_kv, head_dim), summed over the query heads sharing each kv head.
    dk = dk_rep.reshape(N, dims.n_kv_heads, n_rep, *dk_rep.shape[2:]).sum(axis=2)  # (N, g, L_kv, head_dim)
    dv = dv_rep.reshape(N, dims.n_kv_heads, n_rep, *dv_rep.shape[2:]).sum(axis=2)  # (N, g, L_kv, head_dim)

    dx_q = dx_kv = 0.0
    for name, x, d_heads in (("q", x_q, dq), ("k", x_kv, dk), ("v", x_kv, dv)):
        dY = merge_heads(d_heads)  # (N, L, n*head_dim)
        grads[f"W_{name}"] = np.einsum("nld,nlc->dc", x, dY)
        if f"b_{name}" in p:
            grads[f"b_{name}"] = dY.sum(axis=(0, 1))
        dx = dY @ p[f"W_{name}"].T  # (N, L, d_model)
        if name == "q":
            dx_q = dx
        else:
            dx_kv = dx_kv + dx
    if "b_o" in p:
        grads["b_o"] = dO.sum(axis=(0, 1))

    if self_attention:
        dx_q, dx_kv = dx_q + dx_kv, None
    if unbatched:
        dx_q = dx_q[0]
        dx_kv = None if dx_kv is None else dx_kv[0]
    grads["x_q"], grads["x_kv"] = dx_q, dx_kv
    return grads


# ---------------------------------------------------------------------------------------------------------------
# Online softmax (the FlashAttention recurrence).
# ---------------------------------------------------------------------------------------------------------------


def _normalise(acc, l):
    """``acc / l``, and 0 where ``l = 0`` (rows with no allowed key)."""
    return np.divide(acc, l, out=np.zeros_like(acc), where=l > 0)  # (..., L_q, d_v)


def _row_state(m, l):
    """The per-row statistics of the online softmax as (..., L_q) arrays: m, l and lse = m + log l (-inf if l = 0)."""
    lse = np.full_like(l, -np.inf)
    np.log(l, out=lse, where=l > 0)
    return {"m": m[..., 0].copy(), "l": l[..., 0].copy(), "lse": (m + lse)[..., 0]}


def online_softmax_attention(q, k, v, block_size, mask=None, scale=None, is_causal=False, return_stats=False,
                             return_state=False, keep_history=False):
    """Exact attention without the L_q x L_kv matrix: keys/values visited in blocks of ``block_size``.

    Running row max ``m``, running normaliser ``l`` and un-normalised accumulator ``acc``; for each key block B::

        S_B = scale q K_B^T            m' = max(m, rowmax(S_B))         P = exp(S_B - m')
        l' = exp(m - m') l + rowsum(P)                 acc' = exp(m - m') acc + P V_B

    and finally ``out = acc / l``. Same arguments and conventions as ``scaled_dot_product_attention`` (``mask``,
    ``scale``, ``is_causal``) plus
    ``block_size`` (integer >= 1; larger than L_kv means a single block). Returns ``out`` only (the weights are
    exactly what this form never stores). All-masked query rows give a zero output row. Equal to the naive form to
    float64 rounding.

    With ``return_stats=True`` returns ``(out, stats)`` where ``stats`` counts float64 elements:
    ``'max_block_elements'`` = the largest score block held at once (``batch * L_q * min(block_size, L_kv)``),
    ``'full_matrix_elements'`` = what the naive form materialises (``batch * L_q * L_kv``), ``'n_blocks'``, and
    ``'state_elements'`` = the running state ``m``, ``l``, ``acc`` (``batch * L_q * (2 + d_v)``).

    With ``return_state=True`` returns ``(out, state)`` (``(out, stats, state)`` if both flags are set), where
    ``state`` is a dict of the final per-row statistics, each of shape ``(..., L_q)`` (the broadcast batch axes,
    then one entry per query row):

    * ``'m'``: the row maximum of the allowed scaled scores, ``max_j s_j``;
    * ``'l'``: the normaliser ``sum_j exp(s_j - m)`` (>= 1 for a row with at least one allowed key);
    * ``'lse'``: the logsumexp ``m + log l = log sum_j exp(s_j)``, the one number per row that FlashAttention keeps
      for its backward pass (the weights are ``exp(s_j - lse)``);
    * ``'history'``: ``None``, or with ``keep_history=True`` a list with one dict per key block, in order, holding
      the state after that block: ``'stop'`` (number of keys seen so far), ``'m'``, ``'l'``, ``'lse'`` (shape
      ``(..., L_q)``), ``'alpha'`` = ``exp(m_before - m_after)``, the factor that rescaled the old state
      (``(..., L_q)``; 0 while the old state is empty, as in the first block), and ``'out'`` = ``acc / l``, the
      attention output over the keys seen so far (``(..., L_q, d_v)``). The last entry equals the final state.
      The history costs ``n_blocks`` copies of the state: it is for displaying the recurrence on small inputs,
      not for long sequences.

    Fully masked rows (and, in the history, rows with no allowed key among the keys seen so far): ``m = -inf``,
    ``l = 0``, ``lse = -inf``, output 0 (the empty-state conventions; no NaN, no warning).
    ``keep_history=True`` requires ``return_state=True``; the three flags must be True or False (TypeError).

    Book: part II, 'Exact attention without the L × L matrix (online softmax)'.
    """
    q, k, v, batch, mask, scale = _check_attention_args(q, k, v, mask, scale, is_causal)
    block_size = check_int("block_size", block_size)
    return_stats = _check_flag("return_stats", return_stats)
    return_state = _check_flag("return_state", return_state)
    keep_history = _check_flag("keep_history", keep_history)
    if keep_history and not return_state:
        raise ValueError("keep_history=True requires return_state=True (the history is returned inside the state)")
    l_q, l_kv, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    if mask is not None:
        mask = np.broadcast_to(mask, batch + (l_q, l_kv))  # a view: (..., L_q, L_kv), nothing materialised

    m = np.full(batch + (l_q, 1), -np.inf)  # running row max
    l = np.zeros(batch + (l_q, 1))  # running sum of exp(s - m)
    acc = np.zeros(batch + (l_q, d_v))  # running sum of exp(s - m) v
    max_block, n_blocks = 0, 0
    history = [] if keep_history else None
    for start in range(0, l_kv, block_size):
        stop = min(start + block_size, l_kv)
        s = _scores(q, k[..., start:stop, :], scale)  # (..., L_q, B)
        if mask is not None:
            s = np.where(mask[..., start:stop], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isfinite(m_new), m_new, 0.0)  # rows with nothing allowed yet: exp(-inf) = 0 anyway
        with np.errstate(over="ignore", under="ignore"):  # exponents <= 0: results in [0, 1], underflow -> 0
            p = np.exp(s - shift)  # (..., L_q, B)
            alpha = np.exp(m - shift)  # rescales the old state to the new max
        l = alpha * l + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + p @ v[..., start:stop, :]
        m = m_new
        max_block, n_blocks = max(max_block, s.size), n_blocks + 1
        if keep_history:
            history.append({"stop": stop, **_row_state(m, l), "alpha": alpha[..., 0].copy(), "out": _normalise(acc, l)})
    out = _normalise(acc, l)  # (..., L_q, d_v)
    results = (out,)
    if return_stats:
        n_batch = int(np.prod(batch, dtype=np.int64))
        results += ({
            "max_block_elements": max_block,
            "full_matrix_elements": n_batch * l_q * l_kv,
            "n_blocks": n_blocks,
            "state_elements": n_batch * l_q * (2 + d_v),
        },)
    if return_state:
        results += ({**_row_state(m, l), "history": history},)
    return results[0] if len(results) == 1 else results


# ---------------------------------------------------------------------------------------------------------------
# Parameters.
# ---------------------------------------------------------------------------------------------------------------


def _check_seed(seed):
    """An int >= 0 (reproducible draws), None (fresh entropy) or a ``np.random.Generator`` (drawn from)."""
    expected = "an integer >= 0, None or a numpy Generator"
    if seed is None or isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be {expected}, got {seed!r} of type {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be {expected}, got {seed}")
    return int(seed)


def init_params(d_model, n_heads, n_kv_heads=None, head_dim=None, bias=True, seed=0):
    """Random parameters in the dict convention: entries ~ N(0, 1/fan_in), biases ~ N(0, 0.1^2) (or absent).

    ``n_kv_heads`` defaults to ``n_heads`` (MHA); ``head_dim`` to ``d_model // n_heads``. ``bias`` is True or False
    (TypeError otherwise); ``seed`` an int >= 0, None (not reproducible) or a ``np.random.Generator`` (drawn from,
    so it advances). For examples and tests.

    Book: part I, 'From one head to h heads'.
    """
    d_model, n_heads, n_kv_heads, head_dim = head_shape(d_model, n_heads, n_kv_heads, head_dim)
    bias, seed = _check_flag("bias", bias), _check_seed(seed)
    rng = np.random.default_rng(seed)
    q_width, kv_width = n_heads * head_dim, n_kv_heads * head_dim
    shapes = {
        "W_q": (d_model, q_width), "W_k": (d_model, kv_width), "W_v": (d_model, kv_width), "W_o": (q_width, d_model),
    }
    params = {key: rng.standard_normal(shape) / math.sqrt(shape[0]) for key, shape in shapes.items()}
    if bias:
        for key, width in (("b_q", q_width), ("b_k", kv_width), ("b_v", kv_width), ("b_o", d_model)):
            params[key] = 0.1 * rng.standard_normal(width)
    return params
