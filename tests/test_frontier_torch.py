"""Tests of ``MultiHeadAttention``'s options from today's models (RoPE, QK-norm, soft-capping, sliding window,
attention sinks) and of the ring-buffer ``KVCache`` (issue 24, the PyTorch side).

References: an explicit per-sequence, per-head, per-query computation in float64 written here from the layer's
definition (``explicit``: its own RoPE by 2x2 rotations of explicit pairs, its own RMSNorm, softmax with the sink
column, window mask from absolute positions), the module's own full-sequence forward (for the caches: the cache
must decode what the full computation gives), a windowless copy of the module with a full ``KVCache`` and an explicit
window mask, and autograd. Hugging Face's models are in tests/test_from_hf.py.
"""

import math

import pytest
import torch

from mha import KVCache, MultiHeadAttention
from mha.rope import apply_rope, rope_cos_sin

from _params import make, randn

F64 = torch.float64
IMPLS = ["sdpa", "naive"]


def make_frontier(seed=0, d_model=16, n_heads=4, **kwargs):
    """A module with random weights and, where enabled, random sinks and QK-norm weights (not their init values)."""
    m = make(d_model=d_model, n_heads=n_heads, seed=seed, **kwargs)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        if m.sinks is not None:
            m.sinks.copy_(torch.randn(m.n_heads, generator=g, dtype=F64))
        if m.qk_norm:
            m.q_norm.copy_(1 + 0.3 * torch.randn(m.head_dim, generator=g, dtype=F64))
            m.k_norm.copy_(1 + 0.3 * torch.randn(m.head_dim, generator=g, dtype=F64))
    return m


def windowless_copy(m):
    """The same weights and options without the window (for the full-cache comparisons)."""
    other = MultiHeadAttention(m.d_model, m.n_heads, m.n_kv_heads, m.head_dim, bias=m.q_proj.bias is not None,
                               impl=m.impl, scale=m.scale, rope_base=m.rope_base, rope_style=m.rope_style,
                               sinks=m.sinks is not None, qk_norm=m.qk_norm, qk_norm_eps=m.qk_norm_eps,
                               softcap=m.softcap).double().eval()
    other.load_state_dict(m.state_dict())
    return other


def rotate_explicit(x, positions, base, style):
    """RoPE by explicit 2x2 rotations: x (L, d), positions (L,) ints. Pairs (i, i + d/2) or (2i, 2i + 1)."""
    length, d = x.shape
    out = x.clone()
    for t in range(length):
        for i in range(d // 2):
            a, b = (i, i + d // 2) if style == "half" else (2 * i, 2 * i + 1)
            angle = int(positions[t]) * base ** (-2 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            out[t, a] = x[t, a] * c - x[t, b] * s
            out[t, b] = x[t, a] * s + x[t, b] * c
    return out


def explicit(m, x, positions=None, allowed=None, n_sink_tokens=0):
    """The layer by its definition, in float64: x (N, L, d_model) -> (out (N, L, d_model), weights (N, h, L, L)).

    Self-attention; causal and the module's window are applied from the sequence index (plus the first
    ``n_sink_tokens`` keys, StreamingLLM); ``allowed`` (N, L, L) is an extra user mask.
    """
    x = x.double()
    n, length, _ = x.shape
    h, g, hd = m.n_heads, m.n_kv_heads, m.head_dim
    positions = torch.arange(length) if positions is None else positions

    def w_b(lin):
        w = lin.weight.detach().double().T
        return w, torch.zeros(w.shape[1], dtype=F64) if lin.bias is None else lin.bias.detach().double()

    def rms(v, w):
        return v / torch.sqrt((v * v).mean(-1, keepdim=True) + m.qk_norm_eps) * w.detach().double()

    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = map(w_b, (m.q_proj, m.k_proj, m.v_proj, m.o_proj))
    out = torch.zeros(n, length, m.d_model, dtype=F64)
    weights = torch.zeros(n, h, length, length, dtype=F64)
    for b in range(n):
        pos = positions if positions.ndim == 1 else positions[b]
        for j in range(h):
            kv = j // (h // g)
            cq, ckv = slice(j * hd, (j + 1) * hd), slice(kv * hd, (kv + 1) * hd)
            q = x[b] @ wq[:, cq] + bq[cq]
            k = x[b] @ wk[:, ckv] + bk[ckv]
            v = x[b] @ wv[:, ckv] + bv[ckv]
            if m.qk_norm:
                q, k = rms(q, m.q_norm), rms(k, m.k_norm)
            if m.rope_base is not None:
                q = rotate_explicit(q, pos, m.rope_base, m.rope_style)
                k = rotate_explicit(k, pos, m.rope_base, m.rope_style)
            head = torch.zeros(length, hd, dtype=F64)
            for i in range(length):
                s = (q[i] @ k.T) * m.scale
                if m.softcap is not None:
                    s = m.softcap * torch.tanh(s / m.softcap)
                ok = torch.arange(length) <= i
                if m.window is not None:
                    ok &= (torch.arange(length) > i - m.window) | (torch.arange(length) < n_sink_tokens)
                if allowed is not None:
                    ok &= allowed[b, i]
                logits = [s[ok]] + ([] if m.sinks is None else [m.sinks.detach().double()[j].view(1)])
                logits = torch.cat(logits)
                if logits.numel() == 0:
                    continue
                p = torch.exp(logits - logits.max())
                p = p / p.sum()
                row = torch.zeros(length, dtype=F64)
                row[ok] = p[: int(ok.sum())]
                weights[b, j, i] = row
                head[i] = row @ v
            out[b] += head @ wo[cq]
        out[b] += bo
    return out, weights


OPTION_SETS = {
    "rope-half": dict(rope_base=10000.0),
    "rope-interleaved": dict(rope_base=100.0, rope_style="interleaved"),
    "window": dict(window=3),
    "sinks": dict(sinks=True),
    "qk_norm": dict(qk_norm=True, qk_norm_eps=1e-5),
    "softcap": dict(softcap=2.0),
    "gpt-oss": dict(rope_base=500.0, window=4, sinks=True),
    "gemma3": dict(rope_base=1000.0, window=3, qk_norm=True, scale=0.3),
    "everything": dict(rope_base=50.0, rope_style="interleaved", window=2, sinks=True, qk_norm=True, softcap=1.5),
}


# ------------------------------------------------------------------------------------------ the full forward
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n_kv_heads", [4, 2])
@pytest.mark.parametrize("options", list(OPTION_SETS), ids=list(OPTION_SETS))
def test_forward_matches_the_explicit_definition(options, n_kv_heads, impl):
    m = make_frontier(n_kv_heads=n_kv_heads, impl=impl, **OPTION_SETS[options])
    x = randn(2, 7, 16)
    expected, expected_w = explicit(m, x)
    with torch.no_grad():
        out, weights = m(x, is_causal=True)
        out_fast, none = m(x, is_causal=True, need_weights=False)
    assert none is None
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out_fast, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(weights, expected_w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("options", ["rope-half", "gpt-oss", "everything"])
def test_positions_per_sequence_match_the_explicit_definition(options):
    """positions (N, L_q): each sequence rotated at its own positions (RoPE only; the masks use the index)."""
    m = make_frontier(**OPTION_SETS[options])
    x = randn(2, 6, 16)
    positions = torch.stack([torch.arange(6) + 3, torch.tensor([0, 2, 5, 6, 9, 20])])  # (N, L)
    expected, _ = explicit(m, x, positions=positions)
    with torch.no_grad():
        out, _ = m(x, is_causal=True, positions=positions, need_weights=False)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_rope_depends_only_on_relative_positions():
    """Shifting every position by the same amount changes q and k but not q . k: the output is the same."""
    m = make_frontier(rope_base=10000.0, window=3)
    x = randn(1, 6, 16)
    with torch.no_grad():
        out, _ = m(x, is_causal=True)
        shifted, _ = m(x, is_causal=True, positions=torch.arange(6) + 1000)
    torch.testing.assert_close(shifted, out, rtol=1e-9, atol=1e-9)


def test_rope_styles_are_a_permutation_of_the_coordinates():
    """"interleaved" applied to x equals "half" applied to x with its coordinates permuted (2i -> i, 2i+1 -> i+d/2)."""
    x = randn(2, 3, 5, 8)
    cos, sin = rope_cos_sin(torch.arange(5) * 7, 8, 10000.0, F64)
    perm = torch.cat([torch.arange(0, 8, 2), torch.arange(1, 8, 2)])  # interleaved -> half layout
    torch.testing.assert_close(apply_rope(x, cos, sin, "interleaved")[..., perm],
                               apply_rope(x[..., perm], cos, sin, "half"), rtol=0, atol=1e-15)
    assert rope_cos_sin(torch.tensor([0]), 8, 10000.0, F64)[0].eq(1).all()  # position 0: no rotation


# --------------------------------------------------------------------------------------------------- sinks
def test_sink_rows_sum_to_one_minus_the_sink_probability():
    m = make_frontier(sinks=True, n_kv_heads=2)
    x = randn(2, 5, 16)
    with torch.no_grad():
        _, weights = m(x, is_causal=True)
        q = m.q_proj(x).view(2, 5, 4, 4).transpose(1, 2)
        k = m.k_proj(x).view(2, 5, 2, 4).transpose(1, 2).repeat_interleave(2, dim=1)
        scores = (q @ k.transpose(-2, -1) * m.scale).masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -torch.inf)
        sink = m.sinks.view(1, 4, 1, 1).expand(2, 4, 5, 1)
        p_sink = torch.softmax(torch.cat([scores, sink], -1), -1)[..., -1]
    torch.testing.assert_close(weights.sum(-1), 1 - p_sink, rtol=1e-12, atol=1e-12)
    assert (weights.sum(-1) < 1).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_a_row_with_no_allowed_key_gives_all_weight_to_the_sink(impl):
    """A fully masked row: zero weights and zero output (the sink takes everything), never NaN, on both paths."""
    m = make_frontier(sinks=True, impl=impl)
    x = randn(2, 4, 16)
    allowed = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    allowed[1, :, 2] = False  # sequence 1, query 2 sees nothing
    with torch.no_grad():
        out, weights = m(x, mask=allowed, need_weights=True)
        fast, _ = m(x, mask=allowed, need_weights=False)
        heads_only = m.o_proj.bias  # zero head outputs -> o_proj gives its bias
    assert (weights[1, :, 2] == 0).all()
    torch.testing.assert_close(out[1, 2], heads_only, rtol=0, atol=1e-14)
    torch.testing.assert_close(fast, out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("options", ["sinks", "gpt-oss", "everything"])
def test_sdpa_and_naive_paths_agree_in_value_and_gradient(options):
    """The sink as an extra key column (sdpa) and as an extra score column (naive): same output, same gradients
    (the sinks' included), with GQA."""
    grads = {}
    outs = {}
    x = randn(2, 6, 16)
    for impl in IMPLS:
        m = make_frontier(n_kv_heads=2, impl=impl, **OPTION_SETS[options])
        xi = x.clone().requires_grad_(True)
        out, _ = m(xi, is_causal=True, need_weights=False)
        (out * randn(2, 6, 16, seed=9)).sum().backward()
        outs[impl] = out.detach()
        grads[impl] = {"x": xi.grad, **{name: p.grad for name, p in m.named_parameters()}}
    torch.testing.assert_close(outs["sdpa"], outs["naive"], rtol=1e-12, atol=1e-12)
    assert set(grads["sdpa"]) == set(grads["naive"])
    for name in grads["sdpa"]:
        torch.testing.assert_close(grads["sdpa"][name], grads["naive"][name], rtol=1e-10, atol=1e-10, msg=name)


def test_sink_gradient_matches_the_closed_form():
    """dL/dsink_h = -sum_i p_{i,sink} (do_i . o_i) for the per-head outputs o_i (rows without dropout)."""
    m = make_frontier(sinks=True, impl="naive")
    x = randn(1, 5, 16)
    captured = {}
    m.o_proj.register_forward_hook(lambda mod, inp, out: captured.update(heads=inp[0]))
    out, weights = m(x, is_causal=True)
    heads = captured["heads"]
    heads.retain_grad()
    out.pow(2).sum().backward()
    do = heads.grad.view(1, 5, 4, 4).transpose(1, 2)  # (N, h, L, d)
    o = heads.detach().view(1, 5, 4, 4).transpose(1, 2)
    p_sink = 1 - weights.detach().sum(-1)  # (N, h, L)
    expected = -(p_sink * (do * o).sum(-1)).sum(dim=(0, 2))  # (h,)
    torch.testing.assert_close(m.sinks.grad, expected, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------- defaults, params, new_cache
def test_defaults_keep_todays_module():
    m = MultiHeadAttention(16, 4)
    assert list(m.state_dict()) == ["q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                                    "v_proj.weight", "v_proj.bias", "o_proj.weight", "o_proj.bias"]
    assert m.sinks is None and m.q_norm is None and m.k_norm is None
    assert "rope" not in repr(m) and "window" not in repr(m)
    assert sorted(m.export_params()) == ["W_k", "W_o", "W_q", "W_v", "b_k", "b_o", "b_q", "b_v"]


def test_options_add_their_parameters_and_round_trip_through_params():
    m = make_frontier(sinks=True, qk_norm=True, bias=False)
    assert {"sinks", "q_norm", "k_norm"} <= set(m.state_dict())
    params = m.export_params()
    assert params["sinks"].shape == (4,) and params["q_norm"].shape == (4,) and params["k_norm"].shape == (4,)
    other = MultiHeadAttention(16, 4, bias=False, sinks=True, qk_norm=True).double()
    other.load_params(params)
    for name, p in m.named_parameters():
        assert torch.equal(p, dict(other.named_parameters())[name]), name
    with pytest.raises(ValueError, match=r"params is missing \['sinks'\] \(module has bias=False, sinks=True"):
        other.load_params({k: v for k, v in params.items() if k != "sinks"})
    with pytest.raises(ValueError, match=r"unexpected keys \['k_norm', 'q_norm', 'sinks'\] \(module has bias=False\)"):
        MultiHeadAttention(16, 4, bias=False).double().load_params(params)


@pytest.mark.parametrize("window", [None, 5])
def test_new_cache_matches_the_module(window):
    m = MultiHeadAttention(16, 4, n_kv_heads=2, window=window).to(torch.bfloat16)
    cache = m.new_cache(3, 100)
    assert (cache.batch_size, cache.max_len, cache.n_kv_heads, cache.head_dim) == (3, 100, 2, 4)
    assert cache.dtype == torch.bfloat16 and cache.device == m.q_proj.weight.device and cache.window == window
    assert cache.k.shape == (3, 2, 100 if window is None else 5, 4)
    if window is not None:
        assert m.new_cache(1, 100, n_sink_tokens=2).k.shape == (1, 2, 7, 4)


@pytest.mark.parametrize("n_sink_tokens", [0, 3])
def test_ring_buffer_size_does_not_grow_with_max_len(n_sink_tokens):
    """Persistent memory O(window): the buffers hold n_sink_tokens + window slots whatever max_len is."""
    m = MultiHeadAttention(16, 4, n_kv_heads=2, window=8)
    sizes = {max_len: m.new_cache(2, max_len, n_sink_tokens=n_sink_tokens).nbytes for max_len in (8, 1000, 10**6)}
    assert set(sizes.values()) == {2 * 2 * 2 * (n_sink_tokens + 8) * 4 * 4}


# ------------------------------------------------------------------------------------------- the ring buffer
def decode(m, x, chunks, cache, **kwargs):
    outs, start = [], 0
    with torch.no_grad():
        for size in chunks:
            out, _ = m(x[:, start:start + size], kv_cache=cache, is_causal=True, need_weights=False, **kwargs)
            outs.append(out)
            start += size
    assert start == x.shape[1]
    return torch.cat(outs, dim=1)


CHUNKINGS = {
    "one-token": [1] * 40,  # 40 steps of a window of 3: 13 wraps
    "prefill-longer-than-window": [11] + [1] * 29,
    "chunked-prefill": [2, 5, 3, 7, 1, 4, 1, 1, 9, 6, 1],
    "whole": [40],
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("chunks", list(CHUNKINGS), ids=list(CHUNKINGS))
@pytest.mark.parametrize("options", ["window", "gpt-oss", "gemma3", "everything"])
def test_ring_buffer_decodes_what_the_full_computation_gives(options, chunks, impl):
    m = make_frontier(n_kv_heads=2, impl=impl, **OPTION_SETS[options])
    x = randn(2, 40, 16)
    with torch.no_grad():
        expected, _ = m(x, is_causal=True, need_weights=False)
    cache = m.new_cache(2, 40)
    out = decode(m, x, CHUNKINGS[chunks], cache)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    assert cache.length == 40 and cache.k.shape[2] == m.window


@pytest.mark.parametrize("chunks", ["one-token", "chunked-prefill"])
def test_ring_buffer_equals_a_full_cache_with_a_window_mask(chunks):
    """The same decoding by a windowless copy with a full KVCache and an explicit window mask over the cache."""
    m = make_frontier(n_kv_heads=2, rope_base=1000.0, window=4, sinks=True)
    full_m = windowless_copy(m)
    x = randn(1, 40, 16)
    ring, full = m.new_cache(1, 40), full_m.new_cache(1, 40)
    outs_ring, outs_full, start = [], [], 0
    with torch.no_grad():
        for size in CHUNKINGS[chunks]:
            q_idx = torch.arange(start, start + size)[:, None]
            k_idx = torch.arange(start + size)[None, :]
            window = (k_idx > q_idx - 4) & (k_idx <= q_idx)  # (size, start + size)
            outs_full.append(full_m(x[:, start:start + size], kv_cache=full, mask=window, need_weights=False)[0])
            outs_ring.append(m(x[:, start:start + size], kv_cache=ring, need_weights=False)[0])
            start += size
    torch.testing.assert_close(torch.cat(outs_ring, 1), torch.cat(outs_full, 1), rtol=1e-10, atol=1e-10)
    assert ring.nbytes * 10 == full.nbytes  # 4 slots against 40


@pytest.mark.parametrize("chunks", ["one-token", "prefill-longer-than-window", "chunked-prefill"])
def test_sink_tokens_keep_their_original_positions(chunks):
    """StreamingLLM's kept tokens: with n_sink_tokens = S the ring decodes the full computation with the mask
    "p - W < j <= p or j < S", every key at its original absolute position (the explicit definition), and the sink
    slots hold the first keys rotated at positions 0 .. S-1 (not re-numbered)."""
    m = make_frontier(n_kv_heads=2, rope_base=100.0, window=3, sinks=True)
    x = randn(2, 40, 16)
    expected, _ = explicit(m, x, n_sink_tokens=2)
    cache = m.new_cache(2, 40, n_sink_tokens=2)
    out = decode(m, x, CHUNKINGS[chunks], cache)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    with torch.no_grad():
        k = m.k_proj(x[:, :2]).view(2, 2, 2, 4).transpose(1, 2)  # (N, g, 2, d): the first two keys
        cos, sin = rope_cos_sin(torch.arange(2), 4, 100.0, F64)
        torch.testing.assert_close(cache.k[:, :, :2], apply_rope(k, cos, sin), rtol=0, atol=1e-14)
    assert cache.slot_positions().tolist() == [0, 1, 38, 39, 37]  # p >= 2 in slot 2 + (p - 2) % 3


def test_ring_buffer_weights_and_a_padding_mask_over_absolute_positions():
    """need_weights with a ring cache: (N, h, L_q, length + L_q) over the absolute positions, zero outside the window,
    equal to the full forward's rows; a key-padding mask is given over absolute positions too."""
    m = make_frontier(n_kv_heads=2, rope_base=100.0, window=3, sinks=True)
    x = randn(2, 12, 16)
    allowed = torch.ones(2, 1, 1, 12, dtype=torch.bool)
    allowed[1, ..., 9] = False  # sequence 1 never attends to position 9
    with torch.no_grad():
        expected, expected_w = m(x, mask=allowed, is_causal=True)
        cache = m.new_cache(2, 12)
        outs = [m(x[:, :5], kv_cache=cache, mask=allowed[..., :5])[0]]
        for t in range(5, 12):
            out_t, w_t = m(x[:, t:t + 1], kv_cache=cache, mask=allowed[..., :t + 1])
            assert w_t.shape == (2, 4, 1, t + 1)
            torch.testing.assert_close(w_t, expected_w[:, :, t:t + 1, :t + 1], rtol=1e-10, atol=1e-10)
            outs.append(out_t)
    torch.testing.assert_close(torch.cat(outs, 1), expected, rtol=1e-10, atol=1e-10)


def test_slot_positions_and_commit():
    """Unit level: what each slot holds after appends of various sizes, against a dict of position -> key."""
    cache = KVCache(1, 100, 1, 2, dtype=F64, window=4, n_sink_tokens=1)
    written = {}
    start = 0
    for size in [2, 1, 6, 1, 1, 3, 9]:
        k = torch.arange(start, start + size, dtype=F64).view(1, 1, size, 1).expand(1, 1, size, 2)
        cache.append(k, -k)
        written.update({p: p for p in range(start, start + size)})
        start += size
        positions = cache.slot_positions().tolist()
        assert sorted(p for p in positions if p >= 0) == [0] + list(range(max(1, start - 4), start))
        for slot, p in enumerate(positions):
            if p >= 0:
                assert cache.k[0, 0, slot, 0] == written[p] and cache.v[0, 0, slot, 0] == -written[p]
    assert cache.length == 23


def test_ring_buffer_rewind_is_allowed_only_where_exact():
    """length can go back one position (the ring keeps window slots: one more than a query needs), or anywhere while
    nothing has wrapped, or to the sink tokens; decoding after an allowed rewind is exact; further is refused."""
    m = make_frontier(rope_base=100.0, window=3, sinks=True)
    x, y = randn(1, 12, 16), randn(1, 12, 16, seed=5)
    with torch.no_grad():
        expected, _ = m(torch.cat([x[:, :9], y[:, 9:]], 1), is_causal=True, need_weights=False)
    cache = m.new_cache(1, 12)
    decode(m, x[:, :10], [2, 1] + [1] * 7, cache)
    with pytest.raises(ValueError, match=r"length cannot be set back from 10 to 8 .*window=3.* go back to 9, or to 0"):
        cache.length = 8
    assert cache.length == 10
    cache.length = 9  # one step back: exact
    out = decode(m, y[:, 9:], [1, 2], cache)
    torch.testing.assert_close(out, expected[:, 9:], rtol=1e-10, atol=1e-10)
    fresh = m.new_cache(1, 12)
    decode(m, x[:, :3], [3], fresh)
    fresh.length = 0  # nothing has wrapped yet: anywhere back is fine
    with_sinks = m.new_cache(1, 12, n_sink_tokens=1)
    decode(m, x[:, :10], [10], with_sinks)
    with pytest.raises(ValueError, match=r"from 10 to 5 .* go back to 9, or to 1 or below"):
        with_sinks.length = 5
    with_sinks.length = 1  # to the sink tokens: fine
    assert fresh.length == 0 and with_sinks.length == 1
    out = decode(m, y[:, 1:4], [3], with_sinks)
    expected, _ = explicit(m, torch.cat([x[:, :1], y[:, 1:4]], 1), n_sink_tokens=1)
    torch.testing.assert_close(out, expected[:, 1:], rtol=1e-10, atol=1e-10)


def test_ring_buffer_one_token_steps_far_past_the_window_bfloat16():
    """Many wraps in bfloat16 stay close to the float64 computation with the same rounded weights."""
    m = make_frontier(n_kv_heads=2, rope_base=10000.0, window=5, sinks=True, qk_norm=True).to(torch.bfloat16)
    exact = make_frontier(n_kv_heads=2, rope_base=10000.0, window=5, sinks=True, qk_norm=True).to(torch.bfloat16)
    exact = exact.double()
    x = randn(1, 64, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        expected, _ = exact(x.double(), is_causal=True, need_weights=False)
    out = decode(m, x, [1] * 64, m.new_cache(1, 64))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=5e-2 * expected.abs().max().item())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@pytest.mark.parametrize("impl", IMPLS)
def test_cuda_ring_buffer_decoding_without_host_sync(impl):
    """On a GPU, every option and the ring buffer (slot positions, window mask, writes) run without a host-device
    synchronisation (torch.cuda.set_sync_debug_mode("error") raises on one), and decode what the full forward does."""
    m = make_frontier(n_kv_heads=2, impl=impl, **OPTION_SETS["everything"]).float().cuda()
    x = randn(2, 30, 16, dtype=torch.float32, device="cuda")
    with torch.no_grad():
        expected, _ = m(x, is_causal=True, need_weights=False)
    cache = m.new_cache(2, 30, n_sink_tokens=0)
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = decode(m, x, [7, 1, 1, 5, 1, 1, 1, 13], cache)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
