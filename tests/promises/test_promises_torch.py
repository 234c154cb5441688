"""What the PyTorch module promises (issue 22, items 3-5).

Each test below states one promise of ``mha.MultiHeadAttention``, ``mha.KVCache`` or ``mha.convert.copy_to_torch_mha``
in its docstring and checks it. Where a value is checked, it is compared with an independent computation: the NumPy
reference ``mha.reference`` in float64, the same module converted to float64, or ``torch.nn.MultiheadAttention``.

1. A failed forward call leaves its ``KVCache`` as it was, so a retry gives the right answer; a cache is one layer's,
   its ``length`` stays in range, and its ``device`` must be one torch can allocate on. With a ring buffer
   (``window``; issue 24) "as it was" means every slot bitwise, since a write overwrites old slots.
2. Asking for the attention weights (or ``impl="naive"``) never changes the output's correctness in float16/bfloat16.
3. ``copy_to_torch_mha`` refuses every pair that would not compute the same function, and the pairs it accepts do.
4. Tensor values are not checked (no host-device sync): NaN passes through, confined to its own sequence.
"""

import importlib.util

import numpy as np
import pytest
import torch
from torch import nn

from mha import KVCache, MultiHeadAttention, reference
from mha.convert import copy_to_torch_mha

from _params import make, randn

F64 = torch.float64
HAS_TRITON = importlib.util.find_spec("triton") is not None


def causal_reference(m, x):
    """The full-sequence causal forward by the NumPy reference in float64 (no cache, no torch attention code)."""
    length = x.shape[1]
    out, _ = reference.multi_head_attention(x.double().numpy(), None, m.export_params(), m.n_heads,
                                            mask=np.tril(np.ones((length, length), bool)))
    return torch.from_numpy(out)


def boom(*args, **kwargs):
    raise RuntimeError("injected failure")


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


# ------------------------------------------------------------------------------- 1. the cache of a failed call
@pytest.mark.parametrize("impl,step", [("sdpa", "_sdpa_attention"), ("naive", "_naive_attention"),
                                       ("sdpa", "o_proj"), ("naive", "o_proj")])
@pytest.mark.parametrize("failure", [boom, interrupt], ids=["RuntimeError", "KeyboardInterrupt"])
def test_failed_forward_leaves_the_cache_as_it_was_and_a_retry_is_exact(impl, step, failure, monkeypatch):
    """A forward call that fails after computing its keys/values leaves the cache's length and filled prefix as they
    were, so retrying the call gives the output of the uncached causal forward."""
    m = make(n_kv_heads=2, impl=impl)
    x = randn(2, 6, 16)
    cache = KVCache(2, 8, m.n_kv_heads, m.head_dim, dtype=F64)
    with torch.no_grad():
        prefill, _ = m(x[:, :4], kv_cache=cache, is_causal=True, need_weights=False)
        k_before, v_before = cache.k[:, :, :4].clone(), cache.v[:, :, :4].clone()
        with monkeypatch.context() as patch:
            patch.setattr(m.o_proj if step == "o_proj" else m, "forward" if step == "o_proj" else step, failure)
            with pytest.raises((RuntimeError, KeyboardInterrupt)):
                m(x[:, 4:], kv_cache=cache, is_causal=True, need_weights=False)
        assert cache.length == 4
        assert torch.equal(cache.k[:, :, :4], k_before) and torch.equal(cache.v[:, :, :4], v_before)
        retry, _ = m(x[:, 4:], kv_cache=cache, is_causal=True, need_weights=False)
    assert cache.length == 6
    torch.testing.assert_close(torch.cat([prefill, retry], dim=1), causal_reference(m, x), rtol=1e-10, atol=1e-10)


def windowed_reference(m, x, n_sink_tokens):
    """The full-sequence forward of ``m``'s weights without a cache, by a windowless copy of the module given the
    explicit mask "p - W < j <= p, or j < n_sink_tokens" (no ring buffer involved)."""
    other = MultiHeadAttention(16, 4, n_kv_heads=m.n_kv_heads, rope_base=m.rope_base, sinks=True).double().eval()
    other.load_state_dict(m.state_dict())
    q, k = torch.arange(x.shape[1])[:, None], torch.arange(x.shape[1])[None, :]
    allowed = (k <= q) & ((k > q - m.window) | (k < n_sink_tokens))
    with torch.no_grad():
        return other(x, mask=allowed, need_weights=False)[0]


@pytest.mark.parametrize("impl,step", [("sdpa", "_sdpa_attention"), ("naive", "_naive_attention"),
                                       ("sdpa", "_append_sink_key"), ("sdpa", "o_proj"), ("naive", "o_proj")])
@pytest.mark.parametrize("failure", [boom, interrupt], ids=["RuntimeError", "KeyboardInterrupt"])
@pytest.mark.parametrize("n_sink_tokens", [0, 2])
def test_failed_forward_leaves_the_ring_buffer_exactly_as_it_was_and_a_retry_is_exact(impl, step, failure,
                                                                                       n_sink_tokens, monkeypatch):
    """With a ring buffer (a module with a window), a call that fails after computing its keys/values leaves every
    slot bitwise as it was and the length too (restoring the length alone would not do: the new keys would have
    overwritten the oldest slots); the failed chunk is as long as the window, so it would have overwritten all of
    them. Retrying, then decoding on, gives the full computation with the window mask."""
    m = make(n_kv_heads=2, impl=impl, rope_base=100.0, window=3, sinks=True)
    with torch.no_grad():
        m.sinks.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
    x = randn(2, 15, 16)
    cache = m.new_cache(2, 15, n_sink_tokens=n_sink_tokens)
    with torch.no_grad():
        outs = [m(x[:, :10], kv_cache=cache, need_weights=False)[0]]  # 10 > window: the ring has wrapped
        k_before, v_before = cache.k.clone(), cache.v.clone()
        with monkeypatch.context() as patch:
            patch.setattr(m.o_proj if step == "o_proj" else m, "forward" if step == "o_proj" else step, failure)
            with pytest.raises((RuntimeError, KeyboardInterrupt)):
                m(x[:, 10:13], kv_cache=cache, need_weights=False)
        assert cache.length == 10
        assert torch.equal(cache.k, k_before) and torch.equal(cache.v, v_before)
        outs.append(m(x[:, 10:13], kv_cache=cache, need_weights=False)[0])  # the retry
        outs += [m(x[:, t:t + 1], kv_cache=cache, need_weights=False)[0] for t in (13, 14)]
    assert cache.length == 15
    torch.testing.assert_close(torch.cat(outs, dim=1), windowed_reference(m, x, n_sink_tokens), rtol=1e-10,
                               atol=1e-10)


def test_a_ring_buffer_belongs_to_one_layer_and_to_a_module_with_its_window():
    """A ring buffer written by one module is refused by another with the same window until reset(), and refused
    outright by modules with another window or none (they would read it with the wrong mask)."""
    first, second = make(window=3, seed=0), make(window=3, seed=1)
    x = randn(1, 5, 16)
    cache = first.new_cache(1, 8)
    with torch.no_grad():
        first(x, kv_cache=cache)
        with pytest.raises(ValueError, match=r"kv_cache .*another MultiHeadAttention.*reset\(\)"):
            second(x[:, :1], kv_cache=cache)
        for other in (make(window=4), make()):
            with pytest.raises(ValueError, match=rf"kv_cache has window=3 but the module has window={other.window}"):
                other(x[:, :1], kv_cache=cache)
        assert cache.length == 5
        cache.reset()
        out, _ = second(x, kv_cache=cache)
        expected, _ = second(x, is_causal=True)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not HAS_TRITON, reason='Triton is not installed (pip install "mha-derived[kernels]")')
def test_triton_kernel_failure_leaves_the_cache_as_it_was():
    """impl="triton" on float64 CPU tensors fails inside the kernel (which takes float32, float16 and bfloat16, and CPU
    tensors only under Triton's interpreter), after the keys/values were appended: the cache is left as it was, and
    the same call on the naive path then gives the uncached causal forward's output."""
    m = make(impl="naive")
    x = randn(1, 5, 16)
    cache = KVCache(1, 8, m.n_kv_heads, m.head_dim, dtype=F64)
    with torch.no_grad():
        prefill, _ = m(x[:, :3], kv_cache=cache, is_causal=True, need_weights=False)
        k_before = cache.k[:, :, :3].clone()
        m.impl = "triton"  # float64 CPU tensors: refused by the kernel under the CPU interpreter or with CUDA
        with pytest.raises((TypeError, ValueError), match=r"must have dtype|CPU tensors"):
            m(x[:, 3:], kv_cache=cache, is_causal=True, need_weights=False)
        assert cache.length == 3 and torch.equal(cache.k[:, :, :3], k_before)
        m.impl = "naive"
        retry, _ = m(x[:, 3:], kv_cache=cache, is_causal=True, need_weights=False)
    torch.testing.assert_close(torch.cat([prefill, retry], dim=1), causal_reference(m, x), rtol=1e-10, atol=1e-10)


def test_a_cache_belongs_to_one_layer():
    """A KVCache used by one module is refused by another (it would read the first layer's keys) until reset()."""
    first, second = make(seed=0), make(seed=1)
    x = randn(1, 3, 16)
    cache = KVCache(1, 8, 4, 4, dtype=F64)
    with torch.no_grad():
        first(x, kv_cache=cache, is_causal=True)
        with pytest.raises(ValueError, match=r"kv_cache .*another MultiHeadAttention.*reset\(\)"):
            second(x, kv_cache=cache, is_causal=True)
        assert cache.length == 3
        cache.reset()
        out, _ = second(x, kv_cache=cache, is_causal=True)  # after reset() the cache is free again
    torch.testing.assert_close(out, causal_reference(second, x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bad,exc,pattern", [
    (-1, ValueError, r"length must be an integer in \[0, 8\], got -1"),
    (9, ValueError, r"length must be an integer in \[0, 8\], got 9"),
    (2.0, TypeError, r"length must be an integer in \[0, 8\], got 2\.0 of type float"),
])
def test_length_set_by_hand_stays_in_range(bad, exc, pattern):
    """KVCache.length may be set by hand (to rewind) but only to an integer in [0, max_len]; a refused value leaves
    it as it was."""
    cache = KVCache(1, 8, 2, 4)
    cache.append(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4))
    with pytest.raises(exc, match=pattern):
        cache.length = bad
    assert cache.length == 3
    cache.length = 1  # rewinding stays allowed
    assert cache.append(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))[0].shape == (1, 2, 2, 4)


def test_a_failed_model_call_leaves_every_layer_cache_as_it_was(monkeypatch):
    """A model call that fails after its first layers appended leaves every layer's cache where it was, and the retry
    gives the logits of a full forward without a cache."""
    from mha.experiments.model import TinyTransformer, TransformerConfig

    torch.manual_seed(0)
    model = TinyTransformer(TransformerConfig(vocab_size=11, block_size=8, n_layers=2, d_model=16, n_heads=4)).eval()
    idx = torch.randint(11, (2, 6), generator=torch.Generator().manual_seed(3))
    caches = model.make_kv_caches(2)
    with torch.no_grad():
        model(idx[:, :4], kv_caches=caches)
        with monkeypatch.context() as patch:
            patch.setattr(model.lm_head, "forward", boom)  # after both layers appended
            with pytest.raises(RuntimeError, match="injected failure"):
                model(idx[:, 4:], kv_caches=caches)
        assert [cache.length for cache in caches] == [4, 4]
        retried, _, _ = model(idx[:, 4:], kv_caches=caches)
        full, _, _ = model(idx)
    torch.testing.assert_close(retried, full[:, 4:], rtol=1e-5, atol=1e-5)


def test_layer_caches_that_disagree_are_refused():
    """Caches of one model that hold different numbers of positions (one advanced alone) are refused."""
    from mha.experiments.model import TinyTransformer, TransformerConfig

    model = TinyTransformer(TransformerConfig(vocab_size=11, block_size=8, n_layers=2, d_model=16, n_heads=4)).eval()
    caches = model.make_kv_caches(1)
    caches[1].length = 2
    with pytest.raises(ValueError, match=r"kv_caches hold different numbers of positions \[0, 2\]"):
        model(torch.zeros(1, 1, dtype=torch.long), kv_caches=caches)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cache_on_an_unavailable_cuda_device_is_a_value_error():
    """KVCache(device="cuda") without CUDA raises ValueError naming device, what it got and what is available."""
    with pytest.raises(ValueError, match=r"device must be .* got 'cuda' \(CUDA is not available"):
        KVCache(1, 8, 2, 4, device="cuda")


def test_cache_device_string_must_name_a_device():
    """A device string torch does not know is a ValueError naming device and what it got."""
    with pytest.raises(ValueError, match=r"device must be .* got 'gpu'"):
        KVCache(1, 8, 2, 4, device="gpu")


def test_cache_device_of_another_type_is_a_type_error():
    """A device that is neither a str, a torch.device nor None is a TypeError naming device."""
    with pytest.raises(TypeError, match=r"device must be a str, a torch\.device or None, got int"):
        KVCache(1, 8, 2, 4, device=3)


# --------------------------------------------------------------------------- 2. half precision, weights or not
# Tolerances of the output against float64 (relative to its largest entry: the half-precision projections' own
# error, measured up to 0.7% / 5% at size 20), of the weights against float64's (absolute), and of the weights
# path and the naive path against the sdpa path (relative to the largest entry; rounding scores to half precision
# before the softmax measured 0.6% / 2.4% here, computing them in float32 0.04% / 0.15%).
HALF_TOL = {torch.float16: dict(f64=1e-2, weights=5e-2, sdpa=1e-3),
            torch.bfloat16: dict(f64=5e-2, weights=1.5e-1, sdpa=6e-3)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("size", [200, 20])
def test_half_precision_output_is_right_with_or_without_the_weights(dtype, size):
    """In float16/bfloat16, need_weights=True and impl="naive" give a finite output, close to the float64
    computation with the same (rounded) weights and inputs and as close to the sdpa path as rounding allows, for
    large inputs (size * randn: q k^T overflows float16 at 200) as for moderate ones."""
    tol = HALF_TOL[dtype]
    m = make(dtype=dtype)
    x = size * randn(2, 7, 16, dtype=dtype)
    exact = make(dtype=dtype).double()  # the same rounded weights, computed in float64
    with torch.no_grad():
        expected, expected_w = exact(x.double(), is_causal=True)
        scale = expected.abs().max()
        sdpa, _ = m(x, is_causal=True, need_weights=False)
        with_weights, weights = m(x, is_causal=True, need_weights=True)
        m.impl = "naive"
        naive, _ = m(x, is_causal=True, need_weights=False)
    for out in (with_weights, naive, sdpa):
        assert out.dtype == dtype and torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), expected, rtol=0, atol=tol["f64"] * scale)
    torch.testing.assert_close(weights.double(), expected_w, rtol=0, atol=tol["weights"])
    for out in (with_weights, naive):
        torch.testing.assert_close(out.double(), sdpa.double(), rtol=0, atol=tol["sdpa"] * scale)


# ---------------------------------------------------------------------------------------- 3. copy_to_torch_mha
def theirs_for(d_model=16, n_heads=4, dtype=F64, **kwargs):
    return nn.MultiheadAttention(d_model, n_heads, batch_first=True, dtype=dtype, **kwargs).eval()


@pytest.mark.parametrize("ours,theirs,pattern", [
    pytest.param(lambda: make(scale=1.0), theirs_for, r"scale: ours 1, theirs 0\.5", id="scale"),
    pytest.param(make, lambda: theirs_for(add_bias_kv=True), r"add_bias_kv", id="add_bias_kv"),
    pytest.param(make, lambda: theirs_for(add_zero_attn=True), r"add_zero_attn", id="add_zero_attn"),
    pytest.param(make, lambda: theirs_for(dropout=0.1), r"dropout: ours 0\.0, theirs 0\.1", id="dropout"),
    pytest.param(make, lambda: theirs_for(kdim=8, vdim=8), r"kdim/vdim: theirs kdim=8, vdim=8", id="kdim"),
    pytest.param(make, lambda: theirs_for(bias=False), r"bias: ours has biases, theirs has none", id="bias"),
    pytest.param(lambda: make(n_kv_heads=2), theirs_for, r"n_kv_heads: ours 2,.*gqa_to_mha", id="gqa"),
    pytest.param(lambda: make(n_kv_heads=1), theirs_for, r"n_kv_heads: ours 1,", id="mqa"),
    pytest.param(lambda: make(head_dim=8), theirs_for, r"head_dim: ours 8, theirs 4", id="head_dim"),
    pytest.param(make, lambda: theirs_for(d_model=32), r"d_model: ours 16, theirs embed_dim 32", id="d_model"),
    pytest.param(make, lambda: theirs_for(n_heads=2), r"n_heads: ours 4, theirs num_heads 2", id="n_heads"),
    pytest.param(make, lambda: theirs_for(dtype=torch.float32), r"dtype: ours torch\.float64, theirs torch\.float32",
                 id="dtype"),
])
def test_copy_to_torch_mha_refuses_pairs_that_compute_different_functions(ours, theirs, pattern):
    """copy_to_torch_mha raises ValueError naming what differs, and copies nothing, for every pair that would not
    compute the same function."""
    ours, theirs = ours(), theirs()
    before = {name: p.detach().clone() for name, p in theirs.named_parameters()}
    with pytest.raises(ValueError, match=pattern):
        copy_to_torch_mha(ours, theirs)
    assert all(torch.equal(p, before[name]) for name, p in theirs.named_parameters())


def test_copy_to_torch_mha_lists_every_difference_in_one_message():
    """One ValueError lists every difference, not only the first."""
    with pytest.raises(ValueError, match=r"scale: .*dropout: .*add_zero_attn"):
        copy_to_torch_mha(make(scale=1.0), theirs_for(dropout=0.1, add_zero_attn=True))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("masking", ["none", "mask", "causal"])
def test_copy_to_torch_mha_pairs_it_accepts_compute_the_same_function(bias, batch_first, masking):
    """After copy_to_torch_mha the two modules give the same outputs and per-head weights on random input (ours
    without biases copies zero biases into theirs; batch_first only changes the axis order of theirs' arguments)."""
    ours = make(bias=bias, scale=0.5)  # 0.5 = 1 / sqrt(head_dim): torch's scale, given explicitly
    theirs = nn.MultiheadAttention(16, 4, batch_first=batch_first, dtype=F64).eval()
    copy_to_torch_mha(ours, theirs)
    x = randn(2, 5, 16)
    allowed = allowed_t = None  # boolean, True = may attend: ours (N, h, L, L) or (L, L); theirs (N*h, L, L) or (L, L)
    if masking == "mask":
        allowed = torch.rand(2, 4, 5, 5, generator=torch.Generator().manual_seed(2)) < 0.7
        allowed[..., 0] = True  # no fully masked row (torch gives NaN there, ours 0)
        allowed_t = allowed.reshape(8, 5, 5)  # (N*h, L, L): torch's per-head mask layout
    elif masking == "causal":
        allowed = allowed_t = torch.ones(5, 5, dtype=torch.bool).tril()  # (L, L)
    with torch.no_grad():
        out, weights = ours(x, mask=allowed)
        x_theirs = x if batch_first else x.transpose(0, 1)  # (L, N, d_model) when not batch_first
        out_t, weights_t = theirs(x_theirs, x_theirs, x_theirs, attn_mask=None if allowed is None else ~allowed_t,
                                  average_attn_weights=False)
    torch.testing.assert_close(out, out_t if batch_first else out_t.transpose(0, 1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(weights, weights_t, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------- 4. values are not checked
def test_nan_input_is_not_checked_and_stays_in_its_sequence():
    """The module reads no tensor values (no host-device sync), so NaN in the input raises nothing: it gives NaN in
    that sequence's output and leaves the other sequences exactly as computed alone."""
    m = make()
    x = randn(2, 5, 16)
    x[1, 2, 3] = float("nan")
    with torch.no_grad():
        out, _ = m(x, need_weights=False)
        alone, _ = m(x[:1], need_weights=False)
    assert torch.isnan(out[1]).any()
    torch.testing.assert_close(out[:1], alone, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out[0], causal_free_reference(m, x[0]), rtol=1e-10, atol=1e-10)


def causal_free_reference(m, x):
    """Unmasked attention of one sequence (L, d_model) by the NumPy reference in float64."""
    out, _ = reference.multi_head_attention(x.numpy(), None, m.export_params(), m.n_heads)
    return torch.from_numpy(out)
