"""Tests for mha.reference against independent computations.

References used: torch.nn.MultiheadAttention, torch.nn.functional.scaled_dot_product_attention (enable_gqa),
a separate torch forward written here with repeat_interleave (for autograd), central finite differences,
torch.softmax, and properties (permutation equivariance, causality, fully masked rows).
"""

import math
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mha import reference as R

from _optional_hypothesis import arrays, given, settings, st  # property tests skip without hypothesis
from _params import make_params, t, torch_mha_module

torch.set_num_threads(1)
SETTINGS = settings(max_examples=30, deadline=None)
TIGHT = dict(rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Helpers: random inputs and masks, and torch computations written independently of mha.reference.
# ---------------------------------------------------------------------------------------------------------------


def causal_mask(L_q, L_kv):
    """(L_q, L_kv), True = may attend: query t sees keys <= t (aligned at the end when L_kv > L_q)."""
    return np.tril(np.ones((L_q, L_kv), dtype=bool), k=L_kv - L_q)


def padding_mask(rng, N, L_kv):
    """(N, 1, 1, L_kv): each sequence keeps a random non-empty prefix of its keys."""
    lengths = rng.integers(1, L_kv + 1, size=N)
    return (np.arange(L_kv)[None, :] < lengths[:, None])[:, None, None, :]


def make_mask(kind, rng, N, L_q, L_kv):
    if kind == "none":
        return None
    if kind == "causal":
        return causal_mask(L_q, L_kv)
    if kind == "padding":
        return padding_mask(rng, N, L_kv)
    if kind == "causal_empty_row":  # causal, and query row 0 may attend to nothing
        m = causal_mask(L_q, L_kv).copy()
        m[0] = False
        return m
    raise ValueError(kind)


def torch_forward(x_q, x_kv, P, n_heads, mask):
    """Naive torch forward (differentiable), repeat_interleave for GQA; all-masked rows give zero weights."""
    hd = P["W_q"].shape[1] // n_heads
    g = P["W_k"].shape[1] // hd
    N, L_q, _ = x_q.shape
    L_kv = x_kv.shape[1]

    def lin(x, key):
        y = x @ P[f"W_{key}"]
        return y + P[f"b_{key}"] if f"b_{key}" in P else y

    q = lin(x_q, "q").view(N, L_q, n_heads, hd).transpose(1, 2)
    k = lin(x_kv, "k").view(N, L_kv, g, hd).transpose(1, 2).repeat_interleave(n_heads // g, dim=1)
    v = lin(x_kv, "v").view(N, L_kv, g, hd).transpose(1, 2).repeat_interleave(n_heads // g, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(hd)
    if mask is None:
        w = torch.softmax(s, dim=-1)
    else:
        m = torch.as_tensor(mask).expand_as(s)
        w = torch.softmax(s.masked_fill(~m, -1e300), dim=-1) * m  # all-masked row: uniform * 0 = 0
    o = (w @ v).transpose(1, 2).reshape(N, L_q, n_heads * hd) @ P["W_o"]
    return (o + P["b_o"] if "b_o" in P else o), w


# ---------------------------------------------------------------------------------------------------------------
# Forward pass vs torch.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding"])
@pytest.mark.parametrize("cross", [False, True])
def test_mha_matches_torch_multihead_attention(mask_kind, cross):
    rng = np.random.default_rng(1)
    N, L_q, d_model, h = 3, 5, 12, 3
    L_kv = 7 if cross else L_q
    p = make_params(rng, d_model, h, h, d_model // h)
    x_q = rng.standard_normal((N, L_q, d_model))
    x_kv = rng.standard_normal((N, L_kv, d_model)) if cross else None
    mask = make_mask(mask_kind, rng, N, L_q, L_kv)

    out, weights = R.multi_head_attention(x_q, x_kv, p, h, mask=mask)

    torch_kw = {}
    if mask_kind == "causal":
        torch_kw["attn_mask"] = torch.as_tensor(~mask)  # torch: True = NOT allowed
    if mask_kind == "padding":
        torch_kw["key_padding_mask"] = torch.as_tensor(~mask[:, 0, 0, :])  # (N, L_kv), True = ignore
    kv = t(x_kv) if cross else t(x_q)
    t_out, t_w = torch_mha_module(p, d_model, h)(t(x_q), kv, kv, average_attn_weights=False, **torch_kw)
    np.testing.assert_allclose(out, t_out.detach().numpy(), **TIGHT)
    np.testing.assert_allclose(weights, t_w.detach().numpy(), **TIGHT)
    assert weights.shape == (N, h, L_q, L_kv)


def test_mha_unbatched_matches_torch_and_averaged_weights():
    rng = np.random.default_rng(2)
    L, d_model, h = 6, 8, 4
    p = make_params(rng, d_model, h, h, d_model // h)
    x = rng.standard_normal((L, d_model))
    out, weights = R.multi_head_attention(x, None, p, h, mask=causal_mask(L, L))
    assert out.shape == (L, d_model) and weights.shape == (h, L, L)
    t_out, t_w = torch_mha_module(p, d_model, h)(t(x), t(x), t(x), attn_mask=torch.as_tensor(~causal_mask(L, L)))
    np.testing.assert_allclose(out, t_out.detach().numpy(), **TIGHT)
    np.testing.assert_allclose(weights.mean(axis=0), t_w.detach().numpy(), **TIGHT)  # torch averages heads


@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 4), (4, 2), (4, 1), (6, 3), (6, 2), (6, 1)])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding"])
def test_gqa_matches_torch_sdpa_enable_gqa(n_heads, n_kv_heads, mask_kind):
    rng = np.random.default_rng(3)
    N, L_q, L_kv, d_model, hd = 2, 4, 6, 10, 3
    p = make_params(rng, d_model, n_heads, n_kv_heads, hd)
    x_q, x_kv = rng.standard_normal((N, L_q, d_model)), rng.standard_normal((N, L_kv, d_model))
    mask = make_mask(mask_kind, rng, N, L_q, L_kv)

    out, weights = R.multi_head_attention(x_q, x_kv, p, n_heads, mask=mask)

    P = {key: t(v) for key, v in p.items()}
    q = (t(x_q) @ P["W_q"] + P["b_q"]).view(N, L_q, n_heads, hd).transpose(1, 2)
    k = (t(x_kv) @ P["W_k"] + P["b_k"]).view(N, L_kv, n_kv_heads, hd).transpose(1, 2)
    v = (t(x_kv) @ P["W_v"] + P["b_v"]).view(N, L_kv, n_kv_heads, hd).transpose(1, 2)
    attn_mask = None if mask is None else torch.as_tensor(mask)  # torch sdpa: True = may attend
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=True)
    t_out = heads.transpose(1, 2).reshape(N, L_q, n_heads * hd) @ P["W_o"] + P["b_o"]
    np.testing.assert_allclose(out, t_out.numpy(), **TIGHT)

    # Weights: query head j uses kv head j // (h/g).
    k_rep = k.repeat_interleave(n_heads // n_kv_heads, dim=1)
    s = q @ k_rep.transpose(-1, -2) / math.sqrt(hd)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, -math.inf)
    np.testing.assert_allclose(weights, torch.softmax(s, dim=-1).numpy(), **TIGHT)


def repeat_kv_columns(p, n_heads):
    """The MHA parameters equivalent to a GQA model: each kv head's columns repeated for its h/g query heads."""
    hd = p["W_q"].shape[1] // n_heads
    g = p["W_k"].shape[1] // hd
    cols = np.concatenate([np.arange(j // (n_heads // g) * hd, (j // (n_heads // g) + 1) * hd) for j in range(n_heads)])
    out = dict(p)
    for key in ("W_k", "W_v"):
        out[key] = p[key][:, cols]
    for key in ("b_k", "b_v"):
        if key in p:
            out[key] = p[key][cols]
    return out


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_gqa_equals_mha_with_repeated_kv_weights_in_torch(n_kv_heads):
    """g = 1 (MQA), 2 (GQA), 4 (= h, MHA): equal to torch MHA whose W_k/W_v repeat each kv head's columns."""
    rng = np.random.default_rng(4)
    N, L, d_model, h = 2, 5, 8, 4
    p = make_params(rng, d_model, h, n_kv_heads, d_model // h)
    x = rng.standard_normal((N, L, d_model))
    out, weights = R.multi_head_attention(x, None, p, h, mask=causal_mask(L, L))
    mha = torch_mha_module(repeat_kv_columns(p, h), d_model, h)
    t_out, t_w = mha(t(x), t(x), t(x), attn_mask=torch.as_tensor(~causal_mask(L, L)), average_attn_weights=False)
    np.testing.assert_allclose(out, t_out.detach().numpy(), **TIGHT)
    np.testing.assert_allclose(weights, t_w.detach().numpy(), **TIGHT)


@SETTINGS
@given(
    data=st.data(),
    N=st.integers(1, 3),
    L_q=st.integers(1, 5),
    L_kv=st.integers(1, 5),
    n_heads=st.sampled_from([1, 2, 3, 4, 6]),
    head_dim=st.integers(1, 4),
    bias=st.booleans(),
    mask_kind=st.sampled_from(["none", "causal", "padding"]),
    unbatched=st.booleans(),
)
def test_per_head_loop_equals_fused(data, N, L_q, L_kv, n_heads, head_dim, bias, mask_kind, unbatched):
    n_kv_heads = data.draw(st.sampled_from([g for g in range(1, n_heads + 1) if n_heads % g == 0]), label="g")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    d_model = data.draw(st.integers(1, 8), label="d_model")
    N = 1 if unbatched else N
    p = make_params(rng, d_model, n_heads, n_kv_heads, head_dim, bias)
    x_q, x_kv = rng.standard_normal((N, L_q, d_model)), rng.standard_normal((N, L_kv, d_model))
    mask = make_mask(mask_kind, rng, N, L_q, L_kv)
    if unbatched:
        x_q, x_kv = x_q[0], x_kv[0]
        mask = None if mask is None else mask[0] if mask.ndim == 4 else mask
    fused = R.multi_head_attention(x_q, x_kv, p, n_heads, mask=mask)
    looped = R.multi_head_attention_per_head(x_q, x_kv, p, n_heads, mask=mask)
    for a, b in zip(fused, looped):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, **TIGHT)


def test_head_weights_blocks_and_kv_head_mapping():
    rng = np.random.default_rng(5)
    h, g, hd, d_model = 6, 2, 3, 5
    p = make_params(rng, d_model, h, g, hd)
    heads = R.head_weights(p, h)
    expected_kv = torch.arange(g).repeat_interleave(h // g).tolist()  # the convention of enable_gqa
    assert [head["kv_head"] for head in heads] == expected_kv
    np.testing.assert_array_equal(np.concatenate([hd_["W_q_i"] for hd_ in heads], axis=1), p["W_q"])
    np.testing.assert_array_equal(np.concatenate([hd_["W_o_i"] for hd_ in heads], axis=0), p["W_o"])
    np.testing.assert_array_equal(np.concatenate([hd_["b_q_i"] for hd_ in heads]), p["b_q"])
    for head in heads:
        j = head["kv_head"]
        np.testing.assert_array_equal(head["W_k_i"], p["W_k"][:, j * hd:(j + 1) * hd])
        np.testing.assert_array_equal(head["b_v_i"], p["b_v"][j * hd:(j + 1) * hd])
    no_bias = {key: v for key, v in p.items() if key.startswith("W")}
    assert all(head["b_q_i"] is None for head in R.head_weights(no_bias, h))


def test_split_merge_and_repeat_heads_are_the_torch_reshapes():
    """split_heads is view + transpose (head i = column block i), merge_heads its inverse, repeat_kv is
    repeat_interleave on the head axis (query head j reads key/value head j // n_rep); NaN and inf pass through."""
    rng = np.random.default_rng(7)
    y = rng.standard_normal((2, 5, 12))
    heads = R.split_heads(y, 3)
    assert heads.shape == (2, 3, 5, 4)
    np.testing.assert_array_equal(heads, torch.from_numpy(y).view(2, 5, 3, 4).transpose(1, 2).numpy())
    np.testing.assert_array_equal(heads[:, 1], y[:, :, 4:8])
    np.testing.assert_array_equal(R.merge_heads(heads), y)
    kv = rng.standard_normal((2, 2, 5, 4))
    np.testing.assert_array_equal(R.repeat_kv(kv, 3), torch.from_numpy(kv).repeat_interleave(3, dim=1).numpy())
    y[0, 0, 0] = np.nan
    assert np.isnan(R.merge_heads(R.split_heads(y, 3))[0, 0, 0])  # layout only: no finiteness check


@pytest.mark.parametrize("call, exc, match", [
    (lambda: R.split_heads(np.ones((2, 5, 12)), 5), ValueError, r"n_heads = 5 must divide y's last axis .* = 12"),
    (lambda: R.split_heads(np.ones((5, 12)), 3), ValueError, r"y must be 3-D \(N, L, n_heads\*head_dim\)"),
    (lambda: R.split_heads(np.ones((2, 5, 12)), 3.0), TypeError, r"n_heads must be an integer"),
    (lambda: R.merge_heads(np.ones((2, 5, 12))), ValueError, r"y must be 4-D \(N, n_heads, L, head_dim\)"),
    (lambda: R.repeat_kv(np.ones((2, 2, 5, 4)), 0), ValueError, r"n_rep must be an integer >= 1, got 0"),
    (lambda: R.repeat_kv(np.ones((2, 2, 5, 4), dtype=complex), 2), TypeError, r"y must be a real numeric array"),
])
def test_head_helpers_refuse_bad_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding"])
def test_sdpa_matches_torch_sdpa_with_batch_broadcast_and_scale(mask_kind):
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 1, 6, 5)), rng.standard_normal((2, 1, 6, 7))
    mask = make_mask(mask_kind, rng, 2, 4, 6)
    attn_mask = None if mask is None else torch.as_tensor(mask)
    for scale in (None, 0.3):
        out, w = R.scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
        t_k, t_v = t(k).expand(2, 3, 6, 5), t(v).expand(2, 3, 6, 7)
        t_out = F.scaled_dot_product_attention(t(q), t_k, t_v, attn_mask=attn_mask, scale=scale)
        np.testing.assert_allclose(out, t_out.numpy(), **TIGHT)
        assert w.shape == (2, 3, 4, 6)
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Backward pass vs torch autograd and finite differences.
# ---------------------------------------------------------------------------------------------------------------


def autograd_grads(x_q, x_kv, p, n_heads, grad_out, mask):
    P = {key: t(v).requires_grad_() for key, v in p.items()}
    X_q = t(x_q).requires_grad_()
    X_kv = X_q if x_kv is None else t(x_kv).requires_grad_()
    out, _ = torch_forward(X_q, X_kv, P, n_heads, mask)
    (out * t(grad_out)).sum().backward()
    grads = {key: v.grad.numpy() for key, v in P.items()}
    grads["x_q"] = X_q.grad.numpy()
    grads["x_kv"] = None if x_kv is None else X_kv.grad.numpy()
    return grads


@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding", "causal_empty_row"])
@pytest.mark.parametrize("cross", [False, True])
def test_grad_matches_autograd(n_heads, n_kv_heads, bias, mask_kind, cross):
    rng = np.random.default_rng(7)
    N, L_q, d_model, hd = 2, 4, 6, 2
    L_kv = 5 if cross else L_q
    p = make_params(rng, d_model, n_heads, n_kv_heads, hd, bias)
    x_q = rng.standard_normal((N, L_q, d_model))
    x_kv = rng.standard_normal((N, L_kv, d_model)) if cross else None
    mask = make_mask(mask_kind, rng, N, L_q, L_kv)
    grad_out = rng.standard_normal((N, L_q, d_model))

    grads = R.multi_head_attention_grad(x_q, x_kv, p, n_heads, grad_out, mask=mask)
    expected = autograd_grads(x_q, x_kv, p, n_heads, grad_out, mask)
    assert set(grads) == set(expected) == set(p) | {"x_q", "x_kv"}
    for key, value in expected.items():
        if value is None:
            assert grads[key] is None, key
            continue
        assert grads[key].shape == value.shape, key
        np.testing.assert_allclose(grads[key], value, rtol=1e-9, atol=1e-11, err_msg=key)


def test_grad_unbatched_matches_autograd():
    rng = np.random.default_rng(8)
    L, d_model, h, g = 4, 6, 2, 1
    p = make_params(rng, d_model, h, g, 3)
    x = rng.standard_normal((L, d_model))
    grad_out = rng.standard_normal((L, d_model))
    grads = R.multi_head_attention_grad(x, None, p, h, grad_out, mask=causal_mask(L, L))
    expected = autograd_grads(x[None], None, p, h, grad_out[None], causal_mask(L, L))
    assert grads["x_q"].shape == (L, d_model) and grads["x_kv"] is None
    np.testing.assert_allclose(grads["x_q"], expected["x_q"][0], rtol=1e-9, atol=1e-11)
    for key in p:
        np.testing.assert_allclose(grads[key], expected[key], rtol=1e-9, atol=1e-11, err_msg=key)


def test_grad_matches_central_finite_differences():
    rng = np.random.default_rng(9)
    N, L_q, L_kv, d_model, h, g, hd = 1, 3, 4, 4, 2, 1, 2
    p = make_params(rng, d_model, h, g, hd)
    x_q, x_kv = rng.standard_normal((N, L_q, d_model)), rng.standard_normal((N, L_kv, d_model))
    mask = causal_mask(L_q, L_kv)
    grad_out = rng.standard_normal((N, L_q, d_model))
    grads = R.multi_head_attention_grad(x_q, x_kv, p, h, grad_out, mask=mask)

    def loss(inputs):
        out, _ = R.multi_head_attention(inputs["x_q"], inputs["x_kv"], inputs["params"], h, mask=mask)
        return float(np.sum(out * grad_out))

    eps = 1e-6
    for key in ["x_q", "x_kv", *p]:
        base = {"x_q": x_q, "x_kv": x_kv, "params": p}
        target = base[key] if key in ("x_q", "x_kv") else p[key]
        numeric = np.zeros_like(target)
        for idx in np.ndindex(target.shape):
            plus, minus = target.copy(), target.copy()
            plus[idx] += eps
            minus[idx] -= eps
            values = []
            for arr in (plus, minus):
                inputs = {"x_q": x_q, "x_kv": x_kv, "params": dict(p)}
                if key in ("x_q", "x_kv"):
                    inputs[key] = arr
                else:
                    inputs["params"][key] = arr
                values.append(loss(inputs))
            numeric[idx] = (values[0] - values[1]) / (2 * eps)
        np.testing.assert_allclose(grads[key], numeric, rtol=1e-6, atol=1e-8, err_msg=key)


def test_sdpa_grad_and_softmax_backward_match_autograd_with_broadcast():
    rng = np.random.default_rng(10)
    q, k, v = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((1, 3, 6, 5)), rng.standard_normal((3, 6, 2))
    mask = causal_mask(4, 6).copy()
    mask[1] = False  # an all-masked row
    grad_out = rng.standard_normal((2, 3, 4, 2))
    dq, dk, dv = R.scaled_dot_product_attention_grad(q, k, v, grad_out, mask=mask, scale=0.7)
    Q, K, V = (t(a).requires_grad_() for a in (q, k, v))
    m = torch.as_tensor(mask)
    s = (Q @ K.transpose(-1, -2) * 0.7).masked_fill(~m, -1e300)
    out = (torch.softmax(s, dim=-1) * m) @ V
    (out * t(grad_out)).sum().backward()
    for ours, theirs in ((dq, Q), (dk, K), (dv, V)):
        assert ours.shape == tuple(theirs.shape)
        np.testing.assert_allclose(ours, theirs.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert np.all(dq[:, :, 1] == 0)  # the all-masked query row gets zero gradient

    S = t(rng.standard_normal((3, 7))).requires_grad_()
    dA = rng.standard_normal((3, 7))
    (torch.softmax(S, dim=-1) * t(dA)).sum().backward()
    A = R.softmax(S.detach().numpy())
    np.testing.assert_allclose(R.softmax_backward(A, dA), S.grad.numpy(), rtol=1e-10, atol=1e-13)


# ---------------------------------------------------------------------------------------------------------------
# Softmax.
# ---------------------------------------------------------------------------------------------------------------

finite_rows = arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 8)),
                     elements=st.floats(-1e300, 1e300, allow_nan=False))


@SETTINGS
@given(x=finite_rows)
def test_softmax_rows_sum_to_one_for_any_finite_logits_without_warnings(x):
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        a = R.softmax(x)
    assert np.all(np.isfinite(a)) and np.all(a >= 0)
    np.testing.assert_allclose(a.sum(axis=-1), 1.0, rtol=1e-12)
    assert np.all(a[np.arange(len(x)), x.argmax(-1)] == a.max(-1))  # the largest logit gets the largest weight


@SETTINGS
@given(x=arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 8)), elements=st.floats(-50, 50)),
       c=st.floats(-1e3, 1e3))
def test_softmax_shift_invariant_and_equals_torch(x, c):
    a = R.softmax(x)
    np.testing.assert_allclose(R.softmax(x + c), a, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(a, torch.softmax(t(x), dim=-1).numpy(), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(R.softmax(x, axis=0), torch.softmax(t(x), dim=0).numpy(), rtol=1e-12, atol=1e-300)


def test_softmax_huge_logits():
    x = np.array([[1e4, -1e4, 0.0], [1e300, 1e300, -1e300], [-1e4, -1e4 + 1.0, -1e4]])
    a = R.softmax(x)
    np.testing.assert_allclose(a[0], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(a[1], [0.5, 0.5, 0.0])
    e = math.e
    np.testing.assert_allclose(a[2], [1 / (2 + e), e / (2 + e), 1 / (2 + e)], rtol=1e-12)


def test_masked_softmax_zero_row_and_mask_respected():
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = np.array([[True, False, True], [False, False, False]])
    a = R.softmax(x, mask=mask)
    np.testing.assert_allclose(a[0], torch.softmax(t([1.0, 3.0]), 0).numpy()[[0, 0, 1]] * [1, 0, 1], rtol=1e-12)
    assert np.all(a[1] == 0.0)


# ---------------------------------------------------------------------------------------------------------------
# Properties.
# ---------------------------------------------------------------------------------------------------------------


@SETTINGS
@given(data=st.data(), N=st.integers(1, 2), L=st.integers(1, 6), n_heads=st.sampled_from([1, 2, 4]),
       n_kv_heads_div=st.sampled_from([1, 2, 4]))
def test_permutation_equivariance_without_mask(data, N, L, n_heads, n_kv_heads_div):
    n_kv_heads = max(1, n_heads // n_kv_heads_div)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    perm = np.array(data.draw(st.permutations(range(L)), label="perm"))
    p = make_params(rng, 6, n_heads, n_kv_heads, 2)
    x = rng.standard_normal((N, L, 6))
    out, w = R.multi_head_attention(x, None, p, n_heads)
    out_p, w_p = R.multi_head_attention(x[:, perm], None, p, n_heads)
    np.testing.assert_allclose(out_p, out[:, perm], **TIGHT)
    np.testing.assert_allclose(w_p, w[:, :, perm][:, :, :, perm], **TIGHT)
    # Cross attention: permuting the key/value tokens changes nothing at all.
    x_kv = rng.standard_normal((N, L + 1, 6))
    kv_perm = rng.permutation(L + 1)
    out_c, _ = R.multi_head_attention(x, x_kv, p, n_heads)
    out_cp, _ = R.multi_head_attention(x, x_kv[:, kv_perm], p, n_heads)
    np.testing.assert_allclose(out_cp, out_c, **TIGHT)


@SETTINGS
@given(data=st.data(), L=st.integers(2, 7), n_kv_heads=st.sampled_from([1, 2]))
def test_causal_output_ignores_future_tokens(data, L, n_kv_heads):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    pos = data.draw(st.integers(0, L - 2), label="pos")
    p = make_params(rng, 4, 2, n_kv_heads, 2)
    x = rng.standard_normal((2, L, 4))
    x_changed = x.copy()
    x_changed[:, pos + 1:] = rng.standard_normal((2, L - pos - 1, 4)) * 10
    out, _ = R.multi_head_attention(x, None, p, 2, mask=causal_mask(L, L))
    out_changed, _ = R.multi_head_attention(x_changed, None, p, 2, mask=causal_mask(L, L))
    np.testing.assert_allclose(out_changed[:, :pos + 1], out[:, :pos + 1], **TIGHT)
    assert not np.allclose(out_changed[:, pos + 1:], out[:, pos + 1:])  # the test can see a change


def test_fully_masked_row_gives_zeros_no_nan_no_warning():
    rng = np.random.default_rng(11)
    p = make_params(rng, 4, 2, 1, 2)
    x = rng.standard_normal((2, 3, 4))
    mask = np.ones((2, 1, 3, 3), dtype=bool)
    mask[0, 0, 1] = False  # batch 0: query 1 may attend to nothing
    grad_out = rng.standard_normal((2, 3, 4))
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        out, w = R.multi_head_attention(x, None, p, 2, mask=mask)
        looped, _ = R.multi_head_attention_per_head(x, None, p, 2, mask=mask)
        grads = R.multi_head_attention_grad(x, None, p, 2, grad_out, mask=mask)
        sd_out, sd_w = R.scaled_dot_product_attention(x, x, x, mask=np.zeros((3, 3), dtype=bool))
        online = R.online_softmax_attention(x, x, x, block_size=2, mask=np.zeros((3, 3), dtype=bool))
    assert np.all(w[0, :, 1] == 0.0)
    np.testing.assert_array_equal(out[0, 1], p["b_o"])  # zero heads, then the output bias
    np.testing.assert_allclose(looped, out, **TIGHT)
    assert all(np.all(np.isfinite(v)) for v in grads.values() if v is not None)
    assert np.all(sd_out == 0.0) and np.all(sd_w == 0.0) and np.all(online == 0.0)


@SETTINGS
@given(data=st.data(), n_q=st.integers(1, 6), n_k=st.integers(1, 9), d=st.integers(1, 4),
       mask_kind=st.sampled_from(["none", "causal", "random"]))
def test_online_softmax_equals_naive(data, n_q, n_k, d, mask_kind):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    q, k = rng.standard_normal((2, 3, n_q, d)) * 3, rng.standard_normal((2, 1, n_k, d)) * 3
    v = rng.standard_normal((n_k, 2))
    if mask_kind == "causal":
        mask = causal_mask(n_q, n_k)
    elif mask_kind == "random":
        mask = rng.random((2, 3, n_q, n_k)) < 0.5  # may include all-masked rows
    else:
        mask = None
    naive, _ = R.scaled_dot_product_attention(q, k, v, mask=mask)
    for block_size in sorted({1, 2, 3, n_k, n_k + 5}):
        out, stats = R.online_softmax_attention(q, k, v, block_size, mask=mask, return_stats=True)
        np.testing.assert_allclose(out, naive, rtol=1e-12, atol=1e-14)
        assert stats["max_block_elements"] == 2 * 3 * n_q * min(block_size, n_k)
        assert stats["full_matrix_elements"] == 2 * 3 * n_q * n_k
        assert stats["n_blocks"] == -(-n_k // block_size)
    np.testing.assert_allclose(R.online_softmax_attention(q, k, v, 2, mask=mask, scale=0.5),
                               R.scaled_dot_product_attention(q, k, v, mask=mask, scale=0.5)[0], rtol=1e-12, atol=1e-14)


def test_online_softmax_matches_torch_sdpa_for_large_scores():
    rng = np.random.default_rng(12)
    q, k = rng.standard_normal((4, 16, 8)) * 30, rng.standard_normal((4, 33, 8)) * 30
    v = rng.standard_normal((4, 33, 5))
    out = R.online_softmax_attention(q, k, v, block_size=4)
    expected = F.scaled_dot_product_attention(t(q), t(k), t(v)).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)


def independent_row_stats(q, k, scale, mask):
    """m, l, lse of each query row from the full masked score matrix, written out here (no mha code)."""
    s = scale * np.einsum("...qd,...kd->...qk", q, k)  # (..., n_q, n_k)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1)  # (..., n_q)
    has_key = np.isfinite(m)
    m_safe = np.where(has_key, m, 0.0)
    l = np.where(has_key, np.sum(np.exp(s - m_safe[..., None]), axis=-1), 0.0)
    lse = np.where(has_key, np.log(np.where(has_key, l, 1.0)) + m_safe, -np.inf)
    return s, m, l, lse


@SETTINGS
@given(data=st.data(), n_q=st.integers(1, 5), n_k=st.integers(1, 9), d=st.integers(1, 4),
       mask_kind=st.sampled_from(["none", "causal", "random"]), block_size=st.integers(1, 10))
def test_online_softmax_state_equals_independent_logsumexp(data, n_q, n_k, d, mask_kind, block_size):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    q, k = rng.standard_normal((2, 3, n_q, d)) * 3, rng.standard_normal((2, 1, n_k, d)) * 3
    v = rng.standard_normal((n_k, 2))
    mask = {"none": None, "causal": causal_mask(n_q, n_k),
            "random": rng.random((2, 3, n_q, n_k)) < 0.5}[mask_kind]  # random: may include fully masked rows
    scale = 0.7
    s, m, l, lse = independent_row_stats(q, k, scale, mask)
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        out, state = R.online_softmax_attention(q, k, v, block_size, mask=mask, scale=scale, return_state=True)
    assert set(state) == {"m", "l", "lse", "history"} and state["history"] is None
    assert state["m"].shape == state["l"].shape == state["lse"].shape == (2, 3, n_q)
    # -inf (in the same places) for fully masked rows. atol: matmul and einsum round scores of size ~10 apart by
    # ~1e-15, too much for rtol alone where the maximum is near 0 (seed 1320468: 5.8e-16 apart at m = 0.0057)
    np.testing.assert_allclose(state["m"], m, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(state["l"], l, rtol=1e-12)
    np.testing.assert_allclose(state["lse"], lse, rtol=1e-12, atol=1e-12)
    empty = ~np.isfinite(m)
    assert np.all(state["l"][empty] == 0.0) and np.all(state["lse"][empty] == -np.inf)
    assert np.all(state["l"][~empty] >= 1.0)
    np.testing.assert_allclose(  # torch's logsumexp, an independent implementation
        state["lse"], torch.logsumexp(t(s), dim=-1).numpy(), rtol=1e-12, atol=1e-12)
    # The weights are exp(s - lse): equal to the naive form's weights on rows with an allowed key.
    naive_out, naive_w = R.scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
    with np.errstate(invalid="ignore"):  # fully masked rows: -inf - (-inf), excluded just below
        w_from_lse = np.exp(s - state["lse"][..., None])
    np.testing.assert_allclose(w_from_lse[~empty], naive_w[~empty], rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(out, naive_out, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("mask_kind", ["none", "causal", "random"])
@pytest.mark.parametrize("block_size", [1, 2, 3, 7, 20])
def test_online_softmax_history_is_the_state_after_each_block(mask_kind, block_size):
    rng = np.random.default_rng(13)
    n_q, n_k, d, d_v = 4, 7, 3, 2
    q, k, v = rng.standard_normal((2, n_q, d)) * 2, rng.standard_normal((2, n_k, d)) * 2, rng.standard_normal((2, n_k, d_v))
    mask = {"none": None, "causal": causal_mask(n_q, n_k), "random": rng.random((2, n_q, n_k)) < 0.4}[mask_kind]
    if mask is not None and mask_kind == "random":
        mask[0, 1] = False  # one fully masked row for sure
    out, stats, state = R.online_softmax_attention(q, k, v, block_size, mask=mask, return_stats=True,
                                                   return_state=True, keep_history=True)
    history = state["history"]
    stops = list(range(block_size, n_k, block_size)) + [n_k]
    assert [entry["stop"] for entry in history] == stops and len(history) == stats["n_blocks"]
    m_prev = np.full((2, n_q), -np.inf)
    for entry in history:
        stop = entry["stop"]
        prefix_mask = None if mask is None else mask[..., :stop]
        _, m, l, lse = independent_row_stats(q, k[:, :stop], 1 / math.sqrt(d), prefix_mask)
        np.testing.assert_allclose(entry["m"], m, rtol=1e-13)  # the max over the keys of the first blocks
        np.testing.assert_allclose(entry["l"], l, rtol=1e-12)
        np.testing.assert_allclose(entry["lse"], lse, rtol=1e-12, atol=1e-12)
        with np.errstate(invalid="ignore"):  # -inf - (-inf) for rows still empty: alpha is 0 there
            alpha = np.where(np.isfinite(m), np.exp(m_prev - m), 0.0)
        np.testing.assert_allclose(entry["alpha"], alpha, rtol=1e-12)
        prefix_out, _ = R.scaled_dot_product_attention(q, k[:, :stop], v[:, :stop], mask=prefix_mask)
        np.testing.assert_allclose(entry["out"], prefix_out, rtol=1e-12, atol=1e-14)  # attention over keys seen
        m_prev = m
    np.testing.assert_allclose(history[0]["alpha"], 0.0)  # nothing to rescale before the first block
    for key in ("m", "l", "lse"):
        np.testing.assert_array_equal(history[-1][key], state[key])  # the last entry is the final state
    np.testing.assert_array_equal(history[-1]["out"], out)


def test_online_softmax_return_combinations_and_flag_errors():
    rng = np.random.default_rng(14)
    q, k, v = rng.standard_normal((3, 2)), rng.standard_normal((5, 2)), rng.standard_normal((5, 4))
    out = R.online_softmax_attention(q, k, v, 2)
    out_stats, stats = R.online_softmax_attention(q, k, v, 2, return_stats=True)
    out_state, state = R.online_softmax_attention(q, k, v, 2, return_state=True)
    out_both, stats_both, state_both = R.online_softmax_attention(q, k, v, 2, return_stats=True, return_state=True)
    for other in (out_stats, out_state, out_both):
        np.testing.assert_array_equal(other, out)
    assert stats == stats_both and stats["n_blocks"] == 3
    assert state["history"] is None and state["m"].shape == (3,)
    np.testing.assert_array_equal(state["lse"], state_both["lse"])
    with pytest.raises(ValueError, match=r"keep_history=True requires return_state=True"):
        R.online_softmax_attention(q, k, v, 2, keep_history=True)
    with pytest.raises(TypeError, match=r"return_state must be True or False, got 'yes'"):
        R.online_softmax_attention(q, k, v, 2, return_state="yes")
    with pytest.raises(TypeError, match=r"keep_history must be True or False, got 1 of type int"):
        R.online_softmax_attention(q, k, v, 2, return_state=True, keep_history=1)


def test_init_params_shapes():
    p = R.init_params(12, 6, 2, head_dim=5)
    assert {key: v.shape for key, v in p.items()} == {
        "W_q": (12, 30), "W_k": (12, 10), "W_v": (12, 10), "W_o": (30, 12),
        "b_q": (30,), "b_k": (10,), "b_v": (10,), "b_o": (12,),
    }
    assert set(R.init_params(8, 2, bias=False)) == {"W_q", "W_k", "W_v", "W_o"}


def test_the_package_keeps_the_public_api_of_the_single_module():
    """mha.reference is a package whose modules follow the book; what it exports is what the one module exported."""
    assert R.__all__ == [
        "softmax", "softmax_backward", "scaled_dot_product_attention", "scaled_dot_product_attention_grad",
        "multi_head_attention", "multi_head_attention_per_head", "multi_head_attention_grad",
        "online_softmax_attention", "split_heads", "merge_heads", "repeat_kv", "causal_mask", "head_weights",
        "check_params", "Dims", "init_params",
        # issue 24, attention in today's models: appended after the single module's names
        "sliding_window_mask", "rope_frequencies", "rope", "rope_backward", "rms_norm", "rms_norm_backward",
        # issue 25, multi-head latent attention
        "multi_head_latent_attention", "multi_head_latent_attention_grad", "init_latent_params",
    ]
    for name in R.__all__:
        obj = getattr(R, name)
        assert obj.__module__.startswith("mha.reference."), name
        assert getattr(sys.modules[obj.__module__], name) is obj  # R.name is the function the module defines
