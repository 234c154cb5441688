"""``mha.convert.from_hf`` against Hugging Face's Qwen3-Next full-attention layer (``Qwen3NextAttention``): gated
attention (``q_proj`` gives each head [query | gate], the output is multiplied by sigmoid(gate) before ``o_proj``),
QK-norm with Gemma's (1 + w), partial RoPE (``partial_rotary_factor`` 0.25 and 1.0); prefill and token-by-token
decoding with our KV cache.

The models are tiny, randomly initialised, built offline (no download: HF_HUB_OFFLINE=1). Qwen3-Next's MoE and
linear-attention layers do not run in float64, so the model runs once in float32 only to record what it passes to
the full-attention layer (its mask, its position ids, its (cos, sin)); the layer itself is then run alone, as a
float64 copy with float64 random weights, on float64 inputs, with that mask and with (cos, sin) recomputed here in
float64 (after checking HF's float32 ones against them: same frequencies base^(-2j/rope_dim), same width rope_dim).
HF's eager softmax and Qwen3-Next's RMSNorm still run in float32, so outputs agree to ~1e-7, checked at 1e-6 relative
to the output's largest entry (as tests/test_from_hf.py).

transformers is an optional test dependency: without it (or without Qwen3-Next) this module is skipped.
"""

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download anything (before transformers is imported)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen3NextConfig"):
    pytest.skip("this transformers has no Qwen3-Next", allow_module_level=True)

from mha import MultiHeadAttention  # noqa: E402
from mha import reference as R  # noqa: E402
from mha.convert import HF_ATTENTION_CLASSES, from_hf  # noqa: E402
from mha.reference.rope import _rotate  # noqa: E402
from mha.rope import apply_rope  # noqa: E402

from _params import randn  # noqa: E402

F64 = torch.float64
LENGTH = 11
BASE = 700.0
HEAD_DIM = 16
LAYER_TYPES = {0: ["full_attention", "linear_attention"], 1: ["linear_attention", "full_attention"]}


def close(actual, expected):
    """Equal to 1e-6 of the largest entry of ``expected`` (HF's float32 softmax and RMSNorm)."""
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6 * expected.abs().max().item())


def build(factor, layer, bias, seed=0):
    """A tiny float32 Qwen3-Next (2 layers, ``layer`` the full-attention one; GQA 4/2, head_dim 16, 2 experts) and a
    float64 copy of its full-attention layer with visibly random float64 weights (norm weights w ~ 0.3 N(0, 1))."""
    config = transformers.Qwen3NextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM, num_hidden_layers=2,
        layer_types=LAYER_TYPES[layer], intermediate_size=48, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_experts=2, num_experts_per_tok=1, vocab_size=64,
        max_position_embeddings=128, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, attention_bias=bias,
        rope_parameters=dict(rope_type="default", rope_theta=BASE, partial_rotary_factor=factor))
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.Qwen3NextModel(config).eval()
    attention = copy.deepcopy(model.layers[layer].self_attn).to(F64)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in attention.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=F64)
            if "norm" in name:
                p.copy_(0.3 * noise)  # Gemma-style: the gain is 1 + w
            elif name.endswith("bias"):
                p.copy_(noise)
            else:
                p.copy_(1.5 * noise / p.shape[1] ** 0.5)
    return model, config, attention


def exact_rope(position_ids, rope_dim, base):
    """(cos, sin) as HF lays them out, (.., rope_dim) with the angles duplicated, in float64."""
    inv_freq = 1.0 / base ** (torch.arange(0, rope_dim, 2, dtype=F64) / rope_dim)
    angles = position_ids.to(F64)[..., None] * inv_freq  # (N, L, rope_dim/2)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def record_layer_inputs(model, layer, length):
    """What HF's model passes to its full-attention layer: (mask, position_ids, (cos, sin)), from a float32 run."""
    seen = {}

    def hook(module, args, kwargs):
        seen.update(kwargs)

    handle = model.layers[layer].self_attn.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(inputs_embeds=randn(2, length, 32, seed=9).float(), use_cache=False)
    finally:
        handle.remove()
    return seen["attention_mask"], seen["position_ids"], seen["position_embeddings"]


CASES = {  # id -> (partial_rotary_factor, full-attention layer, attention_bias)
    "partial-0.25-layer1": (0.25, 1, False),
    "partial-0.25-layer0-bias": (0.25, 0, True),
    "full-rope-layer1-bias": (1.0, 1, True),
    "full-rope-layer0": (1.0, 0, False),
}


@pytest.fixture(scope="module", params=list(CASES))
def recorded(request):
    factor, layer, bias = CASES[request.param]
    model, config, attention = build(factor, layer, bias)
    mask, position_ids, (cos, sin) = record_layer_inputs(model, layer, LENGTH)
    rope_dim = int(HEAD_DIM * factor)
    assert cos.shape[-1] == rope_dim  # HF's rotary module: the rotated width, not the head
    exact = exact_rope(position_ids, rope_dim, BASE)
    for theirs, ours in zip((cos, sin), exact):  # the same angles, to HF's float32 precision
        torch.testing.assert_close(theirs.double(), ours, rtol=0, atol=2e-5)
    allowed = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()
    assert ((mask == 0) == allowed).all()  # HF's mask is the causal one (additive: 0 or the float32 minimum)
    x = randn(2, LENGTH, 32, seed=3)
    with torch.no_grad():
        out, weights = attention(x, position_embeddings=exact, attention_mask=mask.to(F64))
    return dict(factor=factor, layer=layer, bias=bias, config=config, attention=attention, rope_dim=rope_dim, x=x,
                out=out, weights=weights)


# ------------------------------------------------------------------------------------------------- prefill
@pytest.mark.parametrize("impl", ["sdpa", "naive"])
def test_prefill_matches_hugging_face(recorded, impl):
    r = recorded
    ours = from_hf(r["attention"], r["config"], dtype=F64, impl=impl)
    with torch.no_grad():
        out, weights = ours(r["x"], is_causal=True, need_weights=True)
        fast, _ = ours(r["x"], is_causal=True, need_weights=False)
    close(out, r["out"])
    close(fast, r["out"])
    close(weights, r["weights"])


def test_the_numpy_reference_matches_hugging_face(recorded):
    """The exported params in mha.reference (gate="elementwise", rope_dim) give HF's output too."""
    r = recorded
    ours = from_hf(r["attention"], r["config"], dtype=F64)
    out, weights = R.multi_head_attention(r["x"].numpy(), None, ours.export_params(), 4, is_causal=True,
                                          rope_base=BASE, rope_dim=r["rope_dim"], gate="elementwise",
                                          qk_norm_eps=ours.qk_norm_eps)
    close(torch.as_tensor(out), r["out"])
    close(torch.as_tensor(weights), r["weights"])


# ------------------------------------------------------------------------------------------------ decoding
@pytest.mark.parametrize("chunks", [[1] * LENGTH, [4] + [1] * (LENGTH - 4), [2, 5, 1, 3]],
                         ids=["one-token", "prefill-then-steps", "chunked"])
def test_decoding_with_our_kv_cache_matches_hugging_faces_full_forward(recorded, chunks):
    r = recorded
    ours = from_hf(r["attention"], r["config"], dtype=F64)
    cache = ours.new_cache(2, LENGTH)
    outs, start = [], 0
    with torch.no_grad():
        for size in chunks:
            outs.append(ours(r["x"][:, start:start + size], kv_cache=cache, is_causal=True, need_weights=False)[0])
            start += size
    assert start == LENGTH and cache.length == LENGTH
    close(torch.cat(outs, 1), r["out"])
    close(outs[-1], r["out"][:, -chunks[-1]:])


# ------------------------------------------------------------------------------------------- what is read
def test_settings_and_weights_read(recorded):
    r = recorded
    theirs = r["attention"]
    ours = from_hf(theirs, r["config"])
    assert "Qwen3NextAttention" in HF_ATTENTION_CLASSES
    assert ours.q_proj.weight.dtype == F64  # the module's dtype by default
    assert ours.gate == "elementwise" and ours.qk_norm and ours.sinks is None and ours.window is None
    assert ours.rope_base == BASE and ours.rope_style == "half" and ours.rope_dim == r["rope_dim"]
    assert ours.scale == pytest.approx(HEAD_DIM ** -0.5, rel=1e-12)
    assert (ours.q_proj.bias is not None) == r["bias"] and (ours.gate_proj.bias is not None) == r["bias"]
    # q_proj's rows, per head h: [h * 2d, h * 2d + d) the query, [h * 2d + d, (h + 1) * 2d) the gate
    d = HEAD_DIM
    for h in range(4):
        rows = theirs.q_proj.weight[h * 2 * d:(h + 1) * 2 * d]
        assert torch.equal(ours.q_proj.weight[h * d:(h + 1) * d], rows[:d])
        assert torch.equal(ours.gate_proj.weight[h * d:(h + 1) * d], rows[d:])
        if r["bias"]:
            gate_bias = theirs.q_proj.bias[h * 2 * d + d:(h + 1) * 2 * d]
            assert torch.equal(ours.gate_proj.bias[h * d:(h + 1) * d], gate_bias)
    torch.testing.assert_close(ours.q_norm, 1 + theirs.q_norm.weight, rtol=0, atol=0)  # Gemma-style (1 + w)
    torch.testing.assert_close(ours.k_norm, 1 + theirs.k_norm.weight, rtol=0, atol=0)
    assert ours.qk_norm_eps == theirs.q_norm.eps


def test_the_gate_and_the_partial_rope_matter(recorded):
    """The same layer without the gate, or with RoPE on the whole head, is far from HF's output: the comparisons
    above see both."""
    r = recorded
    ours = from_hf(r["attention"], r["config"], dtype=F64)
    options = dict(bias=ours.q_proj.bias is not None, qk_norm=True, qk_norm_eps=ours.qk_norm_eps, rope_base=BASE)
    ungated = MultiHeadAttention(32, 4, 2, HEAD_DIM, rope_dim=ours.rope_dim, **options).double()
    ungated.load_state_dict({k: v for k, v in ours.state_dict().items() if not k.startswith("gate_proj")})
    whole_head = MultiHeadAttention(32, 4, 2, HEAD_DIM, gate="elementwise", **options).double()
    whole_head.load_state_dict(ours.state_dict())
    with torch.no_grad():
        for other in (ungated, whole_head):
            if other is whole_head and r["factor"] == 1.0:
                continue
            out, _ = other(r["x"], is_causal=True, need_weights=False)
            assert (out - r["out"]).abs().max() > 0.01 * r["out"].abs().max()


def test_partial_rope_pairs_match_hugging_faces_apply_rotary_pos_emb():
    """Qwen3-Next's own ``apply_rotary_pos_emb`` with cos/sin narrower than the head against our two RoPEs."""
    from transformers.models.qwen3_next.modeling_qwen3_next import apply_rotary_pos_emb

    q, k = randn(2, 4, 5, HEAD_DIM, seed=5), randn(2, 2, 5, HEAD_DIM, seed=6)
    position_ids = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 30]])
    for rope_dim in (4, 8, HEAD_DIM):
        cos, sin = exact_rope(position_ids, rope_dim, BASE)  # (N, L, rope_dim)
        q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
        half = rope_dim // 2
        torch.testing.assert_close(apply_rope(q, cos[..., :half], sin[..., :half]), q_hf, rtol=0, atol=1e-14)
        torch.testing.assert_close(apply_rope(k, cos[..., :half], sin[..., :half]), k_hf, rtol=0, atol=1e-14)
        ref = _rotate(q.numpy(), position_ids.numpy()[:, None, :], BASE, "half", rope_dim=rope_dim)
        np.testing.assert_allclose(ref, q_hf.numpy(), rtol=0, atol=1e-14)
        assert torch.equal(q_hf[..., rope_dim:], q[..., rope_dim:])  # the rest is not rotated


# ---------------------------------------------------------------------------------------------- refusals
def test_refusals():
    model, config, _ = build(0.25, 1, False)
    with pytest.raises(ValueError, match=r"attention_module must be one of .*Qwen3NextAttention.* got "
                                         r"Qwen3NextGatedDeltaNet"):
        from_hf(model.layers[0].linear_attn)
    swapped = copy.deepcopy(config)
    swapped.layer_types = LAYER_TYPES[0]  # layer 1 is then a linear-attention layer
    with pytest.raises(ValueError, match=r"layer 1 has layer type 'linear_attention'"):
        from_hf(model.layers[1].self_attn, swapped)
    qwen3 = transformers.Qwen3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                     num_hidden_layers=1, intermediate_size=48, vocab_size=64,
                                     rope_parameters=dict(rope_type="default", rope_theta=BASE,
                                                          partial_rotary_factor=0.5))
    layer = transformers.Qwen3Model(qwen3).layers[0].self_attn
    with pytest.raises(ValueError, match=r"Qwen3Attention: partial_rotary_factor=0.5 is not supported .* partial "
                                         r"RoPE is read for Qwen3NextAttention"):
        from_hf(layer, qwen3)
