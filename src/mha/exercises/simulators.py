"""What the known bugs compute: small NumPy versions of each buggy computation, and the variants of each case.

A simulator computes a checker's function the book's way when its knobs keep their defaults, and the way a known bug
does when one is turned (``_sim_sdpa(..., scale_rule="none")`` is attention without the scale). Each ``*_BUGS``
table pairs a bug id of ``KNOWN_BUGS`` with the knobs that produce it. The checkers ask for ``<checker>_variants(<the
case's inputs>)``: a list of ``(bug id, thunk)``, the thunk computing what that bug returns on the case (or None
where the bug cannot show, or a predicate on the outputs). The correct pieces a bug leaves alone are the reference's
(``mha.reference.split_heads``, ``merge_heads``, ``repeat_kv``, ``causal_mask``).
"""

from __future__ import annotations

import math

import numpy as np

from mha import reference

# ---------------------------------------------------------------------------------------------------------------
# Softmax and scaled dot-product attention (also the attention inside the bigger functions).
# ---------------------------------------------------------------------------------------------------------------

_FILL = {"zero": -np.inf, "nan": -np.inf, "large_negative": -1e9, "zero_score": 0.0}


def _sim_softmax(s, mask=None, *, axis=-1, fill="zero", shift="row", keepdims=True):
    """Softmax of ``s`` along ``axis`` (None: all entries) the way a given bug computes it.

    fill: how masked scores are handled: 'zero' (the book: -inf, rows with no allowed key -> 0), 'nan' (-inf and no
    guard: 0/0), 'large_negative' (-1e9), 'zero_score' (0), 'after' (the softmax output multiplied by the mask).
    shift: 'row' (the row maximum), 'none' (no shift), 'global' (the maximum of the whole array).
    """
    if mask is not None and fill != "after":
        s = np.where(mask, s, _FILL[fill])
    if shift == "none":
        top = 0.0
    elif shift == "global" or axis is None:
        top = np.max(np.where(np.isfinite(s), s, -np.inf))
    else:
        top = np.max(s, axis=axis, keepdims=True)
        if fill != "nan":
            top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(s - top)
    total = np.sum(e, axis=axis, keepdims=keepdims and axis is not None)
    if mask is not None and fill == "zero" and keepdims:  # the book's guard for rows with no allowed key
        weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    else:
        weights = e / total
    return weights * mask if (mask is not None and fill == "after") else weights


def _bug_scale(rule, q, k, v, scale):
    """The scale a bug uses, or None when the bug does not apply (it only concerns the default scale)."""
    d_k = q.shape[-1]
    if rule == "given":
        return 1 / math.sqrt(d_k) if scale is None else scale
    if rule == "none":
        return 1.0
    if rule == "ignored":
        return 1 / math.sqrt(d_k) if scale is not None else None
    if scale is not None:
        return None
    return {"d_k": 1 / d_k, "inverted": math.sqrt(d_k), "d_v": 1 / math.sqrt(v.shape[-1]),
            "seq_len": 1 / math.sqrt(k.shape[-2])}[rule]


def _sim_sdpa(q, k, v, mask=None, scale=None, *, scale_rule="given", softmax_axis=-1, invert_mask=False,
              ignore_mask=False, **softmax_kw):
    c = _bug_scale(scale_rule, q, k, v, scale)
    if c is None or (ignore_mask and mask is None):
        return None
    if ignore_mask:
        mask = None
    if invert_mask:
        if mask is None:
            return None
        mask = ~mask
    weights = _sim_softmax(c * (q @ np.swapaxes(k, -1, -2)), mask, axis=softmax_axis, **softmax_kw)  # (.., L_q, L_kv)
    return weights @ v, weights


# The known bugs of scaled dot-product attention (and of the attention inside the bigger functions). When two bugs give
# the same result on a case, the first in the list is named: the cases are ordered so that each bug shows first on
# the case that is about it (an unguarded -inf mask and a missing max subtraction both give NaN on a fully masked
# row; that case is about the mask).
_SCALE_BUGS = [
    ("no_scale", dict(scale_rule="none")),
    ("scale_d_k_not_sqrt", dict(scale_rule="d_k")),
    ("scale_inverted", dict(scale_rule="inverted")),
    ("scale_d_v", dict(scale_rule="d_v")),
    ("scale_seq_len", dict(scale_rule="seq_len")),
    ("scale_ignored", dict(scale_rule="ignored")),
]
_SOFTMAX_BUGS = [
    ("softmax_over_queries", dict(softmax_axis=-2)),
    ("shift_not_row_max", dict(shift="global")),
    ("no_max_subtraction", dict(shift="none")),
]
_MASK_BUGS = [
    ("mask_inverted", dict(invert_mask=True)),
    ("mask_inverted", dict(invert_mask=True, fill="nan")),
    ("mask_inverted", dict(invert_mask=True, fill="large_negative")),
    ("mask_fill_large_negative", dict(fill="large_negative")),
    ("mask_nan_empty_rows", dict(fill="nan")),
    ("mask_fill_zero", dict(fill="zero_score")),
    ("mask_after_softmax", dict(fill="after")),
    ("mask_ignored", dict(ignore_mask=True)),
]


def _variants(sim, bugs, *args, **kwargs):
    """(bug id, thunk) for each known bug: the thunk computes what the bug returns on this case's inputs."""
    def thunk(bug_kwargs):
        return lambda: sim(*args, **kwargs, **bug_kwargs)
    return [(bug, thunk(bug_kwargs)) for bug, bug_kwargs in bugs]


# ---------------------------------------------------------------------------------------------------------------
# Heads: split, merge, repeat, the multi-head layer.
# ---------------------------------------------------------------------------------------------------------------


def _split(y, n_heads, rule="transpose"):
    """(N, L, n*head_dim) -> (N, n, L, head_dim) the correct way ('transpose') or as a bug does."""
    N, L, width = y.shape
    head_dim = width // n_heads
    if rule == "transpose":
        return reference.split_heads(y, n_heads)  # (N, n, L, head_dim)
    if rule == "no_transpose":
        return y.reshape(N, n_heads, L, head_dim)  # (N, n, L, head_dim): positions and column blocks mixed
    if rule == "strided":
        return y.reshape(N, L, head_dim, n_heads).transpose(0, 3, 1, 2)  # (N, L, head_dim, n) -> (N, n, L, head_dim)
    if rule == "wrong_axes":
        return y.reshape(N, L, n_heads, head_dim).transpose(0, 2, 3, 1)  # (N, L, n, head_dim) -> (N, n, head_dim, L)
    raise ValueError(rule)


def _merge(y, rule="transpose"):
    """(N, n, L, head_dim) -> (N, L, n*head_dim) the correct way ('transpose') or as a bug does."""
    N, n, L, head_dim = y.shape
    if rule == "transpose":
        return reference.merge_heads(y)  # (N, L, n*head_dim)
    if rule == "no_transpose":
        return y.reshape(N, L, n * head_dim)  # reads (N, n, L, head_dim) memory as (N, L, n*head_dim)
    if rule == "strided":
        return y.transpose(0, 2, 3, 1).reshape(N, L, n * head_dim)  # (N, L, head_dim, n) -> (N, L, head_dim*n)
    raise ValueError(rule)


def _repeat(y, n_rep, rule="repeat"):
    """(N, g, L, d) -> (N, g*n_rep, L, d): query head j reads kv head j // n_rep ('repeat') or j % g ('tile')."""
    if rule == "repeat":
        return reference.repeat_kv(y, n_rep)
    if rule == "tile":
        return np.tile(y, (1, n_rep, 1, 1))
    raise ValueError(rule)


def _sim_mha(x_q, x_kv, p, n_heads, mask=None, *, scale_rule="head_dim", split="transpose", merge="transpose",
             out_proj=True, skip_bias=(), value_weight="W_v", kv_input="x_kv", kv_map="repeat", average=False,
             **attention_kw):
    """Multi-head attention the way a given bug computes it (defaults: the book's layer)."""
    N, L_q, d_model = x_q.shape
    head_dim = p["W_q"].shape[1] // n_heads
    n_kv_heads = p["W_k"].shape[1] // head_dim
    source = x_q if kv_input == "x_q" else x_kv

    def project(x, weight, bias):
        y = x @ p[weight]  # (N, L, width)
        return y + p[bias] if (bias in p and bias not in skip_bias) else y

    value_bias = "b_v" if value_weight == "W_v" else "b_k"
    q = _split(project(x_q, "W_q", "b_q"), n_heads, split)  # (N, h, L_q, head_dim)
    k = _split(project(source, "W_k", "b_k"), n_kv_heads, split)  # (N, g, L_kv, head_dim)
    v = _split(project(source, value_weight, value_bias), n_kv_heads, split)  # (N, g, L_kv, head_dim)
    n_rep = n_heads // n_kv_heads
    k, v = _repeat(k, n_rep, kv_map), _repeat(v, n_rep, kv_map)  # (N, h, L_kv, head_dim)
    scale = {"head_dim": 1 / math.sqrt(head_dim), "d_model": 1 / math.sqrt(d_model), "none": 1.0}[scale_rule]
    result = _sim_sdpa(q, k, v, mask, scale, **attention_kw)
    if result is None:
        return None
    heads, weights = result  # (N, h, L_q, head_dim), (N, h, L_q, L_kv)
    out = _merge(heads, merge)  # (N, L_q, h*head_dim)
    if out_proj:
        out = out @ p["W_o"]  # (N, L_q, d_model)
        if "b_o" in p and "b_o" not in skip_bias:
            out = out + p["b_o"]
    return out, (weights.mean(axis=1) if average else weights)


_MHA_BUGS = [
    ("scale_d_model", dict(scale_rule="d_model")),
    ("no_scale", dict(scale_rule="none")),
    ("split_merge_no_transpose", dict(split="no_transpose", merge="no_transpose")),
    ("split_no_transpose", dict(split="no_transpose")),
    ("merge_no_transpose", dict(merge="no_transpose")),
    ("split_strided", dict(split="strided")),
    ("split_strided", dict(split="strided", merge="strided")),
    ("merge_strided", dict(merge="strided")),
    ("no_output_projection", dict(out_proj=False)),
    ("missing_bias_q", dict(skip_bias=("b_q",))),
    ("missing_bias_v", dict(skip_bias=("b_v",))),
    ("missing_bias_o", dict(skip_bias=("b_o",))),
    ("missing_input_biases", dict(skip_bias=("b_q", "b_k", "b_v"))),
    ("missing_biases", dict(skip_bias=("b_q", "b_k", "b_v", "b_o"))),
    ("values_from_W_k", dict(value_weight="W_k")),
    ("kv_from_x_q", dict(kv_input="x_q")),
    ("kv_map_tile", dict(kv_map="tile")),
    ("weights_averaged_over_heads", dict(average=True)),
] + _MASK_BUGS + _SOFTMAX_BUGS


# ---------------------------------------------------------------------------------------------------------------
# The causal mask and the KV-cache decode step.
# ---------------------------------------------------------------------------------------------------------------


def _is_01_mask(expected):
    """Predicate: the output has the right pattern as numbers 1/0 (not booleans)."""
    def matches(actual):
        got = actual[0]
        return (got.dtype != np.bool_ and got.shape == expected.shape and bool(np.all((got == 0) | (got == 1)))
                and bool(np.array_equal(got == 1, expected)))
    return matches


def _is_additive_mask(expected):
    """Predicate: the output is additive: 0 where allowed, -inf or at most -1e4 where not."""
    def matches(actual):
        got = actual[0]
        return (got.dtype != np.bool_ and got.shape == expected.shape and bool(np.all(got[expected] == 0))
                and bool(np.all(got[~expected] <= -1e4)))
    return matches


def _sim_decode(q, k_new, v_new, k_cache, v_cache, *, mask="bottom_right", order="append", attend_new=True,
                kv_map="repeat", scale_rule="head_dim", cache="append", **attention_kw):
    """One cached decoding step the way a given bug computes it (defaults: the book's step)."""
    N, n_heads, T, head_dim = q.shape
    n_rep = n_heads // k_new.shape[1]
    k_all = np.concatenate([k_cache, k_new] if order == "append" else [k_new, k_cache], axis=2)  # (N, g, c+T, d)
    v_all = np.concatenate([v_cache, v_new] if order == "append" else [v_new, v_cache], axis=2)  # (N, g, c+T, d)
    k_seen, v_seen = (k_all, v_all) if attend_new else (k_cache, v_cache)
    L_kv = k_seen.shape[2]
    if L_kv == 0:
        return None
    if not attend_new or mask == "none":
        causal = None
    elif mask == "bottom_right":
        causal = reference.causal_mask(T, L_kv)
    elif mask == "one_future":  # bottom-right, off by one: each query also sees the next key
        causal = np.tril(np.ones((T, L_kv), dtype=bool), k=L_kv - T + 1)
    else:  # top-left
        causal = np.tril(np.ones((T, L_kv), dtype=bool))
    scale = {"head_dim": 1 / math.sqrt(head_dim), "d_model": 1 / math.sqrt(n_heads * head_dim), "none": 1.0}[scale_rule]
    result = _sim_sdpa(q, _repeat(k_seen, n_rep, kv_map), _repeat(v_seen, n_rep, kv_map), causal, scale, **attention_kw)
    if result is None:
        return None
    out = result[0]  # (N, h, T, head_dim)
    if cache == "none":
        return out, k_cache, v_cache
    if cache == "repeated":
        return out, _repeat(k_all, n_rep), _repeat(v_all, n_rep)
    return out, k_all, v_all


_DECODE_BUGS = [
    ("causal_top_left", dict(mask="top_left")),
    ("no_causal_mask", dict(mask="none")),
    ("causal_one_future_key", dict(mask="one_future")),
    ("cache_prepended", dict(order="prepend")),
    ("new_position_not_attended", dict(attend_new=False)),
    ("kv_map_tile", dict(kv_map="tile")),
    ("scale_d_model", dict(scale_rule="d_model")),
    ("no_scale", dict(scale_rule="none")),
    ("cache_not_updated", dict(cache="none")),
    ("cache_repeated_heads", dict(cache="repeated")),
    ("no_max_subtraction", dict(shift="none")),
]


# ---------------------------------------------------------------------------------------------------------------
# Online softmax.
# ---------------------------------------------------------------------------------------------------------------


def _sim_online(q, k, v, block_size, mask=None, scale=None, *, drop_partial=False, rescale_l=True, rescale_acc=True,
                alpha_inverted=False, divide=True, running_max=True, guard_empty=True, guard_final=True,
                fill="zero", invert_mask=False, ignore_mask=False, scale_rule="given"):
    """The online-softmax loop the way a given bug runs it (defaults: the book's recurrence)."""
    c = _bug_scale(scale_rule, q, k, v, scale)
    if c is None or ((invert_mask or ignore_mask) and mask is None):
        return None
    if ignore_mask:
        mask = None
    l_q, l_kv, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if mask is not None:
        mask = np.broadcast_to(~mask if invert_mask else mask, batch + (l_q, l_kv))  # (..., L_q, L_kv)
    end = l_kv - l_kv % block_size if drop_partial else l_kv
    m = np.full(batch + (l_q, 1), -np.inf)  # running max
    l = np.zeros(batch + (l_q, 1))  # running sum
    acc = np.zeros(batch + (l_q, d_v))  # running accumulator
    for start in range(0, end, block_size):
        stop = min(start + block_size, l_kv)
        s = c * (q @ np.swapaxes(k[..., start:stop, :], -1, -2))  # (..., L_q, B)
        if mask is not None:
            s = np.where(mask[..., start:stop], s, _FILL[fill])
        if running_max:
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            shift = np.where(np.isfinite(m_new), m_new, 0.0) if guard_empty else m_new
            alpha = np.exp(shift - m) if alpha_inverted else np.exp(m - shift)
        else:
            m_new, shift, alpha = m, 0.0, 1.0
        p = np.exp(s - shift)  # (..., L_q, B)
        l = (alpha if rescale_l else 1.0) * l + p.sum(axis=-1, keepdims=True)
        acc = (alpha if rescale_acc else 1.0) * acc + p @ v[..., start:stop, :]
        m = m_new
    if not divide:
        return (acc,)
    return (np.divide(acc, l, out=np.zeros_like(acc), where=l > 0) if guard_final else acc / l,)


_ONLINE_BUGS = [
    ("drop_last_partial_block", dict(drop_partial=True)),
    ("no_rescale_acc", dict(rescale_acc=False)),
    ("no_rescale_l", dict(rescale_l=False)),
    ("no_rescale", dict(rescale_acc=False, rescale_l=False)),
    ("alpha_inverted", dict(alpha_inverted=True)),
    ("no_final_division", dict(divide=False)),
    ("online_nan_empty_state", dict(guard_empty=False, guard_final=False)),
    ("mask_nan_empty_rows", dict(guard_final=False)),
    ("no_max_subtraction", dict(running_max=False)),
    ("mask_fill_large_negative", dict(fill="large_negative")),
    ("mask_inverted", dict(invert_mask=True)),
    ("mask_inverted", dict(invert_mask=True, guard_final=False)),
    ("mask_fill_zero", dict(fill="zero_score")),
    ("mask_ignored", dict(ignore_mask=True)),
] + [(bug, dict(scale_rule=kw["scale_rule"])) for bug, kw in _SCALE_BUGS]


# ---------------------------------------------------------------------------------------------------------------
# Backward: the softmax's and attention's.
# ---------------------------------------------------------------------------------------------------------------


def _sim_softmax_backward(A, dA, rule="correct"):
    """dL/dS from A = softmax(S) and dA = dL/dA, the correct way or as a given bug does."""
    if rule == "correct":
        return A * (dA - np.sum(dA * A, axis=-1, keepdims=True))
    if rule == "no_rowsum":
        return A * dA
    if rule == "diagonal":
        return A * (1 - A) * dA
    if rule == "rowsum_of_grad":
        return A * (dA - np.sum(dA, axis=-1, keepdims=True))
    if rule == "sign":
        return A * (dA + np.sum(dA * A, axis=-1, keepdims=True))
    if rule == "no_keepdims":
        return A * (dA - np.sum(dA * A, axis=-1))
    if rule == "wrong_axis":
        return A * (dA - np.sum(dA * A, axis=-2, keepdims=True))
    raise ValueError(rule)


_VJP_BUGS = [
    ("vjp_missing_rowsum", dict(rule="no_rowsum")),
    ("vjp_diagonal_only", dict(rule="diagonal")),
    ("vjp_rowsum_of_grad", dict(rule="rowsum_of_grad")),
    ("vjp_sign", dict(rule="sign")),
    ("vjp_sum_without_keepdims", dict(rule="no_keepdims")),
    ("vjp_sum_wrong_axis", dict(rule="wrong_axis")),
]


def _sim_sdpa_grad(q, k, v, grad_out, mask=None, scale=None, *, scale_rule="given", chain_scale=True, vjp="correct",
                   dv_transpose=True, invert_mask=False, ignore_mask=False, mask_grad=False, **softmax_kw):
    """(dq, dk, dv) of scaled dot-product attention, the correct way or as a given bug computes them.

    ``mask_grad``: the masked scores get zero gradient, as under autograd (the fill is a constant); a hand-written
    backward pass without it uses dS as it comes out of the softmax backward.
    """
    c = _bug_scale(scale_rule, q, k, v, scale)
    if c is None or ((invert_mask or ignore_mask or mask_grad) and mask is None) or (ignore_mask and mask_grad):
        return None
    if ignore_mask:
        mask = None
    if invert_mask:
        mask = ~mask
    A = _sim_softmax(c * (q @ np.swapaxes(k, -1, -2)), mask, **softmax_kw)  # (..., L_q, L_kv)
    dv = (np.swapaxes(A, -1, -2) if dv_transpose else A) @ grad_out  # (..., L_kv, d_v)
    dS = _sim_softmax_backward(A, grad_out @ np.swapaxes(v, -1, -2), vjp)  # (..., L_q, L_kv)
    if mask_grad:
        dS = np.where(mask, dS, 0.0)
    factor = c if chain_scale else 1.0
    return factor * (dS @ k), factor * (np.swapaxes(dS, -1, -2) @ q), dv


_GRAD_BUGS = [
    ("grad_missing_scale", dict(chain_scale=False)),
    ("grad_dv_no_transpose", dict(dv_transpose=False)),
] + [(bug, dict(vjp=kw["rule"])) for bug, kw in _VJP_BUGS] + _SCALE_BUGS + [
    (bug, {**kw, "mask_grad": mask_grad}) for bug, kw in _MASK_BUGS for mask_grad in (False, True)
] + [("shift_not_row_max", dict(shift="global")), ("no_max_subtraction", dict(shift="none"))]


# ---------------------------------------------------------------------------------------------------------------
# The variants of one case, per checker: (bug id, thunk) for each bug the checker can name.
# ---------------------------------------------------------------------------------------------------------------


def softmax_variants(x, axis):
    """check_softmax: a global or missing max shift, a sum without keepdims, every other axis (and all entries)."""
    bugs = [("shift_not_row_max", dict(shift="global")), ("no_max_subtraction", dict(shift="none")),
            ("sum_without_keepdims", dict(keepdims=False))]
    bugs += [("softmax_wrong_axis", dict(axis=other)) for other in [*range(x.ndim), None]
             if other is None or other != axis % x.ndim]

    def sim(**kw):
        out = _sim_softmax(x, **{"axis": axis, **kw})
        return None if out.shape != x.shape else (out,)
    return _variants(sim, bugs)


def sdpa_variants(q, k, v, mask, scale):
    """check_scaled_dot_product_attention: the scale, mask and softmax bugs."""
    return _variants(_sim_sdpa, _SCALE_BUGS + _MASK_BUGS + _SOFTMAX_BUGS, q, k, v, mask, scale)


def split_heads_variants(y, n_heads):
    """check_split_heads: no transpose, head_dim as the outer axis, the wrong axes swapped."""
    bugs = [("split_no_transpose", "no_transpose"), ("split_strided", "strided"), ("split_wrong_axes", "wrong_axes")]
    return [(bug, (lambda rule: lambda: (_split(y, n_heads, rule),))(rule)) for bug, rule in bugs]


def merge_heads_variants(y):
    """check_merge_heads: no transpose, head_dim as the outer axis."""
    bugs = [("merge_no_transpose", "no_transpose"), ("merge_strided", "strided")]
    return [(bug, (lambda rule: lambda: (_merge(y, rule),))(rule)) for bug, rule in bugs]


def mha_variants(x_q, x_kv, params, n_heads, mask):
    """check_multi_head_attention: the layer's bugs, then the mask and softmax bugs of its attention."""
    return _variants(_sim_mha, _MHA_BUGS, x_q, x_kv, params, n_heads, mask)


def causal_mask_variants(l_q, l_kv):
    """check_causal_mask: the mask aligned top-left, strict, one key too far, inverted, transposed, 0/1, additive."""
    expected = reference.causal_mask(l_q, l_kv)
    ones = np.ones((l_q, l_kv), dtype=bool)
    return [
        ("causal_top_left", lambda: (np.tril(ones),)),
        ("causal_strict", lambda: (np.tril(ones, k=l_kv - l_q - 1),)),
        ("causal_one_future_key", lambda: (np.tril(ones, k=l_kv - l_q + 1),)),
        ("causal_inverted", lambda: (~expected,)),
        ("causal_transposed", lambda: (expected.T,)),
        ("causal_transposed", lambda: (np.triu(ones),)),
        ("mask_not_boolean", lambda: _is_01_mask(expected)),
        ("additive_mask", lambda: _is_additive_mask(expected)),
    ]


def repeat_kv_variants(y, n_rep):
    """check_repeat_kv: tiled heads, the wrong axis repeated, the group axis left unmerged."""
    N, g, L, d = y.shape
    return [
        ("kv_map_tile", lambda: (_repeat(y, n_rep, "tile"),)),
        ("repeat_wrong_axis", lambda: (np.repeat(y, n_rep, axis=2),)),
        ("repeat_wrong_axis", lambda: (np.repeat(y, n_rep, axis=0),)),
        ("repeat_not_merged", lambda: (np.broadcast_to(y[:, :, None], (N, g, n_rep, L, d)),)),
    ]


def decode_step_variants(q, k_new, v_new, k_cache, v_cache):
    """check_decode_step: the mask, the cache's order and contents, the head map, the scale, the max shift."""
    return _variants(_sim_decode, _DECODE_BUGS, q, k_new, v_new, k_cache, v_cache)


def online_variants(q, k, v, block_size, mask, scale):
    """check_online_softmax_attention: the recurrence's bugs, then the mask and scale bugs."""
    return _variants(_sim_online, _ONLINE_BUGS, q, k, v, block_size, mask, scale)


def softmax_backward_variants(A, dA):
    """check_softmax_backward: the Jacobian-vector product's bugs."""
    def sim(rule):
        out = _sim_softmax_backward(A, dA, rule)
        return None if out.shape != A.shape else (out,)
    return _variants(sim, _VJP_BUGS)


def sdpa_grad_variants(q, k, v, grad_out, mask, scale):
    """check_scaled_dot_product_attention_grad: the chain rule's bugs, then those of the forward pass."""
    return _variants(_sim_sdpa_grad, _GRAD_BUGS, q, k, v, grad_out, mask, scale)
