"""What the known bugs of part IV's checkers compute: RoPE, a decoding step with RoPE, the sliding-window mask,
attention with sink logits, and RMSNorm (QK-norm).

The same scheme as ``mha.exercises.simulators`` (which this module extends, and whose attention, decoding and mask
simulators it reuses): a simulator computes the checker's function the book's way when its knobs keep their
defaults and the way a known bug does when one is turned; each ``*_BUGS`` table pairs a bug id of ``KNOWN_BUGS``
with the knobs that produce it; ``<checker>_variants(<the case's inputs>)`` returns ``(bug id, thunk)`` pairs, a
thunk computing what that bug returns on the case (or None where it cannot show, or a predicate on the outputs).
"""

from __future__ import annotations

import numpy as np

from mha import reference
from mha.exercises.runner import _same
from mha.exercises.simulators import (_DECODE_BUGS, _MASK_BUGS, _SCALE_BUGS, _SOFTMAX_BUGS, _bug_scale, _is_01_mask,
                                      _sim_decode, _sim_softmax, _variants)

OTHER_STYLE = {"half": "interleaved", "interleaved": "half"}

# ---------------------------------------------------------------------------------------------------------------
# RoPE.
# ---------------------------------------------------------------------------------------------------------------


def _sim_rope(x, positions, base=10000.0, *, style="half", pairing=None, layout=None, sign=1.0, freq="book",
              use_base=True, use_positions=True):
    """RoPE the way a given bug computes it, in the cos/sin-table form ``x * cos + turned(x) * sin``.

    pairing: which coordinates form a pair ('half': (x[i], x[i + d/2]), 'interleaved': (x[2i], x[2i+1]));
    layout: for which pairing the (d,) tables of angles are laid out (both default to ``style``); sign: +1, or -1 for
    the inverse rotation; freq: 'book' (base^(-2i/d)), 'missing_2' (base^(-i/d)), 'inverted' (base^(2i/d)).
    """
    d = x.shape[-1]
    pairing = style if pairing is None else pairing
    layout = pairing if layout is None else layout
    b = base if use_base else 10000.0
    i = np.arange(d // 2, dtype=np.float64)
    theta = {"book": b ** (-2 * i / d), "missing_2": b ** (-i / d), "inverted": b ** (2 * i / d)}[freq]  # (d/2,)
    pos = np.asarray(positions) if use_positions else np.arange(x.shape[-2])
    angles = pos.astype(np.float64)[..., None] * theta  # (..., L, d/2)
    table = np.concatenate([angles, angles], axis=-1) if layout == "half" else np.repeat(angles, 2, axis=-1)
    if pairing == "half":
        turned = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)  # pair partner, with the sign of sin
    else:
        turned = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    return x * np.cos(table) + turned * (sign * np.sin(table))  # (..., L, d)


def _rope_bugs(style):
    return [
        ("rope_wrong_pairing", dict(pairing=OTHER_STYLE[style])),
        ("rope_angle_layout", dict(layout=OTHER_STYLE[style])),
        ("rope_rotation_sign", dict(sign=-1.0)),
        ("rope_positions_ignored", dict(use_positions=False)),
        ("rope_freq_missing_2", dict(freq="missing_2")),
        ("rope_freq_inverted", dict(freq="inverted")),
        ("rope_base_ignored", dict(use_base=False)),
    ]


def rope_variants(x, positions, base, style):
    """check_rope: the pairing, the layout of the angles, the sign, the positions, the frequencies, the base."""
    def sim(**kw):
        return (_sim_rope(x, positions, base, style=style, **kw),)
    return _variants(sim, _rope_bugs(style))


# ---------------------------------------------------------------------------------------------------------------
# One decoding step with RoPE.
# ---------------------------------------------------------------------------------------------------------------


def _sim_rope_decode(q, k_new, v_new, k_cache, v_cache, style, *, offset=True, pairing=None, rotate="qk",
                     after_caching=None, **decode_kw):
    """One cached decoding step with RoPE, the way a given bug computes it (defaults: the book's step).

    offset: the new positions are c .. c+T-1 (False: 0 .. T-1); rotate: which of q, k, v are rotated;
    after_caching: the raw new keys go into the cache, and then 'rerotate': the whole [K_cache; k_new] is rotated at
    0 .. c+T-1 for the attention (the given, rotated cache turns twice), or 'raw': only k_new is rotated for the
    attention. The attention itself is ``simulators._sim_decode`` (its knobs: the mask, the cache's order...).
    """
    c, T = k_cache.shape[2], q.shape[2]
    positions = (c if offset else 0) + np.arange(T)

    def turn(x, pos):
        return reference.rope(x, pos, style=style if pairing is None else pairing)

    if after_caching is not None:
        k_raw = np.concatenate([k_cache, k_new], axis=2)  # (N, g, c+T, d): what this bug caches
        if after_caching == "rerotate":
            k_seen = turn(k_raw, np.arange(c + T))  # the cached keys rotated once more
            k_old, k_now = k_seen[:, :, :c], k_seen[:, :, c:]
        else:
            k_old, k_now = k_cache, turn(k_new, positions)
        result = _sim_decode(turn(q, positions), k_now, v_new, k_old, v_cache, **decode_kw)
        return None if result is None else (result[0], k_raw, np.concatenate([v_cache, v_new], axis=2))
    q_r = turn(q, positions) if "q" in rotate else q
    k_r = turn(k_new, positions) if "k" in rotate else k_new
    v_r = turn(v_new, positions) if "v" in rotate else v_new
    return _sim_decode(q_r, k_r, v_r, k_cache, v_cache, **decode_kw)


def _rope_decode_bugs(style):
    return [
        ("rope_after_caching", dict(after_caching="rerotate")),
        ("rope_after_caching", dict(after_caching="raw")),
        ("rope_no_position_offset", dict(offset=False)),
        ("rope_on_values", dict(rotate="qkv")),
        ("rope_query_not_rotated", dict(rotate="k")),
        ("rope_key_not_rotated", dict(rotate="q")),
        ("rope_wrong_pairing", dict(pairing=OTHER_STYLE[style])),
        *_DECODE_BUGS,  # the bugs of a plain decoding step, passed on to simulators._sim_decode
    ]


def rope_decode_variants(q, k_new, v_new, k_cache, v_cache, style):
    """check_rope_decode_step: where and when RoPE is applied, then the bugs of a plain decoding step."""
    return _variants(_sim_rope_decode, _rope_decode_bugs(style), q, k_new, v_new, k_cache, v_cache, style)


# ---------------------------------------------------------------------------------------------------------------
# The sliding-window mask.
# ---------------------------------------------------------------------------------------------------------------


def _sim_window(l_q, l_kv, window, *, extra=0, bound="causal", align="bottom_right"):
    """The (l_q, l_kv) sliding-window mask as a given bug builds it: query i at position p (bottom-right aligned:
    p = l_kv - l_q + i; top-left: p = i) sees the keys p - (window + extra) < j, and j <= p ('causal'), every later
    key ('none'), j < p + window ('symmetric'); 'ignored': the causal mask alone."""
    p = np.arange(l_q)[:, None] + (l_kv - l_q if align == "bottom_right" else 0)  # (l_q, 1)
    j = np.arange(l_kv)[None, :]  # (1, l_kv)
    if bound == "ignored":
        return j <= p
    recent = j > p - (window + extra)  # (l_q, l_kv)
    if bound == "none":
        return recent
    if bound == "symmetric":
        return recent & (j < p + window)
    return recent & (j <= p)


_WINDOW_BUGS = [
    ("window_one_key_too_many", dict(extra=1)),
    ("window_one_key_too_few", dict(extra=-1)),
    ("window_top_left", dict(align="top_left")),
    ("window_not_causal", dict(bound="none")),
    ("window_symmetric", dict(bound="symmetric")),
    ("window_ignored", dict(bound="ignored")),
]


def window_mask_variants(l_q, l_kv, window):
    """check_sliding_window_mask: off by one either way, top-left, not causal, symmetric, no window, numbers."""
    def sim(**kw):
        return (_sim_window(l_q, l_kv, window, **kw),)
    return _variants(sim, _WINDOW_BUGS) + [
        ("mask_not_boolean", lambda: _is_01_mask(reference.sliding_window_mask(l_q, l_kv, window)))]


# ---------------------------------------------------------------------------------------------------------------
# Attention with a sink logit per head.
# ---------------------------------------------------------------------------------------------------------------


def _sim_sinks(q, k, v, sinks, mask=None, scale=None, *, sink="column", scale_rule="given", softmax_axis=-1,
               invert_mask=False, ignore_mask=False, fill="zero", shift="row"):
    """(out, weights) of attention with sinks, the way a given bug computes them (defaults: the book's).

    sink: 'column' (one more column of logits, dropped after the softmax), 'ignored' (plain attention), 'scaled'
    (the sink multiplied by the scale), 'unshifted' (exp(sink) added without the row's shift), 'per_query' (query i
    of every head gets sinks[i]). The other knobs are those of ``simulators._sim_sdpa``.
    """
    c = _bug_scale(scale_rule, q, k, v, scale)
    if c is None or ((invert_mask or ignore_mask) and mask is None):
        return None
    if ignore_mask:
        mask = None
    if invert_mask:
        mask = ~mask
    S = c * (q @ np.swapaxes(k, -1, -2))  # (..., L_q, L_kv)
    if sink == "ignored":
        weights = _sim_softmax(S, mask, axis=softmax_axis, fill=fill, shift=shift)
        return weights @ v, weights
    sinks = np.asarray(sinks, dtype=np.float64)
    column_shape = S.shape[:-1] + (1,)
    if sink == "per_query":
        column = np.broadcast_to(sinks[:, None], column_shape)  # (L_q, 1): raises unless L_q == h
    else:
        column = np.broadcast_to(sinks[..., None, None], column_shape) * (c if sink == "scaled" else 1.0)
    if sink == "unshifted":
        allowed = np.ones(S.shape, dtype=bool) if mask is None else np.broadcast_to(mask, S.shape)
        x = np.where(allowed, S, -np.inf)
        top = np.max(x, axis=-1, keepdims=True)
        e = np.exp(x - np.where(np.isfinite(top), top, 0.0))
        weights = e / (e.sum(axis=-1, keepdims=True) + np.exp(column))
        return weights @ v, weights
    extended = np.concatenate([S, column], axis=-1)  # (..., L_q, L_kv + 1)
    ext_mask = None if mask is None else np.concatenate(
        [np.broadcast_to(mask, S.shape), np.ones(column_shape, dtype=bool)], axis=-1)
    weights = _sim_softmax(extended, ext_mask, axis=softmax_axis, fill=fill, shift=shift)[..., :-1]
    return weights @ v, weights


def _kept_sink_column(expected_weights):
    """Predicate: the weights came back with the sink's column (last or first) next to the right L_kv columns."""
    p_sink = 1.0 - expected_weights.sum(axis=-1, keepdims=True)  # (..., L_q, 1)

    def matches(actual):
        got = actual[1]
        if got is None or got.shape != expected_weights.shape[:-1] + (expected_weights.shape[-1] + 1,):
            return False
        return any(_same(got[..., keys], expected_weights) and _same(got[..., sink], p_sink)
                   for keys, sink in ((slice(None, -1), slice(-1, None)), (slice(1, None), slice(None, 1))))
    return matches


_SINK_BUGS = [
    ("sink_ignored", dict(sink="ignored")),
    ("sink_scaled", dict(sink="scaled")),
    ("sink_not_shifted", dict(sink="unshifted")),
    ("sink_per_query", dict(sink="per_query")),
] + _SCALE_BUGS + _MASK_BUGS + _SOFTMAX_BUGS


def sink_attention_variants(q, k, v, sinks, mask, scale, expected_weights):
    """check_sink_attention: the sink's column kept, the sink ignored, scaled, unshifted or per query; then the
    scale, mask and softmax bugs of the attention around it."""
    return [("sink_column_kept", lambda: _kept_sink_column(expected_weights))] + _variants(
        _sim_sinks, _SINK_BUGS, q, k, v, sinks, mask, scale)


# ---------------------------------------------------------------------------------------------------------------
# RMSNorm.
# ---------------------------------------------------------------------------------------------------------------


def _sim_rms_norm(x, weight, eps, *, centre=False, stat="mean_square", eps_rule="inside", fixed_eps=None,
                  gain="weight", axis=-1, keepdims=True):
    """RMSNorm over ``axis`` the way a given bug computes it (defaults: ``x / sqrt(mean(x^2) + eps) * weight``).

    centre: subtract the mean first (LayerNorm); stat: 'mean_square', 'variance', 'sum_square'; eps_rule: 'inside'
    or 'outside' the square root; fixed_eps: the eps used instead of the one passed; gain: 'weight', 'one_plus'
    (1 + weight), 'none'.
    """
    eps = eps if fixed_eps is None else fixed_eps
    mean = np.mean(x, axis=axis, keepdims=True)
    numerator = x - mean if centre else x
    squares = (x - mean) ** 2 if stat == "variance" else x * x
    statistic = (np.sum if stat == "sum_square" else np.mean)(squares, axis=axis, keepdims=keepdims)
    with np.errstate(divide="ignore", invalid="ignore"):
        root = np.sqrt(statistic + eps) if eps_rule == "inside" else np.sqrt(statistic) + eps
        y = numerator / root
    return y * {"weight": weight, "one_plus": 1.0 + weight, "none": 1.0}[gain]


def _rms_bugs(ndim):
    bugs = [
        ("rmsnorm_subtracts_mean", dict(centre=True, stat="variance")),
        ("rmsnorm_variance", dict(stat="variance")),
        ("rmsnorm_sum_not_mean", dict(stat="sum_square")),
        ("rmsnorm_eps_outside_sqrt", dict(eps_rule="outside")),
    ]
    bugs += [("rmsnorm_eps_ignored", dict(fixed_eps=e)) for e in (0.0, 1e-6, 1e-5, 1e-8)]
    bugs += [("rmsnorm_one_plus_weight", dict(gain="one_plus")), ("rmsnorm_no_weight", dict(gain="none"))]
    axes = [a for a in range(ndim - 1)] + [None] + ([(-3, -1)] if ndim >= 3 else [])
    bugs += [("rmsnorm_wrong_axis", dict(axis=a)) for a in axes if ndim > 1]
    bugs += [("rmsnorm_no_keepdims", dict(keepdims=False))]
    return bugs


def rms_norm_variants(x, weight, eps):
    """check_rms_norm: LayerNorm, the variance, the sum, eps misplaced or ignored, the gain, the axis, keepdims."""
    def sim(**kw):
        out = _sim_rms_norm(x, weight, eps, **kw)
        return None if out.shape != x.shape else (out,)
    return _variants(sim, _rms_bugs(x.ndim))


