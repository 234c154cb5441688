"""The NumPy reference and the torch module do the same job the same way: same argument names, order and defaults,
the same causal alignment, the same errors for the same bad input."""

import inspect

import numpy as np
import pytest
import torch

from mha import MultiHeadAttention
from mha import reference as R

torch.set_num_threads(1)


def layer_and_params(h=4, g=2, d=16, seed=0):
    torch.manual_seed(seed)
    layer = MultiHeadAttention(d, h, n_kv_heads=g).double()
    return layer, layer.export_params()


def test_signatures_agree():
    """mask, is_causal, need_weights, positions: the same names, in the same order, with the same defaults."""
    ours = inspect.signature(MultiHeadAttention.forward).parameters
    ref = inspect.signature(R.multi_head_attention).parameters
    shared = [name for name in ours if name in ref]
    assert shared == ["x_q", "x_kv", "mask", "is_causal", "need_weights", "positions"]
    assert [name for name in ref if name in ours] == shared
    for name in ("mask", "is_causal", "need_weights", "positions"):
        assert ours[name].default == ref[name].default, name
    for fn in (R.scaled_dot_product_attention, R.scaled_dot_product_attention_grad, R.online_softmax_attention,
               R.multi_head_attention_per_head, R.multi_head_attention_grad):
        assert inspect.signature(fn).parameters["is_causal"].default is False, fn.__name__


@pytest.mark.parametrize("l_q, l_kv", [(5, 5), (3, 7), (7, 3), (1, 6)])
def test_causal_alignment_agrees(l_q, l_kv):
    """Bottom-right: query i sees key j <= l_kv - l_q + i, checked entry by entry; reference and module give the
    same outputs and weights (rows with no allowed key: zero weights, output b_o, in both)."""
    expected = np.array([[j <= l_kv - l_q + i for j in range(l_kv)] for i in range(l_q)])
    np.testing.assert_array_equal(R.causal_mask(l_q, l_kv), expected)
    layer, params = layer_and_params()
    rng = np.random.default_rng(1)
    x_q, x_kv = rng.standard_normal((2, l_q, 16)), rng.standard_normal((2, l_kv, 16))
    out_ref, w_ref = R.multi_head_attention(x_q, x_kv, params, 4, is_causal=True)
    out_mask, w_mask = R.multi_head_attention(x_q, x_kv, params, 4, mask=expected)
    np.testing.assert_array_equal(out_ref, out_mask)
    for impl in ("sdpa", "naive"):
        layer.impl = impl
        with torch.no_grad():
            out, w = layer(torch.from_numpy(x_q), torch.from_numpy(x_kv), is_causal=True)
        np.testing.assert_allclose(out.numpy(), out_ref, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(w.numpy(), w_ref, rtol=1e-10, atol=1e-12)
    assert np.all(w_ref[:, :, ~expected.any(axis=1)] == 0)
    out_sdpa, _ = R.scaled_dot_product_attention(x_q, x_kv, x_kv, is_causal=True)
    np.testing.assert_array_equal(out_sdpa, R.scaled_dot_product_attention(x_q, x_kv, x_kv, mask=expected)[0])
    np.testing.assert_allclose(R.online_softmax_attention(x_q, x_kv, x_kv, 2, is_causal=True), out_sdpa, atol=1e-14)


def test_need_weights_false_returns_none_in_both():
    layer, params = layer_and_params()
    x = np.random.default_rng(2).standard_normal((2, 5, 16))
    out_ref, none_ref = R.multi_head_attention(x, None, params, 4, need_weights=False)
    out, none = layer(torch.from_numpy(x), need_weights=False)
    assert none_ref is None and none is None
    np.testing.assert_allclose(out.detach().numpy(), out_ref, rtol=1e-10, atol=1e-12)
    assert R.multi_head_attention_per_head(x, None, params, 4, need_weights=False)[1] is None


BAD = [  # (what is wrong, keyword arguments for both, expected exception)
    ("scale 0", dict(scale=0.0), ValueError),
    ("scale negative", dict(scale=-1.0), ValueError),
    ("scale nan", dict(scale=float("nan")), ValueError),
    ("scale a string", dict(scale="0.5"), TypeError),
    ("is_causal an int", dict(is_causal=1), TypeError),
    ("need_weights a string", dict(need_weights="yes"), TypeError),
    ("mask of ints", dict(mask="int-mask"), TypeError),
    ("mask of a wrong shape", dict(mask="bad-shape"), ValueError),
    ("x_q of rank 1", dict(x_q="rank-1"), ValueError),
    ("x_q of another width", dict(x_q="wrong-width"), ValueError),
    ("x_kv of another rank", dict(x_kv="rank-2"), ValueError),
]


def _call_reference(layer, params, case):
    x = np.ones((2, 5, 16))
    kwargs = dict(case)
    scale = kwargs.pop("scale", None)
    x_q, x_kv = kwargs.pop("x_q", x), kwargs.pop("x_kv", None)
    x_q = {"rank-1": np.ones(16), "wrong-width": np.ones((2, 5, 15))}.get(x_q, x_q) if isinstance(x_q, str) else x_q
    x_kv = np.ones((5, 16)) if x_kv == "rank-2" else x_kv
    mask = kwargs.pop("mask", None)
    mask = {"int-mask": np.ones((5, 5), dtype=int), "bad-shape": np.ones((3, 5), dtype=bool)}.get(mask, mask)
    if scale is not None:  # the scale belongs to the attention core in the reference, to the module in torch
        return R.scaled_dot_product_attention(np.ones((5, 4)), np.ones((5, 4)), np.ones((5, 4)), scale=scale)
    return R.multi_head_attention(x_q, x_kv, params, 4, mask=mask, **kwargs)


def _call_module(case):
    kwargs = dict(case)
    if "scale" in kwargs:
        return MultiHeadAttention(16, 4, scale=kwargs["scale"])
    layer, _ = layer_and_params()
    x = torch.ones(2, 5, 16, dtype=torch.float64)
    x_q, x_kv = kwargs.pop("x_q", x), kwargs.pop("x_kv", None)
    if isinstance(x_q, str):
        x_q = {"rank-1": torch.ones(16), "wrong-width": torch.ones(2, 5, 15)}[x_q].double()
    x_kv = torch.ones(5, 16, dtype=torch.float64) if x_kv == "rank-2" else x_kv
    mask = kwargs.pop("mask", None)
    mask = {"int-mask": torch.ones(5, 5, dtype=torch.long), "bad-shape": torch.ones(3, 5, dtype=torch.bool)}.get(
        mask, mask)
    return layer(x_q, x_kv, mask=mask, **kwargs)


@pytest.mark.parametrize("what, case, error", BAD, ids=[b[0] for b in BAD])
def test_the_same_bad_input_gets_the_same_error(what, case, error):
    layer, params = layer_and_params()
    with pytest.raises(error) as from_reference:
        _call_reference(layer, params, case)
    with pytest.raises(error) as from_module:
        _call_module(case)
    name = next(iter(case))  # the argument's name is in both messages
    assert name in str(from_reference.value) and name in str(from_module.value), (from_reference, from_module)
