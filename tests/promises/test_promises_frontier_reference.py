"""What the NumPy reference promises about the parts of today's models (issue 24, part I): RoPE, QK-norm, sliding
windows, soft-capping and sinks.

The package's rule holds for every new argument: a bad one raises ``TypeError`` (wrong type) or ``ValueError``
(wrong value) naming the argument, what it got and what was expected, before any computation. Each row of the table
is a call, the exception type and a regex the message must match; ``test_reference_errors.py`` runs them with its
own rows under its ``no_compute`` fixture (so a check that fired after the arithmetic started would fail there).
The tests below the table check the edge cases these checks let through.
"""

import numpy as np
import pytest

from _params import replaced
from mha import reference as R

RNG = np.random.default_rng(24)
D_MODEL, H, G = 8, 4, 2  # head_dim 2
P = R.init_params(D_MODEL, H, G, qk_norm=True, sinks=True)
P_ODD = R.init_params(6, 2, head_dim=3)  # head_dim 3: no RoPE
X = RNG.standard_normal((2, 5, D_MODEL))
X_KV = RNG.standard_normal((2, 3, D_MODEL))
Q, K, V = RNG.standard_normal((2, 4, 3, 6)), RNG.standard_normal((2, 4, 5, 6)), RNG.standard_normal((2, 4, 5, 2))
XR = RNG.standard_normal((2, 3, 5, 6))  # (N, h, L, d) for rope


def mha(x_q=X, x_kv=None, params=P, **kw):
    return R.multi_head_attention(x_q, x_kv, params, H, **kw)


def changed(**entries):
    """P with some entries replaced (value None = removed)."""
    return replaced(P, **entries)


CASES = [  # run by test_reference_errors.py
    # --- rope / rope_backward / rope_frequencies ----------------------------------------------------------------
    pytest.param(lambda: R.rope(RNG.standard_normal((2, 5, 5)), np.arange(5)), ValueError,
                 r"x's last axis d must be even \(RoPE rotates pairs of coordinates\), got shape \(2, 5, 5\)",
                 id="rope-odd-d"),
    pytest.param(lambda: R.rope(np.ones(6), [0]), ValueError,
                 r"x must have at least 2 axes \(\.\.\., L, d\), got shape \(6,\)", id="rope-1d"),
    pytest.param(lambda: R.rope(XR, np.arange(5.0)), TypeError,
                 r"positions must be integers \(absolute token positions\), got dtype float64", id="rope-float-pos"),
    pytest.param(lambda: R.rope(XR, np.arange(5) > 2), TypeError, r"positions must be integers .* got dtype bool",
                 id="rope-bool-pos"),
    pytest.param(lambda: R.rope(XR, np.arange(5) - 1), ValueError,
                 r"positions must be integers >= 0 \(absolute token positions\), got -1", id="rope-negative"),
    pytest.param(lambda: R.rope(XR, np.arange(4)), ValueError,
                 r"positions must have shape \(L,\) = \(5,\) or one broadcastable to \(2, 3, 5\) .* got shape \(4,\)",
                 id="rope-pos-length"),
    pytest.param(lambda: R.rope(XR, np.zeros((3, 1, 5), dtype=int)), ValueError,
                 r"positions must have shape \(L,\) = \(5,\) .* got shape \(3, 1, 5\)", id="rope-pos-broadcast"),
    pytest.param(lambda: R.rope(XR, 3), ValueError, r"positions must have shape \(L,\) .* got shape \(\)",
                 id="rope-pos-scalar"),
    pytest.param(lambda: R.rope(XR, np.arange(5), base=0.0), ValueError,
                 r"base must be a finite real number > 0, got 0\.0", id="rope-base-0"),
    pytest.param(lambda: R.rope(XR, np.arange(5), base="1e4"), TypeError,
                 r"base must be a finite real number > 0, got '1e4' of type str", id="rope-base-str"),
    pytest.param(lambda: R.rope(XR, np.arange(5), style="complex"), ValueError,
                 r"style must be one of 'half', 'interleaved', got 'complex'", id="rope-style"),
    pytest.param(lambda: R.rope(XR, np.arange(5), style=1), TypeError,
                 r"style must be one of 'half', 'interleaved', got 1 of type int", id="rope-style-int"),
    pytest.param(lambda: R.rope(np.full((2, 2), np.nan), [0, 1]), ValueError, r"x contains NaN or inf",
                 id="rope-nan"),
    pytest.param(lambda: R.rope_backward(RNG.standard_normal((5, 3)), np.arange(5)), ValueError,
                 r"grad's last axis d must be even", id="rope-backward-odd"),
    pytest.param(lambda: R.rope_backward(XR, np.arange(6)), ValueError,
                 r"positions must have shape \(L,\) = \(5,\)", id="rope-backward-pos"),
    pytest.param(lambda: R.rope_frequencies(7), ValueError,
                 r"d must be even \(RoPE rotates pairs of coordinates\), got 7", id="freq-odd"),
    pytest.param(lambda: R.rope_frequencies(0), ValueError, r"d must be an integer >= 1, got 0", id="freq-0"),
    pytest.param(lambda: R.rope_frequencies(8, base=-2), ValueError, r"base must be a finite real number > 0, got -2",
                 id="freq-base"),
    # --- rms_norm / rms_norm_backward ----------------------------------------------------------------------------
    pytest.param(lambda: R.rms_norm(XR, np.ones(5)), ValueError,
                 r"weight must have shape \(d,\) = \(6,\) \(x's last axis\), got \(5,\)", id="rms-weight-shape"),
    pytest.param(lambda: R.rms_norm(XR, np.ones(6), eps=0.0), ValueError,
                 r"eps must be a finite real number > 0, got 0\.0", id="rms-eps-0"),
    pytest.param(lambda: R.rms_norm(XR, np.ones(6), eps=None), TypeError,
                 r"eps must be a finite real number > 0, got None", id="rms-eps-None"),
    pytest.param(lambda: R.rms_norm(XR, np.full(6, np.inf)), ValueError, r"weight contains NaN or inf",
                 id="rms-weight-inf"),
    pytest.param(lambda: R.rms_norm(3.0, np.ones(1)), ValueError, r"x must have at least 1 axis", id="rms-scalar"),
    pytest.param(lambda: R.rms_norm_backward(XR, np.ones(6), np.ones((2, 3, 5, 5))), ValueError,
                 r"grad shape \(2, 3, 5, 5\) must equal x shape \(2, 3, 5, 6\)", id="rms-backward-grad"),
    # --- sliding_window_mask ---------------------------------------------------------------------------------------
    pytest.param(lambda: R.sliding_window_mask(4, 4, 0), ValueError, r"window must be an integer >= 1, got 0",
                 id="swm-window-0"),
    pytest.param(lambda: R.sliding_window_mask(4, 4, 2.0), TypeError,
                 r"window must be an integer >= 1, got 2\.0 of type float", id="swm-window-float"),
    pytest.param(lambda: R.sliding_window_mask(4, 4, True), TypeError, r"window must be an integer .* got True",
                 id="swm-window-bool"),
    pytest.param(lambda: R.sliding_window_mask(0, 4, 2), ValueError, r"l_q must be an integer >= 1, got 0",
                 id="swm-l_q"),
    # --- scaled_dot_product_attention and its gradient: sinks, window, softcap --------------------------------------
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, window=0), ValueError,
                 r"window must be an integer >= 1, got 0", id="sdpa-window-0"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, softcap=0.0), ValueError,
                 r"softcap must be a finite real number > 0, got 0\.0", id="sdpa-softcap-0"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, softcap=-30), ValueError,
                 r"softcap must be a finite real number > 0, got -30", id="sdpa-softcap-negative"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, softcap=float("nan")), ValueError,
                 r"softcap must be a finite real number > 0, got nan", id="sdpa-softcap-nan"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, softcap="50"), TypeError,
                 r"softcap must be a finite real number > 0, got '50' of type str", id="sdpa-softcap-str"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, sinks=np.zeros(3)), ValueError,
                 r"sinks shape \(3,\) is not broadcastable to the leading axes \(2, 4\) of q, k, v", id="sdpa-sinks"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, sinks=np.zeros((2, 4, 3))), ValueError,
                 r"sinks shape \(2, 4, 3\) is not broadcastable to the leading axes \(2, 4\)", id="sdpa-sinks-rank"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, sinks=np.array([0.0, np.nan, 0.0, 0.0])),
                 ValueError, r"sinks contains NaN or inf", id="sdpa-sinks-nan"),
    pytest.param(lambda: R.scaled_dot_product_attention(Q, K, V, sinks=["a"] * 4), TypeError,
                 r"sinks must be a real numeric array, got dtype <U1", id="sdpa-sinks-str"),
    pytest.param(lambda: R.scaled_dot_product_attention_grad(Q, K, V, np.ones((2, 4, 3, 2)), sinks=np.zeros(5)),
                 ValueError, r"sinks shape \(5,\) is not broadcastable", id="sdpa-grad-sinks"),
    pytest.param(lambda: R.scaled_dot_product_attention_grad(Q, K, V, np.ones((2, 4, 3, 2)), window=-1), ValueError,
                 r"window must be an integer >= 1, got -1", id="sdpa-grad-window"),
    pytest.param(lambda: R.scaled_dot_product_attention_grad(Q, K, V, np.ones((2, 4, 3, 3)), softcap=5.0),
                 ValueError, r"grad_out shape \(2, 4, 3, 3\) must equal the output shape", id="sdpa-grad-grad_out"),
    # --- the layer: params of today's models ----------------------------------------------------------------------
    pytest.param(lambda: mha(params=changed(k_norm=None)), ValueError,
                 r"params has 'q_norm' but not 'k_norm'; QK-norm normalises both q and k: give both \(shape "
                 r"\(head_dim,\) = \(2,\)\) or neither", id="q_norm-without-k_norm"),
    pytest.param(lambda: mha(params=changed(q_norm=None)), ValueError, r"params has 'k_norm' but not 'q_norm'",
                 id="k_norm-without-q_norm"),
    pytest.param(lambda: mha(params=changed(q_norm=np.ones(8), k_norm=np.ones(8))), ValueError,
                 r"params\['q_norm'\] must have shape \(head_dim,\) = \(2,\), got \(8,\)", id="q_norm-shape"),
    pytest.param(lambda: mha(params=changed(sinks=np.zeros(2))), ValueError,
                 r"params\['sinks'\] must have shape \(n_heads,\) = \(4,\), got \(2,\)", id="params-sinks-shape"),
    pytest.param(lambda: mha(params=changed(sinks=np.array([0.0, np.nan, 0.0, 0.0]))), ValueError,
                 r"params\['sinks'\] contains NaN or inf", id="params-sinks-nan"),
    pytest.param(lambda: mha(params=changed(k_norm=np.array(["1", "1"]))), TypeError,
                 r"params\['k_norm'\] must be a real numeric array", id="params-k_norm-str"),
    pytest.param(lambda: R.multi_head_attention_per_head(X, None, P, H), ValueError,
                 r"multi_head_attention_per_head computes the plain layer, but params has \['q_norm', 'k_norm', "
                 r"'sinks'\]", id="per-head-refuses-new-params"),
    # --- the layer: keywords ----------------------------------------------------------------------------------------
    pytest.param(lambda: R.multi_head_attention(X[..., :6], None, P_ODD, 2, rope_base=10000.0), ValueError,
                 r"RoPE rotates pairs of coordinates: head_dim must be even, got head_dim = 3", id="layer-rope-odd"),
    pytest.param(lambda: mha(rope_base=10000.0, positions=np.arange(5.0)), TypeError,
                 r"positions must be integers \(absolute token positions\), got dtype float64", id="layer-pos-float"),
    pytest.param(lambda: mha(rope_base=10000.0, positions=np.arange(5) - 2), ValueError,
                 r"positions must be integers >= 0 .* got -2", id="layer-pos-negative"),
    pytest.param(lambda: mha(rope_base=10000.0, positions=np.arange(6)), ValueError,
                 r"positions must have shape \(L,\) = \(5,\) or one broadcastable to \(2, 5\) \(N, L\), got shape "
                 r"\(6,\)", id="layer-pos-length"),
    pytest.param(lambda: mha(rope_base=10000.0, positions=np.zeros((3, 5), dtype=int)), ValueError,
                 r"positions must have shape .* \(2, 5\) \(N, L\), got shape \(3, 5\)", id="layer-pos-batch"),
    pytest.param(lambda: mha(x_q=X[0], rope_base=10000.0, positions=np.zeros((1, 5), dtype=int)), ValueError,
                 r"positions must have shape \(L,\) = \(5,\) or one broadcastable to \(5,\) \(L,\)",
                 id="layer-pos-unbatched"),
    pytest.param(lambda: mha(positions=np.arange(5)), ValueError,
                 r"positions is given but rope_base is None: positions are used only by RoPE", id="pos-without-rope"),
    pytest.param(lambda: mha(x_kv=X_KV, rope_base=10000.0), ValueError,
                 r"RoPE in cross-attention \(x_kv given\) needs positions=\(positions_q, positions_kv\).*got "
                 r"positions=None", id="cross-rope-no-positions"),
    pytest.param(lambda: mha(x_kv=X_KV, rope_base=10000.0, positions=np.arange(5)), TypeError,
                 r"RoPE in cross-attention .* got ndarray", id="cross-rope-one-array"),
    pytest.param(lambda: mha(x_kv=X_KV, rope_base=10000.0, positions=(np.arange(5),)), ValueError,
                 r"RoPE in cross-attention .* got a tuple of length 1", id="cross-rope-one-tuple"),
    pytest.param(lambda: mha(x_kv=X_KV, rope_base=10000.0, positions=(np.arange(5), np.arange(5))), ValueError,
                 r"positions\[1\] \(keys\) must have shape \(L,\) = \(3,\)", id="cross-rope-kv-length"),
    pytest.param(lambda: mha(rope_base=0), ValueError, r"rope_base must be a finite real number > 0, got 0",
                 id="layer-rope-base-0"),
    pytest.param(lambda: mha(rope_base="10000"), TypeError, r"rope_base must be a finite real number > 0, got '10000'",
                 id="layer-rope-base-str"),
    pytest.param(lambda: mha(rope_style="rotate_half"), ValueError,
                 r"rope_style must be one of 'half', 'interleaved', got 'rotate_half'", id="layer-rope-style"),
    pytest.param(lambda: mha(window=0), ValueError, r"window must be an integer >= 1, got 0", id="layer-window-0"),
    pytest.param(lambda: mha(window=2.5), TypeError, r"window must be an integer >= 1, got 2\.5", id="layer-window"),
    pytest.param(lambda: mha(softcap=0), ValueError, r"softcap must be a finite real number > 0, got 0",
                 id="layer-softcap-0"),
    pytest.param(lambda: mha(softcap=np.inf), ValueError, r"softcap must be a finite real number > 0, got inf",
                 id="layer-softcap-inf"),
    pytest.param(lambda: mha(qk_norm_eps=0.0), ValueError, r"qk_norm_eps must be a finite real number > 0, got 0\.0",
                 id="layer-eps-0"),
    pytest.param(lambda: mha(qk_norm_eps="1e-6"), TypeError, r"qk_norm_eps must be a finite real number > 0",
                 id="layer-eps-str"),
    pytest.param(lambda: mha(scale=-1.0), ValueError, r"scale must be a finite real number > 0, got -1\.0",
                 id="layer-scale"),
    pytest.param(lambda: R.multi_head_attention_grad(X, None, P, H, X, rope_base=10000.0, positions=[0, 1]),
                 ValueError, r"positions must have shape \(L,\) = \(5,\)", id="grad-positions"),
    pytest.param(lambda: R.multi_head_attention_grad(X, None, P, H, X, softcap=-1.0), ValueError,
                 r"softcap must be a finite real number > 0", id="grad-softcap"),
    # --- init_params ------------------------------------------------------------------------------------------------
    pytest.param(lambda: R.init_params(8, 2, qk_norm="yes"), TypeError, r"qk_norm must be True or False, got 'yes'",
                 id="init-qk_norm"),
    pytest.param(lambda: R.init_params(8, 2, sinks=1), TypeError, r"sinks must be True or False, got 1 of type int",
                 id="init-sinks"),
]


# --- the edge cases these checks let through ----------------------------------------------------------------------


def test_positions_accept_python_lists_and_every_integer_dtype():
    """Positions are any integers >= 0: a list, int32, uint8, and very large ones, all give the same rotation."""
    x = RNG.standard_normal((3, 4))
    expected = R.rope(x, np.array([0, 5, 9], dtype=np.int64))
    for positions in ([0, 5, 9], np.array([0, 5, 9], dtype=np.int32), np.array([0, 5, 9], dtype=np.uint8)):
        np.testing.assert_array_equal(R.rope(x, positions), expected)
    assert np.all(np.isfinite(R.rope(x, [10**9, 10**12, 2**52])))


def test_window_and_is_causal_together_and_apart_are_the_same():
    """A window implies causal attention: is_causal=True adds nothing to it."""
    for is_causal in (False, True):
        got = mha(window=2, is_causal=is_causal)
        np.testing.assert_array_equal(got[0], mha(window=2)[0])
        np.testing.assert_array_equal(got[1], mha(window=2)[1])


def test_queries_with_no_key_and_sinks_give_a_zero_head_and_finite_gradients():
    """L_q > L_kv with is_causal: the first queries see no key; with sinks their rows are all on the sink, the head
    output is zero and every gradient is finite (nothing divides by zero)."""
    x_q = RNG.standard_normal((2, 6, D_MODEL))
    out, weights = R.multi_head_attention(x_q, X_KV, P, H, is_causal=True)
    assert np.all(weights[:, :, :3] == 0)
    np.testing.assert_allclose(out[:, :3], np.broadcast_to(P["b_o"], (2, 3, D_MODEL)), rtol=1e-14, atol=1e-14)
    grads = R.multi_head_attention_grad(x_q, X_KV, P, H, np.ones_like(x_q), is_causal=True)
    assert all(np.all(np.isfinite(g)) for g in grads.values())
    assert np.all(grads["x_q"][:, :3] == 0)


def test_huge_scores_with_a_small_softcap_or_sinks_stay_finite():
    """Scores of 1e200 overflow nothing: tanh saturates, the sink joins after the row max is subtracted."""
    q = np.full((2, 3), 1e100)
    for kw in (dict(softcap=1e-300), dict(sinks=np.float64(5.0)), dict(softcap=1e-300, sinks=np.float64(5.0))):
        out, weights = R.scaled_dot_product_attention(q, q, np.ones((2, 3)), **kw)
        assert np.all(np.isfinite(out)) and np.all(np.isfinite(weights)), kw
