"""Latent attention and the output gate in the experiments' model (book part IV, "Multi-head latent attention" and
"Gated attention"; issue 25's experiments): ModernModelConfig's kv_rank, qk_rope_head_dim and gate, checked against
the NumPy float64 reference run layer by layer on the blocks' exported weights, decoding with the caches against
recomputation, and the cache's size against its own count."""

import pytest
import torch

from mha import reference
from mha.experiments.config import ShakespeareRun
from mha.experiments.model import ModernTransformerConfig, TinyTransformer
from mha.experiments.probes import first_token_attention
from mha.latent import MultiHeadLatentAttention

torch.set_num_threads(1)
F64 = torch.float64


def make(seed=0, **options):
    kwargs = dict(vocab_size=13, block_size=16, n_layers=3, d_model=16, n_heads=4, bias=False, rope_base=10000.0)
    kwargs.update(options)
    torch.manual_seed(seed)
    return TinyTransformer(ModernTransformerConfig(**kwargs)).to(F64).eval()


def ids(n, length, vocab=13, seed=1):
    return torch.randint(vocab, (n, length), generator=torch.Generator().manual_seed(seed))


def reference_logits(model, idx):
    """Each block's attention by the NumPy reference on its exported weights; the rest by the model's modules."""
    cfg = model.config
    with torch.no_grad():
        x = model.tok_emb(idx)
        weights = []
        for block in model.blocks:
            h = block.ln_1(x).numpy()
            params = block.attn.export_params()
            if cfg.kv_rank is not None:
                a = block.attn
                out, w = reference.multi_head_latent_attention(
                    h, params, cfg.n_heads, qk_nope_head_dim=a.qk_nope_head_dim, qk_rope_head_dim=a.qk_rope_head_dim,
                    v_head_dim=a.v_head_dim, rope_base=cfg.rope_base, rope_style="half")
            else:
                out, w = reference.multi_head_attention(h, None, params, cfg.n_heads, is_causal=True,
                                                        rope_base=cfg.rope_base, gate=cfg.gate)
            weights.append(w)
            x = x + torch.from_numpy(out)
            x = x + block.mlp(block.ln_2(x))
        return model.lm_head(model.ln_f(x)), weights


@pytest.mark.parametrize("options", [dict(kv_rank=6), dict(kv_rank=10, qk_rope_head_dim=2), dict(gate="headwise"),
                                     dict(gate="elementwise"), dict(gate="headwise", n_kv_heads=2)])
def test_model_equals_the_reference_layer_by_layer(options):
    model = make(**options)
    x = ids(2, 16)
    logits, _, weights = model(x, need_weights=True)
    want, want_weights = reference_logits(model, x)
    torch.testing.assert_close(logits, want, rtol=0, atol=1e-10)
    for got, w in zip(weights, want_weights):
        torch.testing.assert_close(got, torch.from_numpy(w), rtol=0, atol=1e-12)


@pytest.mark.parametrize("options", [dict(kv_rank=6), dict(gate="elementwise")])
def test_decoding_with_the_caches_equals_recomputation(options):
    model = make(**options)
    x = ids(2, 16)
    full = model(x)[0]
    caches = model.make_kv_caches(2)
    steps = [model(x[:, :5], kv_caches=caches)[0]] + [model(x[:, t:t + 1], kv_caches=caches)[0] for t in range(5, 16)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-10)


def test_latent_model_caches_the_latent_and_one_rope_key_per_layer():
    model = make(kv_rank=6, qk_rope_head_dim=4)
    assert all(isinstance(b.attn, MultiHeadLatentAttention) for b in model.blocks)
    caches = model.make_kv_caches(2)
    per_position = (6 + 4) * 8  # float64: the latent (6) and the shared rope key (4), one layer
    assert model.kv_cache_bytes(2, 16) == 2 * 16 * 3 * per_position == sum(c.nbytes for c in caches)
    plain = make()  # MHA with the same width caches 2 * d_model numbers per position and layer
    assert plain.kv_cache_bytes(2, 16) == 2 * 16 * 3 * 2 * 16 * 8


def test_gate_adds_its_projection_only():
    plain, headwise, elementwise = make(), make(gate="headwise"), make(gate="elementwise")
    assert headwise.num_params() - plain.num_params() == 3 * 16 * 4  # W_gate (d_model, h) per layer, no bias
    assert elementwise.num_params() - plain.num_params() == 3 * 16 * 16  # (d_model, h * head_dim)


def test_the_probe_reads_a_latent_model():
    model = make(kv_rank=6)
    got = first_token_attention(model, [ids(2, 16)])
    assert got["sink"] is None and len(got["first_token"]) == 3


@pytest.mark.parametrize("bad, match", [
    (dict(gate="rowwise"), "gate"),
    (dict(qk_rope_head_dim=4), "set kv_rank too"),
    (dict(kv_rank=6, rope_base=None), "needs rope_base"),
    (dict(kv_rank=6, n_kv_heads=2), "n_kv_heads"),
    (dict(kv_rank=6, gate="headwise"), "gate"),
    (dict(kv_rank=6, qk_rope_head_dim=3), "even"),
])
def test_bad_settings_are_refused_by_name(bad, match):
    settings = dict(n_layers=2, d_model=16, n_heads=4, rope_base=10000.0)
    settings.update(bad)
    with pytest.raises(ValueError, match=match):
        ShakespeareRun.from_dict(settings)


def test_defaults_are_not_recorded():
    recorded = ShakespeareRun.from_dict({"n_layers": 2}).to_dict()
    assert not {"gate", "kv_rank", "qk_rope_head_dim"} & set(recorded)
    assert ShakespeareRun.from_dict({"n_layers": 2, "rope_base": 1e4, "kv_rank": 8}).to_dict()["kv_rank"] == 8
