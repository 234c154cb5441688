"""Tests for mha.experiments.model.TinyTransformer: every check compares with an independent computation."""

import math

import pytest
import torch
import torch.nn.functional as F

from mha import counting
from mha.experiments.model import TinyTransformer, TransformerConfig

torch.set_num_threads(1)


def make_model(dtype=torch.float64, seed=0, **overrides):
    kwargs = dict(vocab_size=17, block_size=12, n_layers=2, d_model=16, n_heads=4, bias=True)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    return TinyTransformer(TransformerConfig(**kwargs)).to(dtype).eval()


def random_ids(model, n, length, seed=1):
    return torch.randint(model.config.vocab_size, (n, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_shapes_and_weights(n_kv_heads):
    model = make_model(n_kv_heads=n_kv_heads)
    idx = random_ids(model, 3, 12)
    logits, loss, weights = model(idx, need_weights=True)
    assert logits.shape == (3, 12, 17) and loss is None
    assert len(weights) == 2 and all(w.shape == (3, 4, 12, 12) for w in weights)
    for w in weights:  # causal softmax rows: sum to one, nothing above the diagonal
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 12, dtype=w.dtype))
        assert torch.all(w.triu(diagonal=1) == 0)
    assert model(idx)[2] is None


def test_causal():
    """Changing the tokens after position t leaves the logits at positions <= t unchanged."""
    model = make_model()
    idx = random_ids(model, 2, 12)
    changed = idx.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 17
    torch.testing.assert_close(model(idx)[0][:, :7], model(changed)[0][:, :7])
    assert not torch.allclose(model(idx)[0][:, 7:], model(changed)[0][:, 7:])


def test_loss_at_init_is_about_log_vocab():
    model = make_model(vocab_size=64, block_size=32, dtype=torch.float32)
    idx, targets = random_ids(model, 8, 32, seed=1), random_ids(model, 8, 32, seed=2)
    _, loss, _ = model(idx, targets)
    assert abs(loss.item() - math.log(64)) < 0.05


def test_loss_ignores_unscored_positions():
    """The loss is the mean of -log softmax at the scored positions, computed here by hand."""
    model = make_model()
    idx, targets = random_ids(model, 2, 12, seed=1), random_ids(model, 2, 12, seed=2)
    targets[:, :5] = -100
    targets[1, 9] = -100
    logits, loss, _ = model(idx, targets)
    terms = [torch.logsumexp(logits[i, t], 0) - logits[i, t, targets[i, t]]
             for i in range(2) for t in range(12) if targets[i, t] != -100]
    torch.testing.assert_close(loss, torch.stack(terms).mean())


def test_kv_cache_forward_equals_full_forward():
    model = make_model(n_kv_heads=2)
    idx = random_ids(model, 2, 12)
    full = model(idx)[0]
    caches = model.make_kv_caches(2)
    pieces = [model(idx[:, :5], kv_caches=caches)[0]]  # prefill 5 positions, then one at a time
    pieces += [model(idx[:, t:t + 1], kv_caches=caches)[0] for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-12)


def recompute_greedy(model, idx, new_tokens):
    """Greedy decoding by full recomputation over the last block_size tokens (no cache)."""
    for _ in range(new_tokens):
        logits = model(idx[:, -model.config.block_size:])[0]
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


@pytest.mark.parametrize("n_kv_heads", [None, 1])
def test_generate_with_cache_equals_recomputation(n_kv_heads):
    """Greedy, float64; 4 + 20 tokens cross block_size = 12, so the fallback to recomputation is covered too."""
    model = make_model(n_kv_heads=n_kv_heads)
    prompt = random_ids(model, 3, 4)
    out = model.generate(prompt, 20, greedy=True)
    assert out.shape == (3, 24)
    assert torch.equal(out[:, :4], prompt)
    assert torch.equal(out, recompute_greedy(model, prompt, 20))
    long_prompt = random_ids(model, 1, 15)  # longer than block_size: cropped to its last 12 tokens
    assert torch.equal(model.generate(long_prompt, 3, greedy=True), recompute_greedy(model, long_prompt, 3))


def test_generate_sampling_matches_recomputed_sampling():
    model = make_model()
    prompt = random_ids(model, 2, 3)
    out = model.generate(prompt, 12, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(3))
    generator, idx = torch.Generator().manual_seed(3), prompt
    for _ in range(12):
        logits = model(idx[:, -12:])[0][:, -1] / 0.8
        kth = logits.sort(dim=-1, descending=True).values[:, 4:5]
        probs = F.softmax(logits.masked_fill(logits < kth, -math.inf), dim=-1)
        idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
    assert torch.equal(out, idx)
    assert torch.equal(model.generate(prompt, 0), prompt)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_generate_on_cuda_with_a_cpu_generator_samples_what_cpu_samples():
    # The first GPU run failed here: torch.multinomial refuses a CPU generator for CUDA probabilities. The ids must
    # be the ones the same model draws on the CPU with the same seed (float64 keeps the probabilities equal).
    model = make_model()
    prompt = random_ids(model, 2, 3)
    on_cpu = model.generate(prompt, 12, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(3))
    on_cuda = model.cuda().generate(prompt.cuda(), 12, temperature=0.8, top_k=5,
                                    generator=torch.Generator().manual_seed(3))
    assert on_cuda.device.type == "cuda"
    assert torch.equal(on_cuda.cpu(), on_cpu)


def reference_without_attention(model, idx):
    """The model's logits when every head is masked: each attention layer then adds only o_proj's bias."""
    x = model.tok_emb.weight[idx] + model.pos_emb.weight[: idx.shape[1]]
    for block in model.blocks:
        x = x + block.attn.o_proj.bias
        h = F.layer_norm(x, (x.shape[-1],), block.ln_2.weight, block.ln_2.bias)
        h = F.gelu(h @ block.mlp.c_fc.weight.T + block.mlp.c_fc.bias)
        x = x + h @ block.mlp.c_proj.weight.T + block.mlp.c_proj.bias
    x = F.layer_norm(x, (x.shape[-1],), model.ln_f.weight, model.ln_f.bias)
    return x @ model.tok_emb.weight.T


def test_head_mask_zero_removes_attention():
    model = make_model()
    idx = random_ids(model, 2, 12)
    zeros = torch.zeros(2, 4, dtype=torch.float64)
    torch.testing.assert_close(model(idx, head_mask=zeros)[0], reference_without_attention(model, idx))
    torch.testing.assert_close(model(idx, head_mask=torch.ones(2, 4, dtype=torch.float64))[0], model(idx)[0])
    one_off = torch.ones(2, 4, dtype=torch.float64)
    one_off[1, 2] = 0
    assert not torch.allclose(model(idx, head_mask=one_off)[0], model(idx)[0])


def test_head_mask_is_differentiable():
    model = make_model()
    head_mask = torch.ones(2, 4, dtype=torch.float64, requires_grad=True)
    idx = random_ids(model, 2, 12)
    model(idx, random_ids(model, 2, 12, seed=5), head_mask=head_mask)[1].backward()
    assert head_mask.grad.shape == (2, 4) and torch.all(head_mask.grad != 0)


def test_num_params_and_kv_cache_bytes_match_counting():
    cfg = dict(vocab_size=17, block_size=12, n_layers=3, d_model=16, n_heads=4, n_kv_heads=2, mlp_ratio=4)
    model = make_model(**cfg)
    d, layers = 16, 3
    per_layer = (counting.param_count(d, 4, 2) + 2 * 2 * d  # attention + two LayerNorms (gain, bias)
                 + (d * 4 * d + 4 * d) + (4 * d * d + d))  # MLP
    expected = 17 * d + 12 * d + layers * per_layer + 2 * d  # tied embedding, positions, blocks, final LN
    assert model.num_params() == expected
    assert model.num_params(non_embedding=True) == expected - 12 * d
    caches = model.make_kv_caches(5, 10)
    assert model.kv_cache_bytes(5, 10) == sum(c.nbytes for c in caches)  # float64 model: 8-byte caches
    assert model.kv_cache_bytes(5, 10, dtype_bytes=4) == 2 * 5 * 10 * 3 * 2 * 4 * 4


def test_attention_only_and_scale_config():
    model = make_model(attention_only=True, scale_scores=False, head_dim=8)
    assert all(block.mlp is None for block in model.blocks)
    assert not any("mlp" in name for name, _ in model.named_parameters())
    assert model.blocks[0].attn.scale == 1.0 and model.blocks[0].attn.head_dim == 8
    assert make_model().blocks[0].attn.scale == pytest.approx(1 / math.sqrt(4))
    assert model(random_ids(model, 1, 12))[0].shape == (1, 12, 17)


def test_init_and_weight_tying():
    model = make_model(d_model=128, n_heads=4, n_layers=2, vocab_size=256, dtype=torch.float32)
    assert model.tok_emb.weight is model.lm_head.weight
    residual = 0.02 / math.sqrt(2 * 2)
    for block in model.blocks:
        assert block.attn.o_proj.weight.std().item() == pytest.approx(residual, rel=0.05)
        assert block.mlp.c_proj.weight.std().item() == pytest.approx(residual, rel=0.05)
        assert block.attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
        assert torch.all(block.attn.q_proj.bias == 0)
    assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_forward_never_reads_values_off_the_cpu():
    """The ids' value checks read the tensors, so they run on the CPU only: on an accelerator a forward pass (every
    training and decoding step) would otherwise copy ids back and wait for the device. The meta device has no data:
    a forward pass there, a decoding step through the caches included, proves that nothing is read."""
    model = make_model().to("meta")
    idx = torch.zeros(2, 6, dtype=torch.long, device="meta")
    logits, loss, _ = model(idx, idx)
    assert logits.shape == (2, 6, 17) and loss.device.type == "meta"
    caches = model.make_kv_caches(2)
    model(idx, kv_caches=caches)
    assert model(idx[:, :1], kv_caches=caches)[0].shape == (2, 1, 17) and caches[0].length == 7


def test_bad_inputs():
    model = make_model()
    idx = random_ids(model, 2, 12)
    with pytest.raises(ValueError, match="block_size"):
        model(random_ids(model, 2, 13))
    with pytest.raises(TypeError, match="int64"):
        model(idx.float())
    with pytest.raises(ValueError, match=r"\(N, L\)"):  # a wrong shape is a wrong value
        model(idx[0])
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.full((1, 3), 17))
    with pytest.raises(ValueError, match="no scored position"):
        model(idx, torch.full_like(idx, -100))
    with pytest.raises(ValueError, match="targets"):
        model(idx, idx[:, :5])
    with pytest.raises(ValueError, match="targets hold ids"):
        model(idx, torch.full_like(idx, 40))
    with pytest.raises(ValueError, match=r"head_mask .*\(2, 4\)"):
        model(idx, head_mask=torch.ones(4))
    with pytest.raises(TypeError, match="head_mask"):
        model(idx, head_mask=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="kv_caches"):
        model(idx, kv_caches=model.make_kv_caches(2)[:1])
    caches = model.make_kv_caches(2)
    model(idx[:, :10], kv_caches=caches)
    with pytest.raises(ValueError, match="10 cached"):
        model(idx[:, :3], kv_caches=caches)
    with pytest.raises(ValueError, match="max_len"):
        model.make_kv_caches(1, 13)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(idx, -1)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(idx, 2, temperature=0)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(idx, 2, top_k=18)
    with pytest.raises(ValueError, match="n_kv_heads"):
        make_model(n_kv_heads=3)
    with pytest.raises(ValueError, match="vocab_size"):
        TransformerConfig(vocab_size=0)
    with pytest.raises(ValueError, match="dropout"):
        TransformerConfig(dropout=1.5)
    with pytest.raises(TypeError, match="dropout"):  # a wrong type is a TypeError, as everywhere in the package
        TransformerConfig(dropout="0.1")
    with pytest.raises(TypeError, match="targets"):
        model(idx, idx.float())
    with pytest.raises(TypeError, match="temperature"):
        model.generate(idx, 2, temperature="hot")
    with pytest.raises(TypeError, match="kv_caches"):
        model(idx, kv_caches=object())
    with pytest.raises(TypeError, match="TransformerConfig"):
        TinyTransformer({"vocab_size": 3})
