"""Bad input -> a clear exception: the right type, and a message naming the argument and what it got.

One table for ``MultiHeadAttention`` (constructor, forward, load_params) and ``KVCache``. Each row is a thunk
that must raise, the exception type, and a regex that must match the message. Device mismatches use the "meta"
device, so they are checked without a GPU.
"""

import numpy as np
import pytest
import torch

from mha import KVCache, MultiHeadAttention

F64 = torch.float64
MHA = MultiHeadAttention


def module(**kwargs):
    kwargs = {"d_model": 16, "n_heads": 4, **kwargs}
    return MHA(**kwargs).double()


def x(*shape, dtype=F64, device="cpu"):
    return torch.zeros(*shape, dtype=dtype, device=device)


def cache(batch_size=2, max_len=8, n_kv_heads=4, head_dim=4, dtype=F64, device="cpu"):
    return KVCache(batch_size, max_len, n_kv_heads, head_dim, dtype=dtype, device=device)


def filled_cache(length, **kwargs):
    c = cache(**kwargs)
    c.append(x(c.batch_size, c.n_kv_heads, length, c.head_dim), x(c.batch_size, c.n_kv_heads, length, c.head_dim))
    return c


def params(bias=True, **overrides):
    p = module(bias=bias).export_params()
    p.update(overrides)
    return {k: v for k, v in p.items() if v is not Ellipsis}


CASES = [
    # ----------------------------------------------------------------------------------------- constructor
    pytest.param(lambda: MHA(10, 4), ValueError, r"d_model \(10\) must be divisible by n_heads \(4\)", id="d_model%h"),
    pytest.param(lambda: MHA(16, 4, n_kv_heads=3), ValueError, r"n_heads \(4\) must be divisible by n_kv_heads \(3\)",
                 id="h%g"),
    pytest.param(lambda: MHA(0, 4), ValueError, r"d_model must be an integer >= 1, got 0", id="d_model=0"),
    pytest.param(lambda: MHA(16.0, 4), TypeError, r"d_model must be an integer >= 1, got 16\.0 of type float", id="d_model-float"),
    pytest.param(lambda: MHA(16, -2), ValueError, r"n_heads must be an integer >= 1, got -2", id="n_heads<0"),
    pytest.param(lambda: MHA(16, True), TypeError, r"n_heads must be an integer >= 1, got True of type bool", id="n_heads-bool"),
    pytest.param(lambda: MHA(16, 4, n_kv_heads=0), ValueError, r"n_kv_heads must be an integer >= 1, got 0",
                 id="n_kv_heads=0"),
    pytest.param(lambda: MHA(16, 4, head_dim=0), ValueError, r"head_dim must be an integer >= 1, got 0", id="head_dim=0"),
    pytest.param(lambda: MHA(16, 4, impl="flash"), ValueError, r"impl must be one of 'sdpa', 'naive', 'triton', got 'flash'",
                 id="impl"),
    pytest.param(lambda: MHA(16, 4, dropout=1.0), ValueError, r"dropout must be a finite real number in \[0, 1\), got 1\.0",
                 id="dropout=1"),
    pytest.param(lambda: MHA(16, 4, dropout=-0.1), ValueError, r"dropout .* got -0\.1", id="dropout<0"),
    pytest.param(lambda: MHA(16, 4, dropout="0.1"), TypeError, r"dropout .* got '0\.1'", id="dropout-str"),
    pytest.param(lambda: MHA(16, 4, scale=0.0), ValueError, r"scale must be a finite real number > 0, got 0\.0",
                 id="scale=0"),
    pytest.param(lambda: MHA(16, 4, scale=float("nan")), ValueError, r"scale .* got nan", id="scale=nan"),
    # ------------------------------------------------------------ constructor: options of today's models (issue 24)
    pytest.param(lambda: MHA(20, 4, rope_base=10000.0), ValueError,
                 r"rope_base needs an even head_dim \(RoPE rotates pairs of coordinates\), got head_dim=5",
                 id="rope-odd"),
    pytest.param(lambda: MHA(16, 4, rope_base=0), ValueError, r"rope_base must be a finite real number > 0, got 0\.0",
                 id="rope_base=0"),
    pytest.param(lambda: MHA(16, 4, rope_base="1e4"), TypeError, r"rope_base must be .* got '1e4' of type str",
                 id="rope_base-str"),
    pytest.param(lambda: MHA(16, 4, rope_style="rotate"), ValueError,
                 r"rope_style must be one of 'half', 'interleaved', got 'rotate'", id="rope_style"),
    pytest.param(lambda: MHA(16, 4, rope_style=1), TypeError, r"rope_style must be one of .* got 1 of type int",
                 id="rope_style-int"),
    pytest.param(lambda: MHA(16, 4, window=0), ValueError, r"window must be an integer >= 1, got 0", id="window=0"),
    pytest.param(lambda: MHA(16, 4, window=2.0), TypeError, r"window must be an integer >= 1, got 2\.0 of type float",
                 id="window-float"),
    pytest.param(lambda: MHA(16, 4, softcap=0.0), ValueError, r"softcap must be a finite real number > 0, got 0\.0",
                 id="softcap=0"),
    pytest.param(lambda: MHA(16, 4, softcap=-30), ValueError, r"softcap .* got -30\.0", id="softcap<0"),
    pytest.param(lambda: MHA(16, 4, qk_norm=True, qk_norm_eps=0), ValueError,
                 r"qk_norm_eps must be a finite real number > 0, got 0\.0", id="qk_norm_eps=0"),
    pytest.param(lambda: MHA(16, 4, qk_norm_eps=None), TypeError, r"qk_norm_eps .* got None of type NoneType",
                 id="qk_norm_eps-None"),
    pytest.param(lambda: MHA(16, 4, qk_norm=1), TypeError, r"qk_norm must be True or False, got 1 of type int",
                 id="qk_norm-int"),
    pytest.param(lambda: MHA(16, 4, sinks="yes"), TypeError, r"sinks must be True or False, got 'yes'", id="sinks-str"),
    pytest.param(lambda: MHA(16, 4, impl="triton", rope_base=10000.0, sinks=True), ValueError,
                 r"impl='triton' .* takes none of rope_base, window, sinks, qk_norm, softcap; got rope_base=10000, "
                 r"rope_style='half', sinks=True", id="triton-options"),
    pytest.param(lambda: MHA(16, 4, impl="triton", window=4), ValueError, r"impl='triton' .* got window=4",
                 id="triton-window"),
    # --------------------------------------------------------------------------------------------- forward
    pytest.param(lambda: module()(np.zeros((2, 5, 16))), TypeError, r"x_q must be a torch\.Tensor, got ndarray",
                 id="x_q-numpy"),
    pytest.param(lambda: module()(x(1, 2, 5, 16)), ValueError,
                 r"x_q must be \(N, L_q, d_model\) or unbatched \(L_q, d_model\), got shape \(1, 2, 5, 16\)",
                 id="x_q-rank4"),
    pytest.param(lambda: module()(x(16)), ValueError, r"x_q must be .* got shape \(16,\)", id="x_q-rank1"),
    pytest.param(lambda: module()(x(2, 5, 15)), ValueError,
                 r"x_q's last dimension must be d_model=16, got shape \(2, 5, 15\)", id="x_q-d_model"),
    pytest.param(lambda: module()(x(2, 0, 16)), ValueError, r"x_q must have at least one position, got shape \(2, 0, 16\)",
                 id="x_q-empty"),
    pytest.param(lambda: module()(x(2, 5, 16, dtype=torch.float32)), TypeError,
                 r"x_q has dtype torch\.float32 but the module's parameters have dtype torch\.float64", id="x_q-dtype"),
    pytest.param(lambda: module()(x(2, 5, 16, device="meta")), ValueError,
                 r"x_q is on device meta but the module's parameters are on cpu", id="x_q-device"),
    pytest.param(lambda: module()(x(2, 5, 16), x(2, 5, 12)), ValueError,
                 r"x_kv's last dimension must be d_model=16, got shape \(2, 5, 12\)", id="x_kv-d_model"),
    pytest.param(lambda: module()(x(2, 5, 16), x(5, 16)), ValueError,
                 r"x_kv must have the same rank as x_q: x_q has shape \(2, 5, 16\), x_kv has shape \(5, 16\)",
                 id="x_kv-rank"),
    pytest.param(lambda: module()(x(2, 5, 16), x(3, 5, 16)), ValueError,
                 r"batch size mismatch: x_q has shape \(2, 5, 16\), x_kv has shape \(3, 5, 16\)", id="x_kv-batch"),
    pytest.param(lambda: module()(x(2, 5, 16), x(2, 5, 16, dtype=torch.float32)), TypeError,
                 r"x_kv must have the dtype of x_q \(torch\.float64\), got torch\.float32", id="x_kv-dtype"),
    pytest.param(lambda: module()(x(2, 5, 16), x(2, 5, 16, device="meta")), ValueError,
                 r"x_kv must be on the device of x_q \(cpu\), got meta", id="x_kv-device"),
    pytest.param(lambda: module()(x(2, 5, 16), x(2, 5, 16).tolist()), TypeError,
                 r"x_kv must be a torch\.Tensor or None, got list", id="x_kv-list"),
    pytest.param(lambda: module()(x(2, 5, 16), mask=torch.ones(5, 5)), TypeError,
                 r"mask must be boolean \(True = may attend\), got dtype torch\.float32", id="mask-float"),
    pytest.param(lambda: module()(x(2, 5, 16), mask=torch.ones(5, 4, dtype=torch.bool)), ValueError,
                 r"mask of shape \(5, 4\) is not broadcastable to \(N, h, L_q, L_kv\) = \(2, 4, 5, 5\)",
                 id="mask-shape"),
    pytest.param(lambda: module()(x(2, 5, 16), x(2, 3, 16), mask=torch.ones(2, 1, 5, 5, dtype=torch.bool)),
                 ValueError, r"mask of shape \(2, 1, 5, 5\) is not broadcastable to .* = \(2, 4, 5, 3\)",
                 id="mask-shape-cross"),
    pytest.param(lambda: module()(x(5, 16), mask=torch.ones(1, 4, 5, 5, dtype=torch.bool)), ValueError,
                 r"mask of shape \(1, 4, 5, 5\) is not broadcastable to \(h, L_q, L_kv\) = \(4, 5, 5\)",
                 id="mask-unbatched-rank4"),
    pytest.param(lambda: module()(x(2, 5, 16), mask=torch.ones(5, 5, dtype=torch.bool, device="meta")), ValueError,
                 r"device mismatch: mask is on meta, x_q is on cpu", id="mask-device"),
    pytest.param(lambda: module()(x(2, 5, 16), head_mask=torch.ones(3, dtype=F64)), ValueError,
                 r"head_mask must have shape \(n_heads,\) = \(4,\), got shape \(3,\)", id="head_mask-shape"),
    pytest.param(lambda: module()(x(2, 5, 16), head_mask=torch.ones(4, dtype=torch.long)), TypeError,
                 r"head_mask must be a float or bool tensor, got dtype torch\.int64", id="head_mask-dtype"),
    # ----------------------------------------------------------------------------------- forward with a cache
    pytest.param(lambda: module()(x(2, 1, 16), x(2, 3, 16), kv_cache=cache()), ValueError,
                 r"kv_cache is for self-attention only: x_kv must be None .* shape \(2, 3, 16\)", id="cache+x_kv"),
    pytest.param(lambda: module()(x(2, 1, 16), kv_cache="cache"), TypeError,
                 r"kv_cache must be a mha\.KVCache or None, got str", id="cache-type"),
    pytest.param(lambda: module()(x(2, 1, 16), kv_cache=cache(batch_size=3)), ValueError,
                 r"x_q \(its keys/values\) has batch size 2 but the KVCache was built for batch_size 3", id="cache-batch"),
    pytest.param(lambda: module(n_kv_heads=2)(x(2, 1, 16), kv_cache=cache(n_kv_heads=4)), ValueError,
                 r"has 2 key/value heads but the KVCache was built for n_kv_heads 4", id="cache-heads"),
    pytest.param(lambda: module(head_dim=8)(x(2, 1, 16), kv_cache=cache(head_dim=4)), ValueError,
                 r"has head_dim 8 but the KVCache was built for head_dim 4", id="cache-head_dim"),
    pytest.param(lambda: module()(x(2, 1, 16), kv_cache=cache(dtype=torch.float32)), TypeError,
                 r"has dtype torch\.float64 but the KVCache holds torch\.float32", id="cache-dtype"),
    pytest.param(lambda: module()(x(2, 1, 16), kv_cache=cache(device="meta")), ValueError,
                 r"is on device cpu but the KVCache is on meta", id="cache-device"),
    pytest.param(lambda: module()(x(2, 3, 16), kv_cache=filled_cache(6)), ValueError,
                 r"KVCache overflow: 6 cached \+ 3 new > max_len 8", id="cache-overflow"),
    pytest.param(lambda: module()(x(2, 1, 16), kv_cache=filled_cache(3), mask=torch.ones(2, 1, 1, 3, dtype=torch.bool)),
                 ValueError, r"mask of shape \(2, 1, 1, 3\) is not broadcastable to .* = \(2, 4, 1, 4\)",
                 id="cache-mask-shape"),
    # --------------------------------------------------------------- forward: positions, windows, ring buffers
    pytest.param(lambda: module(rope_base=100.0)(x(2, 5, 16), positions=torch.arange(4)), ValueError,
                 r"positions must have shape \(L_q,\) = \(5,\) or \(N, L_q\) = \(2, 5\), got shape \(4,\)",
                 id="positions-length"),
    pytest.param(lambda: module(rope_base=100.0)(x(5, 16), positions=torch.zeros(2, 5, dtype=torch.long)), ValueError,
                 r"positions must have shape \(L_q,\) = \(5,\), got shape \(2, 5\)", id="positions-unbatched"),
    pytest.param(lambda: module(rope_base=100.0)(x(2, 5, 16), positions=torch.arange(5.0)), TypeError,
                 r"positions must be an integer tensor, got dtype torch\.float32", id="positions-float"),
    pytest.param(lambda: module(rope_base=100.0)(x(2, 5, 16), positions=torch.arange(5) - 1), ValueError,
                 r"positions must be integers >= 0, got a minimum of -1", id="positions-negative"),
    pytest.param(lambda: module(rope_base=100.0)(x(2, 5, 16), positions=[0, 1, 2, 3, 4]), TypeError,
                 r"positions must be an integer torch\.Tensor or None, got list", id="positions-list"),
    pytest.param(lambda: module(rope_base=100.0)(x(2, 5, 16), positions=torch.arange(5, device="meta")), ValueError,
                 r"device mismatch: positions is on meta, x_q is on cpu", id="positions-device"),
    pytest.param(lambda: module()(x(2, 5, 16), positions=torch.arange(5)), ValueError,
                 r"positions are RoPE's positions, but this module has no RoPE \(rope_base=None\)",
                 id="positions-without-rope"),
    pytest.param(lambda: module(window=3)(x(2, 5, 16), x(2, 4, 16)), ValueError,
                 r"rope_base and window are for self-attention .*window=3.* got x_kv of shape \(2, 4, 16\)",
                 id="window-cross"),
    pytest.param(lambda: module()(x(2, 1, 16), kv_cache=KVCache(2, 8, 4, 4, dtype=F64, window=4)), ValueError,
                 r"kv_cache has window=4 but the module has window=None: .*new_cache", id="ring-cache-no-window"),
    pytest.param(lambda: module(window=4)(x(2, 1, 16), kv_cache=cache()), ValueError,
                 r"kv_cache has window=None but the module has window=4", id="full-cache-window"),
    pytest.param(lambda: module(window=4)(x(2, 1, 16), kv_cache=KVCache(2, 8, 4, 4, dtype=F64, window=3)), ValueError,
                 r"kv_cache has window=3 but the module has window=4", id="cache-window-mismatch"),
    pytest.param(lambda: module(window=4)(x(2, 3, 16), kv_cache=module(window=4).new_cache(2, 2)), ValueError,
                 r"KVCache overflow: 0 cached \+ 3 new > max_len 2", id="ring-overflow"),
    # ------------------------------------------------------------------------------------------ load_params
    pytest.param(lambda: module().load_params(params(W_q=np.zeros((16, 8)))), ValueError,
                 r"params\['W_q'\] must have shape \(16, 16\) .* got shape \(16, 8\)", id="load-W_q-shape"),
    pytest.param(lambda: module(n_kv_heads=2).load_params(params()), ValueError,
                 r"params\['W_k'\] must have shape \(16, 8\) .*n_kv_heads=2.* got shape \(16, 16\)", id="load-gqa-shape"),
    pytest.param(lambda: module().load_params(params(b_o=np.zeros((1, 16)))), ValueError,
                 r"params\['b_o'\] must have shape \(16,\) .* got shape \(1, 16\)", id="load-b_o-shape"),
    pytest.param(lambda: module().load_params(params(b_o=...)), ValueError,
                 r"params is missing \['b_o'\] \(module has bias=True\)", id="load-missing"),
    pytest.param(lambda: module(bias=False).load_params(params()), ValueError,
                 r"params has unexpected keys \['b_k', 'b_o', 'b_q', 'b_v'\] \(module has bias=False\)",
                 id="load-unexpected"),
    pytest.param(lambda: module().load_params([1, 2]), TypeError, r"params must be a dict of arrays, got list",
                 id="load-type"),
    pytest.param(lambda: module().load_params(params(W_o=np.zeros((16, 16), dtype=complex))), TypeError,
                 r"params\['W_o'\] must hold real numbers, got dtype torch\.complex128", id="load-complex"),
    # ---------------------------------------------------------------------------------------------- KVCache
    pytest.param(lambda: KVCache(2, 0, 4, 4), ValueError, r"max_len must be an integer >= 1, got 0", id="cache-max_len"),
    pytest.param(lambda: KVCache(2, 8, 4, 4, dtype=torch.int64), TypeError,
                 r"dtype must be a floating torch\.dtype, got torch\.int64", id="cache-int-dtype"),
    pytest.param(lambda: cache().append(x(2, 4, 3), x(2, 4, 3)), ValueError,
                 r"k_new must be 4-D \(N, n_kv_heads, T, head_dim\), got shape \(2, 4, 3\)", id="append-rank"),
    pytest.param(lambda: cache().append(x(2, 4, 1, 4), x(2, 4, 2, 4)), ValueError,
                 r"k_new and v_new must have the same shape, got \(2, 4, 1, 4\) and \(2, 4, 2, 4\)", id="append-kv-shape"),
    pytest.param(lambda: cache().append(x(1, 4, 1, 4), x(1, 4, 1, 4)), ValueError,
                 r"k_new has batch size 1 but the KVCache was built for batch_size 2", id="append-batch"),
    pytest.param(lambda: cache().append(x(2, 2, 1, 4), x(2, 2, 1, 4)), ValueError,
                 r"k_new has 2 key/value heads but the KVCache was built for n_kv_heads 4", id="append-heads"),
    pytest.param(lambda: cache().append(x(2, 4, 1, 5), x(2, 4, 1, 5)), ValueError,
                 r"k_new has head_dim 5 but the KVCache was built for head_dim 4", id="append-head_dim"),
    pytest.param(lambda: cache().append(x(2, 4, 1, 4, dtype=torch.float32), x(2, 4, 1, 4, dtype=torch.float32)),
                 TypeError, r"k_new has dtype torch\.float32 but the KVCache holds torch\.float64", id="append-dtype"),
    pytest.param(lambda: cache().append(x(2, 4, 1, 4), x(2, 4, 1, 4, dtype=torch.float32)), TypeError,
                 r"v_new must have the dtype of k_new", id="append-kv-dtype"),
    pytest.param(lambda: filled_cache(7).append(x(2, 4, 2, 4), x(2, 4, 2, 4)), ValueError,
                 r"KVCache overflow: 7 cached \+ 2 new > max_len 8", id="append-overflow"),
    pytest.param(lambda: KVCache(2, 8, 4, 4, window=0), ValueError, r"window must be an integer >= 1, got 0",
                 id="cache-window=0"),
    pytest.param(lambda: KVCache(2, 8, 4, 4, window=2.5), TypeError, r"window must be an integer >= 1, got 2\.5",
                 id="cache-window-float"),
    pytest.param(lambda: KVCache(2, 8, 4, 4, window=4, n_sink_tokens=-1), ValueError,
                 r"n_sink_tokens must be an integer in \[0, 3\], got -1", id="sink_tokens<0"),
    pytest.param(lambda: KVCache(2, 8, 4, 4, window=4, n_sink_tokens=4), ValueError,
                 r"n_sink_tokens must be an integer in \[0, 3\], got 4", id="sink_tokens>=window"),
    pytest.param(lambda: KVCache(2, 8, 4, 4, window=4, n_sink_tokens=1.0), TypeError,
                 r"n_sink_tokens must be an integer in \[0, 3\], got 1\.0 of type float", id="sink_tokens-float"),
    pytest.param(lambda: KVCache(2, 8, 4, 4, n_sink_tokens=2), ValueError,
                 r"n_sink_tokens needs a window \(a ring buffer\): got n_sink_tokens=2 with window=None",
                 id="sink_tokens-no-window"),
    pytest.param(lambda: setattr(ring_cache(7), "length", 3), ValueError,
                 r"length cannot be set back from 7 to 3 on a ring-buffer KVCache \(window=4\).* go back to 6",
                 id="ring-rewind"),
    pytest.param(lambda: cache().slot_positions(), ValueError, r"slot_positions is for ring-buffer caches",
                 id="slot_positions-full"),
]


def ring_cache(length):
    c = KVCache(2, 16, 4, 4, dtype=F64, window=4)
    c.append(x(2, 4, length, 4), x(2, 4, length, 4))
    return c


@pytest.mark.parametrize("thunk,exc_type,pattern", CASES)
def test_bad_input_raises_clear_error(thunk, exc_type, pattern):
    with pytest.raises(exc_type, match=pattern):
        thunk()
