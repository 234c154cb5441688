"""Checkers of the heads: the split into heads and the merge back, the multi-head layer (MHA, GQA, MQA), and the
repetition of key/value heads for their query heads.

Book: part I, 'From one head to h heads'; part II, 'MQA and GQA'.
"""

from __future__ import annotations

import numpy as np

from mha import reference
from mha._checks import check_bool
from mha.exercises.catalogue import EQ_FUSED, EQ_GQA_MAP, EQ_MHA_HEAD, EQ_MHA_OUTPUT
from mha.exercises.runner import (TIMEOUT, Case, Output, padding_mask, public_checker, row_with_no_key, run_cases,
                                  transposed)
from mha.exercises.simulators import mha_variants, merge_heads_variants, repeat_kv_variants, split_heads_variants


# ---------------------------------------------------------------------------------------------------------------
# check_split_heads, check_merge_heads
# ---------------------------------------------------------------------------------------------------------------


def _split_case(label, y, n_heads):
    name = f"{label}: y {y.shape}, n_heads={n_heads} (head_dim {y.shape[-1] // n_heads})"
    return Case(name, (y, n_heads), {}, (reference.split_heads(y, n_heads),), split_heads_variants(y, n_heads))


@public_checker
def check_split_heads(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(y, n_heads)``: ``(N, L, n_heads*head_dim) -> (N, n_heads, L, head_dim)``; head i is column block i.

    Cases: several heads, one head, head_dim 1, a batch of one with one position, L equal to n_heads, a
    non-contiguous input. Book: part I, 'From one head to h heads' (Theorem multihead-thm-fused, Eq. multihead-fused).
    """
    rng = np.random.default_rng(303)
    r = rng.standard_normal
    cases = [
        _split_case("3 heads", r((2, 5, 12)), 3),
        _split_case("L = n_heads", r((2, 3, 12)), 3),
        _split_case("one head", r((2, 4, 8)), 1),
        _split_case("head_dim 1", r((2, 3, 6)), 6),
        _split_case("a batch of one, one position", r((1, 1, 6)), 2),
        _split_case("non-contiguous y (a transposed view)", transposed(r((2, 4, 6))), 2),
    ]
    output = Output("heads", "y.reshape(N, L, h, head_dim) with axes 1 and 2 swapped: heads[n, i] = column block i",
                    EQ_FUSED)
    run_cases("check_split_heads", fn, backend, ("y", "n_heads"), (output,), cases, timeout)


def _merge_case(label, y):
    name = f"{label}: y {y.shape} (N, n_heads, L, head_dim)"
    return Case(name, (y,), {}, (reference.merge_heads(y),), merge_heads_variants(y))


@public_checker
def check_merge_heads(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(y)``: ``(N, n_heads, L, head_dim) -> (N, L, n_heads*head_dim)``, the concatenation of the heads.

    The inverse of ``split_heads``: head i's output fills column block i. Cases: several heads, one head, head_dim 1,
    a batch of one with one position, a non-contiguous input. Book: part I, 'From one head to h heads'
    (Eq. multihead-output, Theorem multihead-thm-concat).
    """
    rng = np.random.default_rng(404)
    r = rng.standard_normal
    cases = [
        _merge_case("3 heads", r((2, 3, 5, 4))),
        _merge_case("L = n_heads", r((2, 3, 3, 4))),
        _merge_case("one head", r((2, 1, 4, 8))),
        _merge_case("head_dim 1", r((2, 6, 3, 1))),
        _merge_case("a batch of one, one position", r((1, 2, 1, 3))),
        _merge_case("non-contiguous y (a transposed view)", transposed(r((2, 2, 4, 3)))),
    ]
    output = Output("concat", "Concat(head_1, ..., head_h): y with axes 1 and 2 swapped, reshaped to "
                              "(N, L, h*head_dim)", EQ_MHA_OUTPUT)
    run_cases("check_merge_heads", fn, backend, ("y",), (output,), cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_multi_head_attention
# ---------------------------------------------------------------------------------------------------------------


def _mha_case(label, rng, *, N=2, L_q=5, L_kv=None, d_model=12, n_heads=3, n_kv_heads=None, head_dim=None,
              bias=True, mask=None, cross=False, x_scale=1.0, non_contiguous=False, note=""):
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    head_dim = d_model // n_heads if head_dim is None else head_dim
    params = reference.init_params(d_model, n_heads, n_kv_heads, head_dim, bias=bias, seed=int(rng.integers(1 << 30)))
    L_kv = L_q if L_kv is None else L_kv
    x_q = x_scale * rng.standard_normal((N, L_q, d_model))
    x_kv = x_scale * rng.standard_normal((N, L_kv, d_model)) if cross else x_q
    if non_contiguous:
        x_q, x_kv = transposed(x_q), transposed(x_kv)
        params["W_q"] = transposed(params["W_q"])
    kind = "cross-attention" if cross else "self-attention (x_kv is x_q)"
    name = (f"{label}: {kind}, x_q {x_q.shape}, x_kv {x_kv.shape}, d_model={d_model}, n_heads={n_heads}, "
            f"n_kv_heads={n_kv_heads}, head_dim={head_dim}, {'with' if bias else 'no'} biases, "
            + (f"mask {mask.shape}" if mask is not None else "mask=None"))
    kwargs = {} if mask is None else {"mask": mask}
    expected = reference.multi_head_attention(x_q, x_kv, params, n_heads, mask)
    variants = mha_variants(x_q, x_kv, params, n_heads, mask)
    return Case(name, (x_q, x_kv, params, n_heads), kwargs, expected, variants, note)


@public_checker
def check_multi_head_attention(fn, *, gqa: bool = False, backend: str = "auto",
                               timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(x_q, x_kv, params, n_heads, mask=None) -> (out, weights)``, as ``mha.reference.multi_head_attention``.

    x_q ``(N, L_q, d_model)`` and x_kv ``(N, L_kv, d_model)`` (self-attention cases pass the same array twice);
    ``params`` is the reference's dict (``W_q (d_model, h*head_dim)``, ``W_k``/``W_v (d_model, g*head_dim)``,
    ``W_o (h*head_dim, d_model)``, biases ``b_q``, ``b_k``, ``b_v``, ``b_o`` in some cases); ``head_dim`` is
    ``W_q.shape[1] // n_heads``, not necessarily ``d_model // n_heads``. Returns out ``(N, L_q, d_model)`` and the
    weights of every head ``(N, h, L_q, L_kv)``. Cases: with and without biases, cross-attention with L_q != L_kv,
    causal and padding masks, fully masked query rows, one head, head_dim != d_model / n_heads, a batch of one, large
    activations, non-contiguous inputs. With ``gqa=True`` also grouped-query cases (n_kv_heads < n_heads, including one
    key/value head), where query head j reads key/value head ``j // (n_heads / n_kv_heads)``.

    Book: part I, 'From one head to h heads' (Eqs. multihead-proj, multihead-head, multihead-output); GQA: part II,
    'MQA and GQA' (Eqs. gqa-map, gqa-head).
    """
    gqa = check_bool("gqa", gqa)
    rng = np.random.default_rng(505)
    empty_rows = row_with_no_key(rng, (2, 3, 4, 6), 1)  # query 1 has no key in every head of every sequence ...
    empty_rows[1, 2, 3] = False  # ... and query 3 of sequence 1 none in head 2 only
    cases = [
        _mha_case("no biases", rng, bias=False),
        _mha_case("biases", rng),
        _mha_case("L_q != L_kv", rng, L_q=4, L_kv=6, cross=True),
        _mha_case("causal mask", rng, mask=reference.causal_mask(5, 5)),
        _mha_case("padding mask (lengths 6 and 2)", rng, L_q=4, L_kv=6, cross=True, mask=padding_mask([6, 2], 6)),
        _mha_case("query rows with no allowed key", rng, L_q=4, L_kv=6, cross=True, mask=empty_rows,
                  note="A query row with no allowed key gets zero weights; its output row is then b_o."),
        _mha_case("one head", rng, d_model=8, n_heads=1),
        _mha_case("head_dim != d_model / n_heads", rng, d_model=8, n_heads=2, head_dim=6,
                  note="Here head_dim = 6, not d_model / n_heads = 4: read it from the weights, "
                       "head_dim = W_q.shape[1] // n_heads. W_o is (n_heads*head_dim, d_model) = (12, 8)."),
        _mha_case("a batch of one", rng, N=1, L_q=3),
        _mha_case("large activations (scores in the hundreds)", rng, x_scale=12.0,
                  note="exp of a score above about 709 overflows float64: subtract the row maximum first."),
        _mha_case("non-contiguous x_q, x_kv and W_q (transposed views)", rng, L_q=4, L_kv=5, cross=True,
                  non_contiguous=True),
    ]
    if gqa:
        cases += [
            _mha_case("GQA, groups of 2", rng, d_model=16, n_heads=4, n_kv_heads=2),
            _mha_case("GQA, groups of 3, L_q != L_kv, causal mask", rng, L_q=3, L_kv=5, cross=True, d_model=12,
                      n_heads=6, n_kv_heads=2, head_dim=2, mask=reference.causal_mask(3, 5)),
            _mha_case("MQA: one key/value head", rng, d_model=16, n_heads=4, n_kv_heads=1),
        ]
    outputs = (
        Output("out", "Concat(head_1, ..., head_h) W^O + b^O", EQ_MHA_OUTPUT),
        Output("weights", "softmax(Q_i K_i^T / sqrt(head_dim)) for every head i", EQ_MHA_HEAD),
    )
    run_cases("check_multi_head_attention", fn, backend, ("x_q", "x_kv", "params", "n_heads"), outputs, cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_repeat_kv
# ---------------------------------------------------------------------------------------------------------------


def _repeat_case(label, y, n_rep):
    name = f"{label}: y {y.shape} (N, n_kv_heads, L, head_dim), n_rep={n_rep}"
    return Case(name, (y, n_rep), {}, (reference.repeat_kv(y, n_rep),), repeat_kv_variants(y, n_rep))


@public_checker
def check_repeat_kv(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(y, n_rep)``: ``(N, g, L, d) -> (N, g*n_rep, L, d)``, query head j reading key/value head j // n_rep.

    Cases: groups of 2, three key/value heads, one key/value head (MQA), n_rep = 1 (MHA), a batch of one with one
    position, a non-contiguous input. Book: part II, 'MQA and GQA' (Eq. gqa-map, Proposition gqa-prop-repeat).
    """
    rng = np.random.default_rng(606)
    r = rng.standard_normal
    cases = [
        _repeat_case("groups of 2", r((2, 2, 3, 4)), 2),
        _repeat_case("3 key/value heads, groups of 2", r((1, 3, 2, 2)), 2),
        _repeat_case("one key/value head (MQA)", r((2, 1, 3, 4)), 4),
        _repeat_case("n_rep = 1 (MHA)", r((2, 4, 3, 2)), 1),
        _repeat_case("a batch of one, one position", r((1, 2, 1, 3)), 3),
        _repeat_case("non-contiguous y (a transposed view)", transposed(r((2, 2, 5, 3))), 3),
    ]
    output = Output("repeated", "out[:, j] = y[:, j // n_rep] (np.repeat(y, n_rep, axis=1))", EQ_GQA_MAP)
    run_cases("check_repeat_kv", fn, backend, ("y", "n_rep"), (output,), cases, timeout)
