"""Tests of ``mha.KVCache`` and of cached decoding with ``MultiHeadAttention(..., kv_cache=...)``.

Book: part II, "Autoregressive decoding and the KV cache". The references are the full causal forward pass (no
cache) and the NumPy reference with an explicit causal mask; the cache unit tests compare with ``torch.cat``.
"""

import numpy as np
import pytest
import torch

from mha import KVCache, MultiHeadAttention, reference

F64 = torch.float64
IMPLS = ["sdpa", "naive"]
_skip_without_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")


def needs_cuda(test):
    """Marked ``cuda`` (``pytest -m cuda``: the GPU check runs these) and skipped without a CUDA device."""
    return pytest.mark.cuda(_skip_without_cuda(test))


def make(d_model=16, n_heads=4, n_kv_heads=None, impl="sdpa", dtype=F64, device="cpu", seed=0, **kwargs):
    torch.manual_seed(seed)
    m = MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads, impl=impl, **kwargs)
    with torch.no_grad():
        for lin in (m.q_proj, m.k_proj, m.v_proj, m.o_proj):
            lin.bias.normal_(0.0, 0.5)
    return m.to(dtype=dtype, device=device).eval()


def randn(*shape, seed=1, dtype=F64, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64).to(dtype=dtype, device=device)


def cache_for(m, batch_size, max_len, x):
    return KVCache(batch_size, max_len, m.n_kv_heads, m.head_dim, dtype=x.dtype, device=x.device)


def decode(m, x, chunks, cache):
    """Feed x in chunks through the cache; the first chunk (the prefill) and every later chunk are causal."""
    outs, start = [], 0
    with torch.no_grad():
        for size in chunks:
            out, _ = m(x[:, start:start + size], kv_cache=cache, is_causal=True)
            outs.append(out)
            start += size
    assert start == x.shape[1]
    return torch.cat(outs, dim=1)


# ------------------------------------------------------------------------------------------------- the cache
def test_append_returns_views_of_the_filled_prefix():
    cache = KVCache(2, 6, 3, 4, dtype=F64)
    assert cache.length == 0 and cache.k.shape == (2, 3, 6, 4) and cache.v.shape == (2, 3, 6, 4)
    chunks = [(randn(2, 3, t, 4, seed=s), randn(2, 3, t, 4, seed=s + 10)) for s, t in [(1, 2), (2, 1), (3, 3)]]
    seen_k, seen_v = [], []
    for k_new, v_new in chunks:
        k_all, v_all = cache.append(k_new, v_new)
        seen_k.append(k_new)
        seen_v.append(v_new)
        assert cache.length == sum(k.shape[2] for k in seen_k)
        assert isinstance(cache.length, int)
        torch.testing.assert_close(k_all, torch.cat(seen_k, dim=2), rtol=0, atol=0)
        torch.testing.assert_close(v_all, torch.cat(seen_v, dim=2), rtol=0, atol=0)
        assert k_all.data_ptr() == cache.k.data_ptr() and v_all.data_ptr() == cache.v.data_ptr()  # views, no copy
    assert cache.length == 6


def test_overflow_raises_before_writing():
    cache = KVCache(1, 4, 2, 3)
    cache.append(torch.ones(1, 2, 3, 3), torch.ones(1, 2, 3, 3))
    k_before, v_before = cache.k.clone(), cache.v.clone()
    with pytest.raises(ValueError, match=r"KVCache overflow: 3 cached \+ 2 new > max_len 4"):
        cache.append(torch.full((1, 2, 2, 3), 7.0), torch.full((1, 2, 2, 3), 7.0))
    assert cache.length == 3
    assert torch.equal(cache.k, k_before) and torch.equal(cache.v, v_before)
    k_all, _ = cache.append(torch.full((1, 2, 1, 3), 5.0), torch.full((1, 2, 1, 3), 5.0))  # exactly full is fine
    assert cache.length == 4 and (k_all[:, :, 3] == 5).all()


def test_reset_starts_over():
    cache = KVCache(1, 3, 1, 2)
    cache.append(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))
    cache.reset()
    assert cache.length == 0
    k_all, v_all = cache.append(torch.full((1, 1, 2, 2), 2.0), torch.full((1, 1, 2, 2), 3.0))
    assert k_all.shape == (1, 1, 2, 2) and (k_all == 2).all() and (v_all == 3).all()


@pytest.mark.parametrize("dtype,itemsize", [(torch.float32, 4), (torch.float64, 8), (torch.bfloat16, 2)])
def test_nbytes(dtype, itemsize):
    cache = KVCache(3, 10, 2, 8, dtype=dtype)
    assert cache.nbytes == 2 * 3 * 2 * 10 * 8 * itemsize
    assert cache.k.dtype == dtype and cache.dtype == dtype


def test_mqa_cache_is_h_over_g_smaller():
    """Book: part II, 'MQA and GQA': the cache holds g heads, so it is h/g times smaller than MHA's."""
    mha, gqa, mqa = (make(n_kv_heads=g) for g in (4, 2, 1))
    sizes = [KVCache(2, 32, m.n_kv_heads, m.head_dim).nbytes for m in (mha, gqa, mqa)]
    assert sizes[0] == 2 * sizes[1] == 4 * sizes[2]


# ------------------------------------------------------------------------------------------- cached decoding
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])  # MHA, GQA, MQA
@pytest.mark.parametrize("chunks", [[1] * 7, [3, 1, 1, 1, 1], [4, 2, 1], [2, 3, 2], [7]])
def test_cached_decoding_equals_full_causal_forward(impl, n_kv_heads, chunks):
    m = make(n_kv_heads=n_kv_heads, impl=impl)
    x = randn(2, 7, 16)
    with torch.no_grad():
        expected, _ = m(x, is_causal=True)
    cache = cache_for(m, 2, 9, x)
    out = decode(m, x, chunks, cache)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    assert cache.length == 7


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n_kv_heads", [4, 1])
def test_cached_decoding_matches_numpy_reference(impl, n_kv_heads):
    """Independent of the module's own full forward: the NumPy reference with an explicit causal mask."""
    m = make(n_kv_heads=n_kv_heads, impl=impl)
    x = randn(2, 6, 16)
    causal = np.tril(np.ones((6, 6), dtype=bool))
    expected, _ = reference.multi_head_attention(x.numpy(), None, m.export_params(), m.n_heads, mask=causal)
    out = decode(m, x, [2, 1, 1, 2], cache_for(m, 2, 6, x))
    torch.testing.assert_close(out, torch.from_numpy(expected), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_cached_decoding_with_padding_mask_and_weights(impl):
    """A key-padding mask over the cache, (N, 1, 1, L_kv), and need_weights of shape (N, h, 1, L_kv)."""
    m = make(n_kv_heads=2, impl=impl)
    x = randn(2, 5, 16)
    allowed = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    allowed[1, ..., 0] = False  # sequence 1 has a padded first position
    with torch.no_grad():
        expected, expected_w = m(x, mask=allowed, is_causal=True, need_weights=True)
        cache = cache_for(m, 2, 5, x)
        out_p, _ = m(x[:, :3], mask=allowed[..., :3], kv_cache=cache, is_causal=True)
        outs = [out_p]
        for t in (3, 4):
            out_t, w_t = m(x[:, t:t + 1], mask=allowed[..., : t + 1], kv_cache=cache, need_weights=True)
            assert w_t.shape == (2, 4, 1, t + 1)
            torch.testing.assert_close(w_t, expected_w[:, :, t:t + 1, : t + 1], rtol=1e-10, atol=1e-10)
            outs.append(out_t)
    torch.testing.assert_close(torch.cat(outs, dim=1), expected, rtol=1e-10, atol=1e-10)


def test_single_token_without_is_causal_attends_to_the_whole_cache():
    """For one new token, causal or not is the same: it is the last position."""
    m = make(n_kv_heads=2)
    x = randn(1, 4, 16)
    with torch.no_grad():
        expected, _ = m(x, is_causal=True)
        cache = cache_for(m, 1, 4, x)
        outs = [m(x[:, t:t + 1], kv_cache=cache)[0] for t in range(4)]  # is_causal=False every call
    torch.testing.assert_close(torch.cat(outs, 1), expected, rtol=1e-10, atol=1e-10)


def test_reset_cache_reproduces_the_same_decoding():
    m = make(n_kv_heads=1)
    x, y = randn(1, 5, 16), randn(1, 5, 16, seed=4)
    cache = cache_for(m, 1, 5, x)
    first = decode(m, x, [2, 1, 1, 1], cache)
    cache.reset()
    other = decode(m, y, [5], cache)  # different prompt in the reused buffers
    cache.reset()
    again = decode(m, x, [2, 1, 1, 1], cache)
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(other, m(y, is_causal=True)[0], rtol=1e-10, atol=1e-10)


def test_module_overflow_leaves_cache_untouched():
    m = make(n_kv_heads=2)
    x = randn(1, 4, 16)
    cache = cache_for(m, 1, 4, x)
    decode(m, x[:, :3], [3], cache)
    k_before = cache.k.clone()
    with pytest.raises(ValueError, match=r"KVCache overflow: 3 cached \+ 2 new > max_len 4"):
        m(randn(1, 2, 16), kv_cache=cache)
    assert cache.length == 3 and torch.equal(cache.k, k_before)


def test_bfloat16_cached_decoding_is_close_to_full_forward():
    m = make(n_kv_heads=2, dtype=torch.bfloat16)
    x = randn(2, 6, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        expected, _ = m(x, is_causal=True)
    out = decode(m, x, [3, 1, 1, 1], cache_for(m, 2, 6, x))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), rtol=3e-2, atol=3e-2)


@needs_cuda
@pytest.mark.parametrize("impl", IMPLS)
def test_cuda_cached_decoding_without_host_sync(impl):
    m = make(n_kv_heads=2, impl=impl, dtype=torch.float32, device="cuda")
    x = randn(2, 7, 16, dtype=torch.float32, device="cuda")
    with torch.no_grad():
        expected, _ = m(x, is_causal=True)
    cache = cache_for(m, 2, 8, x)
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = decode(m, x, [3, 1, 2, 1], cache)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
