"""``mha.counting``'s counts for multi-head latent attention (``latent_*``) and for gated attention (``gate=``),
against independent counts: ``numel`` of torch modules (ours, and Hugging Face's DeepSeek-V3 layer on the meta
device), ``FlopCounterMode`` on ``mha.MultiHeadLatentAttention`` (both forms, prefill and decoding) and on a gated
layer written here, and DeepSeek-V3's published sizes."""

import inspect

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mha import MultiHeadAttention, MultiHeadLatentAttention
from mha import counting as C

torch.set_num_threads(1)

SMALL = dict(d_model=24, n_heads=3, kv_rank=10, qk_nope_head_dim=4, qk_rope_head_dim=6, v_head_dim=5)
DEEPSEEK_V3 = dict(d_model=7168, n_heads=128, kv_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                   q_rank=1536)


def module(q_rank=None, **sizes):
    s = {**SMALL, **sizes}
    return MultiHeadLatentAttention(s["d_model"], s["n_heads"], s["kv_rank"], q_rank=q_rank,
                                    qk_nope_head_dim=s["qk_nope_head_dim"], qk_rope_head_dim=s["qk_rope_head_dim"],
                                    v_head_dim=s["v_head_dim"])


def counted(fn):
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        fn()
    return counter.get_total_flops()


# ------------------------------------------------------------------------------------------------ parameters
@pytest.mark.parametrize("q_rank", [None, 7])
def test_latent_param_count_is_the_modules_numel(q_rank):
    m = module(q_rank)
    assert C.latent_param_count(**SMALL, q_rank=q_rank) == sum(p.numel() for p in m.parameters())


def test_latent_param_count_at_deepseek_v3_sizes():
    with torch.device("meta"):  # no memory: 187 million parameters
        ours = MultiHeadLatentAttention(7168, 128, 512, q_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                        v_head_dim=128)
    assert C.latent_param_count(**DEEPSEEK_V3) == sum(p.numel() for p in ours.parameters()) == 187_107_328
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    config = transformers.DeepseekV3Config()  # DeepSeek-V3's own sizes are the defaults
    assert (config.hidden_size, config.q_lora_rank, config.kv_lora_rank) == (7168, 1536, 512)
    with torch.device("meta"):
        theirs = DeepseekV3Attention(config, 0)
    assert sum(p.numel() for p in theirs.parameters()) == 187_107_328


# ----------------------------------------------------------------------------------------------------- FLOPs
@pytest.mark.parametrize("q_rank", [None, 7])
@pytest.mark.parametrize("absorb", [False, True])
def test_prefill_matmul_flops_match_flop_counter(q_rank, absorb):
    m, n, length = module(q_rank), 2, 9
    x = torch.randn(n, length, SMALL["d_model"])
    measured = counted(lambda: m(x, absorb=absorb))
    per_token = C.latent_flops_per_token(length, **SMALL, q_rank=q_rank, absorb=absorb)
    assert measured == n * length * per_token["matmul_total"]


@pytest.mark.parametrize("q_rank", [None, 7])
@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("cached", [0, 1, 6])
def test_decode_step_matmul_flops_match_flop_counter(q_rank, absorb, cached):
    m, n = module(q_rank), 2
    x = torch.randn(n, cached + 1, SMALL["d_model"])
    cache = m.new_cache(n, 8)
    if cached:
        with torch.no_grad():
            m(x[:, :cached], kv_cache=cache)
    measured = counted(lambda: m(x[:, cached:], kv_cache=cache, absorb=absorb))
    step = C.latent_flops_per_token(cached, **SMALL, q_rank=q_rank, absorb=absorb, decode=True)
    assert measured == n * step["matmul_total"]


def test_latent_flops_terms_and_the_crossover_at_deepseek_v3_sizes():
    count = C.latent_flops_per_token(100, **DEEPSEEK_V3)
    assert count["qk"] == 2 * 128 * 100 * 192 and count["av"] == 2 * 128 * 100 * 128
    assert count["kv_b_proj"] == 2 * 512 * 128 * 256 and "q_absorb" not in count
    assert count["rope"] == 3 * 64 * 129 and count["norm"] == 4 * (512 + 1536)
    assert count["total"] == count["matmul_total"] + sum(count[k] for k in ("scale", "softmax", "rope", "norm"))
    for L in (1000, 32_000):  # decoding: absorbed is cheaper; a prefill of the same length: naive is cheaper
        decode = [C.latent_flops_per_token(L, **DEEPSEEK_V3, absorb=a, decode=True)["total"] for a in (False, True)]
        prefill = [C.latent_flops_per_token(L, **DEEPSEEK_V3, absorb=a)["total"] for a in (False, True)]
        assert decode[1] < decode[0] and prefill[0] < prefill[1]


def test_latent_flops_refuse_bad_arguments():
    with pytest.raises(ValueError, match="seq_len must be an integer >= 1, got 0"):
        C.latent_flops_per_token(0, **SMALL)
    assert C.latent_flops_per_token(0, **SMALL, decode=True)["scale"] == SMALL["n_heads"]  # first token: L_kv = 1
    with pytest.raises(TypeError, match="absorb must be True or False"):
        C.latent_flops_per_token(3, **SMALL, absorb="yes")
    with pytest.raises(ValueError, match="qk_rope_head_dim must be even"):
        C.latent_param_count(**{**SMALL, "qk_rope_head_dim": 5})


# ----------------------------------------------------------------------------------------------------- cache
def test_latent_cache_bytes_match_the_cache_and_deepseek_v3():
    m = module()
    for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
        cache = m.to(dtype).new_cache(3, 11)
        assert C.latent_kv_cache_bytes(3, 11, 1, SMALL["kv_rank"], SMALL["qk_rope_head_dim"], size) == cache.nbytes
    per_token = C.latent_kv_cache_bytes(1, 1, 1, 512, 64, 1)
    assert per_token == 512 + 64 == 576
    per_head_kv = 128 * (192 + 128)  # 128 heads of keys (nope 128 + rope 64) and values (128)
    assert per_head_kv == 40_960 == C.kv_cache_bytes(1, 1, 1, 128, 160, 1)  # K and V of mean width 160
    assert C.latent_kv_cache_bytes(2, 4096, 61, 512, 64, 2) == 2 * 4096 * 61 * 576 * 2
    with pytest.raises(TypeError, match="kv_rank must be an integer"):
        C.latent_kv_cache_bytes(1, 1, 1, 512.0, 64, 1)


# ---------------------------------------------------------------------------------------------- gated attention
GATE_WIDTH = {"headwise": lambda h, hd: h, "elementwise": lambda h, hd: h * hd}


def gated_forward(m, w_theta, x):
    """A gated layer written here: the naive heads of ``m``, times sigmoid(x W_theta) per head or per coordinate,
    then o_proj."""
    n, length, _ = x.shape
    h, hd = m.n_heads, m.head_dim
    q = m.q_proj(x).view(n, length, h, hd).transpose(1, 2)
    k = m.k_proj(x).view(n, length, h, hd).transpose(1, 2)
    v = m.v_proj(x).view(n, length, h, hd).transpose(1, 2)
    heads = torch.softmax(q @ k.transpose(-2, -1) * m.scale, dim=-1) @ v  # (N, h, L, hd)
    gate = torch.sigmoid(x @ w_theta).view(n, length, h, -1).transpose(1, 2)  # (N, h, L, 1 or hd)
    return m.o_proj((heads * gate).transpose(1, 2).reshape(n, length, h * hd))


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
@pytest.mark.parametrize("bias", [False, True])
def test_gate_params_and_flops_against_a_gated_layer_written_here(gate, bias):
    d, h, hd, n, length = 24, 3, 5, 2, 7
    m = MultiHeadAttention(d, h, head_dim=hd, bias=bias)
    gate_proj = torch.nn.Linear(d, GATE_WIDTH[gate](h, hd), bias=bias)  # a bias when the layer has biases
    w_theta, extra = gate_proj.weight.T, sum(p.numel() for p in gate_proj.parameters())
    assert C.param_count(d, h, head_dim=hd, bias=bias, gate=gate) == sum(p.numel() for p in m.parameters()) + extra
    assert extra == (d + bias) * GATE_WIDTH[gate](h, hd)
    count = C.flops(n, length, length, d, h, head_dim=hd, gate=gate)
    assert counted(lambda: gated_forward(m, w_theta, torch.randn(n, length, d))) == count["matmul_total"]
    assert count["gate"] == n * length * h * hd
    assert count["sigmoid"] == 3 * n * length * GATE_WIDTH[gate](h, hd)
    plain = C.flops(n, length, length, d, h, head_dim=hd)
    assert count["total"] - plain["total"] == count["gate_proj"] + count["sigmoid"] + count["gate"]
    assert C.flops(n, length, length, d, h, head_dim=hd, gate=None) == plain


def test_gate_refuses_unknown_kinds():
    with pytest.raises(ValueError, match="gate must be one of None, 'headwise', 'elementwise', got 'per_token'"):
        C.param_count(24, 3, gate="per_token")
    with pytest.raises(TypeError, match="gate must be one of"):
        C.flops(1, 2, 2, 24, 3, gate=True)


@pytest.mark.skipif("gate" not in inspect.signature(MultiHeadAttention).parameters,
                    reason="MultiHeadAttention has no gate= yet")
@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
@pytest.mark.parametrize("bias", [False, True])
def test_gate_params_and_flops_match_the_module(gate, bias):
    d, h, hd, n, length = 24, 3, 5, 2, 7
    m = MultiHeadAttention(d, h, head_dim=hd, bias=bias, impl="naive", gate=gate)
    assert C.param_count(d, h, head_dim=hd, bias=bias, gate=gate) == sum(p.numel() for p in m.parameters())
    measured = counted(lambda: m(torch.randn(n, length, d), need_weights=False))
    assert measured == C.flops(n, length, length, d, h, head_dim=hd, gate=gate)["matmul_total"]
