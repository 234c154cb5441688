"""Tests for mha.counting against torch: parameter numel, FlopCounterMode, tensor nbytes."""

import inspect
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mha import KVCache, MultiHeadAttention
from mha import counting as C

torch.set_num_threads(1)


# ---------------------------------------------------------------------------------------------------------------
# Parameters.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d_model,n_heads", [(8, 2), (12, 3), (16, 4), (64, 8), (7, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_param_count_matches_torch_multihead_attention(d_model, n_heads, bias):
    mha = torch.nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True)
    assert C.param_count(d_model, n_heads, bias=bias) == sum(p.numel() for p in mha.parameters())


@pytest.mark.parametrize(
    "d_model,n_heads,n_kv_heads,head_dim",
    [(8, 4, 1, None), (8, 4, 2, None), (12, 6, 3, None), (10, 4, 2, 3), (16, 8, 8, 5), (6, 6, 1, 16)],
)
@pytest.mark.parametrize("bias", [True, False])
def test_param_count_matches_explicit_linear_layers(d_model, n_heads, n_kv_heads, head_dim, bias):
    hd = head_dim or d_model // n_heads
    layers = torch.nn.ModuleList([
        torch.nn.Linear(d_model, n_heads * hd, bias=bias),  # W_q
        torch.nn.Linear(d_model, n_kv_heads * hd, bias=bias),  # W_k
        torch.nn.Linear(d_model, n_kv_heads * hd, bias=bias),  # W_v
        torch.nn.Linear(n_heads * hd, d_model, bias=bias),  # W_o
    ])
    expected = sum(p.numel() for p in layers.parameters())
    assert C.param_count(d_model, n_heads, n_kv_heads, head_dim, bias=bias) == expected


def test_param_count_by_hand():
    # MHA, d = 512, h = 8: 4 d^2 + 4 d.
    assert C.param_count(512, 8) == 4 * 512**2 + 4 * 512
    # MQA, d = 512, h = 8, hd = 64: W_q, W_o 512*512 each; W_k, W_v 512*64 each; biases 512 + 64 + 64 + 512.
    assert C.param_count(512, 8, 1) == 2 * 512 * 512 + 2 * 512 * 64 + 512 + 64 + 64 + 512


# ---------------------------------------------------------------------------------------------------------------
# FLOPs: matmul terms vs FlopCounterMode on a naive torch computation written here.
# ---------------------------------------------------------------------------------------------------------------


def counted(fn):
    with FlopCounterMode(display=False) as counter:
        result = fn()
    return result, counter.get_total_flops()


def measured_steps(N, L_q, L_kv, d_model, n_heads, n_kv_heads, head_dim):
    """FlopCounterMode's count for each step of a naive attention forward (with biases, via x @ W + b)."""
    g = n_kv_heads or n_heads
    hd = head_dim or d_model // n_heads
    x_q, x_kv = torch.randn(N, L_q, d_model), torch.randn(N, L_kv, d_model)
    W_q, W_k, W_v = torch.randn(d_model, n_heads * hd), torch.randn(d_model, g * hd), torch.randn(d_model, g * hd)
    W_o, b_q = torch.randn(n_heads * hd, d_model), torch.randn(n_heads * hd)
    steps = {}
    q, steps["q_proj"] = counted(lambda: x_q @ W_q + b_q)
    k, steps["k_proj"] = counted(lambda: x_kv @ W_k)
    v, steps["v_proj"] = counted(lambda: torch.nn.functional.linear(x_kv, W_v.T, torch.randn(g * hd)))  # addmm
    q = q.view(N, L_q, n_heads, hd).transpose(1, 2)
    k = k.view(N, L_kv, g, hd).transpose(1, 2).repeat_interleave(n_heads // g, dim=1)
    v = v.view(N, L_kv, g, hd).transpose(1, 2).repeat_interleave(n_heads // g, dim=1)
    s, steps["qk"] = counted(lambda: q @ k.transpose(-1, -2))
    w, elementwise = counted(lambda: torch.softmax(s / math.sqrt(hd), dim=-1))
    assert elementwise == 0  # FlopCounterMode ignores elementwise ops: they are not in matmul_total
    o, steps["av"] = counted(lambda: w @ v)
    merged = o.transpose(1, 2).reshape(N, L_q, n_heads * hd)
    _, steps["o_proj"] = counted(lambda: merged @ W_o)
    return steps


SHAPES = [
    # N, L_q, L_kv, d_model, n_heads, n_kv_heads, head_dim
    (1, 4, 4, 8, 2, None, None),
    (2, 5, 5, 12, 4, 2, None),
    (3, 3, 7, 16, 8, 1, None),
    (2, 6, 2, 10, 4, 4, 3),
    (1, 1, 9, 12, 6, 3, 5),
]


@pytest.mark.parametrize("shape", SHAPES)
def test_flops_matmul_terms_match_flop_counter_mode(shape):
    steps = measured_steps(*shape)
    count = C.flops(*shape)
    for key, value in steps.items():
        assert count[key] == value, key
    assert count["matmul_total"] == sum(steps.values()) == C.matmul_flops(*shape)
    assert count.total == count["total"] == count["matmul_total"] + count["scale"] + count["softmax"]


def test_flops_total_of_naive_forward_matches_flop_counter_mode():
    N, L, d_model, h, g = 2, 6, 16, 4, 2
    hd = d_model // h
    x = torch.randn(N, L, d_model)
    P = {"W_q": torch.randn(d_model, d_model), "W_k": torch.randn(d_model, g * hd),
         "W_v": torch.randn(d_model, g * hd), "W_o": torch.randn(d_model, d_model)}

    def forward():
        q = (x @ P["W_q"]).view(N, L, h, hd).transpose(1, 2)
        k = (x @ P["W_k"]).view(N, L, g, hd).transpose(1, 2).repeat_interleave(h // g, dim=1)
        v = (x @ P["W_v"]).view(N, L, g, hd).transpose(1, 2).repeat_interleave(h // g, dim=1)
        w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1)
        return (w @ v).transpose(1, 2).reshape(N, L, d_model) @ P["W_o"]

    _, total = counted(forward)
    assert C.matmul_flops(N, L, L, d_model, h, g) == total


def test_flops_elementwise_conventions_by_hand():
    # N = 1, L = 2, d = 4, h = 2 (hd = 2): 8 scores.
    c = C.flops(1, 2, 2, 4, 2)
    assert (c["q_proj"], c["k_proj"], c["v_proj"], c["o_proj"]) == (64, 64, 64, 64)  # 2 * 2 tokens * 4 * 4
    assert (c["qk"], c["av"]) == (32, 32)  # 2 * 8 scores * hd 2
    assert (c["scale"], c["softmax"]) == (8, 40)  # 1 and 5 per score
    assert c["matmul_total"] == 320 and c["total"] == 368


# ---------------------------------------------------------------------------------------------------------------
# One cached decoding step: FlopCounterMode on mha.MultiHeadAttention(impl="naive") with a KVCache.
# ---------------------------------------------------------------------------------------------------------------


DECODE_SHAPES = [
    # N, cache_len, d_model, n_heads, n_kv_heads, head_dim
    (1, 0, 8, 2, None, None),  # the first token: empty cache, attends over itself only
    (2, 5, 12, 4, 2, None),
    (3, 9, 16, 8, 1, None),
    (2, 6, 12, 4, 2, 5),
    (1, 13, 10, 6, 6, 3),
]


@pytest.mark.parametrize("shape", DECODE_SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_decode_step_flops_match_flop_counter_mode_on_a_cached_module_step(shape, bias):
    N, cache_len, d_model, n_heads, n_kv_heads, head_dim = shape
    torch.manual_seed(0)
    layer = MultiHeadAttention(d_model, n_heads, n_kv_heads, head_dim, bias=bias, impl="naive").eval()
    cache = KVCache(N, cache_len + 1, layer.n_kv_heads, layer.head_dim)
    with torch.no_grad():
        if cache_len:
            layer(torch.randn(N, cache_len, d_model), is_causal=True, kv_cache=cache)  # prefill: not counted
        assert cache.length == cache_len
        with FlopCounterMode(display=False) as counter:
            layer(torch.randn(N, 1, d_model), is_causal=True, kv_cache=cache)  # the one new token
    assert cache.length == cache_len + 1
    by_module = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    count = C.decode_step_flops(N, cache_len, d_model, n_heads, n_kv_heads, head_dim)
    for step in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert count[step] == by_module[f"MultiHeadAttention.{step}"], step
    projections = sum(by_module[f"MultiHeadAttention.{step}"] for step in ("q_proj", "k_proj", "v_proj", "o_proj"))
    assert count["qk"] + count["av"] == by_module["MultiHeadAttention"] - projections  # the two batched matmuls
    assert count["matmul_total"] == counter.get_total_flops()


def test_decode_step_flops_by_hand():
    # N = 2, cache 3 -> L_kv = 4 keys; d = 6, h = 3, g = 1, hd = 2 (MQA); one query per head: 3 heads x 4 keys.
    c = C.decode_step_flops(2, 3, 6, 3, 1)
    assert (c["q_proj"], c["o_proj"]) == (2 * 2 * 6 * 6, 2 * 2 * 6 * 6)  # one token: 2 N d (h hd)
    assert (c["k_proj"], c["v_proj"]) == (2 * 2 * 6 * 2, 2 * 2 * 6 * 2)  # one token: 2 N d (g hd)
    scores = 2 * 3 * 4
    assert (c["qk"], c["av"], c["scale"], c["softmax"]) == (2 * scores * 2, 2 * scores * 2, scores, 5 * scores)
    assert c["total"] == c["matmul_total"] + scores * 6
    # Recomputing the prefix of L positions costs L times a step (MHA, this count): the book's F_full = L F_cache.
    for L in (1, 7, 64):
        assert C.flops(1, L, L, 16, 4).total == L * C.decode_step_flops(1, L - 1, 16, 4).total


@pytest.mark.parametrize("batch,L_q,L_kv,n_heads,head_dim", [(1, 1, 1, 1, 1), (2, 16, 12, 4, 8), (3, 9, 9, 2, 5)])
def test_attention_core_flops_match_torch_sdpa_flop_formulas(batch, L_q, L_kv, n_heads, head_dim):
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q, kv = (batch, n_heads, L_q, head_dim), (batch, n_heads, L_kv, head_dim)
    forward = C.attention_core_flops(batch, L_q, L_kv, n_heads, head_dim)
    assert forward == sdpa_flop_count(q, kv, kv)
    assert C.attention_core_flops(batch, L_q, L_kv, n_heads, head_dim, backward=True) == \
        forward + sdpa_backward_flop_count(q, q, kv, kv)  # backward = 2.5 forwards (five products)
    count = C.flops(batch, L_q, L_kv, n_heads * head_dim, n_heads, head_dim=head_dim)
    assert forward == count["qk"] + count["av"]  # the layer's two attention products, nothing else


def test_attention_core_flops_causal_convention_by_hand():
    # N = 2, h = 3, L = 8, hd = 4: 4 N h L^2 hd = 6144; causal halves it (L_q = L_kv only); backward x 3.5.
    assert C.attention_core_flops(2, 8, 8, 3, 4) == 4 * 2 * 3 * 8 * 8 * 4 == 6144
    assert C.attention_core_flops(2, 8, 8, 3, 4, is_causal=True) == 3072
    assert C.attention_core_flops(2, 8, 8, 3, 4, is_causal=True, backward=True) == 3072 * 7 // 2
    assert C.attention_core_flops(2, 4, 8, 3, 4, is_causal=True) == C.attention_core_flops(2, 4, 8, 3, 4)
    assert isinstance(C.attention_core_flops(1, 3, 3, 1, 1, is_causal=True, backward=True), int)


# ---------------------------------------------------------------------------------------------------------------
# RoPE (issue 24): an elementwise step, 3 FLOPs per rotated coordinate.
# ---------------------------------------------------------------------------------------------------------------


def test_rope_flops_by_hand_and_nothing_else_changes():
    # N = 2, L_q = 3, L_kv = 5, d = 8, h = 4, g = 2, hd = 2: 2*3*4 = 24 query vectors, 2*5*2 = 20 key vectors (one per
    # kv head: GQA rotates a shared key once), 3 * hd = 6 FLOPs each (per pair 4 multiplies + 2 adds).
    plain, rotated = C.flops(2, 3, 5, 8, 4, 2), C.flops(2, 3, 5, 8, 4, 2, rope=True)
    assert "rope" not in plain and rotated["rope"] == 6 * (24 + 20) == 264
    assert rotated["total"] == plain["total"] + 264 and rotated["matmul_total"] == plain["matmul_total"]
    assert {key: value for key, value in rotated.items() if key not in ("rope", "total")} == \
        {key: value for key, value in plain.items() if key != "total"}
    assert C.flops(2, 3, 5, 8, 4, 2, rope=False) == plain
    # One decoding step rotates the new token's query (h heads) and key (g heads) only: 3 hd N (h + g).
    step = C.decode_step_flops(2, 9, 8, 4, 2, rope=True)
    assert step["rope"] == 3 * 2 * 2 * (4 + 2) == 72
    assert step["total"] == C.decode_step_flops(2, 9, 8, 4, 2)["total"] + 72


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_rope_flops_of_a_prefix_are_those_of_its_decoding_steps(n_kv_heads):
    """Each position is rotated once whether it comes in the prefix or one decoding step at a time."""
    for L in (1, 7, 64):
        full = C.flops(1, L, L, 16, 4, n_kv_heads, rope=True)["rope"]
        assert full == sum(C.decode_step_flops(1, c, 16, 4, n_kv_heads, rope=True)["rope"] for c in range(L))


def test_rope_flops_count_the_reference_formula():
    """The count is the formula mha.reference.rope evaluates: per pair a cos - b sin and a sin + b cos, counted
    here by evaluating it on Python floats that count their own multiplications and additions."""
    import numpy as np

    from mha import reference as R

    class Counted(float):
        """A float counting every multiplication, addition and subtraction it takes part in."""

        ops = 0

        def _op(self, other, fn):
            Counted.ops += 1
            return Counted(fn(float(self), float(other)))

        def __mul__(self, other):
            return self._op(other, float.__mul__)

        def __add__(self, other):
            return self._op(other, float.__add__)

        def __sub__(self, other):
            return self._op(other, float.__sub__)

    hd, angles = 8, R.rope_frequencies(8) * 5  # one vector at position 5
    x = np.random.default_rng(0).standard_normal(hd)
    out = []
    for i in range(hd // 2):
        a, b, c, s = Counted(x[i]), Counted(x[i + hd // 2]), Counted(np.cos(angles[i])), Counted(np.sin(angles[i]))
        out.append((a * c - b * s, a * s + b * c))
    np.testing.assert_allclose([p[0] for p in out] + [p[1] for p in out], R.rope(x[None], [5])[0], rtol=1e-15)
    assert Counted.ops == C.ROPE_FLOPS_PER_COORDINATE * hd == C.flops(1, 1, 1, hd, 1, rope=True)["rope"] // 2


# ---------------------------------------------------------------------------------------------------------------
# Memory.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int8])
@pytest.mark.parametrize(
    "batch,seq_len,n_layers,n_kv_heads,head_dim", [(1, 1, 1, 1, 1), (2, 7, 3, 2, 4), (3, 5, 2, 8, 6)]
)
def test_kv_cache_bytes_matches_tensor_nbytes(dtype, batch, seq_len, n_layers, n_kv_heads, head_dim):
    cache = [(torch.empty(batch, n_kv_heads, seq_len, head_dim, dtype=dtype),
              torch.empty(batch, n_kv_heads, seq_len, head_dim, dtype=dtype)) for _ in range(n_layers)]
    expected = sum(k.nbytes + v.nbytes for k, v in cache)
    assert C.kv_cache_bytes(batch, seq_len, n_layers, n_kv_heads, head_dim, dtype.itemsize) == expected


@pytest.mark.parametrize("seq_len,window,n_sink_tokens,cached", [
    (10, None, 0, 10), (10, 4, 0, 4), (10, 10, 0, 10), (10, 64, 0, 10), (3, 4, 0, 3),
    (10, 4, 2, 6), (5, 4, 2, 5), (10, 1, 0, 1), (100, 8, 4, 12),
])
def test_kv_cache_bytes_of_windowed_and_sink_token_caches_match_their_tensors(seq_len, window, n_sink_tokens,
                                                                               cached):
    """A window caps the cached positions at min(seq_len, window + n_sink_tokens): the tensors of such a cache."""
    N, layers, g, hd, dtype = 2, 3, 2, 4, torch.bfloat16
    cache = [(torch.empty(N, g, cached, hd, dtype=dtype), torch.empty(N, g, cached, hd, dtype=dtype))
             for _ in range(layers)]
    expected = sum(k.nbytes + v.nbytes for k, v in cache)
    assert C.kv_cache_bytes(N, seq_len, layers, g, hd, dtype.itemsize, window=window,
                            n_sink_tokens=n_sink_tokens) == expected
    if window is None or window >= seq_len:
        assert expected == C.kv_cache_bytes(N, seq_len, layers, g, hd, dtype.itemsize)


@pytest.mark.parametrize("window", [1, 3, 6])
def test_a_windowed_query_reads_only_the_window_most_recent_keys(window):
    """Why the cap is exact: with a window W the newest query's output from the last W keys alone (what a windowed
    cache holds after appending the new key) equals its output from all of them (mha.reference)."""
    import numpy as np

    from mha import reference as R

    rng = np.random.default_rng(window)
    q, k, v = rng.standard_normal((2, 1, 4)), rng.standard_normal((2, 9, 4)), rng.standard_normal((2, 9, 3))
    full = R.scaled_dot_product_attention(q, k, v, window=window)[0]
    np.testing.assert_allclose(R.scaled_dot_product_attention(q, k[:, -window:], v[:, -window:])[0], full,
                               rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,L_q,L_kv,n_heads", [(1, 1, 1, 1), (2, 5, 7, 3), (4, 16, 16, 8)])
def test_attention_matrix_bytes_matches_weights_nbytes(dtype, batch, L_q, L_kv, n_heads):
    q = torch.randn(batch, n_heads, L_q, 4, dtype=dtype)
    k = torch.randn(batch, n_heads, L_kv, 4, dtype=dtype)
    weights = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
    assert C.attention_matrix_bytes(batch, L_q, L_kv, n_heads, dtype.itemsize) == weights.nbytes


# ---------------------------------------------------------------------------------------------------------------
# Argument checks.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call,exc,match",
    [
        pytest.param(lambda: C.param_count(0, 1), ValueError, r"d_model must be an integer >= 1, got 0", id="d0"),
        pytest.param(lambda: C.param_count(8.0, 2), TypeError, r"d_model .* got 8\.0 of type float", id="dfloat"),
        pytest.param(lambda: C.param_count(8, True), TypeError, r"n_heads .* got True", id="hbool"),
        pytest.param(lambda: C.param_count(8, 4, 3), ValueError, r"n_heads \(4\) must be divisible by n_kv_heads \(3\)", id="g"),
        pytest.param(lambda: C.param_count(10, 4), ValueError, r"d_model \(10\) must be divisible by n_heads \(4\)", id="hd"),
        pytest.param(lambda: C.param_count(10, 4, head_dim=0), ValueError, r"head_dim .* got 0", id="hd0"),
        pytest.param(lambda: C.param_count(8, 2, bias=1), TypeError, r"bias must be True or False, got 1", id="bias"),
        pytest.param(lambda: C.flops(0, 1, 1, 8, 2), ValueError, r"batch must be an integer >= 1, got 0", id="N"),
        pytest.param(lambda: C.flops(1, -3, 1, 8, 2), ValueError, r"l_q must be an integer >= 1, got -3", id="Lq"),
        pytest.param(lambda: C.matmul_flops(1, 1, 1, 8, 2, 3), ValueError, r"n_heads \(2\) must be divisible by n_kv_heads \(3\)", id="mm_g"),
        pytest.param(lambda: C.decode_step_flops(1, -1, 8, 2), ValueError,
                     r"cache_len must be an integer >= 0, got -1", id="cache-1"),
        pytest.param(lambda: C.decode_step_flops(1, 2.0, 8, 2), TypeError, r"cache_len .* got 2\.0 of type float",
                     id="cache_float"),
        pytest.param(lambda: C.decode_step_flops(0, 2, 8, 2), ValueError, r"batch must be an integer >= 1", id="dN"),
        pytest.param(lambda: C.decode_step_flops(1, 2, 8, 4, 3), ValueError, r"n_heads \(4\) must be divisible by n_kv_heads \(3\)", id="dg"),
        pytest.param(lambda: C.kv_cache_bytes(1, 1, 1, 1, 1, 0), ValueError, r"dtype_bytes .* got 0", id="bytes"),
        pytest.param(lambda: C.kv_cache_bytes(1, "4", 1, 1, 1, 2), TypeError, r"seq_len .* got '4'", id="Lstr"),
        pytest.param(lambda: C.attention_matrix_bytes(1, 1, 1, 0, 4), ValueError, r"n_heads .* got 0", id="am_h"),
        pytest.param(lambda: C.attention_matrix_bytes(1, 1, 0, 2, 4), ValueError,
                     r"l_kv must be an integer >= 1, got 0", id="am_Lkv"),
        pytest.param(lambda: C.matmul_flops(1, 1, 1.5, 8, 2), TypeError, r"l_kv .* got 1\.5 of type float",
                     id="mm_Lkv"),
        pytest.param(lambda: C.attention_core_flops(1, 1, 1, 0, 4), ValueError, r"n_heads .* got 0", id="core_h"),
        pytest.param(lambda: C.attention_core_flops(1, 1, 1, 2, 4.0), TypeError, r"head_dim .* got 4\.0", id="core_hd"),
        pytest.param(lambda: C.attention_core_flops(1, 0, 1, 2, 4), ValueError, r"l_q must be an integer >= 1, got 0",
                     id="core_L"),
        pytest.param(lambda: C.attention_core_flops(1, 1, 1, 2, 4, is_causal=1), TypeError,
                     r"is_causal must be True or False", id="core_causal"),
        pytest.param(lambda: C.attention_core_flops(1, 1, 1, 2, 4, backward="yes"), TypeError,
                     r"backward must be True or False", id="core_backward"),
        pytest.param(lambda: C.flops(1, 1, 1, 8, 2, rope="yes"), TypeError, r"rope must be True or False, got 'yes'",
                     id="rope-str"),
        pytest.param(lambda: C.flops(1, 1, 1, 6, 2, rope=True), ValueError,
                     r"rope=True needs an even head_dim \(RoPE rotates pairs of coordinates\), got head_dim = 3",
                     id="rope-odd"),
        pytest.param(lambda: C.decode_step_flops(1, 2, 12, 4, rope=True), ValueError,
                     r"rope=True needs an even head_dim .* got head_dim = 3", id="decode-rope-odd"),
        pytest.param(lambda: C.decode_step_flops(1, 2, 8, 2, rope=1), TypeError, r"rope must be True or False, got 1",
                     id="decode-rope-int"),
        pytest.param(lambda: C.kv_cache_bytes(1, 8, 1, 1, 1, 2, window=0), ValueError,
                     r"window must be an integer >= 1, got 0", id="kv-window-0"),
        pytest.param(lambda: C.kv_cache_bytes(1, 8, 1, 1, 1, 2, window=4.0), TypeError,
                     r"window must be an integer >= 1, got 4\.0 of type float", id="kv-window-float"),
        pytest.param(lambda: C.kv_cache_bytes(1, 8, 1, 1, 1, 2, window=4, n_sink_tokens=-1), ValueError,
                     r"n_sink_tokens must be an integer >= 0, got -1", id="kv-sinks-negative"),
        pytest.param(lambda: C.kv_cache_bytes(1, 8, 1, 1, 1, 2, n_sink_tokens=4), ValueError,
                     r"n_sink_tokens = 4 needs a window: without one every position is cached already",
                     id="kv-sinks-without-window"),
    ],
)
def test_counting_argument_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


LENGTH_FUNCTIONS = [  # (function, its arguments after batch, l_q, l_kv)
    (C.flops, dict(d_model=16, n_heads=4, n_kv_heads=2)),
    (C.matmul_flops, dict(d_model=16, n_heads=4)),
    (C.attention_core_flops, dict(n_heads=4, head_dim=8, is_causal=True)),
    (C.attention_matrix_bytes, dict(n_heads=4, dtype_bytes=2)),
]


@pytest.mark.parametrize("fn,rest", LENGTH_FUNCTIONS, ids=lambda x: getattr(x, "__name__", ""))
def test_lengths_are_l_q_and_l_kv(fn, rest):
    """The lengths are called l_q and l_kv, as everywhere in the package (the book's L_q, L_kv)."""
    assert list(inspect.signature(fn).parameters)[:3] == ["batch", "l_q", "l_kv"]
    assert fn(batch=2, l_q=5, l_kv=7, **rest) == fn(2, 5, 7, *rest.values())


@pytest.mark.parametrize("fn,rest", LENGTH_FUNCTIONS, ids=lambda x: getattr(x, "__name__", ""))
def test_old_length_keywords_work_for_one_release_with_a_deprecation_warning(fn, rest):
    """seq_len_q / seq_len_kv (the book called flops with them) still work, warn at the caller, and clash with the
    new names."""
    with pytest.warns(DeprecationWarning) as record:
        old = fn(batch=2, seq_len_q=5, seq_len_kv=7, **rest)
    assert old == fn(batch=2, l_q=5, l_kv=7, **rest)
    assert [str(w.message) for w in record] == [
        f"{fn.__name__}(): the keyword 'seq_len_q' is now 'l_q'; 'seq_len_q' will be removed in the next release",
        f"{fn.__name__}(): the keyword 'seq_len_kv' is now 'l_kv'; 'seq_len_kv' will be removed in the next release",
    ]
    assert all(w.filename == __file__ for w in record)  # points at the call, not at mha.counting
    with pytest.raises(TypeError, match=rf"{fn.__name__}\(\) got both 'l_q' and its old name 'seq_len_q'"):
        fn(batch=2, l_q=5, seq_len_q=5, l_kv=7, **rest)
