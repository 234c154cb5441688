"""``mha.convert.from_hf`` on Hugging Face's ``DeepseekV3Attention`` (multi-head latent attention): the converted
``mha.MultiHeadLatentAttention`` against Hugging Face's own layer, prefill and token-by-token decoding, with and without
the query's low rank, with ``rope_interleave`` True and False.

Tiny random DeepSeek-V3 models built offline in float64 with the eager attention and only dense MLP layers
(``first_k_dense_replace = num_hidden_layers``: the MoE layers refuse float64). As in tests/test_from_hf.py, hooks on
every ``self_attn`` record what HF's model passes to the layer and what it returns, and a pre-hook replaces HF's
float32 (cos, sin) with the same RoPE in float64 after checking them. HF's eager softmax and its RMSNorms still run in
float32, so outputs agree to ~1e-7: checked at 1e-6 of the largest entry.

transformers is an optional test dependency: without it this module is skipped.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download anything (before transformers is imported)

import pytest
import torch

transformers = pytest.importorskip("transformers")

import mha.reference as R  # noqa: E402
from mha import MultiHeadLatentAttention  # noqa: E402
from mha.convert import from_hf  # noqa: E402

F64 = torch.float64
LENGTH = 11
BASE = 300.0
SIZES = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=10, qk_nope_head_dim=6,
             qk_rope_head_dim=4, v_head_dim=5)


def close(actual, expected):
    """Equal to 1e-6 of the largest entry of ``expected`` (HF's float32 softmax and RMSNorm)."""
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6 * expected.abs().max().item())


def make_config(q_rank, interleave, **overrides):
    config = transformers.DeepseekV3Config(
        **SIZES, q_lora_rank=q_rank, num_hidden_layers=2, first_k_dense_replace=2, intermediate_size=48,
        vocab_size=64, max_position_embeddings=128, rope_interleave=interleave,
        rope_parameters={"rope_type": "default", "rope_theta": BASE}, **overrides)
    config._attn_implementation = "eager"
    return config


def build(q_rank, interleave, seed=0):
    """A tiny random float64 DeepSeek-V3 model whose attention parameters are visibly random (scores of order 1)."""
    config = make_config(q_rank, interleave)
    torch.manual_seed(seed)
    model = transformers.DeepseekV3Model(config).to(F64).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.layers:
            for name, p in layer.self_attn.named_parameters():
                noise = torch.randn(p.shape, generator=g, dtype=F64)
                p.copy_(1 + 0.3 * noise if "layernorm" in name else 1.5 * noise / p.shape[1] ** 0.5)
    return model, config


def exact_rope(position_ids, dim):
    """HF's (cos, sin) layout, cat(freqs, freqs), in float64."""
    inv_freq = 1.0 / BASE ** (torch.arange(0, dim, 2, dtype=F64) / dim)
    angles = position_ids.to(F64)[..., None] * inv_freq  # (N, L, r/2)
    angles = torch.cat([angles, angles], dim=-1)  # (N, L, r)
    return angles.cos(), angles.sin()


def run_hf(model, config, x, steps=None):
    """HF's forward on inputs_embeds x: {layer: dict(input, output, weights)}. ``steps``: feed x in these chunks
    with HF's own cache (DynamicCache) and concatenate the outputs of every call."""
    seen = {}

    def float64_rope(module, args, kwargs):
        cos, sin = kwargs["position_embeddings"]
        exact = exact_rope(kwargs["position_ids"], config.qk_rope_head_dim)
        for theirs, ours in zip((cos, sin), exact):  # HF's rotary module: the base we expect, float32 angles
            torch.testing.assert_close(theirs, ours.expand_as(theirs), rtol=0, atol=2e-5)
        return args, {**kwargs, "position_embeddings": tuple(e.expand_as(c) for e, c in zip(exact, (cos, sin)))}

    def record(module, args, kwargs, output):
        seen.setdefault(module.layer_idx, []).append((kwargs["hidden_states"], output[0], output[1]))

    handles = []
    for layer in model.layers:
        handles.append(layer.self_attn.register_forward_pre_hook(float64_rope, with_kwargs=True))
        handles.append(layer.self_attn.register_forward_hook(record, with_kwargs=True))
    try:
        with torch.no_grad():
            if steps is None:
                model(inputs_embeds=x, use_cache=False)
            else:
                cache, start = transformers.DynamicCache(config=config), 0
                for size in steps:
                    model(inputs_embeds=x[:, start:start + size], cache=cache, use_cache=True)
                    start += size
    finally:
        for handle in handles:
            handle.remove()
    return {layer: dict(input=torch.cat([c[0] for c in calls], 1), output=torch.cat([c[1] for c in calls], 1),
                        weights=calls[0][2]) for layer, calls in seen.items()}


CASES = [(None, True), (12, True), (None, False), (12, False)]
IDS = ["q_proj-interleaved", "q_lora-interleaved", "q_proj-half", "q_lora-half"]


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def recorded(request):
    q_rank, interleave = request.param
    model, config = build(q_rank, interleave)
    x = torch.randn(2, LENGTH, 32, generator=torch.Generator().manual_seed(3), dtype=F64)
    return model, config, x, run_hf(model, config, x)


def test_conversion_reads_every_setting(recorded):
    model, config, _, _ = recorded
    ours = from_hf(model.layers[0].self_attn)
    assert isinstance(ours, MultiHeadLatentAttention)
    assert ours.kv_a_proj.weight.dtype == F64 and not ours.training
    assert (ours.q_rank, ours.kv_rank) == (config.q_lora_rank, 10)
    assert (ours.qk_nope_head_dim, ours.qk_rope_head_dim, ours.v_head_dim) == (6, 4, 5)
    assert ours.rope_style == ("interleaved" if config.rope_interleave else "half") and ours.rope_base == BASE
    assert ours.scale == pytest.approx((6 + 4) ** -0.5, rel=1e-15)  # HF's scaling for default RoPE
    cache = ours.new_cache(2, LENGTH)
    assert cache.c.shape == (2, LENGTH, 10) and cache.k_rope.shape == (2, LENGTH, 4)


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("layer", [0, 1])
def test_prefill_matches_hugging_face(recorded, layer, absorb):
    model, config, _, seen = recorded
    ours = from_hf(model.layers[layer].self_attn, config, dtype=F64)
    hf = seen[layer]
    with torch.no_grad():
        out, weights = ours(hf["input"], absorb=absorb, need_weights=True)
    close(out, hf["output"])
    close(weights, hf["weights"])


@pytest.mark.parametrize("absorb", [False, True])
def test_the_numpy_reference_matches_hugging_face(recorded, absorb):
    """The converted weights, exported to the reference's params dict, give HF's layer in NumPy too."""
    model, config, _, seen = recorded
    ours = from_hf(model.layers[1].self_attn, config)
    out, weights = R.multi_head_latent_attention(
        seen[1]["input"].numpy(), ours.export_params(), 4, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
        rope_base=BASE, rope_style=ours.rope_style, absorb=absorb)
    close(torch.as_tensor(out), seen[1]["output"])
    close(torch.as_tensor(weights), seen[1]["weights"])


@pytest.mark.parametrize("chunks,absorb", [([1] * LENGTH, None), ([1] * LENGTH, False), ([4, 1, 3, 1, 1, 1], None),
                                           ([4, 1, 3, 1, 1, 1], True)],
                         ids=["one-token-absorbed", "one-token-naive", "chunked-default", "chunked-absorbed"])
@pytest.mark.parametrize("layer", [0, 1])
def test_decoding_matches_hugging_faces_full_forward(recorded, layer, chunks, absorb):
    """Decoding into the latent cache (absorbed one-token steps by default) gives HF's full-sequence outputs."""
    model, config, _, seen = recorded
    ours = from_hf(model.layers[layer].self_attn, config)
    x, expected = seen[layer]["input"], seen[layer]["output"]
    cache, outs, start = ours.new_cache(2, LENGTH), [], 0
    with torch.no_grad():
        for size in chunks:
            outs.append(ours(x[:, start:start + size], kv_cache=cache, absorb=absorb)[0])
            start += size
    assert start == cache.length == LENGTH
    close(torch.cat(outs, 1), expected)


def test_hugging_faces_own_cached_decoding_agrees(recorded):
    """HF's decoding with its cache (which stores the latent and re-expands K and V) gives what our absorbed steps
    give, layer by layer (each layer fed HF's own inputs)."""
    model, config, x, _ = recorded
    steps = [3] + [1] * (LENGTH - 3)
    seen = run_hf(model, config, x, steps=steps)
    for layer in (0, 1):
        ours = from_hf(model.layers[layer].self_attn, config)
        cache, outs, start = ours.new_cache(2, LENGTH), [], 0
        with torch.no_grad():
            for size in steps:
                outs.append(ours(seen[layer]["input"][:, start:start + size], kv_cache=cache)[0])
                start += size
        close(torch.cat(outs, 1), seen[layer]["output"])


def test_the_other_rope_layout_would_not_match(recorded):
    """The comparison can fail: the same weights with the other pairing of the rotary coordinates (or a scale off by
    a little) give another output."""
    model, config, _, seen = recorded
    hf = seen[0]
    ours = from_hf(model.layers[0].self_attn, config)
    with torch.no_grad():
        ours.rope_style = "half" if config.rope_interleave else "interleaved"
        wrong_layout = ours(hf["input"])[0]
        ours.rope_style = "interleaved" if config.rope_interleave else "half"
        ours.scale *= 1.01
        wrong_scale = ours(hf["input"])[0]
    for wrong in (wrong_layout, wrong_scale):
        assert (wrong - hf["output"]).abs().max() > 1e-4 * hf["output"].abs().max()


@pytest.mark.parametrize("overrides,match", [
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": BASE, "factor": 4.0,
                           "original_max_position_embeddings": 32, "mscale": 1.0, "mscale_all_dim": 1.0}),
     "rope_type 'yarn'"),
    (dict(attention_bias=True), "attention_bias=True"),
    (dict(attention_dropout=0.1), "attention_dropout=0.1"),
])
def test_refused_settings(overrides, match):
    config = make_config(None, True, **{k: v for k, v in overrides.items() if k != "rope_parameters"})
    if "rope_parameters" in overrides:
        config.rope_parameters = overrides["rope_parameters"]
    layer = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3Attention(make_config(None, True), 0)
    with pytest.raises(ValueError, match=match):
        from_hf(layer, config)
