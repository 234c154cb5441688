"""Multi-head attention: the head helpers (``split_heads``, ``merge_heads``, ``repeat_kv``), the fused layer
(MHA, GQA, MQA), its per-head loop form, the per-head matrices hidden in the fused ones, and random parameters.

Book: part I, 'From one head to h heads'; part II, 'MQA and GQA'.
"""

from __future__ import annotations

import math

import numpy as np

from mha._checks import check_int, head_shape
from mha.reference.checks import _check_flag, _check_mha_inputs, _check_seed, _heads_array, check_params
from mha.reference.scaled_dot_product import scaled_dot_product_attention


def _linear(x, W, b=None):
    """``x W (+ b)``: row-vector convention."""
    y = x @ W
    return y if b is None else y + b


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
