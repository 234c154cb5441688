"""Multi-head latent attention (MLA: DeepSeek-V2, DeepSeek-V3, Kimi K2), its two equal forms and its backward pass.

MLA caches, per token and per layer, one latent vector ``c`` of ``kv_rank`` numbers and one rotary key ``k_rope``
of ``qk_rope_head_dim`` numbers shared by every head, instead of h keys and h values: DeepSeek-V3 caches
512 + 64 = 576 numbers where its 128 heads of keys (192) and values (128) would be 128 (192 + 128) = 40,960.

The layer (DeepSeek-V3's order and Hugging Face's ``DeepseekV3Attention`` in transformers 5, row vectors, Y = X W;
``n`` = qk_nope_head_dim, ``r`` = qk_rope_head_dim, ``d_v`` = v_head_dim, ``d_c`` = kv_rank)::

    queries   q = rms_norm(x W_dq, q_norm) W_uq     (with a query rank; else q = x W_q), (N, L, h (n + r)),
              head i: q_i = [q_nope_i, q_rope_i] (n and r columns; q_rope_i rotated by RoPE)
    latent    [c_raw, k_rope] = x W_dkv,  c = rms_norm(c_raw, kv_norm)  (d_c and r columns; k_rope rotated, one
              per token, shared by all heads)
    up        [W_uk_i, W_uv_i] = column block i of W_ukv (d_c x n and d_c x d_v)
    naive     k_i = [c W_uk_i, k_rope],  v_i = c W_uv_i,  head_i = softmax(scale q_i k_i^T) v_i
    out       Concat(head_1, ..., head_h) W_o

Why the absorbed form is the same function. The key of head i is the latent times a block-diagonal matrix::

    k_i = [c, k_rope] B_i,   B_i = [[W_uk_i, 0], [0, I_r]]     so     q_i k_i^T = q_i B_i^T [c, k_rope]^T
        = [q_nope_i W_uk_i^T, q_rope_i] [c, k_rope]^T = (q_nope_i W_uk_i^T) c^T + q_rope_i k_rope^T

and ``head_i = A_i (c W_uv_i) = (A_i c) W_uv_i`` by associativity. So W_uk_i is absorbed into the query
(``q_lat_i = q_nope_i W_uk_i^T``, width d_c) and W_uv_i applied after the weighted sum of latents: every head
attends over the same cached rows ``[c, k_rope]`` (one key head of width d_c + r, as in MQA) and the per-head keys
and values are never built. Same scores, same weights, same output: the same function, computed with other products
(at another cost: see ``mha.counting.latent_flops_per_token``). DeepSeek-V2's report words the trick as folding
(W_uk "can be absorbed into" W_q, and W_uv into W_o); DeepSeek's inference code (deepseek-ai/DeepSeek-V3,
inference/model.py, attn_impl "absorb") keeps the factors and applies the blocks of wkv_b to q_nope and to the
weighted sum of latents at run time, and so do we: a folded matrix would be larger (the book's Exercise 2 counts
by how much).

Why the rope part must be decoupled. RoPE acts on row vectors as ``u -> u R_p^T`` (R_p the rotation at position p,
orthogonal, ``R_m^T R_p = R_{p-m}``), as in the book. Were the whole key rotated, ``k_i(p) = c_p W_uk_i R_p^T``, the
score of a query ``q_i R_m^T`` at m would be ``q_i R_m^T (c_p W_uk_i R_p^T)^T = q_i R_{p-m} W_uk_i^T c_p^T``: a
rotation that depends on the key's position sits between the query and W_uk_i^T, and matrix products do not
commute, so no single matrix folds W_uk_i into the query, even for one query position m (it would be one per
distance p - m). Hence the split: the ``n`` "nope" coordinates carry no position and absorb
W_uk_i; the ``r`` rotary coordinates come from their own projection, ``k_rope`` (cached after rotation, shared by
the heads) and ``q_rope_i``.

RoPE layout: ``rope_style="interleaved"`` (pairs (x[2i], x[2i+1]), DeepSeek's own code) is Hugging Face's
``rope_interleave=True`` (the default of ``DeepseekV3Config``), and ``"half"`` (pairs (x[i], x[i + r/2])) is
``rope_interleave=False``. Hugging Face's ``apply_rotary_pos_emb_interleave`` rotates the pairs (x[2i], x[2i+1]) and
writes the results de-interleaved, (all first members, all second members), while ours writes each pair back in
place; the two differ by the same permutation P of the r coordinates of q_rope and of k_rope, and
``(q P)(k P)^T = q k^T``: the scores, hence the weights and the output, are the same. theta_i = base^(-2i/r).

``params``: ``W_dkv (d_model, d_c + r)``, ``kv_norm (d_c,)``, ``W_ukv (d_c, h (n + d_v))`` (head i: columns
``i (n + d_v) ..``, its first n for W_uk_i, the next d_v for W_uv_i), ``W_o (h d_v, d_model)``; and either ``W_q
(d_model, h (n + r))`` or all of ``W_dq (d_model, q_rank)``, ``q_norm (q_rank,)``, ``W_uq (q_rank, h (n + r))``. So
W_dq = q_a_proj.weight.T, W_uq = q_b_proj.weight.T, W_dkv = kv_a_proj_with_mqa.weight.T, W_ukv = kv_b_proj.weight.T,
W_o = o_proj.weight.T and the norms are q_a_layernorm.weight, kv_a_layernorm.weight. No biases (DeepSeek's
``attention_bias=False``). Scale: ``(n + r)^-0.5`` by default, as Hugging Face's for default RoPE. The released
DeepSeek-V3 and Kimi K2 use YaRN, which multiplies it by ``(0.1 mscale ln(factor) + 1)^2`` (1.874 for DeepSeek-V3's
factor 40): pass ``scale=`` for that; YaRN's rescaled frequencies are not implemented.

Book: part IV, 'Multi-head latent attention (MLA)'.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from mha._checks import attention_scale, check_bool, check_choice, check_float, check_int
from mha.reference.backward import scaled_dot_product_attention_grad
from mha.reference.checks import (ROPE_STYLES, _as_float_array, _check_nonempty, _check_positions, _check_seed)
from mha.reference.masks import causal_mask
from mha.reference.multi_head import merge_heads, split_heads
from mha.reference.norms import _rms_norm, _rms_norm_grad
from mha.reference.rope import _rotate
from mha.reference.scaled_dot_product import _masked_softmax, _scores, scaled_dot_product_attention

__all__ = ["multi_head_latent_attention", "multi_head_latent_attention_grad", "init_latent_params", "LatentDims"]

_KV_KEYS = ("W_dkv", "kv_norm", "W_ukv", "W_o")  # always
_Q_LOW_RANK_KEYS = ("W_dq", "q_norm", "W_uq")  # with a query rank, instead of W_q


class LatentDims(NamedTuple):
    """The sizes of an MLA layer, read from its ``params`` dict (and the three head widths given)."""

    d_model: int
    n_heads: int  # h
    q_rank: int | None  # width of the query latent (None: a plain W_q)
    kv_rank: int  # d_c, width of the cached latent c
    nope: int  # qk_nope_head_dim, the query/key coordinates without position
    rope: int  # qk_rope_head_dim, the rotary coordinates (the key's shared by all heads)
    v: int  # v_head_dim


class _Options(NamedTuple):
    positions: np.ndarray  # (N, L): the tokens' absolute positions
    rope_base: float
    rope_style: str
    scale: float
    eps: float  # of both RMSNorms
    mask: np.ndarray | None  # (L, L) causal mask or None


# --------------------------------------------------------------------------------------------------- checks
def _check_widths(nope, rope, v):
    nope, v = check_int("qk_nope_head_dim", nope), check_int("v_head_dim", v)
    rope = check_int("qk_rope_head_dim", rope)
    if rope % 2:
        raise ValueError(f"qk_rope_head_dim must be even (RoPE rotates pairs of coordinates), got {rope}")
    return nope, rope, v


def _check_latent_params(params, n_heads, nope, rope, v):
    """``(p, dims)``: float64 copies of the entries and the layer's :class:`LatentDims`; TypeError/ValueError naming
    the key, its shape and the shape expected."""
    n_heads = check_int("n_heads", n_heads)
    nope, rope, v = _check_widths(nope, rope, v)
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict with keys {_KV_KEYS} and W_q or {_Q_LOW_RANK_KEYS}, got "
                        f"{type(params).__name__}")
    low_rank = [key for key in _Q_LOW_RANK_KEYS if key in params]
    if low_rank and len(low_rank) < 3:
        raise ValueError(f"params has {low_rank} but not all of {list(_Q_LOW_RANK_KEYS)}: a low-rank query needs "
                         f"the three (or give a plain W_q instead)")
    expected = _KV_KEYS + (_Q_LOW_RANK_KEYS if low_rank else ("W_q",))
    missing = [key for key in expected if key not in params]
    unknown = sorted(set(params) - set(expected), key=repr)
    if missing or unknown:
        raise ValueError(f"params must have exactly the keys {list(expected)}; missing {missing}, unexpected "
                         f"{unknown}")
    p = {key: _as_float_array(f"params['{key}']", value) for key, value in params.items()}
    for key, value in p.items():
        if value.ndim != (1 if key.endswith("norm") else 2):
            raise ValueError(f"params['{key}'] must be {'1-D' if key.endswith('norm') else 'a 2-D matrix'}, got "
                             f"shape {value.shape}")
        _check_nonempty(f"params['{key}']", value)
    d_model, kv_width = p["W_dkv"].shape
    if kv_width <= rope:
        raise ValueError(f"params['W_dkv'] must have kv_rank + qk_rope_head_dim columns with kv_rank >= 1, got shape "
                         f"{p['W_dkv'].shape} with qk_rope_head_dim = {rope}")
    kv_rank = kv_width - rope
    q_rank = p["W_dq"].shape[1] if low_rank else None
    h, qk = n_heads, nope + rope
    shapes = {"kv_norm": (kv_rank,), "W_ukv": (kv_rank, h * (nope + v)), "W_o": (h * v, d_model)}
    if low_rank:
        shapes.update({"W_dq": (d_model, q_rank), "q_norm": (q_rank,), "W_uq": (q_rank, h * qk)})
    else:
        shapes["W_q"] = (d_model, h * qk)
    for key, shape in shapes.items():
        if p[key].shape != shape:
            raise ValueError(f"params['{key}'] must have shape {shape} (d_model = {d_model}, n_heads = {h}, "
                             f"kv_rank = {kv_rank}, q_rank = {q_rank}, qk_nope_head_dim = {nope}, qk_rope_head_dim "
                             f"= {rope}, v_head_dim = {v}), got {p[key].shape}")
    return p, LatentDims(d_model, h, q_rank, kv_rank, nope, rope, v)


def _check_inputs(x, params, n_heads, nope, rope, v, is_causal, positions, rope_base, rope_style, scale, norm_eps):
    """Every check, before any computation. Returns 3-D x, p, dims, :class:`_Options`, unbatched."""
    p, dims = _check_latent_params(params, n_heads, nope, rope, v)
    x = _as_float_array("x", x)
    if x.ndim not in (2, 3):
        raise ValueError(f"x must be 2-D (L, d_model) or 3-D (N, L, d_model), got shape {x.shape}")
    _check_nonempty("x", x)
    if x.shape[-1] != dims.d_model:
        raise ValueError(f"x's last axis must be d_model = {dims.d_model} (params['W_dkv'].shape[0]), got shape "
                         f"{x.shape}")
    unbatched = x.ndim == 2
    x = x[None] if unbatched else x  # (N, L, d_model)
    N, L = x.shape[:2]
    is_causal = check_bool("is_causal", is_causal)
    base = check_float("rope_base", rope_base, minimum=0.0, min_inclusive=False)
    check_choice("rope_style", rope_style, ROPE_STYLES)
    scale = attention_scale(scale, dims.nope + dims.rope)
    eps = check_float("norm_eps", norm_eps, minimum=0.0, min_inclusive=False)
    target, desc = ((L,), "(L,)") if unbatched else ((N, L), "(N, L)")
    pos = _check_positions("positions", np.arange(L) if positions is None else positions, target, desc)
    pos = np.broadcast_to(pos, (N, L))  # (N, L)
    mask = causal_mask(L, L) if is_causal else None  # (L, L)
    return x, p, dims, _Options(pos, base, rope_style, scale, eps, mask), unbatched


# -------------------------------------------------------------------------------------------------- forward
class _Projected(NamedTuple):
    """What both forms share (and the backward pass reads)."""

    c_q: np.ndarray | None  # (N, L, q_rank): x W_dq before its norm (None without a query rank)
    c_q_normed: np.ndarray | None  # (N, L, q_rank)
    q_nope: np.ndarray  # (N, h, L, n)
    q_rope: np.ndarray  # (N, h, L, r), rotated
    c_raw: np.ndarray  # (N, L, d_c): the latent before kv_norm
    c: np.ndarray  # (N, L, d_c): the cached latent
    k_rope: np.ndarray  # (N, L, r), rotated: the cached rotary key, shared by the heads


def _project(x, p, dims, opts):
    """Queries (split into heads, nope and rope parts), the latent and the shared rotary key, RoPE applied."""
    c_q = c_q_normed = None
    if dims.q_rank is None:
        q = x @ p["W_q"]  # (N, L, h (n + r))
    else:
        c_q = x @ p["W_dq"]  # (N, L, q_rank)
        c_q_normed = _rms_norm(c_q, p["q_norm"], opts.eps)
        q = c_q_normed @ p["W_uq"]  # (N, L, h (n + r))
    q = split_heads(q, dims.n_heads)  # (N, h, L, n + r)
    pos_q = opts.positions[:, None, :]  # (N, 1, L): the same positions for every head
    q_rope = _rotate(q[..., dims.nope:], pos_q, opts.rope_base, opts.rope_style)  # (N, h, L, r)
    latent = x @ p["W_dkv"]  # (N, L, d_c + r)
    c_raw, k_rope = latent[..., :dims.kv_rank], latent[..., dims.kv_rank:]  # (N, L, d_c), (N, L, r)
    c = _rms_norm(c_raw, p["kv_norm"], opts.eps)  # (N, L, d_c)
    k_rope = _rotate(k_rope, opts.positions, opts.rope_base, opts.rope_style)  # (N, L, r)
    return _Projected(c_q, c_q_normed, q[..., :dims.nope], q_rope, c_raw, c, k_rope)


def _up_weights(p, dims):
    """W_uk (h, d_c, n) and W_uv (h, d_c, d_v): the column blocks of W_ukv, head by head."""
    blocks = p["W_ukv"].reshape(dims.kv_rank, dims.n_heads, dims.nope + dims.v)  # (d_c, h, n + d_v)
    blocks = blocks.transpose(1, 0, 2)  # (h, d_c, n + d_v)
    return blocks[..., :dims.nope], blocks[..., dims.nope:]


def _naive_keys_values(pr, p, dims):
    """The per-head keys [c W_uk_i, k_rope] (N, h, L, n + r) and values c W_uv_i (N, h, L, d_v), rebuilt."""
    W_uk, W_uv = _up_weights(p, dims)
    k_nope = np.einsum("nlc,hcd->nhld", pr.c, W_uk)  # (N, h, L, n)
    v = np.einsum("nlc,hcd->nhld", pr.c, W_uv)  # (N, h, L, d_v)
    k_rope = np.broadcast_to(pr.k_rope[:, None], k_nope.shape[:3] + (dims.rope,))  # (N, h, L, r): shared
    return np.concatenate([k_nope, k_rope], axis=-1), v


def _naive(pr, p, dims, opts):
    """Rebuild each head's k and v from the latent, then ordinary attention: heads (N, h, L, d_v), weights."""
    q = np.concatenate([pr.q_nope, pr.q_rope], axis=-1)  # (N, h, L, n + r)
    k, v = _naive_keys_values(pr, p, dims)
    return scaled_dot_product_attention(q, k, v, opts.mask, opts.scale)


def _absorbed(pr, p, dims, opts):
    """Score against the latent itself: S_i = scale ((q_nope_i W_uk_i^T) c^T + q_rope_i k_rope^T); the output
    (A_i c) W_uv_i. Returns heads (N, h, L, d_v), weights (N, h, L, L)."""
    W_uk, W_uv = _up_weights(p, dims)
    q_lat = np.einsum("nhld,hcd->nhlc", pr.q_nope, W_uk)  # (N, h, L, d_c): W_uk_i absorbed into the query
    q_all = np.concatenate([q_lat, pr.q_rope], axis=-1)  # (N, h, L, d_c + r)
    k_all = np.concatenate([pr.c, pr.k_rope], axis=-1)[:, None]  # (N, 1, L, d_c + r): one key head for all
    weights = _masked_softmax(_scores(q_all, k_all, opts.scale), opts.mask)  # (N, h, L, L)
    o_lat = weights @ pr.c[:, None]  # (N, h, L, d_c): weighted sums of latents
    return np.einsum("nhlc,hcd->nhld", o_lat, W_uv), weights  # (N, h, L, d_v)


def multi_head_latent_attention(x, params, n_heads, *, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, is_causal=True,
                                positions=None, rope_base=10000.0, rope_style="interleaved", absorb=False,
                                need_weights=True, scale=None, norm_eps=1e-6):
    """Multi-head latent attention of ``x`` (N, L, d_model) (or (L, d_model)) onto itself: ``(out, weights)``.

    ``out`` is (N, L, d_model) and ``weights`` (N, h, L, L) (without N for 2-D input), or None with
    ``need_weights=False``. The layer, ``params`` and the two forms are in the module docstring: ``absorb=False``
    rebuilds each head's key [c W_uk_i, k_rope] and value c W_uv_i and attends as usual; ``absorb=True`` scores
    ``(q_nope_i W_uk_i^T) c^T + q_rope_i k_rope^T`` against the latent and outputs ``(A_i c) W_uv_i``. Both give the
    same result (to rounding: the tests check 1e-12).

    ``qk_nope_head_dim``, ``qk_rope_head_dim`` (even) and ``v_head_dim`` are integers >= 1 (the rest is read from
    the shapes). ``is_causal``: query i sees keys j <= i. ``positions``: RoPE's absolute positions, integers >= 0, of
    shape (L,) or (N, L); default arange(L). ``rope_base`` > 0, ``rope_style`` "interleaved" (DeepSeek, Hugging
    Face's ``rope_interleave=True``) or "half". ``scale`` (finite > 0) replaces ``(n + r)^-0.5``; ``norm_eps`` is
    the epsilon of both RMSNorms (q_norm, kv_norm). TypeError/ValueError before any computation, naming the
    argument, for anything else (NaN or inf in x or params included).

    Book: part IV, 'Multi-head latent attention (MLA)'.
    """
    x, p, dims, opts, unbatched = _check_inputs(x, params, n_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                                                is_causal, positions, rope_base, rope_style, scale, norm_eps)
    absorb, need_weights = check_bool("absorb", absorb), check_bool("need_weights", need_weights)
    pr = _project(x, p, dims, opts)
    heads, weights = (_absorbed if absorb else _naive)(pr, p, dims, opts)
    out = merge_heads(heads) @ p["W_o"]  # (N, L, h d_v) @ (h d_v, d_model)
    if unbatched:
        out, weights = out[0], weights[0]
    return out, weights if need_weights else None


# ------------------------------------------------------------------------------------------------- backward
def multi_head_latent_attention_grad(x, params, n_heads, grad_out, *, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                                     is_causal=True, positions=None, rope_base=10000.0, rope_style="interleaved",
                                     scale=None, norm_eps=1e-6):
    """Hand-derived gradients of ``sum(multi_head_latent_attention(x, params, ...)[0] * grad_out)``.

    Returns a dict: ``'x'`` (x's shape) and one entry per key of ``params`` (its shape). The same keywords and
    checks as the forward; ``grad_out`` must have the output's shape. No autograd; the chain rule from the output
    back, through the naive form (both forms are one function, so one gradient)::

        dW_o = M^T dO,  dM = dO W_o^T -> per-head dH_i           (M = Concat(heads))
        (dq_i, dk_i, dv_i) = scaled_dot_product_attention_grad(q_i, k_i, v_i, dH_i)
        k_i = [c W_uk_i, k_rope]:  dW_uk_i = c^T dk_i[:, :n],   dk_rope = sum_i dk_i[:, n:]  (shared by the heads)
        v_i = c W_uv_i:            dW_uv_i = c^T dv_i,          dc = sum_i (dk_i[:, :n] W_uk_i^T + dv_i W_uv_i^T)
        c = rms_norm(c_raw):       (dc_raw, dkv_norm) = rms_norm_backward(c_raw, kv_norm, dc)
        k_rope = R k_raw:          dk_raw = R^T dk_rope (RoPE by the opposite angles), likewise dq_rope
        [c_raw, k_raw] = x W_dkv:  dW_dkv = x^T [dc_raw, dk_raw],  dx = [dc_raw, dk_raw] W_dkv^T
        q = x W_q:                 dW_q = x^T dq,  dx += dq W_q^T     (dq = the heads' [dq_nope, dq_raw], merged)
        or q = rms_norm(x W_dq) W_uq: dW_uq = c_q'^T dq, dc_q' = dq W_uq^T, (dc_q, dq_norm) = rms_norm_backward,
                                   dW_dq = x^T dc_q,  dx += dc_q W_dq^T

    (Parameter gradients sum over the batch and the positions.) Book: part II, 'The backward pass'; part IV,
    'Multi-head latent attention (MLA)'.
    """
    x, p, dims, opts, unbatched = _check_inputs(x, params, n_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                                                is_causal, positions, rope_base, rope_style, scale, norm_eps)
    N, L = x.shape[:2]
    dO = _as_float_array("grad_out", grad_out)
    expected = (L, dims.d_model) if unbatched else (N, L, dims.d_model)
    if dO.shape != expected:
        raise ValueError(f"grad_out shape {dO.shape} must equal the output shape {expected}")
    dO = dO.reshape(N, L, dims.d_model)  # (N, L, d_model)

    pr = _project(x, p, dims, opts)
    q = np.concatenate([pr.q_nope, pr.q_rope], axis=-1)  # (N, h, L, n + r)
    k, v = _naive_keys_values(pr, p, dims)
    heads, _ = scaled_dot_product_attention(q, k, v, opts.mask, opts.scale)  # (N, h, L, d_v)
    grads = {"W_o": np.einsum("nlc,nld->cd", merge_heads(heads), dO)}
    dH = split_heads(dO @ p["W_o"].T, dims.n_heads)  # (N, h, L, d_v)
    dq, dk, dv = scaled_dot_product_attention_grad(q, k, v, dH, opts.mask, opts.scale)

    dx = _latent_grad(x, pr, p, dims, opts, dk, dv, grads) + _query_grad(x, pr, p, dims, opts, dq, grads)
    grads["x"] = dx[0] if unbatched else dx
    return grads


def _latent_grad(x, pr, p, dims, opts, dk, dv, grads):
    """Back from the per-head dk (N, h, L, n + r) and dv (N, h, L, d_v) to W_ukv, kv_norm, W_dkv; returns x's part."""
    W_uk, W_uv = _up_weights(p, dims)
    dk_nope, dk_rope = dk[..., :dims.nope], dk[..., dims.nope:].sum(axis=1)  # (N, h, L, n), (N, L, r)
    dW_uk = np.einsum("nlc,nhld->hcd", pr.c, dk_nope)  # (h, d_c, n)
    dW_uv = np.einsum("nlc,nhld->hcd", pr.c, dv)  # (h, d_c, d_v)
    dW_ukv = np.concatenate([dW_uk, dW_uv], axis=-1).transpose(1, 0, 2)  # (d_c, h, n + d_v)
    grads["W_ukv"] = dW_ukv.reshape(dims.kv_rank, -1)  # (d_c, h (n + d_v)): W_ukv's layout
    dc = np.einsum("nhld,hcd->nlc", dk_nope, W_uk) + np.einsum("nhld,hcd->nlc", dv, W_uv)  # (N, L, d_c)
    dc_raw, grads["kv_norm"] = _rms_norm_grad(pr.c_raw, p["kv_norm"], dc, opts.eps)
    dk_raw = _rotate(dk_rope, opts.positions, opts.rope_base, opts.rope_style, inverse=True)  # (N, L, r)
    d_latent = np.concatenate([dc_raw, dk_raw], axis=-1)  # (N, L, d_c + r)
    grads["W_dkv"] = np.einsum("nld,nlc->dc", x, d_latent)
    return d_latent @ p["W_dkv"].T  # (N, L, d_model)


def _query_grad(x, pr, p, dims, opts, dq, grads):
    """Back from the per-head dq (N, h, L, n + r) through RoPE and the query projections; returns x's part."""
    dq_rope = _rotate(dq[..., dims.nope:], opts.positions[:, None, :], opts.rope_base, opts.rope_style,
                      inverse=True)  # (N, h, L, r)
    dQ = merge_heads(np.concatenate([dq[..., :dims.nope], dq_rope], axis=-1))  # (N, L, h (n + r))
    if dims.q_rank is None:
        grads["W_q"] = np.einsum("nld,nlc->dc", x, dQ)
        return dQ @ p["W_q"].T  # (N, L, d_model)
    grads["W_uq"] = np.einsum("nld,nlc->dc", pr.c_q_normed, dQ)
    dc_q, grads["q_norm"] = _rms_norm_grad(pr.c_q, p["q_norm"], dQ @ p["W_uq"].T, opts.eps)  # (N, L, q_rank)
    grads["W_dq"] = np.einsum("nld,nlc->dc", x, dc_q)
    return dc_q @ p["W_dq"].T  # (N, L, d_model)


# ------------------------------------------------------------------------------------------------ parameters
def init_latent_params(d_model, n_heads, kv_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, q_rank=None,
                       seed=0):
    """Random MLA parameters in the dict convention of the module docstring: matrices ~ N(0, 1/fan_in), the norms'
    gains ``1 + N(0, 0.1^2)`` (near the usual all-ones start, but visibly not it, so tests see them).

    ``q_rank`` None gives a plain ``W_q``; an integer >= 1 gives ``W_dq``, ``q_norm``, ``W_uq``. ``seed``: an int
    >= 0, None or a ``np.random.Generator``. For examples and tests.
    """
    d_model, n_heads = check_int("d_model", d_model), check_int("n_heads", n_heads)
    kv_rank = check_int("kv_rank", kv_rank)
    nope, rope, v = _check_widths(qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
    q_rank = None if q_rank is None else check_int("q_rank", q_rank)
    rng = np.random.default_rng(_check_seed(seed))
    h, qk = n_heads, nope + rope
    shapes = {"W_q": (d_model, h * qk)} if q_rank is None else {"W_dq": (d_model, q_rank), "W_uq": (q_rank, h * qk)}
    shapes.update({"W_dkv": (d_model, kv_rank + rope), "W_ukv": (kv_rank, h * (nope + v)), "W_o": (h * v, d_model)})
    params = {key: rng.standard_normal(shape) / math.sqrt(shape[0]) for key, shape in shapes.items()}
    if q_rank is not None:
        params["q_norm"] = 1.0 + 0.1 * rng.standard_normal(q_rank)
    params["kv_norm"] = 1.0 + 0.1 * rng.standard_normal(kv_rank)
    return params
