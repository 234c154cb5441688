"""Checkers of one head's attention: the softmax, scaled dot-product attention, and attention one key block at a
time (the online softmax).

Book: part I, 'Scaled dot-product attention' and 'Why divide by √dₖ'; part II, 'Exact attention without the L × L
matrix'.
"""

from __future__ import annotations

import numpy as np

from mha import reference
from mha.exercises.catalogue import EQ_MASKED_SOFTMAX, EQ_ONLINE, EQ_SDPA, EQ_SOFTMAX
from mha.exercises.runner import (TIMEOUT, Case, Output, mask_and_scale, padding_mask, public_checker, row_with_no_key,
                                  run_cases, shapes_of, transposed)
from mha.exercises.simulators import online_variants, sdpa_variants, softmax_variants


# ---------------------------------------------------------------------------------------------------------------
# check_softmax
# ---------------------------------------------------------------------------------------------------------------


def _softmax_case(name, x, axis, note=""):
    expected = (reference.softmax(x, axis=axis),)
    return Case(name, (x,), {"axis": axis}, expected, softmax_variants(x, axis), note)


@public_checker
def check_softmax(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(x, axis=-1)``: the softmax of ``x`` along ``axis``, safe for any finite logits.

    Cases: a vector, a square matrix, the middle axis of a 3-D array, axis 0, logits near +1000, rows near 0 and near
    -1000 together, a batch of one, a non-contiguous input. Book: part I, 'Scaled dot-product attention'
    (Eq. sdpa-softmax and Lemma sdpa-lem-shift); the safe softmax: part II, 'Exact attention without the L × L
    matrix' (Eq. online-safe).
    """
    rng = np.random.default_rng(101)
    rows_far_apart = rng.standard_normal((2, 5))
    rows_far_apart[1] -= 1000.0
    cases = [
        _softmax_case("x (6,), axis=-1", rng.standard_normal(6), -1),
        _softmax_case("x (4, 4), axis=-1: a square matrix", rng.standard_normal((4, 4)), -1),
        _softmax_case("x (3, 5), axis=-1", rng.standard_normal((3, 5)), -1),
        _softmax_case("x (2, 3, 4), axis=1: the middle axis", rng.standard_normal((2, 3, 4)), 1),
        _softmax_case("x (3, 4), axis=0", rng.standard_normal((3, 4)), 0),
        _softmax_case("x (2, 5), axis=-1, large logits: every entry near +1000", 1000 + 3 * rng.standard_normal((2, 5)),
                      -1, "exp(1000) overflows float64 (the limit is about exp(709))."),
        _softmax_case("x (2, 5), axis=-1: row 0 near 0, row 1 near -1000", rows_far_apart, -1,
                      "exp(-1000) underflows to 0 in float64, so row 1 needs its own shift."),
        _softmax_case("x (1, 7), axis=-1: a batch of one", rng.standard_normal((1, 7)), -1),
        _softmax_case("x (5, 3), axis=-1, non-contiguous (a transposed view)",
                      np.swapaxes(rng.standard_normal((3, 5)), 0, 1), -1),
    ]
    output = Output("softmax", "exp(x_i - max x) / sum_j exp(x_j - max x) along axis", EQ_SOFTMAX)
    run_cases("check_softmax", fn, backend, ("x",), (output,), cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_scaled_dot_product_attention
# ---------------------------------------------------------------------------------------------------------------


_SDPA_OUTPUTS = (
    Output("out", "softmax(QK^T/sqrt(d_k)) V", EQ_SDPA),
    Output("weights", "softmax(QK^T/sqrt(d_k)) (masked entries 0, rows with no allowed key all 0)", EQ_MASKED_SOFTMAX),
)


def _sdpa_case(label, q, k, v, mask=None, scale=None, note=""):
    options, kwargs = mask_and_scale(mask, scale)
    expected = reference.scaled_dot_product_attention(q, k, v, mask, scale)
    return Case(f"{label}: {shapes_of(q=q, k=k, v=v)}{options}", (q, k, v), kwargs, expected,
                sdpa_variants(q, k, v, mask, scale), note)


@public_checker
def check_scaled_dot_product_attention(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(q, k, v, mask=None, scale=None) -> (out, weights)``, as ``reference.scaled_dot_product_attention``.

    q ``(..., L_q, d_k)``, k ``(..., L_kv, d_k)``, v ``(..., L_kv, d_v)``; ``mask`` boolean, True = may attend,
    broadcastable to ``(..., L_q, L_kv)``; ``scale`` defaults to ``1/sqrt(d_k)``. A query row with no allowed key gets
    zero weights and a zero output. Cases: 2-D and 4-D inputs, L_q != L_kv, d_v != d_k, an explicit scale, causal and
    padding masks, a fully masked row, large logits, a batch of one with one query, non-contiguous inputs.

    Book: part I, 'Scaled dot-product attention' (Eqs. sdpa-attention, sdpa-masked-softmax); the scale: part I,
    'Why divide by √dₖ'.
    """
    rng = np.random.default_rng(202)
    r = rng.standard_normal
    batched = "The first case with batch axes: transpose only the last two axes of k (np.swapaxes(k, -1, -2), " \
              "k.transpose(-2, -1)); k.T reverses all of them. Matrix products act on the last two axes."
    cases = [
        _sdpa_case("no batch axes, L_q != L_kv, d_v != d_k", r((4, 8)), r((6, 8)), r((6, 5))),
        _sdpa_case("batch and head axes", r((2, 3, 5, 8)), r((2, 3, 7, 8)), r((2, 3, 7, 6)), note=batched),
        _sdpa_case("explicit scale", r((2, 5, 6)), r((2, 4, 6)), r((2, 4, 3)), scale=0.3),
        _sdpa_case("causal mask", r((2, 5, 8)), r((2, 5, 8)), r((2, 5, 4)), mask=reference.causal_mask(5, 5),
                   note="mask[i, j] = True means query i may attend to key j."),
        _sdpa_case("padding mask (lengths 7 and 3), broadcast over heads and queries", r((2, 2, 4, 8)),
                   r((2, 2, 7, 8)), r((2, 2, 7, 8)), mask=padding_mask([7, 3], 7),
                   note="The mask has shape (N, 1, 1, L_kv): it broadcasts over the heads and the queries."),
        _sdpa_case("query row 2 has no allowed key", r((4, 8)), r((5, 8)), r((5, 3)),
                   mask=row_with_no_key(rng, (4, 5), 2),
                   note="A row with no allowed key must give zero weights and a zero output row (the book's "
                        "convention), never NaN and never uniform weights."),
        _sdpa_case("large logits (scaled scores in the thousands)", 40 * r((3, 8)), 40 * r((6, 8)), r((6, 4)),
                   note="exp of a score above about 709 overflows float64: subtract the row maximum first."),
        _sdpa_case("a batch of one, one head, one query", r((1, 1, 1, 4)), r((1, 1, 3, 4)), r((1, 1, 3, 4))),
        _sdpa_case("non-contiguous q, k, v (transposed views)", transposed(r((2, 3, 5, 8))),
                   transposed(r((2, 3, 6, 8))), transposed(r((2, 3, 6, 4))), mask=reference.causal_mask(5, 6)),
    ]
    run_cases("check_scaled_dot_product_attention", fn, backend, ("q", "k", "v"), _SDPA_OUTPUTS, cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_online_softmax_attention
# ---------------------------------------------------------------------------------------------------------------


def _online_case(label, q, k, v, block_size, mask=None, scale=None, note=""):
    options, kwargs = mask_and_scale(mask, scale)
    expected = (reference.scaled_dot_product_attention(q, k, v, mask, scale)[0],)  # the naive form: o = A V
    return Case(f"{label}: {shapes_of(q=q, k=k, v=v)}, block_size={block_size}{options}", (q, k, v, block_size),
                kwargs, expected, online_variants(q, k, v, block_size, mask, scale), note)


@public_checker
def check_online_softmax_attention(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(q, k, v, block_size, mask=None, scale=None) -> out``: attention computed one key block at a time.

    Same arguments and conventions as ``check_scaled_dot_product_attention`` plus ``block_size``; returns only ``out``,
    which must equal ``softmax(QK^T/sqrt(d_k)) V`` computed in one piece (rows with no allowed key: 0). The checker
    cannot see whether you store the full score matrix; it checks the result on cases that expose the recurrence:
    L_kv a multiple of block_size and not, block_size 1 and larger than L_kv, batch axes with an explicit scale, a
    causal mask, queries whose first key block is fully masked and a query with no allowed key, large logits, a batch
    of one, non-contiguous inputs.

    Book: part II, 'Exact attention without the L × L matrix' (Eqs. online-rec-m, online-rec-l, online-rec-acc,
    online-final, online-matrix).
    """
    rng = np.random.default_rng(808)
    r = rng.standard_normal
    first_block_masked = np.ones((4, 6), dtype=bool)
    first_block_masked[0, :2] = False  # query 0: nothing allowed in the first block of 2 keys
    first_block_masked[1, :] = False  # query 1: no allowed key at all
    first_block_masked[2, :4] = False  # query 2: the first two blocks masked
    cases = [
        _online_case("L_kv a multiple of block_size", r((4, 8)), r((8, 8)), r((8, 5)), 4),
        _online_case("L_kv = 7 not a multiple of block_size (the last block has 1 key)", r((3, 8)), r((7, 8)),
                     r((7, 4)), 3),
        _online_case("block_size 1", r((3, 4)), r((5, 4)), r((5, 2)), 1),
        _online_case("block_size larger than L_kv (one block)", r((3, 4)), r((6, 4)), r((6, 3)), 10),
        _online_case("batch and head axes, explicit scale", r((2, 3, 5, 8)), r((2, 3, 9, 8)), r((2, 3, 9, 6)), 4,
                     scale=0.25),
        _online_case("causal mask", r((5, 8)), r((5, 8)), r((5, 4)), 2, mask=reference.causal_mask(5, 5)),
        _online_case("query 0's first key block and query 2's first two blocks fully masked, query 1 no key at all",
                     r((4, 8)), r((6, 8)), r((6, 3)), 2, mask=first_block_masked,
                     note="While every key seen so far is masked the state is (m, l, acc) = (-inf, 0, 0); a query "
                          "with no allowed key at all returns a zero row."),
        _online_case("large logits (scaled scores in the thousands)", 40 * r((3, 8)), 40 * r((9, 8)), r((9, 4)), 4,
                     note="exp of a score above about 709 overflows float64: the running maximum is what prevents it."),
        _online_case("a batch of one, one head, one query", r((1, 1, 1, 4)), r((1, 1, 5, 4)), r((1, 1, 5, 4)), 2),
        _online_case("non-contiguous q, k, v (transposed views), L_q != L_kv", transposed(r((2, 4, 8))),
                     transposed(r((2, 7, 8))), transposed(r((2, 7, 3))), 3, mask=reference.causal_mask(4, 7)),
    ]
    output = Output("out", "softmax(QK^T/sqrt(d_k)) V computed in one piece, i.e. acc / l after the last block",
                    EQ_ONLINE)
    run_cases("check_online_softmax_attention", fn, backend, ("q", "k", "v", "block_size"), (output,), cases, timeout)
