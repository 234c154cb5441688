"""What the NumPy reference promises (issue 22, item 8).

The package's rule: a bad argument raises ``TypeError`` (wrong type) or ``ValueError`` (wrong value) naming the
argument, what it got and what was expected, before any computation. This file closes the gaps that
``tests/test_reference_errors.py`` left open in ``mha.reference`` and ``mha.counting``:

* ``softmax`` over an empty axis is undefined (ValueError); an empty *batch* axis is fine (an empty result).
* ``softmax_backward`` checks its arguments like ``softmax`` does, and that ``weights`` is a softmax output along
  the last axis (entries >= 0, rows summing to 1, or to 0 for a fully masked row): the formula
  ``A * (dA - rowsum(dA * A))`` is the gradient only at such a point, so anything else (the scores, weights
  normalised along another axis) would give a silently wrong gradient.
* ``init_params`` checks ``bias`` (True or False) and ``seed`` (an int >= 0, None or a numpy Generator).
* ``counting.param_count`` takes NumPy's bool for ``bias`` like every other flag, with the usual message.

Each table row is a call, the exception type and a regex the message must match (``test_reference_errors.py`` runs
them with its own rows, before any computation); the tests below the table check that the calls these checks let
through still give the right answer, against an independent computation.
"""

import numpy as np
import pytest
import torch

from mha import counting as C
from mha import reference as R

RNG = np.random.default_rng(22)
A = R.softmax(RNG.standard_normal((2, 3, 4)))  # valid weights: rows sum to 1
DA = RNG.standard_normal((2, 3, 4))
WRONG_AXIS = np.swapaxes(R.softmax(np.arange(6.0).reshape(2, 3)), 0, 1)  # (3, 2): columns sum to 1, rows do not


def with_entry(a, index, value):
    """A float copy of ``a`` with one entry replaced."""
    a = np.array(a, dtype=float)
    a[index] = value
    return a


CASES = [  # run by test_reference_errors.py
    # --- softmax over an empty axis ---------------------------------------------------------------------------
    pytest.param(lambda: R.softmax(np.ones((3, 0))), ValueError,
                 r"softmax over an empty axis is undefined: x has shape \(3, 0\) and axis -1 has length 0",
                 id="softmax-empty-last-axis"),
    pytest.param(lambda: R.softmax(np.ones(0)), ValueError,
                 r"softmax over an empty axis is undefined: x has shape \(0,\) and axis -1", id="softmax-empty-1d"),
    pytest.param(lambda: R.softmax(np.ones((0, 3)), axis=0), ValueError,
                 r"softmax over an empty axis is undefined: x has shape \(0, 3\) and axis 0 has length 0",
                 id="softmax-empty-axis-0"),
    # --- softmax_backward: types, values, shapes ------------------------------------------------------------
    pytest.param(lambda: R.softmax_backward(None, DA), TypeError,
                 r"weights must be a real numeric array, got dtype object", id="backward-weights-None"),
    pytest.param(lambda: R.softmax_backward(A, None), TypeError,
                 r"grad_weights must be a real numeric array, got dtype object", id="backward-grad-None"),
    pytest.param(lambda: R.softmax_backward([["0.5", "0.5"]], [[1.0, 2.0]]), TypeError,
                 r"weights must be a real numeric array, got dtype <U3", id="backward-weights-str"),
    pytest.param(lambda: R.softmax_backward(A.astype(complex), DA), TypeError,
                 r"weights must be a real numeric array, got dtype complex128", id="backward-weights-complex"),
    pytest.param(lambda: R.softmax_backward(A, DA > 0), TypeError,
                 r"grad_weights must be a real numeric array, got dtype bool", id="backward-grad-bool"),
    pytest.param(lambda: R.softmax_backward(with_entry(A, (0, 0, 1), np.nan), DA), ValueError,
                 r"weights contains NaN or inf", id="backward-weights-nan"),
    pytest.param(lambda: R.softmax_backward(A, with_entry(DA, (1, 2, 3), -np.inf)), ValueError,
                 r"grad_weights contains NaN or inf", id="backward-grad-inf"),
    pytest.param(lambda: R.softmax_backward(1.0, 2.0), ValueError,
                 r"weights must have at least 1 axis \(\.\.\., n\), got a scalar", id="backward-0d"),
    pytest.param(lambda: R.softmax_backward(np.ones((3, 0)), np.ones((3, 0))), ValueError,
                 r"softmax over an empty axis is undefined: weights has shape \(3, 0\)", id="backward-empty-axis"),
    # --- softmax_backward: weights must be a softmax output along the last axis -----------------------------
    pytest.param(lambda: R.softmax_backward(with_entry([[0.5, 0.5], [0.25, 0.75]], (1, 0), -0.25), np.ones((2, 2))),
                 ValueError, r"weights must be a softmax output along the last axis .* weights\[1, 0\] = -0\.25 < 0",
                 id="backward-negative"),
    pytest.param(lambda: R.softmax_backward(RNG.standard_normal((2, 3, 4)) ** 2, DA), ValueError,
                 r"weights must be a softmax output along the last axis .* weights\[0, 0, :\] sums to \d",
                 id="backward-scores-not-weights"),
    pytest.param(lambda: R.softmax_backward(WRONG_AXIS, np.ones((3, 2))), ValueError,
                 r"weights\[0, :\] sums to 0\.18.* \(rows failing: 3 of 3;", id="backward-normalised-along-wrong-axis"),
    pytest.param(lambda: R.softmax_backward(np.array([0.5, 0.5 + 1e-5]), np.ones(2)), ValueError,
                 r"weights\[:\] sums to 1\.00001 \(rows failing: 1 of 1; tolerance 1e-06\)",
                 id="backward-1d-off-by-1e-5"),
    pytest.param(lambda: R.softmax_backward(np.array([1e-300, 0.0]), np.ones(2)), ValueError,
                 r"weights\[:\] sums to 1e-300", id="backward-tiny-row-is-not-masked"),
    # --- init_params ------------------------------------------------------------------------------------------
    pytest.param(lambda: R.init_params(8, 2, bias="no"), TypeError,
                 r"bias must be True or False, got 'no' of type str", id="init-bias-str"),
    pytest.param(lambda: R.init_params(8, 2, bias=0), TypeError,
                 r"bias must be True or False, got 0 of type int", id="init-bias-int"),
    pytest.param(lambda: R.init_params(8, 2, bias=None), TypeError,
                 r"bias must be True or False, got None", id="init-bias-None"),
    pytest.param(lambda: R.init_params(8, 2, seed=True), TypeError,
                 r"seed must be an integer >= 0, None or a numpy Generator, got True of type bool",
                 id="init-seed-bool"),
    pytest.param(lambda: R.init_params(8, 2, seed=1.5), TypeError,
                 r"seed must be an integer >= 0, None or a numpy Generator, got 1\.5 of type float",
                 id="init-seed-float"),
    pytest.param(lambda: R.init_params(8, 2, seed="0"), TypeError,
                 r"seed must be .* got '0' of type str", id="init-seed-str"),
    pytest.param(lambda: R.init_params(8, 2, seed=[1, 2]), TypeError,
                 r"seed must be .* got \[1, 2\] of type list", id="init-seed-list"),
    pytest.param(lambda: R.init_params(8, 2, seed=-1), ValueError,
                 r"seed must be an integer >= 0, None or a numpy Generator, got -1", id="init-seed-negative"),
    # --- params dicts with keys of several types ---------------------------------------------------------------
    pytest.param(lambda: R.head_weights({**R.init_params(8, 2), 3: 1.0, "Wq": 1.0}, 2), ValueError,
                 r"params has unexpected key\(s\) \['Wq', 3\]", id="params-unknown-keys-mixed-types"),
    # --- counting ----------------------------------------------------------------------------------------------
    pytest.param(lambda: C.param_count(8, 2, bias="no"), TypeError,
                 r"bias must be True or False, got 'no' of type str", id="param_count-bias-str"),
]


# --- the calls these checks let through still give the right answer ----------------------------------------------


def test_softmax_of_an_empty_batch_is_empty():
    """An empty batch axis with a non-empty softmax axis gives an empty result, as torch.softmax does."""
    for shape, axis in (((0, 3), -1), ((2, 0, 3), -1), ((3, 0), 0), ((0, 4, 5), 1)):
        x = np.ones(shape)
        out = R.softmax(x, axis=axis)
        expected = torch.softmax(torch.tensor(x), dim=axis).numpy()
        assert out.shape == expected.shape == shape and out.dtype == np.float64
    assert R.softmax(np.ones((0, 3)), mask=np.ones(3, dtype=bool)).shape == (0, 3)


def test_softmax_still_matches_torch_on_non_empty_input():
    """The empty-axis check changes nothing for ordinary input: softmax equals torch.softmax on every axis."""
    x = RNG.standard_normal((2, 3, 5))
    for axis in range(-3, 3):
        np.testing.assert_allclose(R.softmax(x, axis=axis), torch.softmax(torch.tensor(x), dim=axis).numpy(),
                                   rtol=1e-14, atol=1e-16)


def torch_softmax_vjp(S, dA, mask=None):
    """dL/dS for L = sum(softmax(S) * dA), by torch autograd (masked entries filled with -inf, empty rows -> 0)."""
    S_t = torch.tensor(S, requires_grad=True)
    logits = S_t if mask is None else S_t.masked_fill(~torch.tensor(mask), float("-inf"))
    weights = torch.softmax(logits, dim=-1)
    weights = torch.nan_to_num(weights, nan=0.0)  # a fully masked row: NaN in torch, zero weights here
    weights.backward(torch.tensor(dA))
    return torch.nan_to_num(S_t.grad, nan=0.0).numpy()


def test_softmax_backward_matches_autograd_on_softmax_outputs():
    """On weights that are softmax outputs (masked entries, a fully masked row) the result equals autograd's VJP."""
    S, dA = 3 * RNG.standard_normal((2, 3, 4, 6)), RNG.standard_normal((2, 3, 4, 6))
    mask = RNG.random((4, 6)) < 0.6
    mask[:, 0], mask[2] = True, False  # every row but row 2 keeps a key; row 2 is fully masked
    for m in (None, mask):
        got = R.softmax_backward(R.softmax(S, mask=m), dA)
        np.testing.assert_allclose(got, torch_softmax_vjp(S, dA, m), rtol=1e-12, atol=1e-14)
    assert np.all(R.softmax_backward(R.softmax(S, mask=mask), dA)[..., 2, :] == 0)  # fully masked row: zero gradient


def test_softmax_backward_matches_a_finite_difference():
    """A central difference of L(S) = sum(softmax(S) * dA) agrees with softmax_backward (one row, every entry)."""
    s, da, h = RNG.standard_normal(5), RNG.standard_normal(5), 1e-6
    fd = [(np.sum(R.softmax(s + h * e) * da) - np.sum(R.softmax(s - h * e) * da)) / (2 * h) for e in np.eye(5)]
    np.testing.assert_allclose(R.softmax_backward(R.softmax(s), da), fd, rtol=1e-7, atol=1e-9)


def test_softmax_backward_accepts_lower_precision_and_one_hot_weights():
    """Rows summing to 1 within the input's rounding pass: float32 torch softmax of long rows, one-hot integer rows."""
    S = torch.randn(64, 4096, generator=torch.Generator().manual_seed(0)) * 5
    A32 = torch.softmax(S, dim=-1).numpy()  # float32: row sums off by up to ~n * 2^-23
    assert np.abs(A32.astype(np.float64).sum(axis=-1) - 1).max() > 1e-6  # a fixed 1e-6 tolerance would refuse it
    dA = RNG.standard_normal(A32.shape)
    np.testing.assert_allclose(R.softmax_backward(A32, dA), torch_softmax_vjp(S.double().numpy(), dA),
                               rtol=1e-3, atol=1e-8)  # float32 weights: float32 accuracy
    one_hot = np.eye(5, dtype=int)[[3, 0, 4]]  # saturated rows: the gradient is zero
    np.testing.assert_array_equal(R.softmax_backward(one_hot, RNG.standard_normal((3, 5))), 0.0)
    near = np.array([0.5, 0.5 + 1e-9])  # within 1e-6 of summing to 1
    np.testing.assert_allclose(R.softmax_backward(near, np.array([1.0, 0.0])), near * (np.array([1.0, 0.0]) - 0.5))


def test_softmax_backward_of_an_empty_batch_is_empty():
    """No rows, nothing to check and nothing to compute: an empty result of the same shape."""
    assert R.softmax_backward(np.ones((0, 3)), np.ones((0, 3))).shape == (0, 3)


def test_attention_gradient_still_matches_autograd():
    """scaled_dot_product_attention_grad (which calls softmax_backward) still equals autograd, with a causal mask."""
    q, k, v, dO = (RNG.standard_normal(s) for s in ((2, 5, 3), (2, 5, 3), (2, 5, 4), (2, 5, 4)))
    got = R.scaled_dot_product_attention_grad(q, k, v, dO, is_causal=True)
    q_t, k_t, v_t = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    torch.nn.functional.scaled_dot_product_attention(q_t, k_t, v_t, attn_mask=causal).backward(torch.tensor(dO))
    for g, t in zip(got, (q_t, k_t, v_t)):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_init_params_seed_and_bias_accept_what_the_repository_uses():
    """Python and NumPy ints, None and a Generator are seeds; True/False and NumPy's bools choose the biases."""
    p0 = R.init_params(8, 2, seed=0)
    for key, value in R.init_params(8, 2, seed=np.int64(0)).items():
        np.testing.assert_array_equal(value, p0[key])  # same seed, same draws
    np.testing.assert_array_equal(R.init_params(8, 2)["W_q"], p0["W_q"])  # the default seed is 0
    gen = np.random.default_rng(0)
    from_gen = R.init_params(8, 2, seed=gen)
    np.testing.assert_array_equal(from_gen["W_q"], p0["W_q"])  # a Generator is drawn from ...
    assert not np.array_equal(R.init_params(8, 2, seed=gen)["W_q"], p0["W_q"])  # ... and advances
    assert R.init_params(8, 2, seed=None)["W_q"].shape == (8, 8)
    assert set(R.init_params(8, 2, bias=np.bool_(False))) == {"W_q", "W_k", "W_v", "W_o"}


def test_param_count_takes_numpy_bools():
    """bias=np.bool_(...) counts like the Python bool (as check_bool accepts it everywhere else)."""
    assert C.param_count(8, 2, bias=np.bool_(True)) == C.param_count(8, 2, bias=True) == 4 * 64 + 4 * 8
    assert C.param_count(8, 2, bias=np.bool_(False)) == C.param_count(8, 2, bias=False) == 4 * 64
