"""The backward pass, derived by hand (no autograd): softmax, scaled dot-product attention, multi-head attention.

Book: part II, 'The backward pass' (and 'MQA and GQA' for the gradients of shared key/value heads).
"""

from __future__ import annotations

import numpy as np

from mha.reference.checks import _as_float_array, _check_attention_args, _check_mha_inputs, _check_softmax_output
from mha.reference.multi_head import _project, merge_heads, repeat_kv, split_heads
from mha.reference.scaled_dot_product import _attention, scaled_dot_product_attention


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
