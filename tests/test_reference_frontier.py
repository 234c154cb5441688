"""Tests for the parts of today's models in mha.reference (issue 24, part I): RoPE, QK-norm (RMSNorm), sliding
windows, logit soft-capping and attention sinks, forward and hand-derived backward.

Each is checked against something written here independently of mha.reference:

* RoPE: complex numbers (pair (a, b) as a + ib times e^{i angle}), in NumPy and (for autograd) in torch, with the
  frequencies written as Hugging Face does (1 / base^(2i/d)); the rotate_half formula x cos + rotate_half(x) sin;
  the relative-position property; the fixed permutation between the two styles.
* RMSNorm: torch.nn.functional.rms_norm and its autograd.
* sliding_window_mask: a Python loop over (i, j).
* sinks: a torch softmax over the scores with one extra column (the sink logit) that is then dropped.
* the whole layer and every gradient (q_norm, k_norm, sinks included): a torch forward written here, float64, and
  torch autograd through it; plus central finite differences at a few coordinates, and a KV-cache identity.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mha import reference as R
from mha.reference.backward import _attention_grad_general
from mha.reference.scaled_dot_product import _attention, _attention_general

from _params import make_params, t

torch.set_num_threads(1)
TIGHT = dict(rtol=1e-10, atol=1e-12)
GRAD = dict(rtol=1e-9, atol=1e-11)


# ---------------------------------------------------------------------------------------------------------------
# Independent computations.
# ---------------------------------------------------------------------------------------------------------------


def hf_inv_freq(d, base):
    """Hugging Face's form of the frequencies: 1 / base^(arange(0, d, 2) / d)."""
    return 1.0 / (base ** (np.arange(0, d, 2) / d))


def complex_rope_np(x, positions, base, style):
    """Pair (a, b) as a + ib, times e^{i positions theta}; back to the style's layout."""
    d = x.shape[-1]
    angles = np.asarray(positions)[..., None] * hf_inv_freq(d, base)  # (..., L, d/2)
    if style == "half":
        z = x[..., : d // 2] + 1j * x[..., d // 2 :]
    else:
        z = x[..., 0::2] + 1j * x[..., 1::2]
    w = z * np.exp(1j * angles)
    if style == "half":
        return np.concatenate([w.real, w.imag], axis=-1)
    out = np.empty(np.broadcast_shapes(x.shape, w.shape[:-1] + (d,)))
    out[..., 0::2], out[..., 1::2] = w.real, w.imag
    return out


def complex_rope_torch(x, positions, base, style):
    """The same in torch (differentiable): torch.complex / view_as_complex times torch.polar."""
    d = x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = torch.as_tensor(np.asarray(positions), dtype=torch.float64)[..., None] * inv_freq
    rot = torch.polar(torch.ones_like(angles), angles)
    if style == "half":
        w = torch.complex(x[..., : d // 2], x[..., d // 2 :]) * rot
        return torch.cat([w.real, w.imag], dim=-1)
    w = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous()) * rot
    return torch.view_as_real(w).reshape(w.shape[:-1] + (d,))


def rotate_half_rope(x, positions, base):
    """Hugging Face's Llama: x * cos + rotate_half(x) * sin, cos/sin of (angles, angles)."""
    d = x.shape[-1]
    angles = np.asarray(positions)[..., None] * hf_inv_freq(d, base)
    emb = np.concatenate([angles, angles], axis=-1)  # (..., L, d)
    rotate_half = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], axis=-1)
    return x * np.cos(emb) + rotate_half * np.sin(emb)


def allowed_by_loop(L_q, L_kv, is_causal, window):
    """(L_q, L_kv) bool: query i at absolute position p = L_kv - L_q + i; causal j <= p; window p - W < j <= p."""
    out = np.ones((L_q, L_kv), dtype=bool)
    for i in range(L_q):
        p = L_kv - L_q + i
        for j in range(L_kv):
            if is_causal or window is not None:
                out[i, j] &= j <= p
            if window is not None:
                out[i, j] &= j > p - window
    return out


def torch_core(q, k, v, allowed, scale, softcap=None, sinks=None):
    """softmax(softcap(scale q k^T) with a sink column) v, weights without the sink. ``allowed`` (bool tensor,
    broadcastable); a row with nothing allowed and no sink: zero weights. ``sinks`` broadcastable to q's leading
    axes."""
    s = q @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    allowed = torch.as_tensor(allowed).expand_as(s)
    s = s.masked_fill(~allowed, -1e300)  # finite: no NaN in the gradient of a fully masked row
    if sinks is not None:
        column = sinks[..., None, None].expand(*s.shape[:-1], 1)
        w = torch.softmax(torch.cat([s, column], dim=-1), dim=-1)[..., :-1]  # the sink column, dropped
    else:
        w = torch.softmax(s, dim=-1)
    w = w * allowed  # a fully masked row without a sink: uniform * 0 = 0
    return w @ v, w


def torch_layer(x_q, x_kv, P, h, mask=None, is_causal=False, positions=None, rope_base=None, rope_style="half",
                window=None, softcap=None, eps=1e-6, scale=None):
    """The layer of the spec, written directly in torch: projections, heads, QK-norm, RoPE, scores, soft-cap, masks,
    sinks, softmax, A v, merge, W_o. ``positions`` = (positions_q, positions_kv), numpy, shapes (L,) or (N, L)."""
    hd = P["W_q"].shape[1] // h
    g = P["W_k"].shape[1] // hd
    N, L_q, _ = x_q.shape
    L_kv = x_kv.shape[1]

    def lin(x, key):
        y = x @ P[f"W_{key}"]
        return y + P[f"b_{key}"] if f"b_{key}" in P else y

    q = lin(x_q, "q").view(N, L_q, h, hd).transpose(1, 2)
    k = lin(x_kv, "k").view(N, L_kv, g, hd).transpose(1, 2)
    v = lin(x_kv, "v").view(N, L_kv, g, hd).transpose(1, 2)
    if "q_norm" in P:
        q, k = F.rms_norm(q, (hd,), P["q_norm"], eps), F.rms_norm(k, (hd,), P["k_norm"], eps)
    if rope_base is not None:
        pos_q, pos_kv = (p if p.ndim == 1 else p[:, None, :] for p in positions)  # (N, L) -> (N, 1, L)
        q, k = complex_rope_torch(q, pos_q, rope_base, rope_style), complex_rope_torch(k, pos_kv, rope_base, rope_style)
    k, v = k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)
    allowed = allowed_by_loop(L_q, L_kv, is_causal, window)
    if mask is not None:
        allowed = np.logical_and(mask, allowed)
    o, w = torch_core(q, k, v, allowed, 1 / math.sqrt(hd) if scale is None else scale, softcap, P.get("sinks"))
    out = o.transpose(1, 2).reshape(N, L_q, h * hd) @ P["W_o"]
    return (out + P["b_o"] if "b_o" in P else out), w


# ---------------------------------------------------------------------------------------------------------------
# RoPE.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("shape,positions", [
    ((5, 8), np.arange(5)),
    ((2, 3, 4, 6), np.array([0, 7, 100, 100_000])),  # (N, h, L, d), one set of positions for all
    ((2, 3, 4, 2), np.array([[0, 1, 2, 3], [9, 10, 11, 12]])[:, None, :]),  # (N, 1, L): per sequence
    ((1, 1, 16), np.array([3])),
])
@pytest.mark.parametrize("base", [10000.0, 500000.0, 10])
def test_rope_equals_complex_multiplication(style, shape, positions, base):
    x = np.random.default_rng(0).standard_normal(shape)
    # theta_i is computed two ways (base^(-2i/d) and 1 / base^(2i/d)), one rounding apart: the angle p theta_i
    # inherits p times that rounding, so the tolerance grows with the largest position.
    atol = 1e-12 + 4 * np.finfo(float).eps * np.max(positions) * np.abs(x).max()
    np.testing.assert_allclose(R.rope(x, positions, base, style), complex_rope_np(x, positions, base, style),
                               rtol=1e-12, atol=atol)


def test_rope_half_equals_hugging_faces_rotate_half_and_interleaved_is_a_permutation_of_it():
    rng = np.random.default_rng(1)
    x, positions = rng.standard_normal((3, 7, 10)), np.array([0, 1, 2, 5, 8, 13, 2048])
    half = R.rope(x, positions, 10000.0, "half")
    np.testing.assert_allclose(half, rotate_half_rope(x, positions, 10000.0), rtol=1e-12, atol=1e-12)
    perm = np.r_[0:10:2, 1:10:2]  # interleaved pair (2i, 2i+1) -> half pair (i, i + d/2)
    np.testing.assert_allclose(R.rope(x[..., perm], positions, style="half"),
                               R.rope(x, positions, style="interleaved")[..., perm], rtol=1e-13, atol=1e-13)
    assert not np.allclose(half, R.rope(x, positions, style="interleaved"))  # the styles differ


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rope_scores_depend_only_on_the_relative_position(style):
    """<rope(q, m), rope(k, n)> = <q, rope(k, n - m)>: the same for every shift of both positions."""
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal(16), rng.standard_normal(16)

    def score(m, n):
        return float(R.rope(q[None], [m], style=style)[0] @ R.rope(k[None], [n], style=style)[0])

    for m, n in [(0, 0), (3, 7), (7, 3), (100, 140), (5000, 4000)]:
        for shift in (1, 17, 12345):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), rel=1e-10, abs=1e-10)
        if n >= m:
            expected = float(q @ R.rope(k[None], [n - m], style=style)[0])
            assert score(m, n) == pytest.approx(expected, rel=1e-10, abs=1e-10)
    assert abs(score(0, 5) - score(0, 6)) > 1e-3  # and it does depend on it


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rope_backward_is_autograd_and_the_inverse_rotation(style):
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal((2, 3, 5, 8)), rng.standard_normal((2, 3, 5, 8))
    positions = np.array([[4, 5, 6, 7, 8], [0, 1, 2, 3, 4]])[:, None, :]  # (N, 1, L)
    x_t = t(x).requires_grad_()
    (complex_rope_torch(x_t, positions, 10000.0, style) * t(dy)).sum().backward()
    np.testing.assert_allclose(R.rope_backward(dy, positions, style=style), x_t.grad.numpy(), **TIGHT)
    np.testing.assert_allclose(R.rope_backward(R.rope(x, positions, style=style), positions, style=style), x,
                               rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(np.linalg.norm(R.rope(x, positions, style=style), axis=-1),
                               np.linalg.norm(x, axis=-1), rtol=1e-13)  # a rotation keeps lengths


def test_rope_frequencies_and_position_zero():
    np.testing.assert_allclose(R.rope_frequencies(8), hf_inv_freq(8, 10000.0), rtol=1e-15)
    np.testing.assert_allclose(R.rope_frequencies(6, 500000.0), [1.0, 500000.0 ** (-1 / 3), 500000.0 ** (-2 / 3)],
                               rtol=1e-15)
    x = np.random.default_rng(4).standard_normal((3, 4))
    np.testing.assert_array_equal(R.rope(x, [0, 0, 0]), x)  # position 0: no rotation


# ---------------------------------------------------------------------------------------------------------------
# RMSNorm.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_rms_norm_and_its_backward_match_torch(eps):
    rng = np.random.default_rng(5)
    x, w, dy = rng.standard_normal((2, 3, 4, 6)), 1 + 0.3 * rng.standard_normal(6), rng.standard_normal((2, 3, 4, 6))
    x[0, 0, 0] = 1e-4  # a small vector: eps matters
    x_t, w_t = t(x).requires_grad_(), t(w).requires_grad_()
    y_t = F.rms_norm(x_t, (6,), w_t, eps)
    np.testing.assert_allclose(R.rms_norm(x, w, eps), y_t.detach().numpy(), **TIGHT)
    (y_t * t(dy)).sum().backward()
    dx, dw = R.rms_norm_backward(x, w, dy, eps)
    np.testing.assert_allclose(dx, x_t.grad.numpy(), **TIGHT)
    np.testing.assert_allclose(dw, w_t.grad.numpy(), **TIGHT)
    assert dw.shape == (6,)


# ---------------------------------------------------------------------------------------------------------------
# Sliding window.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("l_q,l_kv", [(5, 5), (3, 7), (7, 3), (1, 6), (6, 1), (4, 4)])
@pytest.mark.parametrize("window", [1, 2, 3, 5, 6, 7, 20])
def test_sliding_window_mask_against_a_loop(l_q, l_kv, window):
    got = R.sliding_window_mask(l_q, l_kv, window)
    np.testing.assert_array_equal(got, allowed_by_loop(l_q, l_kv, False, window))
    assert got.shape == (l_q, l_kv) and got.dtype == bool
    assert np.all(got.sum(axis=1) <= window)
    if window >= l_kv:
        np.testing.assert_array_equal(got, R.causal_mask(l_q, l_kv))
    if window == 1 and l_q == l_kv:
        np.testing.assert_array_equal(got, np.eye(l_q, dtype=bool))


# ---------------------------------------------------------------------------------------------------------------
# The core: sinks, softcap, window; forward and backward against torch.
# ---------------------------------------------------------------------------------------------------------------


CORE_CASES = [
    # q, k, v shapes (leading axes broadcast), sinks shape or None, window, softcap, is_causal, fully masked row
    pytest.param(((2, 3, 4, 5), (1, 3, 6, 5), (3, 6, 2)), (3,), None, None, False, False, id="sinks-per-head"),
    pytest.param(((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2)), (2, 1), None, 2.0, False, True, id="sinks-softcap"),
    pytest.param(((4, 5), (4, 5), (4, 3)), (), 2, None, True, False, id="sinks-scalar-window"),
    pytest.param(((2, 3, 4, 5), (1, 3, 6, 5), (3, 6, 2)), None, 3, 1.5, False, True, id="softcap-window"),
    pytest.param(((1, 2, 7, 4), (1, 2, 3, 4), (1, 2, 3, 4)), (2,), 1, 0.7, True, False, id="Lq>Lkv-empty-rows"),
    pytest.param(((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 4)), (3,), 9, 4.0, False, True, id="window>L"),
]


def core_inputs(shapes, sinks_shape, with_empty_row, seed=11):
    rng = np.random.default_rng(seed)
    q, k, v = (2 * rng.standard_normal(s) for s in shapes)
    sinks = None if sinks_shape is None else rng.standard_normal(sinks_shape)
    mask = None
    if with_empty_row:
        mask = rng.random((shapes[0][-2], shapes[1][-2])) < 0.7
        mask[:, -1] = True
        mask[1] = False  # query row 1 may attend to nothing
    return q, k, v, sinks, mask


@pytest.mark.parametrize("shapes,sinks_shape,window,softcap,is_causal,empty_row", CORE_CASES)
def test_core_forward_and_backward_match_torch(shapes, sinks_shape, window, softcap, is_causal, empty_row):
    q, k, v, sinks, mask = core_inputs(shapes, sinks_shape, empty_row)
    kw = dict(mask=mask, scale=0.6, is_causal=is_causal, sinks=sinks, window=window, softcap=softcap)
    out, weights = R.scaled_dot_product_attention(q, k, v, **kw)

    Q, K, V = (t(a).requires_grad_() for a in (q, k, v))
    S = None if sinks is None else t(sinks).requires_grad_()
    allowed = allowed_by_loop(q.shape[-2], k.shape[-2], is_causal, window)
    if mask is not None:
        allowed = mask & allowed
    t_out, t_w = torch_core(Q, K, V, allowed, 0.6, softcap, S)
    np.testing.assert_allclose(out, t_out.detach().numpy(), **TIGHT)
    np.testing.assert_allclose(weights, t_w.detach().numpy(), **TIGHT)

    dO = np.random.default_rng(12).standard_normal(out.shape)
    (t_out * t(dO)).sum().backward()
    grads = R.scaled_dot_product_attention_grad(q, k, v, dO, **kw)
    assert len(grads) == (3 if sinks is None else 4)
    for ours, theirs in zip(grads, (Q, K, V, S)):
        assert ours.shape == tuple(theirs.shape)
        np.testing.assert_allclose(ours, theirs.grad.numpy(), **GRAD)


def test_sinks_equal_an_appended_key_with_zero_value_and_rows_sum_to_one_minus_p_sink():
    """The sink as a real key: k gets one more coordinate (0 for every key, sink/scale for the query) and one more key
    (0, ..., 0, 1) with value 0, whose score is exactly the sink logit. Its weight is the p_sink the rows miss."""
    rng = np.random.default_rng(13)
    h, L_q, L_kv, d, scale = 3, 4, 5, 6, 0.4
    q, k, v, sinks = (rng.standard_normal(s) for s in ((h, L_q, d), (h, L_kv, d), (h, L_kv, 2), (h,)))
    out, weights = R.scaled_dot_product_attention(q, k, v, scale=scale, sinks=sinks)
    q_ext = np.concatenate([q, np.broadcast_to(sinks[:, None, None] / scale, (h, L_q, 1))], axis=-1)
    k_ext = np.concatenate([np.concatenate([k, np.zeros((h, L_kv, 1))], axis=-1),
                            np.broadcast_to(np.r_[np.zeros(d), 1.0], (h, 1, d + 1))], axis=1)  # (h, L_kv + 1, d + 1)
    v_ext = np.concatenate([v, np.zeros((h, 1, 2))], axis=1)
    out_ext, w_ext = R.scaled_dot_product_attention(q_ext, k_ext, v_ext, scale=scale)
    np.testing.assert_allclose(out, out_ext, **TIGHT)
    np.testing.assert_allclose(weights, w_ext[..., :-1], **TIGHT)
    np.testing.assert_allclose(weights.sum(axis=-1), 1 - w_ext[..., -1], **TIGHT)
    s = scale * q @ np.swapaxes(k, -1, -2)
    p_sink = np.exp(sinks)[:, None] / (np.exp(s).sum(axis=-1) + np.exp(sinks)[:, None])  # by the definition
    np.testing.assert_allclose(weights.sum(axis=-1), 1 - p_sink, **TIGHT)


def test_a_row_with_no_allowed_key_puts_everything_on_the_sink():
    rng = np.random.default_rng(14)
    q, k, v = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5, 2))
    mask = np.ones((4, 5), dtype=bool)
    mask[2] = False
    sinks, dO = np.array([0.3, -50.0]), rng.standard_normal((2, 4, 2))
    out, weights = R.scaled_dot_product_attention(q, k, v, mask=mask, sinks=sinks, softcap=3.0)
    assert np.all(weights[:, 2] == 0) and np.all(out[:, 2] == 0) and np.all(np.isfinite(out))
    dq, dk, dv, ds = R.scaled_dot_product_attention_grad(q, k, v, dO, mask=mask, sinks=sinks, softcap=3.0)
    assert np.all(dq[:, 2] == 0)
    dO_other = dO.copy()
    dO_other[:, 2] = 123.0  # the masked row's upstream gradient reaches nothing, the sink neither
    np.testing.assert_array_equal(R.scaled_dot_product_attention_grad(q, k, v, dO_other, mask=mask, sinks=sinks,
                                                                      softcap=3.0)[3], ds)
    assert np.all(np.abs(R.scaled_dot_product_attention(q, k, v, sinks=np.full(2, -800.0))[0]
                         - R.scaled_dot_product_attention(q, k, v)[0]) < 1e-300 + 1e-15)  # a sink at -inf: no sink


def test_softcap_bounds_the_scores_and_a_huge_cap_is_no_cap():
    rng = np.random.default_rng(15)
    q, k, v = 30 * rng.standard_normal((4, 8)), 30 * rng.standard_normal((6, 8)), rng.standard_normal((6, 3))
    _, w = R.scaled_dot_product_attention(q, k, v, softcap=1.0)
    ratios = w / w.max(axis=-1, keepdims=True)
    assert ratios.min() >= math.exp(-2.0) - 1e-12  # scores within [-1, 1]: weights within a factor e^2
    np.testing.assert_allclose(R.scaled_dot_product_attention(q, k, v, softcap=1e9)[0],
                               R.scaled_dot_product_attention(q, k, v)[0], rtol=1e-9, atol=1e-12)


def test_the_new_keywords_off_change_nothing():
    """None everywhere is the old computation, bit for bit; a window >= L_kv is exactly is_causal; the general
    forward and backward with nothing on equal the plain ones."""
    rng = np.random.default_rng(16)
    q, k, v, dO = (rng.standard_normal(s) for s in ((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 2), (2, 3, 4, 2)))
    plain = R.scaled_dot_product_attention(q, k, v, is_causal=True)
    for got, want in zip(R.scaled_dot_product_attention(q, k, v, None, None, True, sinks=None, window=None,
                                                        softcap=None), plain):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(R.scaled_dot_product_attention(q, k, v, window=6), plain):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(_attention_general(q, k, v, None, 0.3)[:2], _attention(q, k, v, None, 0.3)):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(_attention_grad_general(q, k, v, dO, None, 0.3, None, None),
                         R.scaled_dot_product_attention_grad(q, k, v, dO, scale=0.3)):
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
    x, p = rng.standard_normal((2, 5, 8)), R.init_params(8, 4, 2)
    for got, want in zip(R.multi_head_attention(x, None, p, 4, rope_style="interleaved", qk_norm_eps=0.1),
                         R.multi_head_attention_per_head(x, None, p, 4)):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)


# ---------------------------------------------------------------------------------------------------------------
# The layer: forward and every gradient against torch autograd.
# ---------------------------------------------------------------------------------------------------------------


LAYER_CASES = [
    # N (0 = unbatched), L_q, L_kv (None = self-attention), d_model, h, g, hd, bias, qk_norm, sinks, keywords, mask
    pytest.param(2, 5, None, 8, 4, 2, 4, True, True, True,
                 dict(rope_base=10000.0, window=2, softcap=3.0, is_causal=True), None, id="all-on-gqa"),
    pytest.param(1, 6, None, 6, 4, 1, 2, False, False, True,
                 dict(rope_base=100.0, rope_style="interleaved", window=8, positions="per-sequence"), None,
                 id="batch-of-one-mqa-window>L"),
    pytest.param(2, 3, 6, 8, 2, 2, 4, False, True, True,
                 dict(rope_base=10000.0, is_causal=True, window=3, positions="cache"), None, id="cross-cache-like"),
    pytest.param(2, 5, None, 8, 4, 4, 2, True, True, True,
                 dict(rope_base=10000.0, is_causal=True, softcap=2.0, qk_norm_eps=0.1), "empty-row",
                 id="fully-masked-row-with-sinks"),
    pytest.param(2, 4, None, 6, 2, 1, 4, True, True, False,
                 dict(softcap=1.5, scale=0.8, is_causal=True), "empty-row", id="fully-masked-row-no-sinks"),
    pytest.param(0, 5, None, 8, 4, 2, 2, True, True, True,
                 dict(rope_base=10000.0, rope_style="interleaved", window=3, softcap=5.0), None, id="unbatched"),
    pytest.param(2, 6, 3, 8, 4, 2, 2, True, False, True, dict(is_causal=True, window=2), None,
                 id="cross-Lq>Lkv-rows-on-the-sink"),
    pytest.param(2, 4, None, 8, 2, 1, 4, True, True, False, dict(window=1, rope_base=10.0), None, id="window-1"),
]


def layer_inputs(N, L_q, L_kv, d_model, h, g, hd, bias, qk_norm, sinks, kw, mask_kind, seed=21):
    rng = np.random.default_rng(seed)
    p = make_params(rng, d_model, h, g, hd, bias)
    if qk_norm:
        p["q_norm"], p["k_norm"] = 1 + 0.3 * rng.standard_normal(hd), 1 + 0.3 * rng.standard_normal(hd)
    if sinks:
        p["sinks"] = rng.standard_normal(h)
    n = max(N, 1)
    x_q = 2 * rng.standard_normal((n, L_q, d_model))
    x_kv = None if L_kv is None else 2 * rng.standard_normal((n, L_kv, d_model))
    l_kv = L_q if L_kv is None else L_kv
    kw = dict(kw)
    if kw.get("positions") == "per-sequence":
        kw["positions"] = np.arange(L_q)[None, :] + np.array([[3], [100]])[:n]  # (N, L)
    elif kw.get("positions") == "cache":  # the queries are the last L_q of the l_kv positions
        kw["positions"] = (l_kv - L_q + np.arange(L_q), np.arange(l_kv))
    mask = None
    if mask_kind == "empty-row":
        mask = rng.random((n, 1, L_q, l_kv)) < 0.8
        mask[..., 0] = True
        mask[0, 0, 2] = False  # sequence 0, query 2: no allowed key
    grad_out = rng.standard_normal((n, L_q, d_model))
    if N == 0:
        x_q, grad_out = x_q[0], grad_out[0]
        x_kv = None if x_kv is None else x_kv[0]
        mask = None if mask is None else mask[0]
    return p, x_q, x_kv, kw, mask, grad_out


def torch_layer_call(p, x_q, x_kv, h, kw, mask, requires_grad=False):
    """(out, weights, leaves) of torch_layer on the same inputs, batched; leaves: the tensors to read grads from."""
    unbatched = np.ndim(x_q) == 2
    P = {key: t(value).requires_grad_(requires_grad) for key, value in p.items()}
    X_q = t(x_q[None] if unbatched else x_q).requires_grad_(requires_grad)
    X_kv = X_q if x_kv is None else t(x_kv[None] if unbatched else x_kv).requires_grad_(requires_grad)
    L_q, L_kv = X_q.shape[1], X_kv.shape[1]
    kw = dict(kw)
    positions = kw.pop("positions", None)
    if kw.get("rope_base") is not None:
        positions = (np.arange(L_q), np.arange(L_kv)) if positions is None else positions
        positions = positions if isinstance(positions, tuple) else (positions, positions)
    m = None if mask is None else (mask[None] if unbatched else mask)
    out, w = torch_layer(X_q, X_kv, P, h, mask=m, positions=positions, eps=kw.pop("qk_norm_eps", 1e-6), **kw)
    leaves = dict(P, x_q=X_q, x_kv=None if x_kv is None else X_kv)
    return out, w, leaves


@pytest.mark.parametrize("N,L_q,L_kv,d_model,h,g,hd,bias,qk_norm,sinks,kw,mask_kind", LAYER_CASES)
def test_layer_forward_matches_torch(N, L_q, L_kv, d_model, h, g, hd, bias, qk_norm, sinks, kw, mask_kind):
    p, x_q, x_kv, kw, mask, _ = layer_inputs(N, L_q, L_kv, d_model, h, g, hd, bias, qk_norm, sinks, kw, mask_kind)
    out, weights = R.multi_head_attention(x_q, x_kv, p, h, mask=mask, **kw)
    t_out, t_w, _ = torch_layer_call(p, x_q, x_kv, h, kw, mask)
    if N == 0:
        t_out, t_w = t_out[0], t_w[0]
    np.testing.assert_allclose(out, t_out.numpy(), **TIGHT)
    np.testing.assert_allclose(weights, t_w.numpy(), **TIGHT)
    if sinks:
        assert np.all(weights.sum(axis=-1) < 1)  # some weight always goes to the sink
    if mask_kind == "empty-row":
        expected_row = p.get("b_o", np.zeros(d_model))  # zero weights (with or without sinks): the output is b_o
        np.testing.assert_allclose(out[0, 2], expected_row, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("N,L_q,L_kv,d_model,h,g,hd,bias,qk_norm,sinks,kw,mask_kind", LAYER_CASES)
def test_layer_gradients_match_autograd(N, L_q, L_kv, d_model, h, g, hd, bias, qk_norm, sinks, kw, mask_kind):
    p, x_q, x_kv, kw, mask, grad_out = layer_inputs(N, L_q, L_kv, d_model, h, g, hd, bias, qk_norm, sinks, kw,
                                                    mask_kind)
    grads = R.multi_head_attention_grad(x_q, x_kv, p, h, grad_out, mask=mask, **kw)
    t_out, _, leaves = torch_layer_call(p, x_q, x_kv, h, kw, mask, requires_grad=True)
    (t_out * t(grad_out if N else grad_out[None])).sum().backward()
    assert set(grads) == set(p) | {"x_q", "x_kv"}
    assert {"q_norm", "k_norm"} <= set(grads) if qk_norm else True
    for key, leaf in leaves.items():
        if leaf is None:
            assert grads[key] is None, key
            continue
        expected = leaf.grad.numpy()
        if N == 0 and key in ("x_q", "x_kv"):
            expected = expected[0]
        assert grads[key].shape == expected.shape, key
        np.testing.assert_allclose(grads[key], expected, err_msg=key, **GRAD)


def test_layer_gradients_match_central_finite_differences():
    """A second, autograd-free check of the new gradients: q_norm, k_norm, sinks and x, at a few coordinates."""
    rng = np.random.default_rng(31)
    p = R.init_params(6, 2, 1, head_dim=4, qk_norm=True, sinks=True, seed=3)
    x, dO = rng.standard_normal((1, 5, 6)), rng.standard_normal((1, 5, 6))
    kw = dict(rope_base=10000.0, window=3, softcap=2.0)
    grads = R.multi_head_attention_grad(x, None, p, 2, dO, **kw)

    def loss(x_, p_):
        return float(np.sum(R.multi_head_attention(x_, None, p_, 2, **kw)[0] * dO))

    eps = 1e-6
    for key in ("q_norm", "k_norm", "sinks", "W_q", "x_q"):
        target = x if key == "x_q" else p[key]
        for idx in list(np.ndindex(target.shape))[:4]:
            values = []
            for sign in (1, -1):
                changed = target.copy()
                changed[idx] += sign * eps
                values.append(loss(changed, p) if key == "x_q" else loss(x, {**p, key: changed}))
            numeric = (values[0] - values[1]) / (2 * eps)
            assert grads[key][idx] == pytest.approx(numeric, rel=1e-6, abs=1e-8), (key, idx)


def test_rope_layer_is_a_kv_cache_and_shift_invariant():
    """Self-attention over L tokens, then its last rows again as cross-attention of the last L_q tokens against all L
    at their absolute positions (what a KV cache computes); shifting all positions changes nothing."""
    rng = np.random.default_rng(32)
    p = R.init_params(8, 4, 2, qk_norm=True, sinks=True, seed=5)
    x, L, L_q = rng.standard_normal((2, 7, 8)), 7, 3
    kw = dict(rope_base=10000.0, window=4, softcap=4.0, is_causal=True)
    full, w_full = R.multi_head_attention(x, None, p, 4, **kw)
    tail, w_tail = R.multi_head_attention(x[:, -L_q:], x, p, 4, positions=(L - L_q + np.arange(L_q), np.arange(L)),
                                          **kw)
    np.testing.assert_allclose(tail, full[:, -L_q:], **TIGHT)
    np.testing.assert_allclose(w_tail, w_full[:, :, -L_q:], **TIGHT)
    shifted = R.multi_head_attention(x, None, p, 4, positions=np.arange(L) + 1000, **kw)[0]
    np.testing.assert_allclose(shifted, full, rtol=1e-9, atol=1e-11)
    unshifted_tail = R.multi_head_attention(x[:, -L_q:], x, p, 4, positions=(np.arange(L_q), np.arange(L)), **kw)[0]
    assert not np.allclose(unshifted_tail, full[:, -L_q:])  # wrong positions: another result


# ---------------------------------------------------------------------------------------------------------------
# Parameters.
# ---------------------------------------------------------------------------------------------------------------


def test_init_params_default_draws_are_unchanged_and_the_new_entries_come_last():
    """The default output is the same draws in the same order as before issue 24 (written out here); qk_norm and
    sinks add entries drawn after them, leaving the others bit-identical."""
    d_model, h, g, hd = 12, 4, 2, 3
    rng = np.random.default_rng(7)
    expected = {key: rng.standard_normal(shape) / math.sqrt(shape[0]) for key, shape in (
        ("W_q", (12, 12)), ("W_k", (12, 6)), ("W_v", (12, 6)), ("W_o", (12, 12)))}
    for key, width in (("b_q", 12), ("b_k", 6), ("b_v", 6), ("b_o", 12)):
        expected[key] = 0.1 * rng.standard_normal(width)
    default = R.init_params(d_model, h, g, seed=7)
    assert list(default) == list(expected)
    for key in expected:
        np.testing.assert_array_equal(default[key], expected[key])
    full = R.init_params(d_model, h, g, seed=7, qk_norm=True, sinks=True)
    assert list(full) == list(expected) + ["q_norm", "k_norm", "sinks"]
    assert full["q_norm"].shape == full["k_norm"].shape == (hd,) and full["sinks"].shape == (h,)
    for key in expected:
        np.testing.assert_array_equal(full[key], expected[key])
    assert not np.allclose(full["q_norm"], 1.0) and not np.allclose(full["q_norm"], full["k_norm"])
    assert set(R.init_params(8, 2, sinks=True)) == set(R.init_params(8, 2)) | {"sinks"}
    R.check_params(full, h)  # accepted by the checks, as by every function taking params
