"""The backward pass, derived by hand (no autograd): softmax, scaled dot-product attention, multi-head attention,
and the parts of today's models (soft-capping, sinks, QK-norm, RoPE, partial RoPE, output gates; the backward
passes of RMSNorm and RoPE are in ``norms`` and ``rope``).

Book: part II, 'The backward pass' (and 'MQA and GQA' for the gradients of shared key/value heads); part IV,
'Attention in today's models'.
"""

from __future__ import annotations

import numpy as np

from mha.reference.checks import (_as_float_array, _check_attention_args, _check_core_extras, _check_layer_extras,
                                  _check_mha_inputs, _check_softmax_output)
from mha.reference.multi_head import _gate_heads, _project, _qk_norm_rope, merge_heads, repeat_kv, split_heads
from mha.reference.norms import _rms_norm_grad
from mha.reference.rope import _rotate
from mha.reference.scaled_dot_product import (_attention, _capped_scores, _masked_softmax, _sink_softmax,
                                              scaled_dot_product_attention)


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


def _attention_grad_general(q, k, v, dO, mask, scale, softcap, sinks):
    """``(dq, dk, dv[, d_sinks])`` of ``_attention_general`` on checked inputs (derivation in
    ``scaled_dot_product_attention_grad``)."""
    S = _capped_scores(q, k, scale, softcap)  # (..., L_q, L_kv)
    A, p_sink = (_masked_softmax(S, mask), None) if sinks is None else _sink_softmax(S, mask, sinks)
    dV = np.swapaxes(A, -1, -2) @ dO  # (..., L_kv, d_v)
    dA = dO @ np.swapaxes(v, -1, -2)  # (..., L_q, L_kv)
    D = np.sum(dA * A, axis=-1, keepdims=True)  # (..., L_q, 1): dO_i . O_i (the sink's value is zero)
    dS = A * (dA - D)  # the softmax VJP over the row and its sink (whose upstream gradient is 0)
    if softcap is not None:
        dS = dS * (1.0 - (S / softcap) ** 2)  # S = c tanh(R / c): dS/dR = 1 - tanh^2(R / c)
    dQ = scale * (dS @ k)  # (..., L_q, d_k)
    dK = scale * (np.swapaxes(dS, -1, -2) @ q)  # (..., L_kv, d_k)
    grads = (_sum_to_shape(dQ, q.shape), _sum_to_shape(dK, k.shape), _sum_to_shape(dV, v.shape))
    if sinks is None:
        return grads
    d_sink_rows = -p_sink * D[..., 0]  # (..., L_q): d sink = p_sink (0 - D_i) for row i
    return grads + (_sum_to_shape(d_sink_rows.sum(axis=-1), sinks.shape),)


def scaled_dot_product_attention_grad(q, k, v, grad_out, mask=None, scale=None, is_causal=False, *, sinks=None,
                                      window=None, softcap=None):
    """Gradients of ``sum(out * grad_out)`` for ``out = softmax(scale q k^T) v``: returns ``(dq, dk, dv)``.

    With ``A = softmax(S)``, ``S = scale q k^T``, ``dO = grad_out``::

        dV = A^T dO            dA = dO V^T            dS = A * (dA - rowsum(dA * A))
        dQ = scale dS K        dK = scale dS^T Q

    Gradients of broadcast inputs are summed over the broadcast axes. Masked/all-masked rows contribute zero.

    The keywords of ``scaled_dot_product_attention`` (``window``, ``softcap``, ``sinks``) are taken too, and with
    ``sinks`` the result is ``(dq, dk, dv, d_sinks)``, d_sinks of the shape of ``sinks``. ``window`` is only a mask.
    With ``R = scale q k^T`` and a cap c, ``S = c tanh(R / c)``; for row i with sink logit s, ``Z_i = sum_j
    exp(S_ij) + exp(s)``, ``A_ij = exp(S_ij) / Z_i``, ``p_i = exp(s) / Z_i`` and ``O_i = sum_j A_ij V_j`` (the sink
    is a column with a zero value vector)::

        D_i = rowsum(dA * A)_i = dO_i . O_i
        dS  = A * (dA - D)                 the softmax VJP over the row and its sink column; that column's upstream
                                           gradient dO_i . 0 is 0, so it adds nothing to D
        d s = sum_i p_i (0 - D_i) = - sum_i p_i (dO_i . O_i)     summed over every row sharing the sink (for (h,)
                                           sinks: the batch and the query positions of head h)
        dR  = dS * (1 - tanh^2(R / c)) = dS * (1 - (S / c)^2)      (d/dR of c tanh(R / c))
        dQ  = scale dR K                   dK = scale dR^T Q        dV = A^T dO

    Without a cap ``dR = dS``; without sinks ``p = 0`` and the rows sum to 1: the formulas above. A row with no
    allowed key has ``A = 0``, ``O = 0``, so it contributes nothing, to d_sinks either.

    Book: part II, 'The backward pass'; part IV, 'Attention in today's models'.
    """
    q, k, v, batch, mask, scale = _check_attention_args(q, k, v, mask, scale, is_causal)
    mask, sinks, softcap = _check_core_extras(batch, q.shape[-2], k.shape[-2], mask, sinks, window, softcap)
    dO = _as_float_array("grad_out", grad_out)
    expected = batch + (q.shape[-2], v.shape[-1])
    if dO.shape != expected:
        raise ValueError(f"grad_out shape {dO.shape} must equal the output shape {expected} (..., L_q, d_v)")
    if sinks is not None or softcap is not None:
        return _attention_grad_general(q, k, v, dO, mask, scale, softcap, sinks)
    _, A = _attention(q, k, v, mask, scale)  # (..., L_q, L_kv)
    dV = np.swapaxes(A, -1, -2) @ dO  # (..., L_kv, d_v)
    dS = softmax_backward(A, dO @ np.swapaxes(v, -1, -2))  # (..., L_q, L_kv)
    dQ = scale * (dS @ k)  # (..., L_q, d_k)
    dK = scale * (np.swapaxes(dS, -1, -2) @ q)  # (..., L_kv, d_k)
    return _sum_to_shape(dQ, q.shape), _sum_to_shape(dK, k.shape), _sum_to_shape(dV, v.shape)


def _qk_norm_rope_grad(q, k, dq, dk, p, opts, grads):
    """Back through ``_qk_norm_rope``: ``q``, ``k`` are its inputs (the projections, split into heads), ``dq``,
    ``dk`` the gradients of its outputs. RoPE backward is the rotation by the opposite angles; RMSNorm backward is
    ``rms_norm_backward``'s formula, its weight gradients summed over batch, heads and positions go to ``grads``."""
    if opts.rope_base is not None:  # partial RoPE: the unrotated coordinates' gradients pass through
        dq = _rotate(dq, opts.positions_q, opts.rope_base, opts.rope_style, inverse=True, rope_dim=opts.rope_dim)
        dk = _rotate(dk, opts.positions_kv, opts.rope_base, opts.rope_style, inverse=True, rope_dim=opts.rope_dim)
    if "q_norm" in p:
        dq, grads["q_norm"] = _rms_norm_grad(q, p["q_norm"], dq, opts.eps)
        dk, grads["k_norm"] = _rms_norm_grad(k, p["k_norm"], dk, opts.eps)
    return dq, dk


def _gate_grad(x_q, p, dims, heads, d_gated, grads):
    """Back through ``Z = Y * G``, ``G = sigmoid(A)``, ``A = x_q W_gate + b_gate`` (Y = ``heads`` (N, h, L_q,
    head_dim), the attention's output; ``d_gated`` = dZ). Returns ``(dY, dx_q)`` and puts ``W_gate``, ``b_gate``
    into ``grads``::

        dY = dZ * G                      dG = dZ * Y, summed over head_dim for a headwise gate (G broadcast there)
        dA = dG * G (1 - G)              (sigmoid' = sigmoid (1 - sigmoid))
        dW_gate = X_q^T dA, db_gate = sum dA, dX_q = dA W_gate^T    (dA merged back to (N, L_q, width))
    """
    G = _gate_heads(x_q, p, dims)  # (N, h, L_q, 1) headwise, (N, h, L_q, head_dim) elementwise
    dG = d_gated * heads
    if G.shape[-1] == 1:  # headwise: one G per head and query, broadcast over head_dim
        dG = dG.sum(axis=-1, keepdims=True)  # (N, h, L_q, 1)
    dA = merge_heads(dG * G * (1.0 - G))  # (N, L_q, h) or (N, L_q, h*head_dim), A's layout
    grads["W_gate"] = np.einsum("nlc,nld->cd", x_q, dA)
    if "b_gate" in p:
        grads["b_gate"] = dA.sum(axis=(0, 1))
    return d_gated * G, dA @ p["W_gate"].T


def multi_head_attention_grad(x_q, x_kv, params, n_heads, grad_out, mask=None, is_causal=False, *, positions=None,
                              rope_base=None, rope_style="half", window=None, softcap=None, qk_norm_eps=1e-6,
                              scale=None, gate=None, rope_dim=None):
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

    The keywords of today's models are those of ``multi_head_attention``, with the same checks. Their steps, in
    reverse: the core's gradient with ``softcap`` and ``sinks`` (``scaled_dot_product_attention_grad``: the entry
    ``'sinks'``, one per query head, summed over the batch and the positions); then, per head and before the GQA
    sum is used, back through RoPE (the rotation by the opposite angles, applied to dQ and to the summed dK) and
    QK-norm (``rms_norm_backward``: the entries ``'q_norm'``, ``'k_norm'``, summed over batch, heads and positions),
    and on to the projections as above. Partial RoPE (``rope_dim``) rotates back the first rope_dim coordinates and
    passes the others' gradients through. Book: part IV, 'Attention in today's models'.

    The output gate (``gate``; ``Z_i = Y_i * G_i``, ``G = sigmoid(A)``, ``A = X_q W_gate + b_gate``) comes first on
    the way back, between dM and the core::

        dY_i = dZ_i * G_i                (what the core's backward receives)
        dG_i = dZ_i * Y_i                (headwise: summed over head_dim, where G_i was broadcast)
        dA = dG * G (1 - G)              dW_gate = X_q^T dA, db_gate = sum dA, dX_q += dA W_gate^T

    so x_q gets a third path (the gate's), besides the queries' and, in self-attention, the keys' and values'.
    """
    self_attention = x_kv is None
    x_q, x_kv, p, dims, mask, unbatched = _check_mha_inputs(x_q, x_kv, params, n_heads, mask, is_causal)
    opts, mask = _check_layer_extras(self_attention, x_q, x_kv, p, dims, mask, unbatched, positions, rope_base,
                                     rope_style, window, softcap, qk_norm_eps, scale, gate, rope_dim)
    N, L_q = x_q.shape[:2]
    dO = _as_float_array("grad_out", grad_out)
    expected = (L_q, dims.d_model) if unbatched else (N, L_q, dims.d_model)
    if dO.shape != expected:
        raise ValueError(f"grad_out shape {dO.shape} must equal the output shape {expected}")
    dO = dO.reshape(N, L_q, dims.d_model)  # (N, L_q, d_model)

    q, k, v = _project(x_q, x_kv, p, dims)
    q_proj, k_proj = q, k  # before QK-norm and RoPE, whose backward reads them
    q, k = _qk_norm_rope(q_proj, k_proj, p, opts)  # unchanged when both are off
    n_rep = dims.n_heads // dims.n_kv_heads  # query heads per key/value head
    heads, _ = scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask, **opts.sdpa)
    gated = heads if opts.gate is None else heads * _gate_heads(x_q, p, dims)  # (N, h, L_q, head_dim)
    M = merge_heads(gated)  # (N, L_q, h*head_dim)

    grads = {"W_o": np.einsum("nlc,nld->cd", M, dO)}
    dM = dO @ p["W_o"].T  # (N, L_q, h*head_dim)
    d_heads, dx_gate = split_heads(dM, dims.n_heads), 0.0  # (N, h, L_q, head_dim)
    if opts.gate is not None:  # back through the gate: dY, and the gate's own path to x_q
        d_heads, dx_gate = _gate_grad(x_q, p, dims, heads, d_heads, grads)
    dq, dk_rep, dv_rep, *d_sinks = scaled_dot_product_attention_grad(
        q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), d_heads, mask, **opts.sdpa
    )  # d_sinks = [dL/d sinks, shape (h,)] when params has sinks, else []
    if d_sinks:
        grads["sinks"] = d_sinks[0]
    # (N, h, L_kv, head_dim) -> (N, g, h/g, L_kv, head_dim), summed over the query heads sharing each kv head.
    dk = dk_rep.reshape(N, dims.n_kv_heads, n_rep, *dk_rep.shape[2:]).sum(axis=2)  # (N, g, L_kv, head_dim)
    dv = dv_rep.reshape(N, dims.n_kv_heads, n_rep, *dv_rep.shape[2:]).sum(axis=2)  # (N, g, L_kv, head_dim)
    dq, dk = _qk_norm_rope_grad(q_proj, k_proj, dq, dk, p, opts, grads)  # back through RoPE, then QK-norm

    dx_q = dx_kv = 0.0
    for name, x, d_heads in (("q", x_q, dq), ("k", x_kv, dk), ("v", x_kv, dv)):
        dY = merge_heads(d_heads)  # (N, L, n*head_dim)
        grads[f"W_{name}"] = np.einsum("nld,nlc->dc", x, dY)
        if f"b_{name}" in p:
            grads[f"b_{name}"] = dY.sum(axis=(0, 1))
        dx = dY @ p[f"W_{name}"].T  # (N, L, d_model)
        if name == "q":
            dx_q = dx + dx_gate  # the queries' path and the gate's (0.0 without a gate)
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
