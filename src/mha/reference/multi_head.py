"""Multi-head attention: the head helpers (``split_heads``, ``merge_heads``, ``repeat_kv``), the fused layer
(MHA, GQA, MQA; with the parts of today's models: QK-norm, RoPE, sliding windows, soft-capping, sinks, gates), its
per-head loop form, the per-head matrices hidden in the fused ones, and random parameters.

Book: part I, 'From one head to h heads'; part IV, 'Attention in today's models'; part II, 'MQA and GQA'.
"""

from __future__ import annotations

import math

import numpy as np

from mha._checks import check_choice, check_int, head_shape
from mha.reference.checks import (_EXTRA_KEYS, GATES, _check_flag, _check_layer_extras, _check_mha_inputs,
                                  _check_seed, _heads_array, check_params)
from mha.reference.norms import _rms_norm
from mha.reference.rope import _rotate
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


def _qk_norm_rope(q, k, p, opts):
    """QK-norm (when params has q_norm and k_norm: RMSNorm over head_dim, one weight shared by all heads), then RoPE
    (when ``opts.rope_base`` is set) on the heads q (N, h, L_q, head_dim) and k (N, g, L_kv, head_dim); v is never
    touched. Returns q and k themselves when both are off."""
    if "q_norm" in p:
        q, k = _rms_norm(q, p["q_norm"], opts.eps), _rms_norm(k, p["k_norm"], opts.eps)
    if opts.rope_base is not None:
        q = _rotate(q, opts.positions_q, opts.rope_base, opts.rope_style, rope_dim=opts.rope_dim)
        k = _rotate(k, opts.positions_kv, opts.rope_base, opts.rope_style, rope_dim=opts.rope_dim)
    return q, k


def _sigmoid(a):
    """``1 / (1 + exp(-a))``, as ``exp(-log(1 + exp(-a)))``: no overflow for large |a|."""
    return np.exp(-np.logaddexp(0.0, -a))


def _gate_heads(x_q, p, dims):
    """The output gate ``sigmoid(x_q W_gate + b_gate)`` in the heads' layout: (N, h, L_q, 1) for a headwise gate
    (W_gate (d_model, h): one scalar per head and query, broadcast over head_dim), (N, h, L_q, head_dim) for an
    elementwise one (W_gate (d_model, h*head_dim): column block i gates head i, as W_q's blocks)."""
    return split_heads(_sigmoid(_linear(x_q, p["W_gate"], p.get("b_gate"))), dims.n_heads)


def multi_head_attention(x_q, x_kv, params, n_heads, mask=None, is_causal=False, need_weights=True, *,
                         positions=None, rope_base=None, rope_style="half", window=None, softcap=None,
                         qk_norm_eps=1e-6, scale=None, gate=None, rope_dim=None):
    """``MultiHead(X_q, X_kv) = Concat(head_1, ..., head_h) W^O + b^O``, ``head_i = Attention(Q_i, K_i, V_i)``.

    Fused form: one projection per Q/K/V, reshaped to ``(N, h, L, head_dim)``; with GQA each key/value head is
    repeated for the ``h/g`` query heads of its group (query head j uses kv head ``j // (h/g)``).

    x_q ``(N, L_q, d_model)`` or ``(L_q, d_model)``; x_kv the same rank, or None for self-attention (x_kv = x_q).
    ``mask`` boolean, True = may attend, broadcastable to ``(N, h, L_q, L_kv)`` (``(h, L_q, L_kv)`` for 2-D input),
    so ``(L_q, L_kv)`` causal and ``(N, 1, 1, L_kv)`` padding masks both work; ``is_causal=True`` adds the
    bottom-right aligned causal mask. Returns ``(out (N, L_q, d_model), weights (N, h, L_q, L_kv))``, without the N
    axis for 2-D input; ``weights`` is None with ``need_weights=False`` (as ``mha.MultiHeadAttention``).
    All-masked query rows give zero weights; their output row is ``b_o`` (zero before the output projection).

    The parts of today's models, in the order the layer applies them (each off by default, and then the result is
    exactly the one above)::

        q, k, v = x W (+ b), split into heads  ->  QK-norm  ->  RoPE (on the first rope_dim coordinates)
        ->  S = scale q k^T  ->  soft-cap  ->  masks (mask, is_causal, window)  ->  softmax with sinks  ->  A v
        ->  gate: head_i * sigmoid(x_q W_gate (+ b_gate))  ->  merge heads, W_o (+ b_o)

    * QK-norm, when ``params`` has ``q_norm`` and ``k_norm`` (shape ``(head_dim,)``): ``q <- rms_norm(q, q_norm,
      qk_norm_eps)`` per head over head_dim, and k likewise (:func:`rms_norm`; ``qk_norm_eps`` finite > 0).
    * RoPE, when ``rope_base`` is a number (e.g. 10000.0): :func:`rope` on q and k (never v) with ``rope_style``
      ("half" or "interleaved"; head_dim must be even). ``positions`` are the absolute positions, integers >= 0:
      for self-attention shape ``(L,)`` or ``(N, L)`` (``(L,)`` for 2-D input), default ``arange(L)``; for
      cross-attention (x_kv given) RoPE needs both, ``positions=(positions_q, positions_kv)``, with no default
      (e.g. a KV cache: x_kv the whole sequence at ``arange(L_kv)``, x_q its last L_q tokens at ``L_kv - L_q +
      arange(L_q)``, with ``is_causal=True``). ``positions`` without ``rope_base`` is refused.
      ``rope_dim`` (partial RoPE, Qwen3-Next's ``partial_rotary_factor * head_dim``; an even integer <= head_dim,
      None = head_dim): RoPE of size rope_dim, frequencies ``base^(-2i/rope_dim)``, on the first rope_dim
      coordinates of each head of q and k (pairs ``(x[i], x[i + rope_dim/2])`` for "half"), the rest unrotated, as
      Hugging Face's ``apply_rotary_pos_emb`` does; head_dim may then be odd. Refused without ``rope_base``.
    * ``scale`` (finite > 0) replaces ``1/sqrt(head_dim)``; ``softcap``, ``window`` (which implies causal) and the
      sinks, when ``params`` has ``sinks`` (shape ``(h,)``, one logit per query head), are those of
      :func:`scaled_dot_product_attention`. The returned weights exclude the sink column.
    * Gated attention (Qiu et al. 2025; Qwen3-Next's full-attention layers), ``gate="headwise"`` or
      ``"elementwise"`` with ``params['W_gate']`` of shape ``(d_model, h)`` or ``(d_model, h*head_dim)`` (and an
      optional ``b_gate``): each head's output, before the heads are merged and projected by W_o, is multiplied by
      ``sigmoid(x_q W_gate + b_gate)``, computed from the query-side input: one scalar per head and query position
      (headwise, broadcast over head_dim) or one per coordinate (elementwise; column block i gates head i). The
      weights returned are the softmax's, ungated. ``gate`` and W_gate go together: one without the other is refused.

    Book: part I, 'From one head to h heads'; part IV, 'Attention in today's models'; GQA/MQA: part II, 'MQA and GQA'.
    """
    self_attention = x_kv is None
    x_q, x_kv, p, dims, mask, unbatched = _check_mha_inputs(x_q, x_kv, params, n_heads, mask, is_causal)
    need_weights = _check_flag("need_weights", need_weights)
    opts, mask = _check_layer_extras(self_attention, x_q, x_kv, p, dims, mask, unbatched, positions, rope_base,
                                     rope_style, window, softcap, qk_norm_eps, scale, gate, rope_dim)
    q, k, v = _project(x_q, x_kv, p, dims)
    q, k = _qk_norm_rope(q, k, p, opts)  # QK-norm, then RoPE (each only when on)
    n_rep = dims.n_heads // dims.n_kv_heads  # query heads per key/value head
    heads, weights = scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask, **opts.sdpa)
    if opts.gate is not None:
        heads = heads * _gate_heads(x_q, p, dims)  # (N, h, L_q, head_dim) * (N, h, L_q, 1 or head_dim)
    out = _linear(merge_heads(heads), p["W_o"], p.get("b_o"))  # (N, L_q, d_model)
    if unbatched:
        out, weights = out[0], weights[0]
    return out, weights if need_weights else None


def head_weights(params, n_heads):
    """The per-head matrices hidden in the fused ones: a list with one dict per query head i.

    Each dict has ``W_q_i = W_q[:, i*head_dim:(i+1)*head_dim]``, ``W_k_i``/``W_v_i`` = the columns of key/value head
    ``kv_head = i // (h/g)``, ``W_o_i = W_o[i*head_dim:(i+1)*head_dim, :]`` (row block i of W_o), the matching bias
    slices ``b_q_i``, ``b_k_i``, ``b_v_i`` (None when params has no such bias) and ``kv_head`` (an int).
    ``b_o`` is not per head: it is added once after the sum over heads. Arrays are views (float64). The keys of
    today's models (``q_norm``, ``k_norm``, ``sinks``, ``W_gate``, ``b_gate``) are not in the dicts.

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
    (same arguments, same return shapes); the book proves it, the tests check it. It is the plain layer: params with
    ``q_norm``, ``k_norm``, ``sinks`` or ``W_gate`` are refused (ValueError; ``multi_head_attention`` computes them).

    Book: part I, 'From one head to h heads'.
    """
    x_q, x_kv, p, dims, mask, unbatched = _check_mha_inputs(x_q, x_kv, params, n_heads, mask, is_causal)
    need_weights = _check_flag("need_weights", need_weights)
    extra = [key for key in _EXTRA_KEYS if key in p]
    if extra:
        raise ValueError(f"multi_head_attention_per_head computes the plain layer, but params has {extra}; use "
                         f"multi_head_attention for QK-norm, sinks and gates")
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


def init_params(d_model, n_heads, n_kv_heads=None, head_dim=None, bias=True, seed=0, *, qk_norm=False,
                sinks=False, gate=None):
    """Random parameters in the dict convention: entries ~ N(0, 1/fan_in), biases ~ N(0, 0.1^2) (or absent).

    ``n_kv_heads`` defaults to ``n_heads`` (MHA); ``head_dim`` to ``d_model // n_heads``. ``bias`` is True or False
    (TypeError otherwise); ``seed`` an int >= 0, None (not reproducible) or a ``np.random.Generator`` (drawn from,
    so it advances). For examples and tests.

    ``qk_norm=True`` adds ``q_norm`` and ``k_norm`` (shape ``(head_dim,)``, ``1 + N(0, 0.1^2)``: near the usual
    all-ones start, but not equal to it, so that tests see the weights), ``sinks=True`` adds ``sinks`` (shape
    ``(n_heads,)``, ``N(0, 0.5^2)``), ``gate="headwise"`` or ``"elementwise"`` adds ``W_gate`` (``(d_model,
    n_heads)`` or ``(d_model, n_heads*head_dim)``, ``N(0, 1/d_model)``) and, with ``bias``, ``b_gate``
    (``N(0, 0.1^2)``). They are drawn after all the other entries, in that order, so the other entries are the same
    with or without them.

    Book: part I, 'From one head to h heads'.
    """
    d_model, n_heads, n_kv_heads, head_dim = head_shape(d_model, n_heads, n_kv_heads, head_dim)
    bias, seed = _check_flag("bias", bias), _check_seed(seed)
    qk_norm, sinks = _check_flag("qk_norm", qk_norm), _check_flag("sinks", sinks)
    check_choice("gate", gate, GATES)
    rng = np.random.default_rng(seed)
    q_width, kv_width = n_heads * head_dim, n_kv_heads * head_dim
    shapes = {
        "W_q": (d_model, q_width), "W_k": (d_model, kv_width), "W_v": (d_model, kv_width), "W_o": (q_width, d_model),
    }
    params = {key: rng.standard_normal(shape) / math.sqrt(shape[0]) for key, shape in shapes.items()}
    if bias:
        for key, width in (("b_q", q_width), ("b_k", kv_width), ("b_v", kv_width), ("b_o", d_model)):
            params[key] = 0.1 * rng.standard_normal(width)
    if qk_norm:  # drawn after the entries above: those stay the same draws
        params["q_norm"] = 1.0 + 0.1 * rng.standard_normal(head_dim)
        params["k_norm"] = 1.0 + 0.1 * rng.standard_normal(head_dim)
    if sinks:
        params["sinks"] = 0.5 * rng.standard_normal(n_heads)
    if gate is not None:
        gate_width = n_heads if gate == "headwise" else q_width
        params["W_gate"] = rng.standard_normal((d_model, gate_width)) / math.sqrt(d_model)
        if bias:
            params["b_gate"] = 0.1 * rng.standard_normal(gate_width)
    return params
