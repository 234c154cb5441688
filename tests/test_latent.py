"""Multi-head latent attention (MLA): ``mha.reference.multi_head_latent_attention`` (naive and absorbed forms, its
hand-derived backward pass) and ``mha.MultiHeadLatentAttention`` with its ``LatentCache``.

Every check is against an independent computation: a per-head loop written here from the documented layout, the
torch module (float64), torch autograd, recomputation over the whole sequence. Hugging Face's DeepSeek-V3 layer is in
tests/test_from_hf_latent.py.
"""

import math

import numpy as np
import pytest
import torch

import mha.reference as R
from mha import MultiHeadLatentAttention
from mha.latent import LatentCache

F64 = torch.float64
D, H, KV, NOPE, ROPE, V, QR = 16, 3, 5, 4, 6, 7, 6  # small and all different, so a wrong split cannot pass
WIDTHS = dict(qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V)


def params(q_rank=None, seed=1):
    return R.init_latent_params(D, H, KV, NOPE, ROPE, V, q_rank=q_rank, seed=seed)


def inputs(n=2, length=9, seed=0):
    return 1.5 * np.random.default_rng(seed).standard_normal((n, length, D))


def module(p, q_rank=None, **kwargs):
    m = MultiHeadLatentAttention(D, H, KV, q_rank=q_rank, **WIDTHS, **kwargs).to(F64)
    m.load_params(p)
    return m


def per_head_loop(x, p, positions=None, causal=True, style="interleaved", base=10000.0, scale=None):
    """The layer head by head from the documented layout, with the public (separately tested) rope and rms_norm."""
    n, length, _ = x.shape
    positions = np.arange(length) if positions is None else positions
    if "W_q" in p:
        q = x @ p["W_q"]
    else:
        q = R.rms_norm(x @ p["W_dq"], p["q_norm"]) @ p["W_uq"]
    latent = x @ p["W_dkv"]
    c = R.rms_norm(latent[..., :KV], p["kv_norm"])
    k_rope = R.rope(latent[..., KV:], positions, base, style)
    scale = 1 / math.sqrt(NOPE + ROPE) if scale is None else scale
    out = np.zeros((n, length, D))
    weights = np.zeros((n, H, length, length))
    for i in range(H):
        q_i = q[..., i * (NOPE + ROPE):(i + 1) * (NOPE + ROPE)]
        q_i = np.concatenate([q_i[..., :NOPE], R.rope(q_i[..., NOPE:], positions, base, style)], axis=-1)
        block = p["W_ukv"][:, i * (NOPE + V):(i + 1) * (NOPE + V)]
        k_i = np.concatenate([c @ block[:, :NOPE], k_rope], axis=-1)
        v_i = c @ block[:, NOPE:]
        s = scale * q_i @ np.swapaxes(k_i, 1, 2)
        if causal:
            s = np.where(np.tril(np.ones((length, length), bool)), s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        weights[:, i] = a
        out += (a @ v_i) @ p["W_o"][i * V:(i + 1) * V]
    return out, weights


# -------------------------------------------------------------------------------------------------- reference
@pytest.mark.parametrize("q_rank", [None, QR])
@pytest.mark.parametrize("style", ["interleaved", "half"])
@pytest.mark.parametrize("causal", [True, False])
def test_naive_and_absorbed_agree_with_the_per_head_loop(q_rank, style, causal):
    p, x = params(q_rank), inputs()
    positions = np.array([[3, 4, 5, 9, 10, 11, 20, 21, 22], [0, 1, 2, 3, 4, 5, 6, 7, 8]])
    expected, expected_w = per_head_loop(x, p, positions, causal, style, base=500.0, scale=0.3)
    kw = dict(WIDTHS, is_causal=causal, positions=positions, rope_style=style, rope_base=500.0, scale=0.3)
    naive, naive_w = R.multi_head_latent_attention(x, p, H, **kw)
    absorbed, absorbed_w = R.multi_head_latent_attention(x, p, H, absorb=True, **kw)
    np.testing.assert_allclose(naive, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(naive_w, expected_w, rtol=0, atol=1e-12)
    assert np.abs(naive - absorbed).max() < 1e-12 and np.abs(naive_w - absorbed_w).max() < 1e-12


def test_defaults_unbatched_input_and_need_weights():
    p, x = params(), inputs(n=1)
    out, weights = R.multi_head_latent_attention(x[0], p, H, **WIDTHS)
    expected, expected_w = per_head_loop(x, p)  # causal, interleaved, base 10000, positions arange(L)
    np.testing.assert_allclose(out, expected[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(weights, expected_w[0], rtol=0, atol=1e-12)
    assert R.multi_head_latent_attention(x, p, H, need_weights=False, **WIDTHS)[1] is None


def test_rope_is_relative_through_the_latent_path():
    """Shifting every position by the same amount changes neither form's output (RoPE on the decoupled part only)."""
    p, x = params(QR), inputs()
    base = R.multi_head_latent_attention(x, p, H, absorb=True, **WIDTHS)[0]
    shifted = R.multi_head_latent_attention(x, p, H, absorb=True, positions=np.arange(9) + 37, **WIDTHS)[0]
    np.testing.assert_allclose(shifted, base, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------- reference vs module
@pytest.mark.parametrize("q_rank", [None, QR])
@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_module_matches_reference(q_rank, absorb, style):
    p, x = params(q_rank), inputs()
    m = module(p, q_rank, rope_style=style, rope_base=700.0)
    expected, expected_w = R.multi_head_latent_attention(x, p, H, rope_style=style, rope_base=700.0, **WIDTHS)
    with torch.no_grad():
        out, weights = m(torch.as_tensor(x), absorb=absorb, need_weights=True)
        unbatched, _ = m(torch.as_tensor(x[1]), absorb=absorb)
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(weights.numpy(), expected_w, rtol=0, atol=1e-12)
    np.testing.assert_allclose(unbatched.numpy(), expected[1], rtol=0, atol=1e-12)


def test_export_and_load_round_trip():
    for q_rank in (None, QR):
        p = params(q_rank)
        m = module(p, q_rank)
        exported = m.export_params()
        assert exported.keys() == p.keys()
        for key in p:
            np.testing.assert_array_equal(exported[key], p[key])
    assert module(params()).kv_b_proj.weight.shape == (H * (NOPE + V), KV)  # nn.Linear stores W^T


# ------------------------------------------------------------------------------------------------- backward
def _autograd(p, x, grad_out, q_rank, absorb, **kwargs):
    m = module(p, q_rank, **kwargs)
    xt = torch.tensor(x, requires_grad=True)
    out, _ = m(xt, absorb=absorb)
    out.backward(torch.as_tensor(grad_out))
    tensors = {"W_dkv": m.kv_a_proj.weight, "kv_norm": m.kv_a_norm, "W_ukv": m.kv_b_proj.weight,
               "W_o": m.o_proj.weight}
    if q_rank is None:
        tensors["W_q"] = m.q_proj.weight
    else:
        tensors.update({"W_dq": m.q_a_proj.weight, "q_norm": m.q_a_norm, "W_uq": m.q_b_proj.weight})
    grads = {key: (t.grad.T if t.ndim == 2 else t.grad).numpy() for key, t in tensors.items()}
    grads["x"] = xt.grad.numpy()
    return grads


@pytest.mark.parametrize("q_rank", [None, QR])
@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_hand_backward_matches_autograd(q_rank, absorb, style):
    p, x = params(q_rank), inputs()
    grad_out = np.random.default_rng(5).standard_normal(x.shape)
    expected = _autograd(p, x, grad_out, q_rank, absorb, rope_style=style, rope_base=300.0)
    grads = R.multi_head_latent_attention_grad(x, p, H, grad_out, rope_style=style, rope_base=300.0, **WIDTHS)
    assert grads.keys() == expected.keys() == set(p) | {"x"}
    for key in grads:
        scale = np.abs(expected[key]).max()
        np.testing.assert_allclose(grads[key], expected[key], rtol=0, atol=1e-11 * scale, err_msg=key)


def test_hand_backward_with_positions_no_causal_mask_and_unbatched_input():
    p, x = params(QR), inputs(n=1)
    positions = np.array([2, 3, 5, 8, 13, 21, 34, 55, 89])
    grad_out = np.random.default_rng(6).standard_normal(x.shape)
    kw = dict(WIDTHS, is_causal=False, positions=positions, scale=0.4)
    grads = R.multi_head_latent_attention_grad(x[0], p, H, grad_out[0], **kw)
    # autograd through the reference's own forward, by finite differences on two entries of each gradient
    for key in ("x", "W_ukv", "kv_norm", "q_norm"):
        base = x[0] if key == "x" else p[key]
        for index in [(0,) * base.ndim, tuple(s - 1 for s in base.shape)]:
            eps, shifted = 1e-6, [base.copy(), base.copy()]
            shifted[0][index] += eps
            shifted[1][index] -= eps
            values = []
            for b in shifted:
                xx, pp = (b, p) if key == "x" else (x[0], {**p, key: b})
                values.append(np.sum(R.multi_head_latent_attention(xx, pp, H, **kw)[0] * grad_out[0]))
            assert grads[key][index] == pytest.approx((values[0] - values[1]) / (2 * eps), rel=1e-6, abs=1e-8)


# -------------------------------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("q_rank", [None, QR])
@pytest.mark.parametrize("chunks,absorb", [([1] * 9, None), ([1] * 9, False), ([4, 1, 3, 1], None),
                                           ([4, 1, 3, 1], True), ([9], None)])
def test_decoding_with_the_latent_cache_equals_recomputation(q_rank, chunks, absorb):
    p, x = params(q_rank), torch.as_tensor(inputs())
    m = module(p, q_rank)
    with torch.no_grad():
        full, full_w = m(x, need_weights=True)
        cache, outs, start = m.new_cache(2, 12), [], 0
        for size in chunks:
            out, weights = m(x[:, start:start + size], kv_cache=cache, absorb=absorb, need_weights=True)
            assert weights.shape == (2, H, size, start + size)
            outs.append(out)
            start += size
    assert cache.length == 9
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=0, atol=1e-12)
    torch.testing.assert_close(weights, full_w[:, :, 9 - chunks[-1]:], rtol=0, atol=1e-12)


def test_absorb_none_means_absorbed_for_one_token_steps_only(monkeypatch):
    m = module(params())
    used = []
    for name in ("_naive_attention", "_absorbed_attention"):
        original = getattr(m, name)
        monkeypatch.setattr(m, name, lambda *a, _o=original, _n=name: used.append(_n) or _o(*a))
    x = torch.as_tensor(inputs())
    with torch.no_grad():
        m(x)
        cache = m.new_cache(2, 12)
        m(x[:, :4], kv_cache=cache)
        m(x[:, 4:5], kv_cache=cache)
        m(x[:, 5:6], kv_cache=cache, absorb=False)
        m(x[:, 6:8], kv_cache=cache, absorb=True)
    assert used == ["_naive_attention", "_naive_attention", "_absorbed_attention", "_naive_attention",
                    "_absorbed_attention"]


def test_the_cache_holds_only_the_latent_and_the_shared_rotary_key():
    p, x = params(QR), inputs()
    m = module(p, QR)
    cache = m.new_cache(2, 12)
    tensors = {name: value for name, value in vars(cache).items() if isinstance(value, torch.Tensor)}
    assert {name: tuple(t.shape) for name, t in tensors.items()} == {"c": (2, 12, KV), "k_rope": (2, 12, ROPE)}
    assert cache.nbytes == 2 * 12 * (KV + ROPE) * 8  # float64
    assert MultiHeadLatentAttention(D, H, KV, **WIDTHS).new_cache(3, 10).nbytes == 3 * 10 * (KV + ROPE) * 4
    with torch.no_grad():
        m(torch.as_tensor(x), kv_cache=cache)
    latent = x @ p["W_dkv"]  # what the cache should hold, computed here
    np.testing.assert_allclose(cache.c[:, :9].numpy(), R.rms_norm(latent[..., :KV], p["kv_norm"]), atol=1e-12)
    np.testing.assert_allclose(cache.k_rope[:, :9].numpy(), R.rope(latent[..., KV:], np.arange(9), style="interleaved"),
                               atol=1e-12)
    cache.reset()
    assert cache.length == 0 and "length=0" in repr(cache)


def test_cache_errors_leave_the_cache_as_it_was():
    m, x = module(params()), torch.as_tensor(inputs())
    cache = m.new_cache(2, 5)
    with torch.no_grad():
        m(x[:, :4], kv_cache=cache)
        with pytest.raises(ValueError, match=r"LatentCache overflow: 4 cached \+ 2 new > max_len 5"):
            m(x[:, 4:6], kv_cache=cache)
        with pytest.raises(ValueError, match="batch size 1 but the LatentCache was built for batch_size 2"):
            m(x[:1, 4:5], kv_cache=cache)
        with pytest.raises(ValueError, match="another MultiHeadLatentAttention"):
            module(params(seed=2))(x[:, 4:5], kv_cache=cache)
        with pytest.raises(TypeError, match="kv_cache must be a mha.latent.LatentCache"):
            m(x[:, 4:5], kv_cache=R)
        with pytest.raises(ValueError, match="kv_rank=3"):
            m(x[:, 4:5], kv_cache=LatentCache(2, 5, 3, ROPE, dtype=F64))
    assert cache.length == 4
    with pytest.raises(ValueError, match=r"length must be an integer in \[0, 5\], got 6"):
        cache.length = 6


# ---------------------------------------------------------------------------------------------- bad inputs
def _call(**changes):
    args = dict(x=inputs(), params=params(), n_heads=H, **WIDTHS)
    args.update(changes)
    return R.multi_head_latent_attention(**args)


@pytest.mark.parametrize("changes,error,match", [
    (dict(x=np.full((2, 9, D), np.nan)), ValueError, r"x contains NaN or inf"),
    (dict(x=np.ones((2, 9, D + 1))), ValueError, r"x's last axis must be d_model = 16"),
    (dict(x=np.ones((9,))), ValueError, r"x must be 2-D \(L, d_model\) or 3-D"),
    (dict(x=np.array([["a"]])), TypeError, r"x must be a real numeric array"),
    (dict(n_heads="3"), TypeError, r"n_heads must be an integer >= 1, got '3'"),
    (dict(n_heads=2), ValueError, r"params\['W_ukv'\] must have shape \(5, 22\)"),
    (dict(qk_rope_head_dim=5), ValueError, r"qk_rope_head_dim must be even"),
    (dict(v_head_dim=0), ValueError, r"v_head_dim must be an integer >= 1, got 0"),
    (dict(params={**params(), "W_o": np.ones((20, D))}), ValueError, r"params\['W_o'\] must have shape \(21, 16\)"),
    (dict(params={**params(), "kv_norm": np.array([1.0, np.inf, 1, 1, 1])}), ValueError,
     r"params\['kv_norm'\] contains NaN or inf"),
    (dict(params={k: v for k, v in params().items() if k != "W_dkv"}), ValueError, r"missing \['W_dkv'\]"),
    (dict(params={**params(), "W_dq": np.ones((D, QR))}), ValueError, r"has \['W_dq'\] but not all of"),
    (dict(params={**params(), "b_o": np.ones(D)}), ValueError, r"unexpected \['b_o'\]"),
    (dict(params=[1]), TypeError, r"params must be a dict"),
    (dict(is_causal="yes"), TypeError, r"is_causal must be True or False, got 'yes'"),
    (dict(absorb=1), TypeError, r"absorb must be True or False, got 1"),
    (dict(rope_style="rotate"), ValueError, r"rope_style must be one of 'half', 'interleaved', got 'rotate'"),
    (dict(rope_base=0.0), ValueError, r"rope_base must be a finite real number > 0, got 0.0"),
    (dict(positions=np.arange(9.0)), TypeError, r"positions must be integers"),
    (dict(positions=np.arange(8)), ValueError, r"positions must have shape \(L,\) = \(9,\)"),
    (dict(positions=np.arange(9) - 1), ValueError, r"positions must be integers >= 0"),
    (dict(scale=-1.0), ValueError, r"scale must be a finite real number > 0, got -1.0"),
    (dict(norm_eps=0), ValueError, r"norm_eps must be a finite real number > 0, got 0.0"),
])
def test_reference_refuses_bad_inputs(changes, error, match):
    with pytest.raises(error, match=match):
        _call(**changes)


def test_grad_refuses_a_grad_out_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"grad_out shape \(2, 9, 15\) must equal the output shape \(2, 9, 16\)"):
        R.multi_head_latent_attention_grad(inputs(), params(), H, np.ones((2, 9, 15)), **WIDTHS)


def test_module_refuses_bad_inputs():
    m, x = module(params()), torch.as_tensor(inputs())
    cases = [
        (dict(x=x.float()), TypeError, "x has dtype torch.float32 but the module's parameters have dtype"),
        (dict(x=x[..., :5]), ValueError, r"x must be \(N, L, d_model\) or unbatched \(L, d_model\) with d_model=16"),
        (dict(x=x.numpy()), TypeError, "x must be a torch.Tensor"),
        (dict(absorb="yes"), TypeError, "absorb must be True or False, got 'yes'"),
        (dict(is_causal=None), TypeError, "is_causal must be True or False, got None"),
        (dict(positions=torch.arange(8)), ValueError, r"positions must have shape \(L,\) = \(9,\)"),
        (dict(positions=torch.arange(9.0)), TypeError, "positions must be an integer tensor"),
        (dict(positions=torch.arange(9) - 2), ValueError, "positions must be integers >= 0"),
    ]
    for changes, error, match in cases:
        with pytest.raises(error, match=match):
            m(**{"x": x, **changes})
    for kwargs, error, match in [
        (dict(qk_rope_head_dim=3), ValueError, "qk_rope_head_dim must be even"),
        (dict(rope_style="x"), ValueError, "rope_style must be one of"),
        (dict(q_rank=0), ValueError, "q_rank must be an integer >= 1, got 0"),
        (dict(scale=0.0), ValueError, "scale must be a finite real number > 0"),
    ]:
        with pytest.raises(error, match=match):
            MultiHeadLatentAttention(D, H, KV, **{**WIDTHS, **kwargs})
    with pytest.raises(ValueError, match=r"params is missing \['W_dq', 'W_uq', 'q_norm'\] \(module has q_rank=6\)"):
        module(params(), q_rank=QR)
    with pytest.raises(ValueError, match=r"params\['W_o'\] must have shape \(21, 16\) \(d_model=16, .*\), got shape \(16, 21\)"):
        m.load_params({**params(), "W_o": np.ones((16, 21))})


def test_module_defaults_follow_deepseek_ratios():
    m = MultiHeadLatentAttention(64, 4, 8)
    assert (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (16, 8, 16)
    assert m.scale == pytest.approx(24 ** -0.5) and m.rope_style == "interleaved" and m.q_proj is not None
    assert MultiHeadLatentAttention(64, 4, 8, q_rank=12).q_b_proj.weight.shape == (4 * 24, 12)


def test_init_latent_params_shapes():
    assert {k: v.shape for k, v in params(QR).items()} == {
        "W_dq": (D, QR), "q_norm": (QR,), "W_uq": (QR, H * (NOPE + ROPE)), "W_dkv": (D, KV + ROPE),
        "kv_norm": (KV,), "W_ukv": (KV, H * (NOPE + V)), "W_o": (H * V, D)}
    assert set(params()) == {"W_q", "W_dkv", "kv_norm", "W_ukv", "W_o"}
    with pytest.raises(TypeError, match="seed must be an integer >= 0"):
        R.init_latent_params(D, H, KV, NOPE, ROPE, V, seed=1.5)
