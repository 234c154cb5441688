"""``mha.convert.from_hf`` against Hugging Face's attention layers (issue 24): Llama, Mistral, Qwen3, Gemma 2,
Gemma 3 and gpt-oss, sliding and full layers, prefill and ring-buffer decoding past the window.

The models are tiny, randomly initialised, built offline (no download: HF_HUB_OFFLINE=1) in float64 with the eager
attention. A forward hook on every ``self_attn`` records what Hugging Face's model passes to the layer (its input,
the mask its model built, the position ids) and what the layer returns (output and weights); our module gets only
the layer's input. A pre-hook first checks HF's (cos, sin) against RoPE at the positions with the base we expect
(to its float32 precision: HF's rotary module computes the angles in float32) and replaces them with the same RoPE
in float64, so that the comparison is not limited by HF's float32 angles. HF's eager softmax (except gpt-oss's) and
Qwen3/Gemma's RMSNorm still run in float32: outputs of size ~7 agree to ~1e-7 (gpt-oss's to 1e-14), checked at 1e-6
relative to the output's largest entry (``close``).

transformers is an optional test dependency (Python >= 3.11): without it this module is skipped.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download anything (before transformers is imported)

import pytest
import torch

transformers = pytest.importorskip("transformers")

from mha.convert import HF_ATTENTION_CLASSES, from_hf  # noqa: E402

from _params import randn  # noqa: E402

F64 = torch.float64
W = 4  # the sliding window of the tiny models
LENGTH = 3 * W + 5  # long enough to decode far past the window
SLIDING_FULL = ["sliding_attention", "full_attention"]


def close(actual, expected):
    """Equal to 1e-6 of the largest entry of ``expected`` (HF's float32 softmax; see the module docstring)."""
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6 * expected.abs().max().item())


def _families():
    """name -> (config class, model class, config overrides, {layer type: expected rope base})."""
    t = transformers
    default = lambda base: {"rope_type": "default", "rope_theta": base}  # noqa: E731
    return {
        "llama": (t.LlamaConfig, t.LlamaModel, dict(attention_bias=True, rope_parameters=default(500.0)),
                  {None: 500.0}),
        "mistral": (t.MistralConfig, t.MistralModel, dict(sliding_window=W, rope_parameters=default(300.0)),
                    {None: 300.0}),
        "qwen3": (t.Qwen3Config, t.Qwen3Model,
                  dict(use_sliding_window=True, sliding_window=W, layer_types=SLIDING_FULL,
                       rope_parameters=default(700.0)),
                  {"sliding_attention": 700.0, "full_attention": 700.0}),
        "gemma2": (t.Gemma2Config, t.Gemma2Model,
                   dict(sliding_window=W, layer_types=SLIDING_FULL, query_pre_attn_scalar=11,
                        attn_logit_softcapping=3.0, rope_parameters=default(200.0)),
                   {"sliding_attention": 200.0, "full_attention": 200.0}),
        "gemma3": (t.Gemma3TextConfig, t.Gemma3TextModel,
                   dict(sliding_window=W, layer_types=SLIDING_FULL, query_pre_attn_scalar=13,
                        rope_parameters={"sliding_attention": default(100.0), "full_attention": default(2000.0)}),
                   {"sliding_attention": 100.0, "full_attention": 2000.0}),
        "gpt_oss": (t.GptOssConfig, t.GptOssModel,
                    dict(sliding_window=W, layer_types=SLIDING_FULL, rope_parameters=default(400.0),
                         num_local_experts=2, num_experts_per_tok=1, attention_bias=True),
                    {"sliding_attention": 400.0, "full_attention": 400.0}),
    }


FAMILIES = ["llama", "mistral", "qwen3", "gemma2", "gemma3", "gpt_oss"]


def build(family, seed=0):
    """A tiny random float64 model (2 layers, GQA 4/2, head_dim 8) with visibly random attention parameters."""
    config_cls, model_cls, overrides, _ = _families()[family]
    config = config_cls(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=2,
                        intermediate_size=48, vocab_size=64, max_position_embeddings=128, **overrides)
    config._attn_implementation = "eager"
    if family == "gpt_oss":
        config._experts_implementation = "eager"  # the grouped-matmul experts refuse float64
    torch.manual_seed(seed)
    model = model_cls(config).to(F64).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.layers:
            for name, p in layer.self_attn.named_parameters():
                noise = torch.randn(p.shape, generator=g, dtype=F64)
                if "norm" in name:
                    p.copy_(1 + 0.3 * noise)
                elif name == "sinks" or name.endswith("bias"):
                    p.copy_(noise)
                else:  # scores of order 1: a peaked softmax, which a wrong mask or scale cannot hide
                    p.copy_(1.5 * noise / p.shape[1] ** 0.5)
    return model, config


def hf_rope(position_ids, head_dim, base, duplicated):
    """RoPE's (cos, sin) in float64 laid out as HF's rotary modules lay them out ((.., d) or gpt-oss's (.., d/2))."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=F64) / head_dim)
    angles = position_ids.to(F64)[..., None] * inv_freq  # (N, L, d/2)
    if duplicated:
        angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def run_hf(family, model, config, x):
    """HF's forward on inputs_embeds x; returns {layer_idx: dict(input, output, weights)} of every self_attn."""
    bases = _families()[family][3]
    seen = {}

    def exact_rope(module, args, kwargs):
        cos, sin = kwargs["position_embeddings"]
        layer_type = config.layer_types[module.layer_idx] if getattr(config, "layer_types", None) else None
        exact = hf_rope(kwargs["position_ids"], module.head_dim, bases[layer_type], cos.shape[-1] == module.head_dim)
        for theirs, ours in zip((cos, sin), exact):  # HF's rotary module: the base we expect, float32 angles
            torch.testing.assert_close(theirs, ours.expand_as(theirs), rtol=0, atol=2e-5)
        return args, {**kwargs, "position_embeddings": tuple(e.expand_as(c) for e, c in zip(exact, (cos, sin)))}

    def record(module, args, kwargs, output):
        seen[module.layer_idx] = dict(input=kwargs["hidden_states"], output=output[0], weights=output[1])

    handles = []
    for layer in model.layers:
        handles.append(layer.self_attn.register_forward_pre_hook(exact_rope, with_kwargs=True))
        handles.append(layer.self_attn.register_forward_hook(record, with_kwargs=True))
    try:
        with torch.no_grad():
            model(inputs_embeds=x, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return seen


@pytest.fixture(scope="module", params=FAMILIES)
def recorded(request):
    family = request.param
    model, config = build(family)
    x = randn(2, LENGTH, 32, seed=3)
    return family, model, config, run_hf(family, model, config, x)


def sliding_layers(family, config):
    if family == "llama":
        return []
    if family == "mistral":
        return [0, 1]
    return [i for i, kind in enumerate(config.layer_types) if kind == "sliding_attention"]


# ------------------------------------------------------------------------------------------------- prefill
@pytest.mark.parametrize("impl", ["sdpa", "naive"])
@pytest.mark.parametrize("layer", [0, 1])
def test_prefill_matches_hugging_face(recorded, layer, impl):
    family, model, config, seen = recorded
    ours = from_hf(model.layers[layer].self_attn, config, dtype=F64, impl=impl)
    assert ours.window == (W if layer in sliding_layers(family, config) else None)
    hf = seen[layer]
    with torch.no_grad():
        out, weights = ours(hf["input"], is_causal=True, need_weights=True)
        fast, _ = ours(hf["input"], is_causal=True, need_weights=False)
    close(out, hf["output"])
    close(fast, hf["output"])
    close(weights, hf["weights"])


def test_each_familys_sliding_window_counts_the_query_itself(recorded):
    """Found from HF's own attention weights: on a sliding layer every query from position W - 1 on gives non-zero
    weight to exactly ``config.sliding_window`` keys, itself included (i - W < j <= i): our ``window`` is HF's
    ``sliding_window`` unchanged, for every family (gpt-oss's reference convention)."""
    family, model, config, seen = recorded
    layers = sliding_layers(family, config)
    if not layers:
        pytest.skip(f"{family} has no sliding layer")
    for layer in layers:
        visible = (seen[layer]["weights"] > 0).sum(-1)  # (N, h, L): keys each query sees
        assert (visible[..., W - 1:] == config.sliding_window).all(), (family, layer)
        assert (visible[..., :W] == torch.arange(1, W + 1)).all()  # causal before the window is full
        last = seen[layer]["weights"][..., -1, :]  # (N, h, L): the last query's keys are the last W
        assert (last[..., -W:] > 0).all() and (last[..., :-W] == 0).all()
        assert from_hf(model.layers[layer].self_attn, config).window == config.sliding_window


# ------------------------------------------------------------------------------------------------ decoding
@pytest.mark.parametrize("chunks", [[W + 3] + [1] * (LENGTH - W - 3), [2, 5, 1, 1, 6, 1, 1], [1] * LENGTH],
                         ids=["prefill-then-steps", "chunked", "one-token"])
@pytest.mark.parametrize("layer", [0, 1])
def test_ring_buffer_decoding_matches_hugging_faces_full_forward(recorded, layer, chunks):
    """Decoding with ``new_cache`` (a ring buffer of W slots on sliding layers) gives HF's full-sequence outputs at
    every position, the last ones (far past the window, after several wraps) included."""
    family, model, config, seen = recorded
    ours = from_hf(model.layers[layer].self_attn, config, dtype=F64)
    x, expected = seen[layer]["input"], seen[layer]["output"]
    cache = ours.new_cache(2, LENGTH)
    assert cache.k.shape[2] == (W if ours.window else LENGTH)
    outs, start = [], 0
    with torch.no_grad():
        for size in chunks:
            outs.append(ours(x[:, start:start + size], kv_cache=cache, is_causal=True, need_weights=False)[0])
            start += size
    assert start == LENGTH
    close(torch.cat(outs, 1), expected)
    close(outs[-1], expected[:, -chunks[-1]:])  # the last step, LENGTH - 1 = 4 W: past several wraps


# ------------------------------------------------------------------------------------------- what is read
def test_settings_read_from_each_family():
    expected = {  # family -> (scale, qk_norm, sinks, softcap, bias)
        "llama": (8 ** -0.5, False, False, None, True),
        "mistral": (8 ** -0.5, False, False, None, False),
        "qwen3": (8 ** -0.5, True, False, None, False),
        "gemma2": (11 ** -0.5, False, False, 3.0, False),
        "gemma3": (13 ** -0.5, True, False, None, False),
        "gpt_oss": (8 ** -0.5, False, True, None, True),
    }
    for family, (scale, qk_norm, sinks, softcap, bias) in expected.items():
        model, config = build(family)
        for layer in (0, 1):
            theirs = model.layers[layer].self_attn
            ours = from_hf(theirs, config)
            assert type(theirs).__name__ in HF_ATTENTION_CLASSES
            assert ours.scale == pytest.approx(scale, rel=1e-12) and ours.qk_norm == qk_norm, family
            assert (ours.sinks is not None) == sinks and ours.softcap == softcap, family
            assert (ours.q_proj.bias is not None) == bias and ours.rope_style == "half", family
            assert ours.rope_base == _families()[family][3][config.layer_types[layer] if family not in
                                                            ("llama", "mistral") else None]
            if family == "gemma3":  # Gemma's (1 + w), folded into the weight
                torch.testing.assert_close(ours.q_norm, 1 + theirs.q_norm.weight, rtol=0, atol=0)


def test_dtype_defaults_to_the_modules_and_float32_agrees():
    model, config = build("gpt_oss")
    model = model.float()
    x = randn(1, 9, 32, seed=4).float()
    ours = from_hf(model.layers[0].self_attn, config)
    assert ours.q_proj.weight.dtype == torch.float32 and ours.sinks.dtype == torch.float32
    assert from_hf(model.layers[0].self_attn, config, dtype=F64).q_proj.weight.dtype == F64
    theirs = model.layers[0].self_attn
    position_ids = torch.arange(9)[None]
    cos, sin = model.rotary_emb(x, position_ids)  # HF's own float32 rotary module
    with torch.no_grad():
        mask = torch.ones(9, 9, dtype=torch.bool).tril() & ~torch.ones(9, 9, dtype=torch.bool).tril(-W)
        additive = torch.zeros(1, 1, 9, 9).masked_fill(~mask, float("-inf"))
        expected, _ = theirs(x, position_embeddings=(cos, sin), attention_mask=additive)
        out, _ = ours(x, is_causal=True, need_weights=False)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


def test_refused_layers():
    model, config = build("gpt_oss")
    with pytest.raises(ValueError, match=r"attention_module must be one of LlamaAttention, .* got Linear"):
        from_hf(model.layers[0].self_attn.q_proj)
    with pytest.raises(TypeError, match=r"attention_module must be a Hugging Face attention module"):
        from_hf("self_attn")
    with pytest.raises(TypeError, match=r"dtype must be a floating torch\.dtype or None, got torch\.int64"):
        from_hf(model.layers[0].self_attn, dtype=torch.int64)
    yarn = transformers.GptOssConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                     num_hidden_layers=2, intermediate_size=48, vocab_size=64,
                                     max_position_embeddings=8192, num_local_experts=2, num_experts_per_tok=1,
                                     sliding_window=W)
    with pytest.raises(ValueError, match=r"rope_type 'yarn' .* is not supported, only 'default' RoPE"):
        from_hf(model.layers[0].self_attn, yarn)
