"""Bad inputs to mha.reference: each row is a call, the exception type, and a regex the message must match
(the argument's name and the offending shape/value). Every input check must fire before any computation:
the ``no_compute`` fixture makes the projection and score helpers fail loudly if they are reached.
"""

import importlib
import pkgutil

import numpy as np
import pytest

from _params import replaced
from mha import reference as R

import test_promises_frontier_reference  # its table of issue 24's cases (today's models), run here too
import test_promises_reference  # its table of issue 22's cases, run here with these

D_MODEL, H, G, HD = 8, 4, 2, 2  # W_q (8, 8), W_k/W_v (8, 4), W_o (8, 8)
P = R.init_params(D_MODEL, H, G)
X = np.random.default_rng(0).standard_normal((2, 5, D_MODEL))
Q, K, V = np.ones((3, 4)), np.ones((5, 4)), np.ones((5, 6))


def with_params(**changes):
    """P with some entries replaced (value None = removed)."""
    return replaced(P, **changes)


def no_bias(**changes):
    p = {key: value for key, value in P.items() if key.startswith("W")}
    p.update(changes)
    return p


def mha(x_q=X, x_kv=None, params=P, n_heads=H, mask=None):
    return R.multi_head_attention(x_q, x_kv, params, n_heads, mask=mask)


def with_nan(a, value=np.nan):
    a = np.array(a, dtype=float)
    a.flat[3] = value
    return a


CASES = [
    # --- x_q / x_kv rank, width, batch, values --------------------------------------------------------------
    pytest.param(lambda: mha(x_q=np.ones(D_MODEL)), ValueError,
                 r"x_q must be 2-D \(L, d_model\) or 3-D \(N, L, d_model\), got shape \(8,\)", id="x_q-1d"),
    pytest.param(lambda: mha(x_q=np.ones((1, 2, 5, D_MODEL))), ValueError,
                 r"x_q must be 2-D .* got shape \(1, 2, 5, 8\)", id="x_q-4d"),
    pytest.param(lambda: mha(x_kv=np.ones((5, D_MODEL))), ValueError,
                 r"x_kv must have the same rank as x_q \(3-D, shape \(2, 5, 8\)\), got shape \(5, 8\)", id="x_kv-rank"),
    pytest.param(lambda: mha(x_q=np.ones((2, 5, 7))), ValueError,
                 r"x_q last dimension must be d_model = 8 .* got shape \(2, 5, 7\)", id="x_q-width"),
    pytest.param(lambda: mha(x_kv=np.ones((2, 3, 6))), ValueError,
                 r"x_kv last dimension must be d_model = 8 .* got shape \(2, 3, 6\)", id="x_kv-width"),
    pytest.param(lambda: mha(x_kv=np.ones((3, 5, D_MODEL))), ValueError,
                 r"x_kv batch size 3 must equal x_q batch size 2", id="batch-mismatch"),
    pytest.param(lambda: mha(x_q=with_nan(X)), ValueError, r"x_q contains NaN or inf", id="x_q-nan"),
    pytest.param(lambda: mha(x_kv=with_nan(X, np.inf)), ValueError, r"x_kv contains NaN or inf", id="x_kv-inf"),
    pytest.param(lambda: mha(x_q=X.astype(complex)), TypeError,
                 r"x_q must be a real numeric array, got dtype complex128", id="x_q-complex"),
    pytest.param(lambda: mha(x_q=np.ones((2, 0, D_MODEL))), ValueError,
                 r"x_q has an empty axis \(shape \(2, 0, 8\)\)", id="x_q-empty"),
    # --- params ---------------------------------------------------------------------------------------------
    pytest.param(lambda: mha(params=[P]), TypeError, r"params must be a dict", id="params-type"),
    pytest.param(lambda: mha(params=with_params(W_o=None)), ValueError,
                 r"params is missing key\(s\) \['W_o'\]", id="params-missing"),
    pytest.param(lambda: mha(params=with_params(Wq=P["W_q"])), ValueError,
                 r"params has unexpected key\(s\) \['Wq'\]", id="params-unknown"),
    pytest.param(lambda: mha(params=with_params(W_q=np.ones(8))), ValueError,
                 r"params\['W_q'\] must be a 2-D matrix, got shape \(8,\)", id="W_q-1d"),
    pytest.param(lambda: mha(params=with_params(W_k=np.ones((7, 4)), W_v=np.ones((7, 4)))), ValueError,
                 r"params\['W_k'\] must have d_model = 8 rows .* got shape \(7, 4\)", id="W_k-rows"),
    pytest.param(lambda: mha(params=with_params(W_v=np.ones((8, 2)))), ValueError,
                 r"params\['W_v'\] shape \(8, 2\) must equal params\['W_k'\] shape \(8, 4\)", id="W_v-vs-W_k"),
    pytest.param(lambda: mha(params=with_params(W_o=np.ones((6, 8)))), ValueError,
                 r"params\['W_o'\] must have shape \(h\*head_dim, d_model\) = \(8, 8\), got \(6, 8\)", id="W_o-rows"),
    pytest.param(lambda: mha(params=with_params(b_q=np.ones(7))), ValueError,
                 r"params\['b_q'\] must have shape \(8,\), got \(7,\)", id="b_q-len"),
    pytest.param(lambda: mha(params=with_params(b_k=np.ones(8))), ValueError,
                 r"params\['b_k'\] must have shape \(4,\), got \(8,\)", id="b_k-len"),
    pytest.param(lambda: mha(params=with_params(b_o=np.ones((1, 8)))), ValueError,
                 r"params\['b_o'\] must have shape \(8,\), got \(1, 8\)", id="b_o-shape"),
    pytest.param(lambda: mha(params=with_params(W_k=with_nan(P["W_k"]))), ValueError,
                 r"params\['W_k'\] contains NaN or inf", id="W_k-nan"),
    # --- n_heads / n_kv_heads -------------------------------------------------------------------------------
    pytest.param(lambda: mha(n_heads=3), ValueError,
                 r"n_heads = 3 must divide W_q's width h\*head_dim = 8", id="n_heads-divide"),
    pytest.param(lambda: mha(n_heads=0), ValueError, r"n_heads must be an integer >= 1, got 0", id="n_heads-0"),
    pytest.param(lambda: mha(n_heads=4.0), TypeError, r"n_heads must be an integer .* got 4\.0", id="n_heads-float"),
    pytest.param(lambda: mha(params=no_bias(W_k=np.ones((8, 3)), W_v=np.ones((8, 3)))), ValueError,
                 r"n_kv_heads = W_k width / head_dim = 3 / 2 is not an integer", id="n_kv_heads-fraction"),
    pytest.param(lambda: mha(params=no_bias(W_k=np.ones((8, 6)), W_v=np.ones((8, 6)))), ValueError,
                 r"n_kv_heads = 3 \(W_k width 6 / head_dim 2\) must divide n_heads = 4", id="n_kv_heads-divide"),
    # --- mask -----------------------------------------------------------------------------------------------
    pytest.param(lambda: mha(mask=np.ones((5, 5))), TypeError,
                 r"mask must be a boolean array \(True = may attend\), got dtype float64", id="mask-float"),
    pytest.param(lambda: mha(mask=np.ones((5, 5), dtype=int)), TypeError, r"mask .* got dtype int64", id="mask-int"),
    pytest.param(lambda: mha(mask=np.ones((5, 4), dtype=bool)), ValueError,
                 r"mask shape \(5, 4\) is not broadcastable to the attention weights shape \(2, 4, 5, 5\)",
                 id="mask-shape"),
    pytest.param(lambda: mha(mask=np.ones((3, 1, 1, 5), dtype=bool)), ValueError,
                 r"mask shape \(3, 1, 1, 5\) is not broadcastable .* \(2, 4, 5, 5\) \(N, h, L_q, L_kv\)", id="mask-N"),
    pytest.param(lambda: mha(mask=np.ones((2, 2, 4, 5, 5), dtype=bool)), ValueError,
                 r"mask shape \(2, 2, 4, 5, 5\) is not broadcastable", id="mask-extra-axis"),
    pytest.param(lambda: mha(x_q=X[0], mask=np.ones((2, 4, 5, 5), dtype=bool)), ValueError,
                 r"mask shape \(2, 4, 5, 5\) is not broadcastable .* \(4, 5, 5\) \(h, L_q, L_kv\)",
                 id="mask-unbatched"),
    # --- the other multi-head entry points share the checks ------------------------------------------------
    pytest.param(lambda: R.multi_head_attention_per_head(X, None, P, 3), ValueError,
                 r"n_heads = 3 must divide", id="per-head-n_heads"),
    pytest.param(lambda: R.head_weights(with_params(W_o=None), H), ValueError,
                 r"params is missing key\(s\) \['W_o'\]", id="head_weights-missing"),
    pytest.param(lambda: R.multi_head_attention_grad(X, None, P, H, np.ones((2, 5, 7))), ValueError,
                 r"grad_out shape \(2, 5, 7\) must equal the output shape \(2, 5, 8\)", id="grad_out-shape"),
    pytest.param(lambda: R.multi_head_attention_grad(X[0], None, P, H, np.ones((2, 5, 8))), ValueError,
                 r"grad_out shape \(2, 5, 8\) must equal the output shape \(5, 8\)", id="grad_out-unbatched"),
    pytest.param(lambda: R.multi_head_attention_grad(X, None, P, H, with_nan(X)), ValueError,
                 r"grad_out contains NaN or inf", id="grad_out-nan"),
    pytest.param(lambda: R.multi_head_attention_grad(X, np.ones((2, 3, 6)), P, H, X), ValueError,
                 r"x_kv last dimension must be d_model = 8", id="grad-x_kv-width"),
    # --- scaled_dot_product_attention and its gradient --------------------------------------------------------
    pytest.param(lambda: R.scaled_dot_product_attention(np.ones(4), K, V), ValueError,
                 r"q must have at least 2 axes \(\.\.\., L, d\), got shape \(4,\)", id="sdpa-q-1d"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, np.ones((5, 3)), V), ValueError,
                 r"q and k must share the last axis d_k: q shape \(3, 4\), k shape \(5, 3\)", id="sdpa-d_k"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, np.ones((6, 6))), ValueError,
                 r"k and v must share the key axis L_kv: k shape \(5, 4\), v shape \(6, 6\)", id="sdpa-L_kv"),
    pytest.param(lambda: R.scaled_dot_product_attention(np.ones((2, 3, 4)), np.ones((3, 5, 4)), np.ones((3, 5, 6))),
                 ValueError, r"leading \(batch\) axes of q \(2, 3, 4\), k \(3, 5, 4\), v \(3, 5, 6\) do not broadcast",
                 id="sdpa-batch"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, mask=np.ones((3, 4), dtype=bool)), ValueError,
                 r"mask shape \(3, 4\) is not broadcastable to the attention weights shape \(3, 5\)", id="sdpa-mask"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, mask=[[1, 0, 1, 0, 1]] * 3), TypeError,
                 r"mask must be a boolean array .* got dtype int64", id="sdpa-mask-list"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, scale="0.5"), TypeError,
                 r"scale must be a finite real number > 0, got '0\.5' of type str", id="sdpa-scale-str"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, scale=float("inf")), ValueError,
                 r"scale must be a finite real number .* got inf", id="sdpa-scale-inf"),
    pytest.param(lambda: R.scaled_dot_product_attention(with_nan(Q), K, V), ValueError,
                 r"q contains NaN or inf", id="sdpa-q-nan"),
    pytest.param(lambda: R.scaled_dot_product_attention_grad(Q, K, V, np.ones((3, 5))), ValueError,
                 r"grad_out shape \(3, 5\) must equal the output shape \(3, 6\)", id="sdpa-grad_out"),
    # --- online softmax ---------------------------------------------------------------------------------------
    pytest.param(lambda: R.online_softmax_attention(Q, K, V, 0), ValueError,
                 r"block_size must be an integer >= 1, got 0", id="block_size-0"),
    pytest.param(lambda: R.online_softmax_attention(Q, K, V, 1.5), TypeError,
                 r"block_size must be an integer >= 1, got 1\.5", id="block_size-float"),
    pytest.param(lambda: R.online_softmax_attention(Q, K, V, 2, mask=np.ones((5, 3), dtype=bool)), ValueError,
                 r"mask shape \(5, 3\) is not broadcastable .* \(3, 5\)", id="online-mask"),
    pytest.param(lambda: R.online_softmax_attention(Q, K, with_nan(V), 2), ValueError,
                 r"v contains NaN or inf", id="online-v-nan"),
    # --- softmax and its backward ----------------------------------------------------------------------------
    pytest.param(lambda: R.softmax(np.array([1.0, np.inf])), ValueError, r"x contains NaN or inf", id="softmax-inf"),
    pytest.param(lambda: R.softmax(np.ones((2, 3)), axis=2), ValueError,
                 r"axis \(for x of shape \(2, 3\)\) must be an integer in \[-2, 1\], got 2", id="softmax-axis"),
    pytest.param(lambda: R.softmax(np.ones((2, 3)), axis=1.0), TypeError,
                 r"axis .* must be an integer in \[-2, 1\], got 1\.0 of type float", id="softmax-axis-float"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, scale=0.0), ValueError,
                 r"scale must be a finite real number > 0, got 0\.0", id="sdpa-scale-0"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, is_causal=1), TypeError,
                 r"is_causal must be True or False, got 1", id="sdpa-is_causal-int"),
    pytest.param(lambda: R.softmax(np.ones((2, 3)), mask=np.ones(2, dtype=bool)), ValueError,
                 r"mask shape \(2,\) is not broadcastable .* \(2, 3\)", id="softmax-mask"),
    pytest.param(lambda: R.softmax_backward(np.ones((2, 3)), np.ones((3, 2))), ValueError,
                 r"grad_weights shape \(3, 2\) must equal weights shape \(2, 3\)", id="softmax-backward"),
]


COMPUTE_HELPERS = ("_linear", "_scores", "_masked_softmax",  # the arithmetic the functions reach first
                   "_rotate", "_rms_norm", "_rms_norm_grad")  # RoPE and RMSNorm (issue 24)


def reference_modules():
    """The modules of the package mha.reference (checks, masks, scaled_dot_product, multi_head, ...)."""
    return [importlib.import_module(f"{R.__name__}.{info.name}") for info in pkgutil.iter_modules(R.__path__)]


@pytest.fixture
def no_compute(monkeypatch):
    """Make any arithmetic helper fail: an input error must be raised before it is reached.

    A function finds a helper in the globals of its own module, so each helper is replaced in every module of the
    package that holds it (the one defining it and those importing it), not in ``mha.reference`` itself."""

    def reached(*args, **kwargs):
        raise AssertionError("computation started before the input was checked")

    for name in COMPUTE_HELPERS:
        holders = [module for module in reference_modules() if name in vars(module)]
        assert holders, f"no module of mha.reference defines {name}"
        for module in holders:
            monkeypatch.setattr(module, name, reached)


@pytest.mark.parametrize("call,exc,match", CASES + test_promises_reference.CASES
                         + test_promises_frontier_reference.CASES)
def test_bad_input_raises_clear_error_before_computing(no_compute, call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("call", [
    pytest.param(lambda: R.softmax(np.ones((2, 3))), id="softmax"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V), id="sdpa"),
    pytest.param(lambda: R.scaled_dot_product_attention_grad(Q, K, V, np.ones((3, 6))), id="sdpa-grad"),
    pytest.param(lambda: R.online_softmax_attention(Q, K, V, 2), id="online"),
    pytest.param(lambda: mha(), id="mha"),
    pytest.param(lambda: R.multi_head_attention_per_head(X, None, P, H), id="mha-per-head"),
    pytest.param(lambda: R.multi_head_attention_grad(X, None, P, H, X), id="mha-grad"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, sinks=0.0, softcap=5.0), id="sdpa-sinks-softcap"),
    pytest.param(lambda: R.scaled_dot_product_attention_grad(Q, K, V, np.ones((3, 6)), sinks=0.0),
                 id="sdpa-grad-sinks"),
    pytest.param(lambda: R.rope(Q, np.arange(3)), id="rope"),
    pytest.param(lambda: R.rope_backward(Q, np.arange(3)), id="rope-backward"),
    pytest.param(lambda: R.rms_norm(Q, np.ones(4)), id="rms_norm"),
    pytest.param(lambda: R.rms_norm_backward(Q, np.ones(4), Q), id="rms_norm-backward"),
    pytest.param(lambda: mha(params=R.init_params(D_MODEL, H, G, qk_norm=True, sinks=True)), id="mha-qk_norm-sinks"),
])
def test_no_compute_stops_every_function_on_valid_input(no_compute, call):
    """The fixture takes effect inside each function, so the test above would see a computation before a check."""
    with pytest.raises(AssertionError, match="computation started before the input was checked"):
        call()


def test_overflowing_scores_raise_instead_of_nan():
    big = np.full((2, 3), 1e200)
    with pytest.raises(ValueError, match=r"q @ k\^T \* scale overflowed float64"):
        R.scaled_dot_product_attention(big, big, big)
    with pytest.raises(ValueError, match=r"overflowed float64"):
        R.online_softmax_attention(big, big, big, block_size=1)


def test_valid_inputs_pass_the_checks():
    """The table's baseline inputs are valid: each error above comes from the one thing changed."""
    out, weights = mha()
    assert out.shape == X.shape and weights.shape == (2, H, 5, 5)
    assert R.scaled_dot_product_attention(Q, K, V)[0].shape == (3, 6)
    assert R.online_softmax_attention(Q, K, V, 2).shape == (3, 6)
    assert mha(params=no_bias())[0].shape == X.shape
    assert mha(mask=np.ones((5, 5), dtype=bool))[0].shape == X.shape
