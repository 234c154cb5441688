"""Tests of ``mha.MultiHeadAttention`` against independent computations.

References: ``torch.nn.MultiheadAttention`` (same weights), ``F.scaled_dot_product_attention(enable_gqa=True)``
on hand-made projections, an explicit per-head Python loop (below), the NumPy reference ``mha.reference``, autograd
and finite differences. Never the module's own output as its own reference.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mha import MultiHeadAttention, reference

from _optional_hypothesis import given, settings, st  # skips the property test where hypothesis is missing
from _params import make, randn

F64 = torch.float64
IMPLS = ["sdpa", "naive"]
_skip_without_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")


def needs_cuda(test):
    """Marked ``cuda`` (``pytest -m cuda``: the GPU check runs these) and skipped without a CUDA device."""
    return pytest.mark.cuda(_skip_without_cuda(test))


def causal_bottom_right(l_q, l_kv):
    """allowed[i, j] = j <= L_kv - L_q + i, written as an explicit loop."""
    allowed = torch.zeros(l_q, l_kv, dtype=torch.bool)
    for i in range(l_q):
        for j in range(l_kv):
            allowed[i, j] = j <= l_kv - l_q + i
    return allowed


def explicit_attention(m, x_q, x_kv=None, allowed=None, head_mask=None, scale=None):
    """Per-head, per-sequence Python loop in float64 from the module's weights (the book's head_i formula).

    Returns (out (N, L_q, d_model), weights (N, h, L_q, L_kv), head_outputs (N, h, L_q, head_dim)).
    """
    x_kv = x_q if x_kv is None else x_kv
    x_q, x_kv = x_q.double(), x_kv.double()
    h, g, hd = m.n_heads, m.n_kv_heads, m.head_dim
    scale = 1.0 / math.sqrt(hd) if scale is None else scale

    def w_b(lin):
        w = lin.weight.detach().double().T  # (in, out): Y = X W
        b = torch.zeros(w.shape[1], dtype=F64) if lin.bias is None else lin.bias.detach().double()
        return w, b

    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = map(w_b, (m.q_proj, m.k_proj, m.v_proj, m.o_proj))
    n, l_q, l_kv = x_q.shape[0], x_q.shape[1], x_kv.shape[1]
    if allowed is not None:
        allowed = torch.broadcast_to(allowed, (n, h, l_q, l_kv))
    weights = torch.zeros(n, h, l_q, l_kv, dtype=F64)
    heads = torch.zeros(n, h, l_q, hd, dtype=F64)
    out = torch.zeros(n, l_q, m.d_model, dtype=F64)
    for b in range(n):
        for j in range(h):
            kv = j // (h // g)
            cq, ckv = slice(j * hd, (j + 1) * hd), slice(kv * hd, (kv + 1) * hd)
            q = x_q[b] @ wq[:, cq] + bq[cq]
            k = x_kv[b] @ wk[:, ckv] + bk[ckv]
            v = x_kv[b] @ wv[:, ckv] + bv[ckv]
            s = (q @ k.T) * scale
            for i in range(l_q):
                row = s[i]
                if allowed is not None:
                    if not allowed[b, j, i].any():
                        continue  # attends to nothing: zero weights, zero output
                    row = row.masked_fill(~allowed[b, j, i], float("-inf"))
                e = torch.exp(row - row.max())
                weights[b, j, i] = e / e.sum()
            heads[b, j] = weights[b, j] @ v
            factor = 1.0 if head_mask is None else float(head_mask[j])
            out[b] += factor * heads[b, j] @ wo[cq]
        out[b] += bo
    return out, weights, heads


def torch_mha_like(m):
    """torch.nn.MultiheadAttention (batch_first) holding the same weights as our MHA module ``m`` (g = h)."""
    bias = m.q_proj.bias is not None
    ref = torch.nn.MultiheadAttention(m.d_model, m.n_heads, bias=bias, batch_first=True,
                                      dtype=m.q_proj.weight.dtype, device=m.q_proj.weight.device).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]))  # (3E, E)
        ref.out_proj.weight.copy_(m.o_proj.weight)
        if bias:
            ref.in_proj_bias.copy_(torch.cat([m.q_proj.bias, m.k_proj.bias, m.v_proj.bias]))
            ref.out_proj.bias.copy_(m.o_proj.bias)
    return ref


# --------------------------------------------------------------------------------- vs torch.nn.MultiheadAttention
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", ["none", "causal", "key_padding", "cross", "cross_padding"])
def test_matches_torch_multihead_attention(impl, bias, case):
    m = make(d_model=24, n_heads=3, bias=bias, impl=impl)
    ref = torch_mha_like(m)
    n, l_q = 3, 6
    l_kv = 4 if case.startswith("cross") else l_q
    x_q = randn(n, l_q, 24, seed=2)
    x_kv = randn(n, l_kv, 24, seed=3) if case.startswith("cross") else None
    pad = torch.zeros(n, l_kv, dtype=torch.bool)  # True = padding (torch's convention)
    pad[0, -2:] = True
    pad[2, 0] = True
    kw_ours, kw_ref = {}, {}
    if case == "causal":
        kw_ours = dict(is_causal=True)
        kw_ref = dict(attn_mask=~torch.ones(l_q, l_kv, dtype=torch.bool).tril())  # True = NOT allowed
    elif case in ("key_padding", "cross_padding"):
        kw_ours = dict(mask=~pad[:, None, None, :])  # (N, 1, 1, L_kv), True = may attend
        kw_ref = dict(key_padding_mask=pad)
    kv = x_q if x_kv is None else x_kv
    expected, expected_w = ref(x_q, kv, kv, need_weights=True, average_attn_weights=False, **kw_ref)
    out, w = m(x_q, x_kv, need_weights=True, **kw_ours)
    out_fast, none = m(x_q, x_kv, need_weights=False, **kw_ours)
    assert none is None
    out_default, w_default = m(x_q, x_kv, **kw_ours)  # need_weights defaults to True, as in mha.reference and torch
    assert w_default is not None and torch.equal(w_default, w)
    assert w.shape == (n, 3, l_q, l_kv)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out_fast, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(w, expected_w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_sdpa_path_runs_the_fused_kernel_exactly_when_no_weights_are_asked_for(impl, monkeypatch):
    """impl="sdpa" calls F.scaled_dot_product_attention once per forward with need_weights=False; asking for the
    weights (the default, as in torch.nn.MultiheadAttention) takes the naive path, and impl="naive" never calls it.
    A benchmark or check of the sdpa path that forgets need_weights=False measures the naive path instead."""
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    m, x = make(impl=impl), torch.randn(2, 5, 16, dtype=F64)
    m(x, need_weights=False)
    assert len(calls) == (1 if impl == "sdpa" else 0)
    m(x)
    m(x, need_weights=True)
    assert len(calls) == (1 if impl == "sdpa" else 0)


@pytest.mark.parametrize("impl", IMPLS)
def test_explicit_boolean_causal_mask_equals_is_causal(impl):
    m = make(impl=impl)
    x = randn(2, 5, 16)
    a, _ = m(x, is_causal=True)
    b, _ = m(x, mask=torch.ones(5, 5, dtype=torch.bool).tril())
    expected, _, _ = explicit_attention(m, x, allowed=causal_bottom_right(5, 5))
    torch.testing.assert_close(a, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(b, expected, rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------------------------------------- GQA and MQA
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 4), (4, 2), (4, 1), (6, 3), (6, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_matches_sdpa_enable_gqa_and_explicit_loop(impl, n_heads, n_kv_heads, causal):
    hd = 3
    m = make(d_model=12, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=hd, impl=impl)
    x = randn(2, 5, 12)
    out, w = m(x, is_causal=causal, need_weights=True)  # the explicit path, even for impl="sdpa"
    out_fast, _ = m(x, is_causal=causal)  # impl's own path
    # Hand-made projections, then PyTorch's own GQA attention.
    q = (x @ m.q_proj.weight.T + m.q_proj.bias).view(2, 5, n_heads, hd).transpose(1, 2)
    k = (x @ m.k_proj.weight.T + m.k_proj.bias).view(2, 5, n_kv_heads, hd).transpose(1, 2)
    v = (x @ m.v_proj.weight.T + m.v_proj.bias).view(2, 5, n_kv_heads, hd).transpose(1, 2)
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    expected = heads.transpose(1, 2).reshape(2, 5, n_heads * hd) @ m.o_proj.weight.T + m.o_proj.bias
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out_fast, expected, rtol=1e-10, atol=1e-10)
    loop_out, loop_w, _ = explicit_attention(m, x, allowed=causal_bottom_right(5, 5) if causal else None)
    torch.testing.assert_close(out, loop_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(w, loop_w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_gqa_equals_mha_with_repeated_kv_weights(impl, n_kv_heads):
    """GQA == MHA whose key/value head j is a copy of GQA head j // (h/g); checked with torch's MHA module."""
    h, d, hd = 4, 16, 4
    r = h // n_kv_heads
    gqa = make(d_model=d, n_heads=h, n_kv_heads=n_kv_heads, impl=impl)
    mha = make(d_model=d, n_heads=h, seed=5, impl=impl)
    with torch.no_grad():
        for name in ("k_proj", "v_proj"):
            src, dst = getattr(gqa, name), getattr(mha, name)
            dst.weight.copy_(src.weight.view(n_kv_heads, hd, d).repeat_interleave(r, dim=0).reshape(h * hd, d))
            dst.bias.copy_(src.bias.view(n_kv_heads, hd).repeat_interleave(r, dim=0).reshape(h * hd))
        mha.q_proj.load_state_dict(gqa.q_proj.state_dict())
        mha.o_proj.load_state_dict(gqa.o_proj.state_dict())
    x = randn(2, 7, d)
    out, w = gqa(x, is_causal=True, need_weights=True)
    ref = torch_mha_like(mha)
    expected, expected_w = ref(x, x, x, attn_mask=~torch.ones(7, 7, dtype=torch.bool).tril(),
                               need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(w, expected_w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_gqa_paths_do_not_materialise_repeated_kv(impl, monkeypatch):
    """The GQA paths never call repeat_interleave / repeat / expand on K or V (book: part II, 'MQA and GQA')."""
    def forbidden(*args, **kwargs):
        raise AssertionError("K/V repeated")

    m = make(n_heads=4, n_kv_heads=2, impl=impl)
    x = randn(1, 3, 16)
    expected, _, _ = explicit_attention(m, x)
    for name in ("repeat_interleave", "repeat", "expand"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    monkeypatch.setattr(torch, "repeat_interleave", forbidden)
    out, _ = m(x)
    monkeypatch.undo()
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------- vs the NumPy reference
DTYPE_TOL = {F64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 6e-2}


@st.composite
def configs(draw):
    n_kv_heads = draw(st.integers(1, 3))
    n_heads = n_kv_heads * draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from([None, 2, 5]))
    d_model = n_heads * draw(st.integers(1, 3)) if head_dim is None else draw(st.integers(1, 9))
    return dict(
        d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
        bias=draw(st.booleans()), impl=draw(st.sampled_from(IMPLS)),
        dtype=draw(st.sampled_from([F64, F64, torch.float32, torch.bfloat16])),
        n=draw(st.integers(1, 2)), l_q=draw(st.integers(1, 5)),
        l_kv=draw(st.none() | st.integers(1, 5)),  # None: self-attention
        mask=draw(st.sampled_from(["none", "causal", "random", "causal+random"])),
        unbatched=draw(st.booleans()), need_weights=draw(st.booleans()), seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=60, deadline=None)
@given(configs())
def test_matches_numpy_reference(cfg):
    dtype = cfg["dtype"]
    m = make(cfg["d_model"], cfg["n_heads"], n_kv_heads=cfg["n_kv_heads"], head_dim=cfg["head_dim"],
             bias=cfg["bias"], impl=cfg["impl"], seed=cfg["seed"], dtype=dtype)
    params = m.export_params()  # float64 copies of the (possibly bf16-rounded) weights
    rng = np.random.default_rng(cfg["seed"])
    n, l_q = cfg["n"], cfg["l_q"]
    l_kv = l_q if cfg["l_kv"] is None else cfg["l_kv"]
    x_q = torch.from_numpy(rng.standard_normal((n, l_q, cfg["d_model"]))).to(dtype)
    x_kv = None if cfg["l_kv"] is None else torch.from_numpy(rng.standard_normal((n, l_kv, cfg["d_model"]))).to(dtype)
    allowed = np.ones((n, cfg["n_heads"], l_q, l_kv), dtype=bool)
    is_causal, mask = "causal" in cfg["mask"], None
    if is_causal:
        allowed &= np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q)
    if "random" in cfg["mask"]:
        random_mask = rng.random((n, 1, l_q, l_kv)) < 0.7
        allowed &= random_mask
        mask = torch.from_numpy(random_mask)
    if cfg["unbatched"]:
        x_q, x_kv = x_q[0], None if x_kv is None else x_kv[0]
        allowed, mask = allowed[0], None if mask is None else mask[0]
    ref_out, ref_w = reference.multi_head_attention(
        x_q.double().numpy(), None if x_kv is None else x_kv.double().numpy(), params, cfg["n_heads"], mask=allowed)
    out, w = m(x_q, x_kv, mask=mask, is_causal=is_causal, need_weights=cfg["need_weights"])
    assert out.dtype == dtype and out.shape == ref_out.shape
    tol = DTYPE_TOL[dtype]
    scale = 1.0 + np.abs(ref_out).max()
    torch.testing.assert_close(out.double(), torch.from_numpy(ref_out), rtol=tol, atol=tol * scale)
    if cfg["need_weights"]:
        assert w.shape == ref_w.shape
        torch.testing.assert_close(w.double(), torch.from_numpy(ref_w), rtol=tol, atol=tol)
    else:
        assert w is None


def test_load_params_from_reference_init_params():
    """Weights made by the NumPy side, loaded into the module, give the reference's output (GQA, custom head_dim)."""
    params = reference.init_params(10, 4, n_kv_heads=2, head_dim=3, bias=True, seed=3)
    x = np.random.default_rng(0).standard_normal((2, 6, 10))
    causal = np.tril(np.ones((6, 6), dtype=bool))
    expected, expected_w = reference.multi_head_attention(x, None, params, 4, mask=causal)
    for impl in IMPLS:
        m = MultiHeadAttention(10, 4, n_kv_heads=2, head_dim=3, impl=impl).double()
        m.load_params(params)
        out, w = m(torch.from_numpy(x), is_causal=True, need_weights=True)
        torch.testing.assert_close(out, torch.from_numpy(expected), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(w, torch.from_numpy(expected_w), rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------------------- weights and masking
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_need_weights_on_sdpa_equals_naive_and_rows_sum_to_one(n_kv_heads):
    sdpa = make(n_kv_heads=n_kv_heads, impl="sdpa")
    naive = make(n_kv_heads=n_kv_heads, impl="naive")  # same seed: same weights
    x = randn(2, 6, 16)
    mask = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(0)) < 0.8
    mask[..., 0] = True  # every row keeps a key
    o1, w1 = sdpa(x, mask=mask, is_causal=True, need_weights=True)
    o2, w2 = naive(x, mask=mask, is_causal=True, need_weights=True)
    o3, _ = sdpa(x, mask=mask, is_causal=True)
    torch.testing.assert_close(w1, w2, rtol=0, atol=0)
    torch.testing.assert_close(o1, o2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(o3, o2, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(w1.sum(-1), torch.ones(2, 4, 6, dtype=F64), rtol=1e-12, atol=1e-12)
    assert not w1.masked_select(~(mask & torch.ones(6, 6, dtype=torch.bool).tril())).any()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_row_gives_zero_not_nan(impl, need_weights):
    m = make(n_kv_heads=2, impl=impl)
    x = randn(2, 4, 16).requires_grad_()
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    mask[0, :, 1] = False  # query 1 of sequence 0 may attend to nothing
    mask[1, :, :, 2] = False
    out, w = m(x, mask=mask, need_weights=need_weights)
    assert torch.isfinite(out).all()
    # Zero attention output, so the row is just o_proj's bias.
    torch.testing.assert_close(out[0, 1], m.o_proj.bias, rtol=0, atol=1e-12)
    expected, expected_w, _ = explicit_attention(m, x.detach(), allowed=mask)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    if need_weights:
        assert (w[0, :, 1] == 0).all()
        torch.testing.assert_close(w, expected_w, rtol=1e-10, atol=1e-10)
    out.sum().backward()  # gradients stay finite too
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("l_q,l_kv", [(2, 5), (5, 2), (3, 3)])
def test_causal_is_bottom_right_aligned(impl, l_q, l_kv):
    """Query i (of the last L_q positions) sees keys j <= L_kv - L_q + i; rows with no key give zero (L_q > L_kv)."""
    m = make(n_kv_heads=2, impl=impl)
    x_q, x_kv = randn(2, l_q, 16, seed=4), randn(2, l_kv, 16, seed=5)
    allowed = causal_bottom_right(l_q, l_kv)
    expected, expected_w, _ = explicit_attention(m, x_q, x_kv, allowed=allowed)
    for need_weights in (False, True):
        out, w = m(x_q, x_kv, is_causal=True, need_weights=need_weights)
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(w, expected_w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_mask_and_causal_combine_by_logical_and(impl):
    m = make(impl=impl)
    x = randn(2, 5, 16)
    mask = torch.rand(2, 4, 5, 5, generator=torch.Generator().manual_seed(1)) < 0.6
    expected, _, _ = explicit_attention(m, x, allowed=mask & causal_bottom_right(5, 5))
    out, _ = m(x, mask=mask, is_causal=True)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_causal_output_ignores_future_tokens(impl):
    m = make(n_kv_heads=2, impl=impl)
    x = randn(2, 8, 16)
    t = 4
    x2 = x.clone()
    x2[:, t + 1:] = randn(2, 8 - t - 1, 16, seed=9)
    a, _ = m(x, is_causal=True)
    b, _ = m(x2, is_causal=True)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-12)
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])  # the test can see a change


@pytest.mark.parametrize("impl", IMPLS)
def test_permutation_equivariance_without_mask(impl):
    m = make(n_kv_heads=1, impl=impl)
    x = randn(2, 7, 16)
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(3))
    out, w = m(x, need_weights=True)
    out_p, w_p = m(x[:, perm], need_weights=True)
    torch.testing.assert_close(out_p, out[:, perm], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(m(x[:, perm])[0], m(x)[0][:, perm], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(w_p, w[:, :, perm][:, :, :, perm], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_unbatched_input_equals_batch_of_one(impl):
    m = make(n_kv_heads=2, impl=impl)
    x_q, x_kv = randn(5, 16), randn(3, 16, seed=2)
    mask = torch.tensor([[True, False, True]] * 5)  # (L_q, L_kv)
    out, w = m(x_q, x_kv, mask=mask, need_weights=True)
    out1, w1 = m(x_q[None], x_kv[None], mask=mask, need_weights=True)
    assert out.shape == (5, 16) and w.shape == (4, 5, 3)
    torch.testing.assert_close(out, out1[0], rtol=0, atol=0)
    torch.testing.assert_close(w, w1[0], rtol=0, atol=0)
    torch.testing.assert_close(m(x_q, x_kv, mask=mask)[0], out1[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("scale", [None, 1.0, 0.05])
def test_scale(impl, scale):
    m = make(impl=impl, scale=scale)
    assert m.scale == (0.5 if scale is None else scale)  # head_dim 4 -> 1/sqrt(4)
    x = randn(2, 5, 16)
    expected, expected_w, _ = explicit_attention(m, x, scale=0.5 if scale is None else scale)
    out, w = m(x, need_weights=True)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(w, expected_w, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(m(x)[0], expected, rtol=1e-10, atol=1e-10)  # without weights: impl's own path


@pytest.mark.parametrize("n_kv_heads", [4, 1])
def test_gradients_sdpa_equal_naive(n_kv_heads):
    grads = []
    for impl in IMPLS:
        m = make(n_kv_heads=n_kv_heads, impl=impl)
        x_q, x_kv = randn(2, 5, 16).requires_grad_(), randn(2, 6, 16, seed=7).requires_grad_()
        mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
        mask[1, ..., -2:] = False
        out, _ = m(x_q, x_kv, mask=mask, is_causal=True)
        (out * randn(2, 5, 16, seed=8)).sum().backward()
        grads.append([x_q.grad, x_kv.grad] + [p.grad for p in m.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_sdpa_and_naive_agree_in_low_precision():
    for dtype, tol in [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)]:
        outs = [make(n_kv_heads=2, impl=impl, dtype=dtype)(randn(2, 9, 16, dtype=dtype), is_causal=True)[0]
                for impl in IMPLS]
        assert outs[0].dtype == dtype
        torch.testing.assert_close(outs[0].float(), outs[1].float(), rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------------- dropout
@pytest.mark.parametrize("impl", IMPLS)
def test_dropout_only_in_training(impl):
    m = make(impl=impl, dropout=0.5)
    plain = make(impl=impl)  # same weights, no dropout
    x = randn(2, 6, 16)
    torch.testing.assert_close(m(x)[0], plain(x)[0], rtol=0, atol=0)  # eval mode: no dropout
    m.train()
    torch.manual_seed(0)
    a, _ = m(x)
    b, _ = m(x)
    assert not torch.allclose(a, b)  # a fresh dropout mask per call
    assert not torch.allclose(a, plain(x)[0])
    plain.train()  # dropout=0 in training mode changes nothing
    torch.testing.assert_close(plain(x)[0], make(impl=impl)(x)[0], rtol=0, atol=0)


def test_naive_dropout_drops_attention_weights():
    """With dropout, out == (mask * weights / (1 - p)) @ v: recover the dropout mask and check that formula."""
    m = make(n_heads=1, d_model=4, impl="naive", dropout=0.5, bias=False).train()
    with torch.no_grad():
        for lin in (m.q_proj, m.k_proj, m.o_proj):
            lin.weight.copy_(torch.eye(4, dtype=F64))
        m.v_proj.weight.copy_(torch.eye(4, dtype=F64))
    x = torch.eye(4, dtype=F64)[None]  # v = identity: out row i = dropped weights row i
    torch.manual_seed(1)
    out, w = m(x, need_weights=True)  # weights are returned before dropout
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 1, 4, dtype=F64))
    kept = out[0] != 0
    assert 0 < kept.sum() < 16
    torch.testing.assert_close(out[0][kept], (w[0, 0] / 0.5)[kept], rtol=1e-12, atol=1e-12)


# -------------------------------------------------------------------------------------------------- head_mask
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_head_mask_zero_equals_removing_the_head(impl, n_kv_heads):
    m = make(n_kv_heads=n_kv_heads, impl=impl)
    x = randn(2, 5, 16)
    _, _, heads = explicit_attention(m, x)  # (N, h, L, head_dim)
    keep = [0, 2, 3]  # head 1 removed
    hd = m.head_dim
    rows = torch.cat([torch.arange(j * hd, (j + 1) * hd) for j in keep])
    concat = heads[:, keep].transpose(1, 2).reshape(2, 5, len(keep) * hd)  # the kept heads only
    expected = concat @ m.o_proj.weight[:, rows].T + m.o_proj.bias  # o_proj without head 1's input rows
    for head_mask in (torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=F64), torch.tensor([True, False, True, True])):
        out, _ = m(x, head_mask=head_mask, is_causal=False)
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_head_mask_gradient_matches_finite_differences(impl):
    m = make(n_kv_heads=2, impl=impl)
    x = randn(2, 4, 16)
    head_mask = torch.tensor([1.0, 0.5, -0.3, 2.0], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda hm: m(x, head_mask=hm, is_causal=True)[0], (head_mask,))
    # and the value itself: out is linear in head_mask, so d(sum out)/d(head_mask_j) = sum(head_j @ W_o_j)
    _, _, heads = explicit_attention(m, x, allowed=causal_bottom_right(4, 4))
    out, _ = m(x, head_mask=head_mask, is_causal=True)
    out.sum().backward()
    hd = m.head_dim
    expected = torch.stack([(heads[:, j] @ m.o_proj.weight[:, j * hd:(j + 1) * hd].T).sum() for j in range(4)])
    torch.testing.assert_close(head_mask.grad, expected.detach(), rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------------- load_params / export_params
@pytest.mark.parametrize("bias", [True, False])
def test_export_load_roundtrip(bias):
    a = make(d_model=10, n_heads=4, n_kv_heads=2, head_dim=3, bias=bias)
    params = a.export_params()
    assert sorted(params) == sorted(["W_q", "W_k", "W_v", "W_o"] + (["b_q", "b_k", "b_v", "b_o"] if bias else []))
    assert params["W_q"].shape == (10, 12) and params["W_k"].shape == (10, 6) and params["W_o"].shape == (12, 10)
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float64 for v in params.values())
    np.testing.assert_array_equal(params["W_q"], a.q_proj.weight.detach().numpy().T)  # Y = X W
    b = MultiHeadAttention(10, 4, n_kv_heads=2, head_dim=3, bias=bias).double()
    b.load_params(params)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)
    x = randn(1, 3, 10)
    torch.testing.assert_close(a(x)[0], b(x)[0], rtol=0, atol=0)
    # tensors are accepted too, and the module keeps its own dtype
    c = MultiHeadAttention(10, 4, n_kv_heads=2, head_dim=3, bias=bias)
    c.load_params({k: torch.from_numpy(v) for k, v in params.items()})
    assert c.q_proj.weight.dtype == torch.float32
    torch.testing.assert_close(c.q_proj.weight.double(), a.q_proj.weight, rtol=1e-7, atol=1e-7)


def test_load_params_failure_writes_nothing():
    m = make(d_model=8, n_heads=2)
    before = [p.clone() for p in m.parameters()]
    params = {k: np.zeros_like(v) for k, v in m.export_params().items()}
    params["b_o"] = np.zeros(7)
    with pytest.raises(ValueError, match=r"params\['b_o'\] must have shape \(8,\).*got shape \(7,\)"):
        m.load_params(params)
    for p, q in zip(before, m.parameters()):
        assert torch.equal(p, q)


# ------------------------------------------------------------------------------------------------------- CUDA
@needs_cuda
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
def test_cuda_matches_cpu_float64(impl, dtype, tol):
    cpu = make(n_kv_heads=2, impl=impl)
    gpu = make(n_kv_heads=2, impl=impl, dtype=dtype, device="cuda")
    x = randn(2, 9, 16)
    mask = torch.ones(2, 1, 9, 9, dtype=torch.bool)
    mask[0, :, 3] = False  # one fully masked row
    expected, expected_w = cpu(x, mask=mask, is_causal=True, need_weights=True)
    x_gpu, mask_gpu = x.to("cuda", dtype), mask.cuda()  # copies from the host synchronise: do them first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host-device synchronisation in forward raises
    try:
        out, _ = gpu(x_gpu, mask=mask_gpu, is_causal=True)
        out_w, w = gpu(x_gpu, mask=mask_gpu, is_causal=True, need_weights=True)
        out_c, _ = gpu(x_gpu, is_causal=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(out.double().cpu(), expected, rtol=tol, atol=tol)
    torch.testing.assert_close(out_w.double().cpu(), expected, rtol=tol, atol=tol)
    torch.testing.assert_close(w.double().cpu(), expected_w, rtol=tol, atol=tol)
    torch.testing.assert_close(out_c.double().cpu(), cpu(x, is_causal=True)[0], rtol=tol, atol=tol)


@needs_cuda
def test_cuda_matches_torch_multihead_attention():
    m = make(d_model=32, n_heads=4, dtype=torch.float32, device="cuda")
    ref = torch_mha_like(m)
    x = randn(3, 10, 32, dtype=torch.float32, device="cuda")
    expected, _ = ref(x, x, x, attn_mask=~torch.ones(10, 10, dtype=torch.bool, device="cuda").tril())
    torch.testing.assert_close(m(x, is_causal=True)[0], expected, rtol=1e-4, atol=1e-4)
