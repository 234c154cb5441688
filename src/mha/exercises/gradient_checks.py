"""Checkers of the backward pass: the softmax's, and scaled dot-product attention's (dq, dk, dv).

Book: part II, 'The backward pass'.
"""

from __future__ import annotations

import inspect
import tracemalloc

import numpy as np

from mha import reference
from mha.exercises.catalogue import EQ_DQ_DK, EQ_DV_DA, EQ_SOFTMAX_VJP, KNOWN_BUGS
from mha.exercises.language import case_name, tr
from mha.exercises.runner import (TIMEOUT, Case, ExerciseError, Output, known_bug_text, mask_and_scale,
                                  public_checker, row_with_no_key, run_cases, shapes_of, transposed)
from mha.exercises.simulators import sdpa_grad_variants, softmax_backward_variants


# ---------------------------------------------------------------------------------------------------------------
# check_softmax_backward
# ---------------------------------------------------------------------------------------------------------------


def _softmax_backward_case(label, A, dA):
    expected = (reference.softmax_backward(A, dA),)
    return Case(f"{label}: weights {A.shape}, grad_weights {dA.shape}", (A, dA), {}, expected,
                softmax_backward_variants(A, dA))


@public_checker
def check_softmax_backward(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(weights, grad_weights) -> grad_scores``, the backward pass of a softmax over the last axis.

    ``weights`` = A = softmax(S) (rows normalised along the last axis), ``grad_weights`` = dL/dA; return dL/dS
    ``= A * (dA - rowsum(dA * A))``, same shape. Cases: a vector, a square matrix, a rectangular one, batch axes,
    masked entries and a fully masked row (all-zero weights), saturated one-hot rows, a batch of one, a non-contiguous
    input. Book: part II, 'The backward pass' (Theorem bwd-thm-softmax-jacobian, Eq. bwd-softmax-vjp); the same
    Jacobian: part I, 'Why divide by √dₖ' (Eq. scaling-vjp).
    """
    rng = np.random.default_rng(909)
    r = rng.standard_normal

    def weights(shape, mask=None):
        return reference.softmax(2 * r(shape), mask=mask)

    masked = rng.random((4, 6)) < 0.6
    masked[:, 0] = True
    masked[2] = False  # a row with no allowed key: all-zero weights
    one_hot = np.eye(5)[[3, 0, 4]]  # (3, 5), saturated rows
    cases = [
        _softmax_backward_case("a vector", weights(5), r(5)),
        _softmax_backward_case("a square matrix", weights((4, 4)), r((4, 4))),
        _softmax_backward_case("a rectangular matrix", weights((3, 6)), r((3, 6))),
        _softmax_backward_case("batch and head axes", weights((2, 3, 4, 5)), r((2, 3, 4, 5))),
        _softmax_backward_case("masked entries (weight 0) and row 2 fully masked", weights((4, 6), masked),
                               r((4, 6))),
        _softmax_backward_case("saturated one-hot rows", one_hot, r((3, 5))),
        _softmax_backward_case("a batch of one", weights((1, 1, 7)), r((1, 1, 7))),
        _softmax_backward_case("non-contiguous inputs (transposed views)", transposed(weights((2, 4, 3))),
                               transposed(r((2, 4, 3)))),
    ]
    output = Output("grad_scores", "A * (dA - rowsum(dA * A))", EQ_SOFTMAX_VJP)
    run_cases("check_softmax_backward", fn, backend, ("weights", "grad_weights"), (output,), cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_scaled_dot_product_attention_grad
# ---------------------------------------------------------------------------------------------------------------


def _grad_case(label, q, k, v, grad_out, mask=None, scale=None, note=""):
    options, kwargs = mask_and_scale(mask, scale)
    expected = reference.scaled_dot_product_attention_grad(q, k, v, grad_out, mask, scale)
    return Case(f"{label}: {shapes_of(q=q, k=k, v=v, grad_out=grad_out)}{options}", (q, k, v, grad_out), kwargs,
                expected, sdpa_grad_variants(q, k, v, grad_out, mask, scale), note)


TILED_LENGTH = 2048  # L_q = L_kv of the memory case: one float64 L x L matrix is 32 MiB
TILED_TILE = 32  # the tile width passed to a fn that takes `tile`
TILED_BUDGET = 1 / 4  # the peak allowed during the call, as a fraction of one float64 L_q x L_kv matrix


def _peak_bytes(fn, args, kwargs) -> tuple[object, int]:
    """fn(*args, **kwargs) and the peak of the memory Python and NumPy allocated during the call, above what was
    allocated before it (tracemalloc: NumPy reports its array buffers to it)."""
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = fn(*args, **kwargs)
        return result, tracemalloc.get_traced_memory()[1] - before
    finally:
        if not tracing:
            tracemalloc.stop()


def _check_tiled(fn, outputs, timeout) -> None:
    """The memory case of ``check_scaled_dot_product_attention_grad(fn, tiled=True)``: a long causal sequence in
    NumPy float64, run like every other case (time limit, exceptions, comparison with the reference); then the call's
    peak allocation must stay below TILED_BUDGET of one L_q x L_kv matrix."""
    checker = "check_scaled_dot_product_attention_grad"
    rng = np.random.default_rng(2048)
    length, d = TILED_LENGTH, 16
    q, k, v, grad_out = (rng.standard_normal((length, d)) for _ in range(4))
    mask = reference.causal_mask(length, length)  # allocated before the call: only fn's own arrays count
    kwargs = {"mask": mask}
    if "tile" in inspect.signature(fn).parameters:
        kwargs["tile"] = TILED_TILE
    name = (f"memory (tiled=True): q, k, v, grad_out ({length}, {d}) float64, a causal mask"
            + (f", tile={TILED_TILE}" if "tile" in kwargs else ""))
    peaks = []

    def measured(fn, args, kwargs):  # the call, with its peak allocation recorded
        result, peak = _peak_bytes(fn, args, kwargs)
        peaks.append(peak)
        return result

    expected = reference.scaled_dot_product_attention_grad(q, k, v, grad_out, mask)
    case = Case(name, (q, k, v, grad_out), kwargs, expected, call=measured)
    run_cases(checker, fn, "numpy", ("q", "k", "v", "grad_out"), outputs, [case], timeout)
    matrix = length * length * 8  # bytes of one float64 L_q x L_kv array
    if peaks[-1] >= TILED_BUDGET * matrix:
        known = KNOWN_BUGS["full_score_matrix"]
        raise ExerciseError(
            tr("{checker}: case '{case}': the call allocated up to {peak} MiB at once, at least {budget} of one "
               "{length} x {length} float64 matrix ({matrix} MiB).\n").format(
                checker=checker, case=case_name(name), peak=f"{peaks[-1] / 2**20:.1f}", budget=f"{TILED_BUDGET:.0%}",
                length=length, matrix=f"{matrix / 2**20:.0f}")
            + known_bug_text("full_score_matrix") + "\n"
            + tr("Where to look: Eq. {label} ({chapter}).").format(label=known.equation.label,
                                                                   chapter=tr(known.equation.chapter)),
            checker, name, "full_score_matrix")


@public_checker
def check_scaled_dot_product_attention_grad(fn, *, tiled: bool = False, backend: str = "auto",
                                            timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(q, k, v, grad_out, mask=None, scale=None) -> (dq, dk, dv)``, the hand-derived backward pass.

    The gradients of ``sum(out * grad_out)`` for ``out = softmax(scale q k^T) v`` (the arguments of
    ``check_scaled_dot_product_attention``; q, k, v here share their batch axes, no broadcasting), as
    ``mha.reference.scaled_dot_product_attention_grad``. Cases: square and L_q != L_kv, d_v != d_k, batch axes, an
    explicit scale, a causal mask, a query row with no allowed key (zero gradient), large logits, a batch of one with
    one query, non-contiguous inputs. Book: part II, 'The backward pass' (Theorem bwd-thm-attention-grad,
    Eqs. bwd-attn-dv-da, bwd-attn-ds, bwd-attn-dq-dk).

    ``tiled=True`` (the kernel chapter's exercise, part II 'From the recurrence to a kernel') adds a memory case:
    q, k, v, grad_out of 2048 positions in NumPy float64 with a causal mask (and ``tile=32`` when ``fn`` takes a
    ``tile`` argument); the memory NumPy allocates during the call (tracemalloc) must peak below a quarter of one
    2048 x 2048 float64 matrix, so an implementation that builds the whole score, weight or mask matrix fails
    (bug ``full_score_matrix``), and the gradients must still match the reference.
    """
    if not isinstance(tiled, bool):
        raise TypeError(f"tiled must be True or False, got {tiled!r} of type {type(tiled).__name__}")
    rng = np.random.default_rng(1010)
    r = rng.standard_normal
    cases = [
        _grad_case("square (L_q = L_kv)", r((5, 4)), r((5, 4)), r((5, 3)), r((5, 3))),
        _grad_case("L_q != L_kv, d_v != d_k", r((4, 8)), r((6, 8)), r((6, 5)), r((4, 5))),
        _grad_case("batch and head axes", r((2, 3, 5, 8)), r((2, 3, 7, 8)), r((2, 3, 7, 6)), r((2, 3, 5, 6))),
        _grad_case("explicit scale", r((2, 4, 6)), r((2, 5, 6)), r((2, 5, 3)), r((2, 4, 3)), scale=0.5),
        _grad_case("causal mask", r((2, 5, 8)), r((2, 5, 8)), r((2, 5, 4)), r((2, 5, 4)),
                   mask=reference.causal_mask(5, 5)),
        _grad_case("query row 2 has no allowed key", r((4, 8)), r((5, 8)), r((5, 3)), r((4, 3)),
                   mask=row_with_no_key(rng, (4, 5), 2),
                   note="A row with no allowed key has zero weights, so it contributes zero gradient."),
        _grad_case("large logits (scaled scores in the thousands)", 40 * r((3, 8)), 40 * r((6, 8)), r((6, 4)),
                   r((3, 4)), note="Subtract the row maximum in the forward softmax."),
        _grad_case("a batch of one, one head, one query", r((1, 1, 1, 4)), r((1, 1, 3, 4)), r((1, 1, 3, 4)),
                   r((1, 1, 1, 4))),
        _grad_case("non-contiguous inputs (transposed views)", transposed(r((2, 5, 8))), transposed(r((2, 6, 8))),
                   transposed(r((2, 6, 4))), transposed(r((2, 5, 4))), mask=reference.causal_mask(5, 6)),
    ]
    outputs = (
        Output("dq", "scale * dS K", EQ_DQ_DK),
        Output("dk", "scale * dS^T Q", EQ_DQ_DK),
        Output("dv", "A^T dO", EQ_DV_DA),
    )
    run_cases("check_scaled_dot_product_attention_grad", fn, backend, ("q", "k", "v", "grad_out"), outputs,
              cases, timeout)
    if tiled:
        _check_tiled(fn, outputs, timeout)
