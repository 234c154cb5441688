"""Tests for mha.convert.mha_to_gqa against independent computations.

References: per-head column blocks averaged (or selected) with explicit Python loops, an MHA layer whose key/value
heads are replaced by the pooled head of their group built here column by column and run through
torch.nn.MultiheadAttention, and the GQA path of mha.MultiHeadAttention (sdpa with enable_gqa).
"""


import numpy as np
import pytest
import torch

import mha
from mha import convert, reference

from _params import make_params, t, torch_mha_module

torch.set_num_threads(1)
TIGHT = dict(rtol=1e-12, atol=1e-12)


def head_block(a, i, head_dim):
    """Columns (or bias entries) of head i."""
    return a[..., i * head_dim:(i + 1) * head_dim]


def pooled_heads_by_loop(a, n_old, n_new, head_dim, method):
    """New head c = mean (or first) of old heads c*r ... (c+1)*r - 1, r = n_old / n_new: a Python loop."""
    r = n_old // n_new
    heads = []
    for c in range(n_new):
        members = [head_block(a, c * r + i, head_dim) for i in range(r)]
        heads.append(sum(members) / r if method == "mean" else members[0])
    return heads


@pytest.mark.parametrize("n_kv_heads_in", [8, 4, 1])
def test_same_number_of_kv_heads_is_an_independent_copy(n_kv_heads_in):
    rng = np.random.default_rng(0)
    p = make_params(rng, 16, 8, n_kv_heads_in, 3)
    before = {key: value.copy() for key, value in p.items()}
    for method in convert.METHODS:
        out = convert.mha_to_gqa(p, 8, n_kv_heads_in, method=method)
        assert set(out) == set(p)
        for key in p:
            np.testing.assert_array_equal(out[key], p[key])
            assert out[key].dtype == np.float64 and not np.shares_memory(out[key], p[key])
        out["W_k"][:] = 0.0  # writing to the result leaves the input alone
    for key in p:
        np.testing.assert_array_equal(p[key], before[key])


@pytest.mark.parametrize("bias", [True, False])
def test_mqa_mean_is_the_average_of_all_heads(bias):
    rng = np.random.default_rng(1)
    h, head_dim = 6, 4
    p = make_params(rng, 10, h, h, head_dim, bias=bias)
    out = convert.mha_to_gqa(p, h, 1)
    keys = ("W_k", "W_v", "b_k", "b_v") if bias else ("W_k", "W_v")
    assert set(out) == set(p)
    for key in keys:
        expected = np.zeros(p[key].shape[:-1] + (head_dim,))
        for j in range(h):
            expected += p[key][..., j * head_dim:(j + 1) * head_dim]
        np.testing.assert_allclose(out[key], expected / h, rtol=1e-14, atol=1e-15)
    for key in ("W_q", "W_o") + (("b_q", "b_o") if bias else ()):
        np.testing.assert_array_equal(out[key], p[key])


@pytest.mark.parametrize("method", ["mean", "first"])
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_each_new_head_pools_its_group(method, n_kv_heads):
    rng = np.random.default_rng(2)
    h, head_dim = 8, 3
    p = make_params(rng, 12, h, h, head_dim)
    out = convert.mha_to_gqa(p, h, n_kv_heads, method=method)
    for key in ("W_k", "W_v", "b_k", "b_v"):
        assert out[key].shape == p[key].shape[:-1] + (n_kv_heads * head_dim,)
        for c, expected in enumerate(pooled_heads_by_loop(p[key], h, n_kv_heads, head_dim, method)):
            np.testing.assert_allclose(head_block(out[key], c, head_dim), expected, rtol=1e-14, atol=1e-15)
    if method == "first":  # the first head of group c is old head c * (h / g), exactly
        r = h // n_kv_heads
        for c in range(n_kv_heads):
            np.testing.assert_array_equal(head_block(out["W_k"], c, head_dim), head_block(p["W_k"], c * r, head_dim))


@pytest.mark.parametrize("method", ["mean", "first"])
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_converted_layer_equals_mha_whose_kv_heads_are_replaced_by_the_pooled_head(method, n_kv_heads):
    """GQA(pooled) == MHA in which query head j's key/value head is the pooled head of its group (built here)."""
    rng = np.random.default_rng(3)
    N, L, d_model, h, head_dim = 2, 5, 16, 8, 2
    p = make_params(rng, d_model, h, h, head_dim)
    x = rng.standard_normal((N, L, d_model))
    causal = np.tril(np.ones((L, L), dtype=bool))

    r = h // n_kv_heads
    replaced = dict(p)
    for key in ("W_k", "W_v", "b_k", "b_v"):
        blocks = []
        for j in range(h):  # query head j reads new head j // r, the pool of old heads (j // r) * r ... + r - 1
            group = [head_block(p[key], (j // r) * r + i, head_dim) for i in range(r)]
            blocks.append(sum(group) / r if method == "mean" else group[0])
        replaced[key] = np.concatenate(blocks, axis=-1)  # (.., h*head_dim): an MHA layer again
    expected, _ = torch_mha_module(replaced, d_model, h)(t(x), t(x), t(x), attn_mask=torch.as_tensor(~causal))
    expected = expected.detach().numpy()

    converted = convert.mha_to_gqa(p, h, n_kv_heads, method=method)
    out, _ = reference.multi_head_attention(x, None, converted, h, mask=causal)
    np.testing.assert_allclose(out, expected, **TIGHT)

    module = mha.MultiHeadAttention(d_model, h, n_kv_heads=n_kv_heads, head_dim=head_dim).double().eval()
    module.load_params(converted)  # shapes fit a GQA module with n_kv_heads key/value heads
    with torch.no_grad():
        out_module, _ = module(t(x), is_causal=True)
    np.testing.assert_allclose(out_module.numpy(), expected, **TIGHT)
    if n_kv_heads < h:  # the test can see a change: the conversion is not the identity here
        original, _ = reference.multi_head_attention(x, None, p, h, mask=causal)
        assert not np.allclose(out, original)


def test_equal_heads_within_each_group_convert_exactly():
    rng = np.random.default_rng(4)
    N, L, d_model, h, g, head_dim = 2, 6, 12, 6, 2, 2
    p = make_params(rng, d_model, h, h, head_dim)
    for key in ("W_k", "W_v", "b_k", "b_v"):  # heads 0-2 equal, heads 3-5 equal
        p[key] = np.repeat(rng.standard_normal(p[key].shape[:-1] + (g, 1, head_dim)), h // g, axis=-2).reshape(
            p[key].shape)
    x = rng.standard_normal((N, L, d_model))
    original, _ = reference.multi_head_attention(x, None, p, h)
    for method in convert.METHODS:
        converted, _ = reference.multi_head_attention(x, None, convert.mha_to_gqa(p, h, g, method), h)
        np.testing.assert_allclose(converted, original, **TIGHT)


@pytest.mark.parametrize("method", ["mean", "first"])
def test_gqa_input_pools_like_its_equivalent_mha(method):
    """A GQA layer (g_in = 4 of h = 8) pooled to g = 2 equals its MHA form (kv heads repeated) pooled to g = 2."""
    rng = np.random.default_rng(5)
    h, g_in, head_dim = 8, 4, 3
    p = make_params(rng, 10, h, g_in, head_dim)
    as_mha = dict(p)
    for key in ("W_k", "W_v", "b_k", "b_v"):  # query head j reads kv head j // (h / g_in): repeat its columns
        as_mha[key] = np.concatenate([head_block(p[key], j // (h // g_in), head_dim) for j in range(h)], axis=-1)
    from_gqa, from_mha = convert.mha_to_gqa(p, h, 2, method), convert.mha_to_gqa(as_mha, h, 2, method)
    for key in p:
        np.testing.assert_allclose(from_gqa[key], from_mha[key], rtol=1e-14, atol=1e-15)


def test_biases_given_as_none_stay_absent():
    rng = np.random.default_rng(6)
    p = make_params(rng, 8, 4, 4, 2, bias=False) | {"b_q": None, "b_k": None}
    assert set(convert.mha_to_gqa(p, 4, 2)) == {"W_q", "W_k", "W_v", "W_o"}


P_MHA = make_params(np.random.default_rng(7), 12, 8, 8, 2)  # h = 8 MHA
P_GQA2 = make_params(np.random.default_rng(8), 12, 8, 2, 2)  # h = 8, g = 2
P_H12_G4 = make_params(np.random.default_rng(9), 12, 12, 4, 1)  # h = 12, g = 4


@pytest.mark.parametrize(
    "call,exc,match",
    [
        pytest.param(lambda: convert.mha_to_gqa(P_MHA, 8, 3), ValueError,
                     r"n_kv_heads = 3 must divide n_heads = 8", id="g-not-dividing-h"),
        pytest.param(lambda: convert.mha_to_gqa(P_GQA2, 8, 4), ValueError,
                     r"n_kv_heads = 4 is more than the layer's 2 key/value heads .*\(12, 4\)", id="already-fewer"),
        pytest.param(lambda: convert.mha_to_gqa(P_H12_G4, 12, 3), ValueError,
                     r"n_kv_heads = 3 must divide the layer's current number of key/value heads 4", id="g-not-dividing-g"),
        pytest.param(lambda: convert.mha_to_gqa(P_MHA, 8, 2, method="median"), ValueError,
                     r"method must be one of 'mean', 'first', got 'median'", id="method"),
        pytest.param(lambda: convert.mha_to_gqa(P_MHA, 8, 0), ValueError,
                     r"n_kv_heads must be an integer >= 1, got 0", id="g0"),
        pytest.param(lambda: convert.mha_to_gqa(P_MHA, 8, 2.0), TypeError,
                     r"n_kv_heads must be an integer >= 1, got 2\.0", id="gfloat"),
        pytest.param(lambda: convert.mha_to_gqa(P_MHA, 3, 1), ValueError,
                     r"n_heads = 3 must divide W_q's width", id="h"),
        pytest.param(lambda: convert.mha_to_gqa({k: v for k, v in P_MHA.items() if k != "W_o"}, 8, 2), ValueError,
                     r"params is missing key\(s\) \['W_o'\]", id="missing"),
        pytest.param(lambda: convert.mha_to_gqa([P_MHA], 8, 2), TypeError, r"params must be a dict", id="not-dict"),
    ],
)
def test_mha_to_gqa_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
