"""Graded "write it yourself" exercises: checkers that run *your* attention code against the book's derivation.

Each checker takes the function you wrote, calls it on a series of cases (small shapes first, then the hard ones:
large logits, fully masked rows, L_q != L_kv, one head, one key/value head, non-contiguous inputs, a batch of one,
head_dim != d_model / n_heads, lengths that are not a multiple of the block size) and compares every result with the
NumPy float64 reference, ``mha.reference``. It returns None when your function is right. Otherwise it raises
:class:`ExerciseError` (an ``AssertionError``) whose message names the case (shapes, flags), shows a few expected and
actual numbers, and names the book's equation your result breaks. When your result equals what a *known bug* would
produce on that case (the checker computes each known bug's output independently and compares), the message names
the bug and gives a hint.

Checkers (``fn`` is your function, called as shown):

* ``check_softmax(fn)``: ``fn(x, axis=-1)``, the softmax of x along axis.
* ``check_scaled_dot_product_attention(fn)``: ``fn(q, k, v, mask=None, scale=None) -> (out, weights)``.
* ``check_split_heads(fn)``: ``fn(y, n_heads)``, (N, L, h*head_dim) -> (N, h, L, head_dim).
* ``check_merge_heads(fn)``: ``fn(y)``, (N, h, L, head_dim) -> (N, L, h*head_dim).
* ``check_multi_head_attention(fn, gqa=False)``: ``fn(x_q, x_kv, params, n_heads, mask=None) -> (out, weights)``.
* ``check_causal_mask(fn)``: ``fn(l_q, l_kv)``, a boolean (l_q, l_kv) causal mask aligned bottom-right.
* ``check_repeat_kv(fn)``: ``fn(y, n_rep)``, (N, g, L, d) -> (N, g*n_rep, L, d).
* ``check_decode_step(fn)``: ``fn(q, k_new, v_new, k_cache, v_cache) -> (out, k_cache, v_cache)``, one cached
  decoding step.
* ``check_online_softmax_attention(fn)``: ``fn(q, k, v, block_size, mask=None, scale=None) -> out``.
* ``check_softmax_backward(fn)``: ``fn(weights, grad_weights) -> grad_scores``.
* ``check_scaled_dot_product_attention_grad(fn)``: ``fn(q, k, v, grad_out, mask=None, scale=None) -> (dq, dk, dv)``.

Conventions (those of ``mha.reference``): row vectors, ``Y = X W``; masks are boolean, True = may attend; a query row
with no allowed key gets zero weights and a zero output (never NaN); query head j reads key/value head
``j // (n_heads / n_kv_heads)``; ``params`` holds ``W_q (d_model, h*hd)``, ``W_k``/``W_v (d_model, g*hd)``,
``W_o (h*hd, d_model)`` and optional biases ``b_q``, ``b_k``, ``b_v``, ``b_o``.

Inputs are NumPy float64 arrays. With ``backend="torch"`` they are torch float64 tensors instead (non-contiguous
where the case says so); ``backend="auto"`` (the default) uses NumPy unless your function fails on the first case with
NumPy arrays and works with tensors. Your function may return NumPy arrays or torch tensors either way. Results are
compared in float64 with a relative tolerance of 1e-5: compute in the dtype you are given. Every checker also
verifies that your function does not modify its inputs in place. torch is imported only when tensors are involved.

Time limit: every checker takes ``timeout=`` (seconds, default :data:`TIMEOUT` = 10; ``timeout=None``: no limit). Each
call of your function on a case may take that long; a call that runs longer is stopped and reported as
:class:`ExerciseTimeout` (an ``ExerciseError``) naming the case that was running, so that an infinite loop fails the
check instead of hanging your script, your Jupyter cell or the book build. The limit is per call, not per checker: a
slow but correct function is not failed for the number of cases, and the case named is the one that hung. Ten seconds
is about a thousand times what a plain Python loop over the elements needs on these small cases, and leaves room for a
first ``import torch`` inside your function. In the main thread (scripts, Jupyter) the limit is a SIGALRM timer, which
also interrupts ``time.sleep`` (an alarm you set yourself is kept, and fires first if it is due first); in any other
thread a watchdog thread raises in yours, which stops Python code but not one long C call (such as ``time.sleep``)
until that call returns.

Book: the checked functions are derived in parts I and II; each checker's docstring names its chapter, and the
appendix 'Check your own implementation' lists them all.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import math
import signal
import sys
import sysconfig
import threading
import time
import traceback
from dataclasses import dataclass, field
from importlib import import_module
from typing import Callable, NamedTuple

import numpy as np

from mha import reference
from mha._checks import check_bool, check_choice, check_float

__all__ = [
    "ExerciseError",
    "ExerciseTimeout",
    "TIMEOUT",
    "KNOWN_BUGS",
    "check_softmax",
    "check_scaled_dot_product_attention",
    "check_split_heads",
    "check_merge_heads",
    "check_multi_head_attention",
    "check_causal_mask",
    "check_repeat_kv",
    "check_decode_step",
    "check_online_softmax_attention",
    "check_softmax_backward",
    "check_scaled_dot_product_attention_grad",
]

RTOL = 1e-5  # relative tolerance of every comparison (float64 reference; float32 arithmetic would mostly pass too)
ATOL = 1e-7  # absolute tolerance, times max(1, largest |expected| entry)
_BACKENDS = ("auto", "numpy", "torch")
TIMEOUT = 10.0  # seconds each call of your function may take (see the module docstring); None: no limit


class ExerciseError(AssertionError):
    """Your function gave a wrong result (or raised, or returned the wrong kind of thing) on one checker case.

    Attributes: ``checker`` (its name), ``case`` (the case's description), ``bug`` (the id of the known bug your
    result matches, a key of :data:`KNOWN_BUGS`, or None).
    """

    def __init__(self, message: str, checker: str, case: str, bug: str | None = None):
        super().__init__(message)
        self.checker = checker
        self.case = case
        self.bug = bug


class ExerciseTimeout(ExerciseError):
    """Your function did not return within ``timeout`` seconds on one case (an infinite loop, or a very slow one).

    Attributes: those of :class:`ExerciseError` (``bug`` is None), and ``timeout``, the seconds the checker waited.
    """

    def __init__(self, message: str, checker: str, case: str, timeout: float):
        super().__init__(message, checker, case)
        self.timeout = timeout


# ---------------------------------------------------------------------------------------------------------------
# The book's equations, and the catalogue of known bugs.
# ---------------------------------------------------------------------------------------------------------------


class Equation(NamedTuple):
    label: str  # the equation's label in the book: {eq}`label`
    chapter: str  # where it is derived


SDPA_CH = "part I 'Scaled dot-product attention'"
SCALING_CH = "part I 'Why divide by √d_k'"
MHA_CH = "part I 'From one head to h heads'"
BWD_CH = "part II 'The backward pass'"
KV_CH = "part II 'Autoregressive decoding and the KV cache'"
GQA_CH = "part II 'MQA and GQA'"
ONLINE_CH = "part II 'Exact attention without the L × L matrix'"

EQ_SOFTMAX = Equation("sdpa-softmax", SDPA_CH)
EQ_SAFE_SOFTMAX = Equation("online-safe", ONLINE_CH)
EQ_SDPA = Equation("sdpa-attention", SDPA_CH)
EQ_SCALED = Equation("sdpa-scaled", SDPA_CH)
EQ_SCALE_VARIANCE = Equation("scaling-var-scaled", SCALING_CH)
EQ_MASKED_SOFTMAX = Equation("sdpa-masked-softmax", SDPA_CH)
EQ_FUSED = Equation("multihead-fused", MHA_CH)
EQ_BLOCKS = Equation("multihead-blocks", MHA_CH)
EQ_MHA_HEAD = Equation("multihead-head", MHA_CH)
EQ_MHA_OUTPUT = Equation("multihead-output", MHA_CH)
EQ_MHA_PROJ = Equation("multihead-proj", MHA_CH)
EQ_GQA_MAP = Equation("gqa-map", GQA_CH)
EQ_GQA_HEAD = Equation("gqa-head", GQA_CH)
EQ_CHUNK_MASK = Equation("kv-chunk-mask", KV_CH)
EQ_KV_STEP = Equation("kv-step", KV_CH)
EQ_ONLINE = Equation("online-matrix", ONLINE_CH)
EQ_ONLINE_M = Equation("online-rec-m", ONLINE_CH)
EQ_ONLINE_L = Equation("online-rec-l", ONLINE_CH)
EQ_ONLINE_ACC = Equation("online-rec-acc", ONLINE_CH)
EQ_ONLINE_FINAL = Equation("online-final", ONLINE_CH)
EQ_SOFTMAX_VJP = Equation("bwd-softmax-vjp", BWD_CH)
EQ_SOFTMAX_JAC = Equation("bwd-softmax-jac", BWD_CH)
EQ_DV_DA = Equation("bwd-attn-dv-da", BWD_CH)
EQ_DS = Equation("bwd-attn-ds", BWD_CH)
EQ_DQ_DK = Equation("bwd-attn-dq-dk", BWD_CH)


class KnownBug(NamedTuple):
    description: str  # what the buggy code computes
    hint: str  # where to look
    equation: Equation | None  # the equation it breaks (None: not about an equation)


KNOWN_BUGS: dict[str, KnownBug] = {
    # --- softmax --------------------------------------------------------------------------------------------------
    "no_max_subtraction": KnownBug(
        "the softmax exponentiates the scores without subtracting the row maximum, so exp overflows to inf for "
        "large logits (inf / inf = NaN)",
        "subtract the row maximum before exp: e = exp(x - x.max(axis, keepdims=True)). By the shift lemma "
        "(sdpa-lem-shift) this changes nothing mathematically, and every exponent becomes <= 0.",
        EQ_SAFE_SOFTMAX),
    "shift_not_row_max": KnownBug(
        "the softmax subtracts a maximum that is not the row's own (the maximum of the whole array, or along another "
        "axis), so a row far below that maximum underflows to 0 / 0 = NaN",
        "take the maximum along the softmax axis, with keepdims: x.max(axis=axis, keepdims=True).",
        EQ_SAFE_SOFTMAX),
    "softmax_wrong_axis": KnownBug(
        "the softmax normalises along the wrong axis (or over all entries at once): the entries along `axis` do not "
        "sum to 1",
        "use the `axis` argument for both the max and the sum: e.sum(axis=axis, keepdims=True).",
        EQ_SOFTMAX),
    "sum_without_keepdims": KnownBug(
        "the sum is taken without keepdims=True, so broadcasting divides each entry by the sum of another row "
        "(silently, when the array is square)",
        "e / e.sum(axis=axis, keepdims=True): keepdims keeps the reduced axis in place for broadcasting.",
        EQ_SOFTMAX),
    "modifies_input": KnownBug(
        "your function changed one of its inputs in place (for example x -= x.max(...), or masked_fill_)",
        "work on new arrays: x = x - x.max(axis, keepdims=True) creates one; x -= ... overwrites the caller's data.",
        None),
    "outputs_swapped": KnownBug(
        "your function returns the right arrays in the wrong order",
        "return them in the order of the signature: out, weights (attention, multi-head attention); out, k_cache, "
        "v_cache (a decode step); dq, dk, dv (the gradient).",
        None),
    # --- scaled dot-product attention -----------------------------------------------------------------------------
    "no_scale": KnownBug(
        "the scores are not scaled: softmax(QK^T) instead of softmax(QK^T / sqrt(d_k))",
        "multiply the scores by `scale`, and when scale is None use 1 / sqrt(d_k) with d_k = q.shape[-1]. Why: the "
        "variance of q . k grows like d_k (part I 'Why divide by √d_k').",
        EQ_SCALED),
    "scale_d_k_not_sqrt": KnownBug(
        "the scores are divided by d_k instead of sqrt(d_k)",
        "scale = 1 / math.sqrt(d_k) (or d_k ** -0.5): it brings the variance d_k of q . k back to 1 "
        "(Eq. scaling-var-scaled).",
        EQ_SCALED),
    "scale_inverted": KnownBug(
        "the scores are multiplied by sqrt(d_k) instead of divided by it",
        "scores * d_k ** -0.5, or scores / d_k ** 0.5.",
        EQ_SCALED),
    "scale_d_v": KnownBug(
        "the scale uses d_v, the width of the values, instead of d_k, the width of the queries and keys",
        "d_k = q.shape[-1]; v.shape[-1] is d_v, which may differ (this case has d_v != d_k).",
        EQ_SCALED),
    "scale_seq_len": KnownBug(
        "the scale uses the number of keys L_kv (k.shape[-2]) instead of the key width d_k (k.shape[-1])",
        "d_k is the last axis: q.shape[-1]. Axis -2 is the sequence.",
        EQ_SCALED),
    "scale_ignored": KnownBug(
        "the `scale` argument is ignored: the scores are always multiplied by 1 / sqrt(d_k)",
        "scale = 1 / math.sqrt(d_k) if scale is None else scale.",
        EQ_SCALED),
    "scale_d_model": KnownBug(
        "the scores are scaled by 1/sqrt(d_model) instead of 1/sqrt(d_k) (the head size): the scores shrink by a "
        "further factor sqrt(n_heads) and the weights come out too flat",
        "scale by 1 / sqrt(head_dim), head_dim = W_q.shape[1] // n_heads (= q.shape[-1] after the split into heads). "
        "The dot product inside one head sums head_dim terms, so its variance is head_dim (Eq. scaling-var-scaled); "
        "d_model = n_heads * head_dim is the width of the whole layer. (This bug shipped in a widely watched "
        "lecture's code, C ** -0.5 with C the embedding width, and was fixed after a reader's pull request.)",
        EQ_SCALE_VARIANCE),
    "softmax_over_queries": KnownBug(
        "the softmax runs over the queries (axis -2) instead of over the keys (axis -1): the columns of the weights "
        "sum to 1 instead of the rows",
        "softmax(scores, axis=-1): each query gets its own distribution over the keys.",
        EQ_SOFTMAX),
    "mask_inverted": KnownBug(
        "the mask is used the wrong way round: True entries are blocked instead of allowed",
        "the book's convention is True = may attend: np.where(mask, scores, -np.inf) (torch: "
        "scores.masked_fill(~mask, float('-inf'))).",
        EQ_MASKED_SOFTMAX),
    "mask_fill_large_negative": KnownBug(
        "masked scores are set to a large negative number (like -1e9) instead of -inf, so a query row with no allowed "
        "key gets uniform weights over all its keys (and the average of all the values) instead of zero weights and "
        "a zero output",
        "after the softmax, zero the rows that have no allowed key: "
        "weights = np.where(mask.any(axis=-1, keepdims=True), weights, 0). The book's convention for an empty row is "
        "'attends to nothing': zero weights, zero output.",
        EQ_MASKED_SOFTMAX),
    "mask_nan_empty_rows": KnownBug(
        "a query row with no allowed key comes out NaN: with every score -inf, the softmax computes "
        "exp(-inf - (-inf)) or 0 / 0",
        "guard the empty rows: shift by a finite number where the row maximum is -inf, and divide only where the "
        "row sum is > 0 (np.divide(e, total, out=np.zeros_like(e), where=total > 0)), or zero those rows afterwards.",
        EQ_MASKED_SOFTMAX),
    "mask_fill_zero": KnownBug(
        "masked scores are set to 0 (for example scores * mask) instead of -inf, so masked keys still get weight",
        "a forbidden key must get weight exactly 0, i.e. score -inf: np.where(mask, scores, -np.inf).",
        EQ_MASKED_SOFTMAX),
    "mask_after_softmax": KnownBug(
        "the mask multiplies the weights after the softmax, without renormalising: the allowed weights no longer sum "
        "to 1",
        "mask the scores before the softmax (-inf where not allowed), so the softmax normalises over the allowed "
        "keys only.",
        EQ_MASKED_SOFTMAX),
    "mask_ignored": KnownBug(
        "the `mask` argument is ignored: every query attends to every key, allowed or not",
        "when mask is not None, set the scores of the forbidden keys to -inf before the softmax: "
        "np.where(mask, scores, -np.inf) (torch: scores.masked_fill(~mask, float('-inf'))); in multi-head attention, "
        "pass the mask on to the attention of every head.",
        EQ_MASKED_SOFTMAX),
    # --- heads: split, merge, the multi-head layer ----------------------------------------------------------------
    "split_no_transpose": KnownBug(
        "the heads are split with a reshape to (N, h, L, head_dim) and no transpose: 'head' i then holds a mixture "
        "of positions and column blocks, not X W_i^Q",
        "reshape to (N, L, h, head_dim) first (each position's row cut into h column blocks), then swap axes 1 and 2 "
        "(Theorem multihead-thm-fused).",
        EQ_FUSED),
    "split_strided": KnownBug(
        "the heads are split with head_dim as the outer axis (a reshape to (N, L, head_dim, h)): head i gets every "
        "h-th column instead of the column block i",
        "reshape to (N, L, h, head_dim): the heads are the contiguous column blocks of W^Q (Eq. multihead-blocks).",
        EQ_BLOCKS),
    "split_wrong_axes": KnownBug(
        "the split transposes the wrong axes: the result is (N, h, head_dim, L) (or another order), not "
        "(N, h, L, head_dim)",
        "y.reshape(N, L, h, head_dim), then swap only axes 1 and 2 (np.swapaxes(r, 1, 2) / r.transpose(1, 2)).",
        EQ_FUSED),
    "merge_no_transpose": KnownBug(
        "the heads are merged with a reshape and no transpose: reading (N, h, L, head_dim) as (N, L, h*head_dim) "
        "mixes positions across heads",
        "swap axes 1 and 2 back to (N, L, h, head_dim) first, then reshape to (N, L, h*head_dim).",
        EQ_MHA_OUTPUT),
    "merge_strided": KnownBug(
        "the heads are merged with head_dim as the outer axis: the concatenation interleaves the heads' columns "
        "instead of putting head i's output in column block i",
        "transpose to (N, L, h, head_dim), then reshape: Concat(head_1, ..., head_h) puts head_1's columns first "
        "(Eq. multihead-wo-blocks).",
        EQ_MHA_OUTPUT),
    "split_merge_no_transpose": KnownBug(
        "both the split into heads and the merge reshape without transposing: each 'head' mixes positions and "
        "column blocks",
        "split: reshape to (N, L, h, head_dim), then swap axes 1 and 2; merge: swap them back, then reshape "
        "(Theorem multihead-thm-fused).",
        EQ_FUSED),
    "view_non_contiguous": KnownBug(
        "torch's .view() was called on a non-contiguous tensor (after a transpose, or on an input that is itself a "
        "transposed view), and raised",
        "use .reshape(...), or .contiguous().view(...): a transpose changes the strides, not the memory.",
        EQ_FUSED),
    "no_output_projection": KnownBug(
        "the concatenated heads are returned without the output projection W^O (and b^O)",
        "finish with concat @ W_o (+ b_o): the heads are mixed by W^O (Eq. multihead-output).",
        EQ_MHA_OUTPUT),
    "missing_bias_o": KnownBug(
        "the output bias b_o is not added",
        "out = concat @ W_o + b_o when params has 'b_o'.",
        EQ_MHA_OUTPUT),
    "missing_bias_q": KnownBug(
        "the query bias b_q is not added",
        "Q = x_q @ W_q + b_q when params has 'b_q'.",
        EQ_MHA_PROJ),
    "missing_bias_v": KnownBug(
        "the value bias b_v is not added",
        "V = x_kv @ W_v + b_v when params has 'b_v'.",
        EQ_MHA_PROJ),
    "missing_input_biases": KnownBug(
        "the projection biases b_q, b_k, b_v are not added (b_o is)",
        "add each bias to its projection. (Leaving out b_k alone would change nothing: a key bias adds a constant to "
        "each query's row of scores, and the softmax ignores row constants.)",
        EQ_MHA_PROJ),
    "missing_biases": KnownBug(
        "none of the biases b_q, b_k, b_v, b_o is added",
        "params may hold biases: add b_q, b_k, b_v to the projections and b_o to the output when they are present.",
        EQ_MHA_PROJ),
    "values_from_W_k": KnownBug(
        "the values are projected with W_k (and b_k) instead of W_v",
        "V = x_kv @ W_v + b_v.",
        EQ_MHA_PROJ),
    "kv_from_x_q": KnownBug(
        "the keys and values are computed from x_q instead of x_kv (self-attention code used for cross-attention)",
        "K = x_kv @ W_k, V = x_kv @ W_v: queries come from x_q, keys and values from x_kv.",
        EQ_MHA_PROJ),
    "kv_map_tile": KnownBug(
        "the key/value heads are repeated in the wrong order (tiled): query head j reads key/value head j % g "
        "instead of j // (h/g)",
        "repeat each key/value head h/g times in place: np.repeat(k, n_rep, axis=1) or "
        "k.repeat_interleave(n_rep, dim=1), not np.tile or k.repeat(1, n_rep, 1, 1). Consecutive query heads form "
        "a group (Eq. gqa-map).",
        EQ_GQA_MAP),
    "weights_averaged_over_heads": KnownBug(
        "the weights are averaged over the heads, (N, L_q, L_kv), as torch.nn.MultiheadAttention does by default, "
        "instead of returned per head, (N, h, L_q, L_kv)",
        "return the weights of every head.",
        EQ_MHA_HEAD),
    # --- masks, repeat_kv, the KV cache -----------------------------------------------------------------------------
    "causal_top_left": KnownBug(
        "the causal mask is aligned top-left (query i sees keys 0..i) instead of bottom-right (query i sees keys "
        "0..L_kv - L_q + i): with a KV cache the L_q queries are the last positions of the L_kv keys",
        "np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q). Beware: torch's is_causal=True is top-left when "
        "L_q != L_kv.",
        EQ_CHUNK_MASK),
    "causal_strict": KnownBug(
        "the diagonal is masked too: a query cannot see its own position",
        "j <= L_kv - L_q + i includes equality: np.tril(..., k=l_kv - l_q), not k=l_kv - l_q - 1.",
        EQ_CHUNK_MASK),
    "causal_one_future_key": KnownBug(
        "the causal mask is off by one: each query also sees the key just after its own position "
        "(np.tril(..., k=l_kv - l_q + 1), or j <= i + 1)",
        "query i is position L_kv - L_q + i: it sees keys j <= L_kv - L_q + i, itself included and nothing after, "
        "np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q) (torch: .tril(diagonal=l_kv - l_q)).",
        EQ_CHUNK_MASK),
    "causal_inverted": KnownBug(
        "the mask is inverted: True marks the forbidden (future) keys",
        "True = may attend: the lower triangle (np.tril) is True; np.triu(..., k=1) is its complement.",
        EQ_CHUNK_MASK),
    "causal_transposed": KnownBug(
        "the mask is transposed: keys on the rows, or the upper triangle allowed (queries see the future)",
        "rows are queries, columns are keys: shape (l_q, l_kv), mask[i, j] = (j <= l_kv - l_q + i).",
        EQ_CHUNK_MASK),
    "mask_not_boolean": KnownBug(
        "the mask has the right pattern but holds numbers (1/0), not booleans",
        "dtype=bool: np.tril(np.ones((l_q, l_kv), dtype=bool), ...). A 0/1 number mask in np.where or as an index "
        "does something else.",
        EQ_CHUNK_MASK),
    "additive_mask": KnownBug(
        "the mask is additive (0 where allowed, -inf or a large negative number where not), not boolean",
        "return booleans, True = may attend; the additive form is an implementation detail of the softmax.",
        EQ_CHUNK_MASK),
    "repeat_wrong_axis": KnownBug(
        "the key/value heads are repeated along the wrong axis (the positions, or the batch)",
        "repeat along axis 1, the head axis: np.repeat(y, n_rep, axis=1).",
        EQ_GQA_MAP),
    "repeat_not_merged": KnownBug(
        "the result keeps a separate group axis, (N, g, n_rep, L, d), instead of (N, g*n_rep, L, d)",
        "merge the two axes: .reshape(N, g * n_rep, L, d), group-major, so that query head j reads kv head "
        "j // n_rep.",
        EQ_GQA_MAP),
    "no_causal_mask": KnownBug(
        "the new queries see all the new keys: no causal mask inside a chunk of several new positions",
        "when T > 1 positions arrive at once after c cached ones, query i may attend to key j iff j <= c + i "
        "(Eq. kv-chunk-mask); a single new position (T = 1) needs no mask.",
        EQ_CHUNK_MASK),
    "cache_prepended": KnownBug(
        "the new keys/values are put before the cached ones instead of after them",
        "np.concatenate([k_cache, k_new], axis=2): the cache keeps positions in order, oldest first.",
        EQ_KV_STEP),
    "new_position_not_attended": KnownBug(
        "the new queries attend to the cached keys only: the new positions' own keys and values are appended after "
        "the attention instead of before",
        "append first, then attend over [K_cache; k_new] (Eq. kv-step): a position attends to itself.",
        EQ_KV_STEP),
    "cache_not_updated": KnownBug(
        "the returned caches are the old ones: the new keys and values are not appended",
        "return k_all = concat([k_cache, k_new], axis=2) (and the same for v): the next step needs them.",
        EQ_KV_STEP),
    "cache_repeated_heads": KnownBug(
        "the returned cache holds the repeated heads (n_heads per position) instead of the n_kv_heads key/value "
        "heads, so it is n_heads / n_kv_heads times too large",
        "cache the n_kv_heads heads and repeat only the copies you attend with: GQA's point is the smaller cache "
        "(part II 'MQA and GQA').",
        EQ_KV_STEP),
    # --- online softmax -------------------------------------------------------------------------------------------
    "drop_last_partial_block": KnownBug(
        "the loop over key blocks skips the last block when L_kv is not a multiple of block_size",
        "for start in range(0, L_kv, block_size): k[..., start:start + block_size, :]; the last block is shorter "
        "(T = ceil(n / b) blocks).",
        EQ_ONLINE),
    "no_rescale_acc": KnownBug(
        "the accumulator is not rescaled by alpha = exp(m_old - m_new) when the running maximum grows",
        "acc = alpha * acc + P @ V_block: the old terms were computed relative to the old maximum.",
        EQ_ONLINE_ACC),
    "no_rescale_l": KnownBug(
        "the running sum l is not rescaled by alpha = exp(m_old - m_new) when the running maximum grows",
        "l = alpha * l + P.sum(axis=-1, keepdims=True).",
        EQ_ONLINE_L),
    "no_rescale": KnownBug(
        "neither the running sum l nor the accumulator is rescaled when the running maximum grows",
        "alpha = exp(m_old - m_new); l = alpha * l + rowsum(P); acc = alpha * acc + P @ V_block.",
        EQ_ONLINE_L),
    "alpha_inverted": KnownBug(
        "the rescaling factor is exp(m_new - m_old) instead of exp(m_old - m_new)",
        "alpha = exp(m_old - m_new) lies in [0, 1]: it shrinks the old terms when the maximum grows.",
        EQ_ONLINE_L),
    "no_final_division": KnownBug(
        "the output is the accumulator itself: it is never divided by the running sum l",
        "out = acc / l after the last block (Eq. online-final).",
        EQ_ONLINE_FINAL),
    "online_nan_empty_state": KnownBug(
        "a query whose first key block is fully masked gets NaN: while the running maximum is -inf, "
        "exp(s - m) = exp(-inf - (-inf)) = NaN",
        "shift by a finite number while the running maximum is still -inf: "
        "shift = np.where(np.isfinite(m_new), m_new, 0.0); every term is exp(-inf) = 0 anyway.",
        EQ_ONLINE_FINAL),
    # --- backward -------------------------------------------------------------------------------------------------
    "vjp_missing_rowsum": KnownBug(
        "the softmax backward is dS = A * dA: the term from -a a^T of the Jacobian, the row sum, is missing",
        "dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True)).",
        EQ_SOFTMAX_VJP),
    "vjp_diagonal_only": KnownBug(
        "the softmax backward uses only the diagonal of the Jacobian: dS = A (1 - A) dA (the sigmoid's derivative)",
        "the off-diagonal entries -a_i a_j matter: J = diag(a) - a a^T, so dS = A * (dA - rowsum(dA * A)).",
        EQ_SOFTMAX_JAC),
    "vjp_rowsum_of_grad": KnownBug(
        "the row sum in the softmax backward is of dA alone, sum_j dA_j, instead of sum_j dA_j A_j",
        "dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True)).",
        EQ_SOFTMAX_VJP),
    "vjp_sign": KnownBug(
        "the row-sum term of the softmax backward has the wrong sign: A * (dA + rowsum(dA * A))",
        "dS = A * (dA - rowsum(dA * A)), from J = diag(a) - a a^T.",
        EQ_SOFTMAX_VJP),
    "vjp_sum_without_keepdims": KnownBug(
        "the row sum is taken without keepdims, so broadcasting subtracts the sum of another row (silently, when "
        "the last two axes have the same length)",
        "(dA * A).sum(axis=-1, keepdims=True).",
        EQ_SOFTMAX_VJP),
    "vjp_sum_wrong_axis": KnownBug(
        "the sum of the softmax backward runs over axis -2 (a column) instead of the last axis (the row)",
        "the softmax normalised each row over the last axis, so its backward sums over the last axis too.",
        EQ_SOFTMAX_VJP),
    "grad_missing_scale": KnownBug(
        "dQ and dK miss the factor `scale`: dQ = dS K instead of scale * dS K (and the same for dK)",
        "S = scale * Q K^T, so the chain rule multiplies by scale once more: dQ = scale dS K, dK = scale dS^T Q.",
        EQ_DQ_DK),
    "grad_dv_no_transpose": KnownBug(
        "dV = A dO instead of A^T dO",
        "O = A V, so dV = A^T dO (Lemma bwd-lemma-matmul): it has V's shape (L_kv, d_v).",
        EQ_DV_DA),
}

# Hints for exceptions, keyed on a fragment of the exception's message (behaviour, not source code).
_ERROR_HINTS = (
    ("view size is not compatible", "view_non_contiguous"),
    ("could not be broadcast", "A broadcasting error: usually a reduction (sum, max) without keepdims=True, or "
                               "arrays whose axes are in a different order than you think."),
    ("must match the size of tensor", "A broadcasting error: usually a reduction (sum, max) without keepdim=True, "
                                      "or tensors whose axes are in a different order than you think."),
    ("matmul", "A matrix-product shape error: transpose only the last two axes of k (np.swapaxes(k, -1, -2), "
               "k.transpose(-2, -1)); k.T reverses every axis of a batched array."),
    ("cannot be multiplied", "A matrix-product shape error: check which axes you transpose (k.T reverses every "
                             "axis of a batched array; use k.transpose(-2, -1))."),
    ("cannot reshape", "A reshape error: check the sizes you reshape to against the shapes in the case name."),
    ("shape '[", "A reshape/view error: check the sizes you reshape to against the shapes in the case name."),
)


# ---------------------------------------------------------------------------------------------------------------
# Time limits: stop a call of fn that runs longer than `timeout` seconds.
# ---------------------------------------------------------------------------------------------------------------


class _TimedOut(BaseException):
    """Raised inside fn when its time is up: a BaseException, like KeyboardInterrupt, so that an ``except Exception``
    in fn (or in the checker) does not swallow it. The checker turns it into an ExerciseTimeout."""


class _TimeLimit:
    """``start()`` ... ``stop()`` raises _TimedOut in the calling thread once ``seconds`` have passed in between.

    The main thread uses SIGALRM (signal.setitimer), which also interrupts time.sleep and other blocking calls;
    other threads (no signal handlers there), and the main thread when an alarm set by someone else is due first,
    use a watchdog thread. After ``stop()`` nothing is left: no timer or handler of ours, no pending exception; the
    alarm we replaced gets its handler back and its timer, less the time spent. Call ``stop()`` in a ``finally``
    whose ``try`` includes ``start()`` (which is not a context manager for that reason: a timeout due while
    ``__enter__`` returns would skip ``__exit__``).
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.theirs = None  # (handler, delay, interval) of the alarm we replaced, while ours is set
        self.watcher = None

    def start(self):
        self.begin = time.monotonic()
        if (hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGALRM) is not None):  # None: a handler installed outside Python
            delay, interval = signal.getitimer(signal.ITIMER_REAL)
            if not 0 < delay <= self.seconds:  # their alarm, if any, is due after ours: replace it for now
                self.theirs = (signal.signal(signal.SIGALRM, self._on_alarm), delay, interval)
                signal.setitimer(signal.ITIMER_REAL, self.seconds)
                return
        self._start_watchdog()

    def stop(self):
        if self.theirs is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            handler, delay, interval = self.theirs
            signal.signal(signal.SIGALRM, handler)  # first runs a still-pending alarm: _on_alarm ignores it here
            self.theirs = None
            if delay > 0:  # their timer, less the time spent here (due at once if it fell due meanwhile)
                signal.setitimer(signal.ITIMER_REAL, max(delay - (time.monotonic() - self.begin), 1e-6), interval)
        elif self.watcher is not None:
            self._stop_watchdog()

    def _on_alarm(self, signum, frame):
        # An alarm that arrives once fn has returned (inside stop) is ignored: fn did return in time.
        if frame is None or frame.f_code is not _TimeLimit.stop.__code__:
            raise _TimedOut

    # The watchdog: a thread that, when time is up, makes the calling thread raise _TimedOut with
    # PyThreadState_SetAsyncExc. Its limits: the exception is raised only when that thread next runs Python bytecode,
    # so one long C call (time.sleep(1000), a huge matmul, a blocking read) is not interrupted until it returns; and
    # code that catches BaseException (a bare `except:`) can swallow it. The lock makes "fire" and "the call is
    # over" exclusive; an exception fired but not yet raised when the call ends is withdrawn.

    def _start_watchdog(self):
        self.target, self.lock, self.over = threading.get_ident(), threading.Lock(), threading.Event()
        self.done = self.fired = False

        def watch():
            if self.over.wait(self.seconds):
                return
            with self.lock:
                if not self.done:
                    self.fired = True
                    _set_async_exc(self.target, _TimedOut)

        self.watcher = threading.Thread(target=watch, name="mha.exercises time limit", daemon=True)
        self.watcher.start()

    def _stop_watchdog(self):
        self.over.set()
        with self.lock:
            self.done = True
            if self.fired:
                _set_async_exc(self.target, None)  # withdraw it if it is still pending
        self.watcher.join()


def _set_async_exc(thread_id: int, exc) -> None:
    """Make thread ``thread_id`` raise ``exc`` at its next bytecode (None: withdraw a pending one). CPython only."""
    set_async_exc = getattr(getattr(ctypes, "pythonapi", None), "PyThreadState_SetAsyncExc", None)
    if set_async_exc is not None:
        set_async_exc(ctypes.c_ulong(thread_id), None if exc is None else ctypes.py_object(exc))


_LIBRARIES = tuple(sysconfig.get_paths()[key] for key in ("stdlib", "purelib", "platlib"))


def _check_timeout(timeout) -> float | None:
    if timeout is None:
        return None
    try:
        return check_float("timeout", timeout, minimum=0, min_inclusive=False)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc} (seconds each call of your function may take; None: no limit)") from None


def _timeout_message(checker, case, backend, timeout, exc) -> str:
    where = [frame for frame in traceback.extract_tb(exc.__traceback__) if frame.filename != __file__]
    where = [f for f in where if not f.filename.startswith(_LIBRARIES)] or where  # your code, if it is on the stack
    at = "" if not where else f" at {where[-1].filename}, line {where[-1].lineno}" + (
        f" (`{where[-1].line}`)" if where[-1].line else "")
    return (f"{_header(checker, case, backend)}: your function did not return within {timeout:g} s, so the checker "
            f"stopped it{at}.\nHint: look for an infinite loop (a while loop whose condition never turns false, a "
            f"counter that is never incremented) or a very slow loop over single elements; these cases hold a few "
            f"dozen numbers, so a correct function returns in well under a second. To wait longer, pass "
            f"timeout=<seconds> (timeout=None: no limit).")


def _call(checker, case, backend, fn, args, kwargs, timeout):
    """fn on one case (through the case's driver if it has one), stopped after ``timeout`` seconds."""
    if timeout is None:
        return case.call(fn, args, kwargs) if case.call else fn(*args, **kwargs)
    limit = _TimeLimit(timeout)
    try:
        try:
            limit.start()
            return case.call(fn, args, kwargs) if case.call else fn(*args, **kwargs)
        finally:
            limit.stop()
    except _TimedOut as exc:
        raise ExerciseTimeout(_timeout_message(checker, case, backend, timeout, exc), checker, case.name,
                              timeout) from exc


# ---------------------------------------------------------------------------------------------------------------
# Cases, calls and comparisons.
# ---------------------------------------------------------------------------------------------------------------


class _Output(NamedTuple):
    name: str  # as in the signature: "out", "weights", ...
    formula: str  # what it must equal, in words
    equation: Equation


@dataclass
class _Case:
    name: str  # what is special about it: shapes and flags
    args: tuple  # positional arguments (NumPy; converted per backend on each call)
    kwargs: dict  # keyword arguments
    expected: tuple  # one float64 (or bool) array per output, from mha.reference
    variants: list = field(default_factory=list)  # (bug id, thunk -> outputs tuple | None) what each bug would give
    note: str = ""  # shown when this case fails and no known bug matches
    call: Callable | None = None  # custom driver (fn, args, kwargs) -> result, for multi-call cases
    arg_names: tuple = ()  # names of args for messages, when they are not fn's own arguments (custom driver)


def _check_fn(checker: str, fn) -> None:
    if not callable(fn):
        raise TypeError(f"{checker}: fn must be a callable (the function you wrote), got {fn!r} of type "
                        f"{type(fn).__name__}")


_KEYWORDS_DOC = """

    Like every checker, it also takes ``backend`` ("auto", "numpy" or "torch": the kind of inputs) and ``timeout``
    (seconds each call of ``fn`` may take, default :data:`TIMEOUT` = 10; None: no limit): a call that runs longer is
    stopped and reported as :class:`ExerciseTimeout`, naming the case. See the module docstring.
    """


def _checker(body):
    """Decorator for the public checkers: validate ``fn``, ``backend`` and ``timeout`` before any case is built."""
    @functools.wraps(body)
    def check(fn, *args, backend: str = "auto", timeout: float | None = TIMEOUT, **kwargs):
        _check_fn(body.__name__, fn)
        check_choice("backend", backend, _BACKENDS)
        timeout = _check_timeout(timeout)
        return body(fn, *args, backend=backend, timeout=timeout, **kwargs)
    check.__doc__ = body.__doc__.rstrip() + _KEYWORDS_DOC  # one wording for the keywords every checker shares
    return check


def _torch():
    return import_module("torch")


def _is_tensor(x) -> bool:
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
    return torch is not None and isinstance(x, torch.Tensor)


def _fresh(x, backend: str):
    """A new copy of a case input for one call: same layout (a non-contiguous input stays non-contiguous)."""
    if isinstance(x, np.ndarray):
        copy = np.empty_like(x, order="K")  # keeps the axis order of the strides
        np.copyto(copy, x)
        if not x.flags.c_contiguous and copy.flags.c_contiguous:
            copy = np.swapaxes(np.swapaxes(x, -1, -2).copy(), -1, -2)  # a transposed view again
        return _torch().from_numpy(copy) if backend == "torch" else copy
    if isinstance(x, dict):
        return {key: _fresh(value, backend) for key, value in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_fresh(value, backend) for value in x)
    return x


def _to_numpy(x):
    """An output as a NumPy array (float64, or bool for a mask); None if it is not array-like."""
    if _is_tensor(x):
        x = x.detach().cpu()
        if x.is_floating_point() and x.dtype != _torch().float64:
            x = x.double()
        x = x.numpy()
    try:
        arr = np.asarray(x)
    except Exception:
        return None
    if arr.dtype == np.bool_:
        return arr
    if arr.dtype.kind not in "iuf":
        return None
    return arr.astype(np.float64)


def _unchanged(passed, pristine) -> bool:
    if isinstance(pristine, np.ndarray):
        now = _to_numpy(passed)
        return now is not None and now.shape == pristine.shape and np.array_equal(now, pristine)
    if isinstance(pristine, dict):
        return all(_unchanged(passed[key], value) for key, value in pristine.items())
    if isinstance(pristine, (tuple, list)):
        return all(_unchanged(a, b) for a, b in zip(passed, pristine))
    return True


def _tolerance(expected: np.ndarray) -> float:
    finite = np.abs(expected[np.isfinite(expected)]) if expected.size else np.zeros(0)
    return ATOL * max(1.0, float(finite.max()) if finite.size else 1.0)


def _same(actual, expected, equal_nan: bool = False) -> bool:
    """Does ``actual`` equal ``expected`` (same shape; bool exactly, floats to the tolerance)?"""
    if actual is None or expected is None or actual.shape != expected.shape:
        return False
    if expected.dtype == np.bool_ or actual.dtype == np.bool_:
        return actual.dtype == expected.dtype and bool(np.array_equal(actual, expected))
    return bool(np.allclose(actual, expected, rtol=RTOL, atol=_tolerance(expected), equal_nan=equal_nan))


def _fmt_index(index) -> str:
    return ",".join(str(i) for i in index)


def _fmt_values(values) -> str:
    if values.dtype == np.bool_:
        return "[" + " ".join("T" if v else "F" for v in values) + "]"
    return "[" + ", ".join(f"{v:.6g}" for v in values) + "]"


def _show(name: str, expected: np.ndarray, actual) -> str:
    """A few expected and actual numbers, around the entry that differs most."""
    if actual is None:
        return ""
    if actual.shape != expected.shape:
        return f"    expected {name} of shape {expected.shape}, got shape {actual.shape}\n"
    if expected.ndim == 0:
        return f"    expected {name} = {expected}, got {actual}\n"
    if expected.dtype == np.bool_ or actual.dtype == np.bool_:
        diff = (actual != expected).astype(np.float64)
    else:
        with np.errstate(invalid="ignore"):
            diff = np.abs(actual - expected)
        diff = np.where(np.isnan(diff), np.inf, diff)
    where = np.unravel_index(int(np.argmax(diff)), diff.shape)
    row, col = where[:-1], where[-1]
    width = expected.shape[-1]
    start = max(0, min(col - 2, width - 5))
    stop = min(width, start + 5)
    label = f"{name}[{_fmt_index(row)}{',' if row else ''}{start}:{stop}]"
    return (f"    expected {label} = {_fmt_values(expected[row][start:stop])}\n"
            f"    got      {label} = {_fmt_values(actual[row][start:stop])}\n")


def _describe_bug(bug: str, equation: Equation) -> str:
    known = KNOWN_BUGS[bug]
    where = "" if known.equation in (None, equation) else (
        f" (book Eq. {known.equation.label}, {known.equation.chapter})")
    return f"This matches a known bug: {known.description}{where}.\nHint: {known.hint}"


def _diagnose(case: _Case, actual: tuple) -> str | None:
    """The first known bug whose output on this case (computed independently) is what ``fn`` returned."""
    for bug, thunk in case.variants:
        try:
            with np.errstate(all="ignore"):
                variant = thunk()
        except Exception:  # the bug cannot happen on these shapes (its code would raise)
            continue
        if variant is None:
            continue
        if callable(variant):  # a predicate on the outputs
            if variant(actual):
                return bug
            continue
        variant = tuple(_to_numpy(v) for v in variant)
        if all(_same(v, e, equal_nan=True) for v, e in zip(variant, case.expected)):
            continue  # this bug is invisible on this case
        if all(_same(a, v, equal_nan=True) for a, v in zip(actual, variant)):
            return bug
    return "outputs_swapped" if _swapped_order(case, actual) else None


def _swapped_order(case: _Case, actual: tuple) -> tuple | None:
    """The order p such that actual[i] is the expected output p[i], when fn returned its outputs out of order."""
    n = len(case.expected)
    for order in itertools.permutations(range(n)):
        if order == tuple(range(n)) or all(_same(case.expected[j], case.expected[i]) for i, j in enumerate(order)):
            continue  # the right order, or an order that changes nothing on this case
        if all(_same(actual[i], case.expected[j]) for i, j in enumerate(order)):
            return order
    return None


def _header(checker: str, case: _Case, backend: str) -> str:
    inputs = " (inputs: torch float64 tensors)" if backend == "torch" else ""
    return f"{checker}: case '{case.name}'{inputs}"


def _exception_text(exc) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 400 else text[:400] + " ..."


def _exception_message(checker, case, backend, excs) -> tuple[str, str | None]:
    """The message for a case on which fn raised: ``excs`` is [(exception, 'with NumPy arrays' or '')]."""
    if len({_exception_text(exc) for exc, _ in excs}) == 1:  # the same error with both backends: say it once
        excs = excs[:1]
        raised = _exception_text(excs[0][0])
    else:
        raised = "; and ".join(f"{where}{' ' if where else ''}{_exception_text(exc)}" for exc, where in excs)
    message = f"{_header(checker, case, backend)}: your function raised {raised}\n"
    if any(isinstance(exc, NotImplementedError) for exc, _ in excs):
        return message + "Hint: replace the stub's `raise NotImplementedError` with your code.", None
    for exc, _ in reversed(excs):  # with both backends tried, the torch error (last) is usually the telling one
        for fragment, hint in _ERROR_HINTS:
            if fragment in str(exc):
                if hint in KNOWN_BUGS:
                    return message + f"This matches a known bug: {KNOWN_BUGS[hint].description}.\n" \
                                     f"Hint: {KNOWN_BUGS[hint].hint}", hint
                message += f"Hint: {hint}\n"
                break
        else:
            continue
        break
    if case.note:
        message += f"About this case: {case.note}"
    return message.rstrip("\n"), None


def _unpack(checker, case, backend, outputs, result) -> tuple:
    n = len(outputs)
    names = ", ".join(o.name for o in outputs)
    if n == 1:
        if isinstance(result, (tuple, list)):
            raise ExerciseError(f"{_header(checker, case, backend)}: your function returned a {type(result).__name__} "
                                f"of {len(result)} values; expected one array, {names}", checker, case.name)
        values = (result,)
    else:
        if not isinstance(result, (tuple, list)) or len(result) != n:
            got = (f"a {type(result).__name__} of {len(result)} values" if isinstance(result, (tuple, list))
                   else f"one {type(result).__name__}")
            raise ExerciseError(f"{_header(checker, case, backend)}: your function returned {got}; expected a tuple "
                                f"of {n} arrays ({names})", checker, case.name)
        values = tuple(result)
    arrays = tuple(_to_numpy(v) for v in values)
    for spec, value, arr in zip(outputs, values, arrays):
        if arr is None:
            raise ExerciseError(f"{_header(checker, case, backend)}: {spec.name} is a {type(value).__name__}, not an "
                                f"array of numbers", checker, case.name)
    return arrays


def _run(checker: str, fn, backend: str, inputs: tuple, outputs: tuple, cases: list, timeout: float | None) -> None:
    """Call ``fn`` on every case; raise ExerciseError at the first case it gets wrong.

    ``inputs`` names fn's positional arguments (for messages), ``outputs`` describes what it returns; each call may
    take ``timeout`` seconds (ExerciseTimeout).
    """
    if backend == "auto":
        backend, failures = _pick_backend(checker, fn, cases[0], timeout)
        if failures:
            message, bug = _exception_message(checker, cases[0], backend, failures)
            raise ExerciseError(message, checker, cases[0].name, bug) from failures[-1][0]
    for case in cases:
        args, kwargs = _fresh(case.args, backend), _fresh(case.kwargs, backend)
        try:
            result = _call(checker, case, backend, fn, args, kwargs, timeout)
        except ExerciseError:
            raise
        except Exception as exc:
            message, bug = _exception_message(checker, case, backend, [(exc, "")])
            raise ExerciseError(message, checker, case.name, bug) from exc
        names = case.arg_names or inputs
        changed = [name for name, passed, pristine in zip(names, args, case.args) if not _unchanged(passed, pristine)]
        changed += [name for name, value in case.kwargs.items() if not _unchanged(kwargs[name], value)]
        if changed:
            known = KNOWN_BUGS["modifies_input"]
            raise ExerciseError(f"{_header(checker, case, backend)}: after the call, {', '.join(changed)} no longer "
                                f"held what was passed in.\nThis matches a known bug: {known.description}.\n"
                                f"Hint: {known.hint}", checker, case.name, "modifies_input")
        actual = _unpack(checker, case, backend, outputs, result)
        wrong = [i for i, (a, e) in enumerate(zip(actual, case.expected)) if not _same(a, e)]
        if wrong:
            bug = _diagnose(case, actual)
            raise ExerciseError(_mismatch_message(checker, case, backend, outputs, actual, wrong, bug),
                                checker, case.name, bug)


def _mismatch_message(checker, case, backend, outputs, actual, wrong, bug) -> str:
    first = wrong[0]
    spec, expected, got = outputs[first], case.expected[first], actual[first]
    lines = f"{_header(checker, case, backend)}: {spec.name} differs from {spec.formula} " \
            f"(book Eq. {spec.equation.label}, {spec.equation.chapter}).\n"
    lines += _show(spec.name, expected, got)
    if len(outputs) > 1:
        right = [o.name for i, o in enumerate(outputs) if i not in wrong]
        also = [o.name for i, o in enumerate(outputs) if i in wrong[1:]]
        parts = ([f"also wrong: {', '.join(also)}"] if also else []) + ([f"right: {', '.join(right)}"] if right else [])
        lines += "    (" + "; ".join(parts) + ")\n"
    if bug == "outputs_swapped":
        order = _swapped_order(case, actual)
        lines += (f"    (your function returned ({', '.join(outputs[j].name for j in order)}) instead of "
                  f"({', '.join(o.name for o in outputs)}))\n")
    if bug is not None:
        return lines + _describe_bug(bug, spec.equation)
    lines += "This matches none of the known bugs this checker simulates."
    if got is not None and got.dtype != np.bool_ and got.shape == expected.shape and not np.all(np.isfinite(got)):
        lines += (f" Your {spec.name} contains NaN or inf: look for exp of a large number (subtract the maximum), "
                  f"a division by zero (rows with no allowed key), or -inf - (-inf).")
    if case.note:
        lines += f"\nAbout this case: {case.note}"
    return lines


def _pick_backend(checker: str, fn, case: _Case, timeout: float | None) -> tuple[str, list]:
    """'numpy', unless fn fails on the first case's NumPy arrays and runs on torch tensors.

    Returns (backend, failures): failures is empty, or [(numpy exception, ...), (torch exception, ...)] when fn
    raised with both. A call that runs out of time raises ExerciseTimeout at once.
    """
    failures = []
    for backend, where in (("numpy", "with NumPy arrays"), ("torch", "with torch tensors")):
        args, kwargs = _fresh(case.args, backend), _fresh(case.kwargs, backend)
        try:
            _call(checker, case, backend, fn, args, kwargs, timeout)
            return backend, []
        except ExerciseTimeout:
            raise
        except Exception as exc:
            failures.append((exc, where))
    return "numpy", failures


# ---------------------------------------------------------------------------------------------------------------
# What the known bugs compute: small independent NumPy versions of each buggy computation.
# ---------------------------------------------------------------------------------------------------------------

_FILL = {"zero": -np.inf, "nan": -np.inf, "large_negative": -1e9, "zero_score": 0.0}


def _sim_softmax(s, mask=None, *, axis=-1, fill="zero", shift="row", keepdims=True):
    """Softmax of ``s`` along ``axis`` (None: all entries) the way a given bug computes it.

    fill: how masked scores are handled: 'zero' (the book: -inf, rows with no allowed key -> 0), 'nan' (-inf and no
    guard: 0/0), 'large_negative' (-1e9), 'zero_score' (0), 'after' (the softmax output multiplied by the mask).
    shift: 'row' (the row maximum), 'none' (no shift), 'global' (the maximum of the whole array).
    """
    if mask is not None and fill != "after":
        s = np.where(mask, s, _FILL[fill])
    if shift == "none":
        top = 0.0
    elif shift == "global" or axis is None:
        top = np.max(np.where(np.isfinite(s), s, -np.inf))
    else:
        top = np.max(s, axis=axis, keepdims=True)
        if fill != "nan":
            top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(s - top)
    total = np.sum(e, axis=axis, keepdims=keepdims and axis is not None)
    if mask is not None and fill == "zero" and keepdims:  # the book's guard for rows with no allowed key
        weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    else:
        weights = e / total
    return weights * mask if (mask is not None and fill == "after") else weights


def _bug_scale(rule, q, k, v, scale):
    """The scale a bug uses, or None when the bug does not apply (it only concerns the default scale)."""
    d_k = q.shape[-1]
    if rule == "given":
        return 1 / math.sqrt(d_k) if scale is None else scale
    if rule == "none":
        return 1.0
    if rule == "ignored":
        return 1 / math.sqrt(d_k) if scale is not None else None
    if scale is not None:
        return None
    return {"d_k": 1 / d_k, "inverted": math.sqrt(d_k), "d_v": 1 / math.sqrt(v.shape[-1]),
            "seq_len": 1 / math.sqrt(k.shape[-2])}[rule]


def _sim_sdpa(q, k, v, mask=None, scale=None, *, scale_rule="given", softmax_axis=-1, invert_mask=False,
              ignore_mask=False, **softmax_kw):
    c = _bug_scale(scale_rule, q, k, v, scale)
    if c is None or (ignore_mask and mask is None):
        return None
    if ignore_mask:
        mask = None
    if invert_mask:
        if mask is None:
            return None
        mask = ~mask
    weights = _sim_softmax(c * (q @ np.swapaxes(k, -1, -2)), mask, axis=softmax_axis, **softmax_kw)  # (.., L_q, L_kv)
    return weights @ v, weights


# The known bugs of scaled dot-product attention (and of the attention inside the bigger functions). When two bugs give
# the same result on a case, the first in the list is named: the cases are ordered so that each bug shows first on
# the case that is about it (an unguarded -inf mask and a missing max subtraction both give NaN on a fully masked
# row; that case is about the mask).
_SCALE_BUGS = [
    ("no_scale", dict(scale_rule="none")),
    ("scale_d_k_not_sqrt", dict(scale_rule="d_k")),
    ("scale_inverted", dict(scale_rule="inverted")),
    ("scale_d_v", dict(scale_rule="d_v")),
    ("scale_seq_len", dict(scale_rule="seq_len")),
    ("scale_ignored", dict(scale_rule="ignored")),
]
_SOFTMAX_BUGS = [
    ("softmax_over_queries", dict(softmax_axis=-2)),
    ("shift_not_row_max", dict(shift="global")),
    ("no_max_subtraction", dict(shift="none")),
]
_MASK_BUGS = [
    ("mask_inverted", dict(invert_mask=True)),
    ("mask_inverted", dict(invert_mask=True, fill="nan")),
    ("mask_inverted", dict(invert_mask=True, fill="large_negative")),
    ("mask_fill_large_negative", dict(fill="large_negative")),
    ("mask_nan_empty_rows", dict(fill="nan")),
    ("mask_fill_zero", dict(fill="zero_score")),
    ("mask_after_softmax", dict(fill="after")),
    ("mask_ignored", dict(ignore_mask=True)),
]


def _variants(sim, bugs, *args, **kwargs):
    """(bug id, thunk) for each known bug: the thunk computes what the bug returns on this case's inputs."""
    def thunk(bug_kwargs):
        return lambda: sim(*args, **kwargs, **bug_kwargs)
    return [(bug, thunk(bug_kwargs)) for bug, bug_kwargs in bugs]


# ---------------------------------------------------------------------------------------------------------------
# check_softmax
# ---------------------------------------------------------------------------------------------------------------


def _softmax_case(name, x, axis, note=""):
    expected = (reference.softmax(x, axis=axis),)
    bugs = [("shift_not_row_max", dict(shift="global")), ("no_max_subtraction", dict(shift="none")),
            ("sum_without_keepdims", dict(keepdims=False))]
    bugs += [("softmax_wrong_axis", dict(axis=other)) for other in [*range(x.ndim), None]
             if other is None or other != axis % x.ndim]

    def sim(**kw):
        out = _sim_softmax(x, **{"axis": axis, **kw})
        return None if out.shape != x.shape else (out,)
    return _Case(name, (x,), {"axis": axis}, expected, _variants(sim, bugs), note)


@_checker
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
    _run("check_softmax", fn, backend, ("x",),
         (_Output("softmax", "exp(x_i - max x) / sum_j exp(x_j - max x) along axis", EQ_SOFTMAX),), cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_scaled_dot_product_attention
# ---------------------------------------------------------------------------------------------------------------

_SDPA_OUTPUTS = (
    _Output("out", "softmax(QK^T/sqrt(d_k)) V", EQ_SDPA),
    _Output("weights", "softmax(QK^T/sqrt(d_k)) (masked entries 0, rows with no allowed key all 0)", EQ_MASKED_SOFTMAX),
)


def _shapes(**arrays) -> str:
    return ", ".join(f"{name} {tuple(a.shape)}" for name, a in arrays.items())


def _sdpa_case(label, q, k, v, mask=None, scale=None, note=""):
    name = f"{label}: {_shapes(q=q, k=k, v=v)}"
    name += f", mask {tuple(mask.shape)}" if mask is not None else ", mask=None"
    name += f", scale={scale}" if scale is not None else ", scale=None"
    kwargs = {key: value for key, value in (("mask", mask), ("scale", scale)) if value is not None}
    expected = reference.scaled_dot_product_attention(q, k, v, mask, scale)
    variants = _variants(_sim_sdpa, _SCALE_BUGS + _MASK_BUGS + _SOFTMAX_BUGS, q, k, v, mask, scale)
    return _Case(name, (q, k, v), kwargs, expected, variants, note)


def _row_with_no_key(rng, shape, empty_row):
    """A random boolean mask with at least one allowed key per row, except row ``empty_row`` (no key)."""
    mask = rng.random(shape) < 0.6
    mask[..., 0] |= ~mask.any(axis=-1)
    mask[..., empty_row, :] = False
    return mask


def _causal(l_q, l_kv):
    """Bottom-right aligned causal mask, (l_q, l_kv): query i sees keys j <= l_kv - l_q + i."""
    return np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q)


def _padding(lengths, l_kv):
    """(N, 1, 1, l_kv) padding mask: sequence b keeps its first lengths[b] keys."""
    return (np.arange(l_kv)[None, :] < np.asarray(lengths)[:, None])[:, None, None, :]


def _t(x):
    """A non-contiguous copy of x: the same values, stored with its last two axes swapped."""
    return np.swapaxes(np.ascontiguousarray(np.swapaxes(x, -1, -2)), -1, -2)


@_checker
def check_scaled_dot_product_attention(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(q, k, v, mask=None, scale=None) -> (out, weights)``, as ``reference.scaled_dot_product_attention``.

    q ``(..., L_q, d_k)``, k ``(..., L_kv, d_k)``, v ``(..., L_kv, d_v)``; ``mask`` boolean, True = may attend,
    broadcastable to ``(..., L_q, L_kv)``; ``scale`` defaults to ``1/sqrt(d_k)``. A query row with no allowed key gets
    zero weights and a zero output. Cases: 2-D and 4-D inputs, L_q != L_kv, d_v != d_k, an explicit scale, causal and
    padding masks, a fully masked row, large logits, a batch of one with one query, non-contiguous inputs.

    Book: part I, 'Scaled dot-product attention' (Eqs. sdpa-attention, sdpa-masked-softmax); the scale: part I,
    'Why divide by √d_k'.
    """
    rng = np.random.default_rng(202)
    r = rng.standard_normal
    batched = "The first case with batch axes: transpose only the last two axes of k (np.swapaxes(k, -1, -2), " \
              "k.transpose(-2, -1)); k.T reverses all of them. Matrix products act on the last two axes."
    cases = [
        _sdpa_case("no batch axes, L_q != L_kv, d_v != d_k", r((4, 8)), r((6, 8)), r((6, 5))),
        _sdpa_case("batch and head axes", r((2, 3, 5, 8)), r((2, 3, 7, 8)), r((2, 3, 7, 6)), note=batched),
        _sdpa_case("explicit scale", r((2, 5, 6)), r((2, 4, 6)), r((2, 4, 3)), scale=0.3),
        _sdpa_case("causal mask", r((2, 5, 8)), r((2, 5, 8)), r((2, 5, 4)), mask=_causal(5, 5),
                   note="mask[i, j] = True means query i may attend to key j."),
        _sdpa_case("padding mask (lengths 7 and 3), broadcast over heads and queries", r((2, 2, 4, 8)),
                   r((2, 2, 7, 8)), r((2, 2, 7, 8)), mask=_padding([7, 3], 7),
                   note="The mask has shape (N, 1, 1, L_kv): it broadcasts over the heads and the queries."),
        _sdpa_case("query row 2 has no allowed key", r((4, 8)), r((5, 8)), r((5, 3)),
                   mask=_row_with_no_key(rng, (4, 5), 2),
                   note="A row with no allowed key must give zero weights and a zero output row (the book's "
                        "convention), never NaN and never uniform weights."),
        _sdpa_case("large logits (scaled scores in the thousands)", 40 * r((3, 8)), 40 * r((6, 8)), r((6, 4)),
                   note="exp of a score above about 709 overflows float64: subtract the row maximum first."),
        _sdpa_case("a batch of one, one head, one query", r((1, 1, 1, 4)), r((1, 1, 3, 4)), r((1, 1, 3, 4))),
        _sdpa_case("non-contiguous q, k, v (transposed views)", _t(r((2, 3, 5, 8))), _t(r((2, 3, 6, 8))),
                   _t(r((2, 3, 6, 4))), mask=_causal(5, 6)),
    ]
    _run("check_scaled_dot_product_attention", fn, backend, ("q", "k", "v"), _SDPA_OUTPUTS, cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_split_heads, check_merge_heads
# ---------------------------------------------------------------------------------------------------------------


def _split(y, n_heads, rule="transpose"):
    """(N, L, n*hd) -> (N, n, L, hd) the correct way ('transpose') or as a bug does."""
    N, L, width = y.shape
    head_dim = width // n_heads
    if rule == "transpose":
        return y.reshape(N, L, n_heads, head_dim).transpose(0, 2, 1, 3)  # (N, L, n, hd) -> (N, n, L, hd)
    if rule == "no_transpose":
        return y.reshape(N, n_heads, L, head_dim)  # (N, n, L, hd): positions and column blocks mixed
    if rule == "strided":
        return y.reshape(N, L, head_dim, n_heads).transpose(0, 3, 1, 2)  # (N, L, hd, n) -> (N, n, L, hd)
    if rule == "wrong_axes":
        return y.reshape(N, L, n_heads, head_dim).transpose(0, 2, 3, 1)  # (N, L, n, hd) -> (N, n, hd, L)
    raise ValueError(rule)


def _merge(y, rule="transpose"):
    """(N, n, L, hd) -> (N, L, n*hd) the correct way ('transpose') or as a bug does."""
    N, n, L, head_dim = y.shape
    if rule == "transpose":
        return y.transpose(0, 2, 1, 3).reshape(N, L, n * head_dim)  # (N, L, n, hd) -> (N, L, n*hd)
    if rule == "no_transpose":
        return y.reshape(N, L, n * head_dim)  # reads (N, n, L, hd) memory as (N, L, n*hd)
    if rule == "strided":
        return y.transpose(0, 2, 3, 1).reshape(N, L, n * head_dim)  # (N, L, hd, n) -> (N, L, hd*n): interleaved
    raise ValueError(rule)


def _split_case(label, y, n_heads):
    name = f"{label}: y {y.shape}, n_heads={n_heads} (head_dim {y.shape[-1] // n_heads})"
    bugs = [("split_no_transpose", "no_transpose"), ("split_strided", "strided"), ("split_wrong_axes", "wrong_axes")]
    variants = [(bug, (lambda rule: lambda: (_split(y, n_heads, rule),))(rule)) for bug, rule in bugs]
    expected = (reference._split_into_heads(y, n_heads),)
    return _Case(name, (y, n_heads), {}, expected, variants)


@_checker
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
        _split_case("non-contiguous y (a transposed view)", _t(r((2, 4, 6))), 2),
    ]
    _run("check_split_heads", fn, backend, ("y", "n_heads"),
         (_Output("heads", "y.reshape(N, L, h, head_dim) with axes 1 and 2 swapped: heads[n, i] = column block i",
                  EQ_FUSED),), cases, timeout)


def _merge_case(label, y):
    name = f"{label}: y {y.shape} (N, n_heads, L, head_dim)"
    bugs = [("merge_no_transpose", "no_transpose"), ("merge_strided", "strided")]
    variants = [(bug, (lambda rule: lambda: (_merge(y, rule),))(rule)) for bug, rule in bugs]
    return _Case(name, (y,), {}, (reference._merge_heads(y),), variants)


@_checker
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
        _merge_case("non-contiguous y (a transposed view)", _t(r((2, 2, 4, 3)))),
    ]
    _run("check_merge_heads", fn, backend, ("y",),
         (_Output("concat", "Concat(head_1, ..., head_h): y with axes 1 and 2 swapped, reshaped to (N, L, h*head_dim)",
                  EQ_MHA_OUTPUT),), cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_multi_head_attention
# ---------------------------------------------------------------------------------------------------------------


def _repeat(y, n_rep, rule="repeat"):
    """(N, g, L, d) -> (N, g*n_rep, L, d): query head j reads kv head j // n_rep ('repeat') or j % g ('tile')."""
    if rule == "repeat":
        return np.repeat(y, n_rep, axis=1)
    if rule == "tile":
        return np.tile(y, (1, n_rep, 1, 1))
    raise ValueError(rule)


def _sim_mha(x_q, x_kv, p, n_heads, mask=None, *, scale_rule="head_dim", split="transpose", merge="transpose",
             out_proj=True, skip_bias=(), value_weight="W_v", kv_input="x_kv", kv_map="repeat", average=False,
             **attention_kw):
    """Multi-head attention the way a given bug computes it (defaults: the book's layer)."""
    N, L_q, d_model = x_q.shape
    head_dim = p["W_q"].shape[1] // n_heads
    n_kv_heads = p["W_k"].shape[1] // head_dim
    source = x_q if kv_input == "x_q" else x_kv

    def project(x, weight, bias):
        y = x @ p[weight]  # (N, L, width)
        return y + p[bias] if (bias in p and bias not in skip_bias) else y

    value_bias = "b_v" if value_weight == "W_v" else "b_k"
    q = _split(project(x_q, "W_q", "b_q"), n_heads, split)  # (N, h, L_q, hd)
    k = _split(project(source, "W_k", "b_k"), n_kv_heads, split)  # (N, g, L_kv, hd)
    v = _split(project(source, value_weight, value_bias), n_kv_heads, split)  # (N, g, L_kv, hd)
    n_rep = n_heads // n_kv_heads
    k, v = _repeat(k, n_rep, kv_map), _repeat(v, n_rep, kv_map)  # (N, h, L_kv, hd)
    scale = {"head_dim": 1 / math.sqrt(head_dim), "d_model": 1 / math.sqrt(d_model), "none": 1.0}[scale_rule]
    result = _sim_sdpa(q, k, v, mask, scale, **attention_kw)
    if result is None:
        return None
    heads, weights = result  # (N, h, L_q, hd), (N, h, L_q, L_kv)
    out = _merge(heads, merge)  # (N, L_q, h*hd)
    if out_proj:
        out = out @ p["W_o"]  # (N, L_q, d_model)
        if "b_o" in p and "b_o" not in skip_bias:
            out = out + p["b_o"]
    return out, (weights.mean(axis=1) if average else weights)


_MHA_BUGS = [
    ("scale_d_model", dict(scale_rule="d_model")),
    ("no_scale", dict(scale_rule="none")),
    ("split_merge_no_transpose", dict(split="no_transpose", merge="no_transpose")),
    ("split_no_transpose", dict(split="no_transpose")),
    ("merge_no_transpose", dict(merge="no_transpose")),
    ("split_strided", dict(split="strided")),
    ("split_strided", dict(split="strided", merge="strided")),
    ("merge_strided", dict(merge="strided")),
    ("no_output_projection", dict(out_proj=False)),
    ("missing_bias_q", dict(skip_bias=("b_q",))),
    ("missing_bias_v", dict(skip_bias=("b_v",))),
    ("missing_bias_o", dict(skip_bias=("b_o",))),
    ("missing_input_biases", dict(skip_bias=("b_q", "b_k", "b_v"))),
    ("missing_biases", dict(skip_bias=("b_q", "b_k", "b_v", "b_o"))),
    ("values_from_W_k", dict(value_weight="W_k")),
    ("kv_from_x_q", dict(kv_input="x_q")),
    ("kv_map_tile", dict(kv_map="tile")),
    ("weights_averaged_over_heads", dict(average=True)),
] + _MASK_BUGS + _SOFTMAX_BUGS


def _mha_case(label, rng, *, N=2, L_q=5, L_kv=None, d_model=12, n_heads=3, n_kv_heads=None, head_dim=None,
              bias=True, mask=None, cross=False, x_scale=1.0, non_contiguous=False, note=""):
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    head_dim = d_model // n_heads if head_dim is None else head_dim
    params = reference.init_params(d_model, n_heads, n_kv_heads, head_dim, bias=bias, seed=int(rng.integers(1 << 30)))
    L_kv = L_q if L_kv is None else L_kv
    x_q = x_scale * rng.standard_normal((N, L_q, d_model))
    x_kv = x_scale * rng.standard_normal((N, L_kv, d_model)) if cross else x_q
    if non_contiguous:
        x_q, x_kv = _t(x_q), _t(x_kv)
        params["W_q"] = _t(params["W_q"])
    kind = "cross-attention" if cross else "self-attention (x_kv is x_q)"
    name = (f"{label}: {kind}, x_q {x_q.shape}, x_kv {x_kv.shape}, d_model={d_model}, n_heads={n_heads}, "
            f"n_kv_heads={n_kv_heads}, head_dim={head_dim}, {'with' if bias else 'no'} biases, "
            + (f"mask {mask.shape}" if mask is not None else "mask=None"))
    kwargs = {} if mask is None else {"mask": mask}
    expected = reference.multi_head_attention(x_q, x_kv, params, n_heads, mask)
    variants = _variants(_sim_mha, _MHA_BUGS, x_q, x_kv, params, n_heads, mask)
    return _Case(name, (x_q, x_kv, params, n_heads), kwargs, expected, variants, note)


@_checker
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
    empty_rows = _row_with_no_key(rng, (2, 3, 4, 6), 1)  # query 1 has no key in every head of every sequence ...
    empty_rows[1, 2, 3] = False  # ... and query 3 of sequence 1 none in head 2 only
    cases = [
        _mha_case("no biases", rng, bias=False),
        _mha_case("biases", rng),
        _mha_case("L_q != L_kv", rng, L_q=4, L_kv=6, cross=True),
        _mha_case("causal mask", rng, mask=_causal(5, 5)),
        _mha_case("padding mask (lengths 6 and 2)", rng, L_q=4, L_kv=6, cross=True, mask=_padding([6, 2], 6)),
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
                      n_heads=6, n_kv_heads=2, head_dim=2, mask=_causal(3, 5)),
            _mha_case("MQA: one key/value head", rng, d_model=16, n_heads=4, n_kv_heads=1),
        ]
    outputs = (
        _Output("out", "Concat(head_1, ..., head_h) W^O + b^O", EQ_MHA_OUTPUT),
        _Output("weights", "softmax(Q_i K_i^T / sqrt(head_dim)) for every head i", EQ_MHA_HEAD),
    )
    _run("check_multi_head_attention", fn, backend, ("x_q", "x_kv", "params", "n_heads"), outputs, cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_causal_mask
# ---------------------------------------------------------------------------------------------------------------


def _is_01_mask(expected):
    """Predicate: the output has the right pattern as numbers 1/0 (not booleans)."""
    def matches(actual):
        got = actual[0]
        return (got.dtype != np.bool_ and got.shape == expected.shape and bool(np.all((got == 0) | (got == 1)))
                and bool(np.array_equal(got == 1, expected)))
    return matches


def _is_additive_mask(expected):
    """Predicate: the output is additive: 0 where allowed, -inf or at most -1e4 where not."""
    def matches(actual):
        got = actual[0]
        return (got.dtype != np.bool_ and got.shape == expected.shape and bool(np.all(got[expected] == 0))
                and bool(np.all(got[~expected] <= -1e4)))
    return matches


def _causal_case(label, l_q, l_kv):
    i, j = np.arange(l_q)[:, None], np.arange(l_kv)[None, :]
    expected = j <= l_kv - l_q + i  # (l_q, l_kv), eq. kv-chunk-mask
    ones = np.ones((l_q, l_kv), dtype=bool)
    variants = [
        ("causal_top_left", lambda: (np.tril(ones),)),
        ("causal_strict", lambda: (np.tril(ones, k=l_kv - l_q - 1),)),
        ("causal_one_future_key", lambda: (np.tril(ones, k=l_kv - l_q + 1),)),
        ("causal_inverted", lambda: (~expected,)),
        ("causal_transposed", lambda: (expected.T,)),
        ("causal_transposed", lambda: (np.triu(ones),)),
        ("mask_not_boolean", lambda: _is_01_mask(expected)),
        ("additive_mask", lambda: _is_additive_mask(expected)),
    ]
    return _Case(f"{label}: l_q={l_q}, l_kv={l_kv}", (l_q, l_kv), {}, (expected,), variants)


@_checker
def check_causal_mask(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(l_q, l_kv)``: the boolean ``(l_q, l_kv)`` causal mask, True = may attend, bottom-right aligned.

    The l_q queries are the last l_q of the l_kv positions, so query i may attend to key j iff
    ``j <= l_kv - l_q + i``. Cases: square, one query after a cache, a chunk of queries after a cache, 1 x 1.
    Book: part II, 'Autoregressive decoding and the KV cache' (Eq. kv-chunk-mask); part I, 'Scaled dot-product
    attention' (Eq. sdpa-causal-padding, the square case).
    """
    cases = [
        _causal_case("self-attention (square)", 4, 4),
        _causal_case("one new query after 5 cached positions", 1, 6),
        _causal_case("a chunk of 3 new queries after 4 cached positions", 3, 7),
        _causal_case("one position", 1, 1),
        _causal_case("self-attention (square)", 6, 6),
    ]
    _run("check_causal_mask", fn, backend, ("l_q", "l_kv"),
         (_Output("mask", "mask[i, j] = (j <= l_kv - l_q + i), booleans", EQ_CHUNK_MASK),), cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_repeat_kv
# ---------------------------------------------------------------------------------------------------------------


def _repeat_case(label, y, n_rep):
    N, g, L, d = y.shape
    variants = [
        ("kv_map_tile", lambda: (_repeat(y, n_rep, "tile"),)),
        ("repeat_wrong_axis", lambda: (np.repeat(y, n_rep, axis=2),)),
        ("repeat_wrong_axis", lambda: (np.repeat(y, n_rep, axis=0),)),
        ("repeat_not_merged", lambda: (np.broadcast_to(y[:, :, None], (N, g, n_rep, L, d)),)),
    ]
    expected = (reference._repeat_kv(y, n_rep),)
    return _Case(f"{label}: y {y.shape} (N, n_kv_heads, L, head_dim), n_rep={n_rep}", (y, n_rep), {}, expected,
                 variants)


@_checker
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
        _repeat_case("non-contiguous y (a transposed view)", _t(r((2, 2, 5, 3))), 3),
    ]
    _run("check_repeat_kv", fn, backend, ("y", "n_rep"),
         (_Output("repeated", "out[:, j] = y[:, j // n_rep] (np.repeat(y, n_rep, axis=1))", EQ_GQA_MAP),), cases,
         timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_decode_step
# ---------------------------------------------------------------------------------------------------------------


def _sim_decode(q, k_new, v_new, k_cache, v_cache, *, mask="bottom_right", order="append", attend_new=True,
                kv_map="repeat", scale_rule="head_dim", cache="append", **attention_kw):
    """One cached decoding step the way a given bug computes it (defaults: the book's step)."""
    N, n_heads, T, head_dim = q.shape
    n_rep = n_heads // k_new.shape[1]
    k_all = np.concatenate([k_cache, k_new] if order == "append" else [k_new, k_cache], axis=2)  # (N, g, c+T, hd)
    v_all = np.concatenate([v_cache, v_new] if order == "append" else [v_new, v_cache], axis=2)  # (N, g, c+T, hd)
    k_seen, v_seen = (k_all, v_all) if attend_new else (k_cache, v_cache)
    L_kv = k_seen.shape[2]
    if L_kv == 0:
        return None
    if not attend_new or mask == "none":
        causal = None
    elif mask == "bottom_right":
        causal = _causal(T, L_kv)
    elif mask == "one_future":  # bottom-right, off by one: each query also sees the next key
        causal = np.tril(np.ones((T, L_kv), dtype=bool), k=L_kv - T + 1)
    else:  # top-left
        causal = np.tril(np.ones((T, L_kv), dtype=bool))
    scale = {"head_dim": 1 / math.sqrt(head_dim), "d_model": 1 / math.sqrt(n_heads * head_dim), "none": 1.0}[scale_rule]
    result = _sim_sdpa(q, _repeat(k_seen, n_rep, kv_map), _repeat(v_seen, n_rep, kv_map), causal, scale, **attention_kw)
    if result is None:
        return None
    out = result[0]  # (N, h, T, hd)
    if cache == "none":
        return out, k_cache, v_cache
    if cache == "repeated":
        return out, _repeat(k_all, n_rep), _repeat(v_all, n_rep)
    return out, k_all, v_all


_DECODE_BUGS = [
    ("causal_top_left", dict(mask="top_left")),
    ("no_causal_mask", dict(mask="none")),
    ("causal_one_future_key", dict(mask="one_future")),
    ("cache_prepended", dict(order="prepend")),
    ("new_position_not_attended", dict(attend_new=False)),
    ("kv_map_tile", dict(kv_map="tile")),
    ("scale_d_model", dict(scale_rule="d_model")),
    ("no_scale", dict(scale_rule="none")),
    ("cache_not_updated", dict(cache="none")),
    ("cache_repeated_heads", dict(cache="repeated")),
    ("no_max_subtraction", dict(shift="none")),
]


def _decode_expected(q, k_new, v_new, k_cache, v_cache):
    """The step by the reference: attention over [cache; new] with the bottom-right causal mask (eq. kv-chunk-mask)."""
    n_rep = q.shape[1] // k_new.shape[1]
    k_all = np.concatenate([k_cache, k_new], axis=2)  # (N, g, c+T, hd)
    v_all = np.concatenate([v_cache, v_new], axis=2)  # (N, g, c+T, hd)
    T, L_kv = q.shape[2], k_all.shape[2]
    out, _ = reference.scaled_dot_product_attention(q, reference._repeat_kv(k_all, n_rep),
                                                    reference._repeat_kv(v_all, n_rep), mask=_causal(T, L_kv))
    return out, k_all, v_all


def _decode_case(label, rng, *, N=2, n_heads=2, n_kv_heads=2, head_dim=4, T=1, cached=4, scale=1.0,
                 non_contiguous=False, note=""):
    r = rng.standard_normal
    q = scale * r((N, n_heads, T, head_dim))
    k_new, v_new = scale * r((N, n_kv_heads, T, head_dim)), r((N, n_kv_heads, T, head_dim))
    k_cache, v_cache = scale * r((N, n_kv_heads, cached, head_dim)), r((N, n_kv_heads, cached, head_dim))
    if non_contiguous:
        q, k_new, v_new, k_cache, v_cache = (_t(a) for a in (q, k_new, v_new, k_cache, v_cache))
    name = (f"{label}: n_heads={n_heads}, n_kv_heads={n_kv_heads}, {T} new position{'s' if T > 1 else ''} after "
            f"{cached} cached; {_shapes(q=q, k_new=k_new, k_cache=k_cache)}")
    args = (q, k_new, v_new, k_cache, v_cache)
    return _Case(name, args, {}, _decode_expected(*args), _variants(_sim_decode, _DECODE_BUGS, *args), note)


def _decode_run(fn, args, kwargs):
    """Drive a whole decode: start from the empty caches, call fn once per step, feed back the caches it returns."""
    k_cache, v_cache, steps = args
    outs = []
    for q, k_new, v_new in steps:
        out, k_cache, v_cache = fn(q, k_new, v_new, k_cache, v_cache)
        outs.append(_to_numpy(out))
    if any(o is None or o.ndim != 4 for o in outs):
        return outs[0], k_cache, v_cache  # reported as it is
    return np.concatenate(outs, axis=2), k_cache, v_cache  # (N, h, L, hd): every step's outputs in order


def _decode_whole_case(rng, chunks=(3, 1, 1, 2), N=2, n_heads=4, n_kv_heads=2, head_dim=4):
    r = rng.standard_normal
    L = sum(chunks)
    q, k, v = r((N, n_heads, L, head_dim)), r((N, n_kv_heads, L, head_dim)), r((N, n_kv_heads, L, head_dim))
    out, _ = reference.scaled_dot_product_attention(q, reference._repeat_kv(k, n_heads // n_kv_heads),
                                                    reference._repeat_kv(v, n_heads // n_kv_heads), _causal(L, L))
    bounds = np.cumsum((0,) + tuple(chunks))
    steps = [(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    empty = np.zeros((N, n_kv_heads, 0, head_dim))  # (N, g, 0, hd)
    name = (f"a whole decode: n_heads={n_heads}, n_kv_heads={n_kv_heads}, from empty caches (N, g, 0, hd), steps of "
            f"{', '.join(map(str, chunks))} positions, each call given the caches the previous one returned; "
            f"compared with causal attention over all {L} positions")
    note = ("out is every step's output, concatenated along the position axis. The single steps above passed, so "
            "look at what you return: the caches must hold every position so far, oldest first, n_kv_heads heads.")
    return _Case(name, (empty, empty.copy(), steps), {}, (out, k, v), [], note, call=_decode_run,
                 arg_names=("the initial k_cache", "the initial v_cache", "a step's q, k_new or v_new"))


@_checker
def check_decode_step(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check one cached decoding step, ``fn(q, k_new, v_new, k_cache, v_cache) -> (out, k_cache, v_cache)``.

    ``q`` ``(N, n_heads, T, head_dim)``: the queries of the T new positions (T = 1 is one decoding step, T > 1 a
    prefill or a chunk); ``k_new``, ``v_new`` ``(N, n_kv_heads, T, head_dim)``: their keys and values;
    ``k_cache``, ``v_cache`` ``(N, n_kv_heads, c, head_dim)``: those of the c earlier positions (c may be 0). Return
    ``out`` ``(N, n_heads, T, head_dim)``, the attention of the new queries over all ``c + T`` keys with the causal
    mask aligned bottom-right (new query i sees keys ``j <= c + i``), scale ``1/sqrt(head_dim)``, query head j reading
    key/value head ``j // (n_heads / n_kv_heads)``; and the updated caches ``(N, n_kv_heads, c + T, head_dim)``, the
    new positions appended after the old ones. No projections: q, k, v are already per head.

    Cases: one step, a prefill into empty caches, a chunk after a cache, GQA, MQA, one head with a batch of one,
    non-contiguous inputs, large logits, and a whole decode that feeds back the caches you return.
    Book: part II, 'Autoregressive decoding and the KV cache' (Eqs. kv-step, kv-chunk-mask); GQA caches: part II,
    'MQA and GQA'.
    """
    rng = np.random.default_rng(707)
    cases = [
        _decode_case("one decoding step", rng),
        _decode_case("prefill into empty caches", rng, T=4, cached=0,
                     note="The caches have 0 positions: np.concatenate of an empty (N, g, 0, hd) array works."),
        _decode_case("a chunk (L_q != L_kv)", rng, T=3, cached=4,
                     note="New query i is position c + i: it sees keys j <= c + i (bottom-right causal mask)."),
        _decode_case("GQA", rng, n_heads=4, n_kv_heads=2, cached=5),
        _decode_case("MQA: one key/value head", rng, n_heads=4, n_kv_heads=1, T=2, cached=3),
        _decode_case("one head, a batch of one", rng, N=1, n_heads=1, n_kv_heads=1, head_dim=8, cached=1),
        _decode_case("non-contiguous inputs (transposed views)", rng, n_heads=4, n_kv_heads=2, T=2, cached=3,
                     non_contiguous=True),
        _decode_case("large logits (scores in the thousands)", rng, T=2, cached=3, scale=12.0,
                     note="exp of a score above about 709 overflows float64: subtract the row maximum first."),
        _decode_whole_case(rng),
    ]
    outputs = (
        _Output("out", "softmax(q [K_cache; k_new]^T / sqrt(head_dim), causal bottom-right) [V_cache; v_new]",
                EQ_KV_STEP),
        _Output("k_cache", "[K_cache; k_new] (new positions appended along axis 2)", EQ_KV_STEP),
        _Output("v_cache", "[V_cache; v_new] (new positions appended along axis 2)", EQ_KV_STEP),
    )
    _run("check_decode_step", fn, backend, ("q", "k_new", "v_new", "k_cache", "v_cache"), outputs, cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_online_softmax_attention
# ---------------------------------------------------------------------------------------------------------------


def _sim_online(q, k, v, block_size, mask=None, scale=None, *, drop_partial=False, rescale_l=True, rescale_acc=True,
                alpha_inverted=False, divide=True, running_max=True, guard_empty=True, guard_final=True,
                fill="zero", invert_mask=False, ignore_mask=False, scale_rule="given"):
    """The online-softmax loop the way a given bug runs it (defaults: the book's recurrence)."""
    c = _bug_scale(scale_rule, q, k, v, scale)
    if c is None or ((invert_mask or ignore_mask) and mask is None):
        return None
    if ignore_mask:
        mask = None
    n_q, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if mask is not None:
        mask = np.broadcast_to(~mask if invert_mask else mask, batch + (n_q, n_k))  # (..., n_q, n_k)
    end = n_k - n_k % block_size if drop_partial else n_k
    m = np.full(batch + (n_q, 1), -np.inf)  # running max
    l = np.zeros(batch + (n_q, 1))  # running sum
    acc = np.zeros(batch + (n_q, d_v))  # running accumulator
    for start in range(0, end, block_size):
        stop = min(start + block_size, n_k)
        s = c * (q @ np.swapaxes(k[..., start:stop, :], -1, -2))  # (..., n_q, B)
        if mask is not None:
            s = np.where(mask[..., start:stop], s, _FILL[fill])
        if running_max:
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            shift = np.where(np.isfinite(m_new), m_new, 0.0) if guard_empty else m_new
            alpha = np.exp(shift - m) if alpha_inverted else np.exp(m - shift)
        else:
            m_new, shift, alpha = m, 0.0, 1.0
        p = np.exp(s - shift)  # (..., n_q, B)
        l = (alpha if rescale_l else 1.0) * l + p.sum(axis=-1, keepdims=True)
        acc = (alpha if rescale_acc else 1.0) * acc + p @ v[..., start:stop, :]
        m = m_new
    if not divide:
        return (acc,)
    return (np.divide(acc, l, out=np.zeros_like(acc), where=l > 0) if guard_final else acc / l,)


_ONLINE_BUGS = [
    ("drop_last_partial_block", dict(drop_partial=True)),
    ("no_rescale_acc", dict(rescale_acc=False)),
    ("no_rescale_l", dict(rescale_l=False)),
    ("no_rescale", dict(rescale_acc=False, rescale_l=False)),
    ("alpha_inverted", dict(alpha_inverted=True)),
    ("no_final_division", dict(divide=False)),
    ("online_nan_empty_state", dict(guard_empty=False, guard_final=False)),
    ("mask_nan_empty_rows", dict(guard_final=False)),
    ("no_max_subtraction", dict(running_max=False)),
    ("mask_fill_large_negative", dict(fill="large_negative")),
    ("mask_inverted", dict(invert_mask=True)),
    ("mask_inverted", dict(invert_mask=True, guard_final=False)),
    ("mask_fill_zero", dict(fill="zero_score")),
    ("mask_ignored", dict(ignore_mask=True)),
] + [(bug, dict(scale_rule=kw["scale_rule"])) for bug, kw in _SCALE_BUGS]


def _online_case(label, q, k, v, block_size, mask=None, scale=None, note=""):
    name = f"{label}: {_shapes(q=q, k=k, v=v)}, block_size={block_size}"
    name += f", mask {tuple(mask.shape)}" if mask is not None else ", mask=None"
    name += f", scale={scale}" if scale is not None else ", scale=None"
    kwargs = {key: value for key, value in (("mask", mask), ("scale", scale)) if value is not None}
    expected = (reference.scaled_dot_product_attention(q, k, v, mask, scale)[0],)  # the naive form: o = A V
    variants = _variants(_sim_online, _ONLINE_BUGS, q, k, v, block_size, mask, scale)
    return _Case(name, (q, k, v, block_size), kwargs, expected, variants, note)


@_checker
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
        _online_case("causal mask", r((5, 8)), r((5, 8)), r((5, 4)), 2, mask=_causal(5, 5)),
        _online_case("query 0's first key block and query 2's first two blocks fully masked, query 1 no key at all",
                     r((4, 8)), r((6, 8)), r((6, 3)), 2, mask=first_block_masked,
                     note="While every key seen so far is masked the state is (m, l, acc) = (-inf, 0, 0); a query "
                          "with no allowed key at all returns a zero row."),
        _online_case("large logits (scaled scores in the thousands)", 40 * r((3, 8)), 40 * r((9, 8)), r((9, 4)), 4,
                     note="exp of a score above about 709 overflows float64: the running maximum is what prevents it."),
        _online_case("a batch of one, one head, one query", r((1, 1, 1, 4)), r((1, 1, 5, 4)), r((1, 1, 5, 4)), 2),
        _online_case("non-contiguous q, k, v (transposed views), L_q != L_kv", _t(r((2, 4, 8))), _t(r((2, 7, 8))),
                     _t(r((2, 7, 3))), 3, mask=_causal(4, 7)),
    ]
    _run("check_online_softmax_attention", fn, backend, ("q", "k", "v", "block_size"),
         (_Output("out", "softmax(QK^T/sqrt(d_k)) V computed in one piece, i.e. acc / l after the last block",
                  EQ_ONLINE),), cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_softmax_backward
# ---------------------------------------------------------------------------------------------------------------


def _sim_softmax_backward(A, dA, rule="correct"):
    """dL/dS from A = softmax(S) and dA = dL/dA, the correct way or as a given bug does."""
    if rule == "correct":
        return A * (dA - np.sum(dA * A, axis=-1, keepdims=True))
    if rule == "no_rowsum":
        return A * dA
    if rule == "diagonal":
        return A * (1 - A) * dA
    if rule == "rowsum_of_grad":
        return A * (dA - np.sum(dA, axis=-1, keepdims=True))
    if rule == "sign":
        return A * (dA + np.sum(dA * A, axis=-1, keepdims=True))
    if rule == "no_keepdims":
        return A * (dA - np.sum(dA * A, axis=-1))
    if rule == "wrong_axis":
        return A * (dA - np.sum(dA * A, axis=-2, keepdims=True))
    raise ValueError(rule)


_VJP_BUGS = [
    ("vjp_missing_rowsum", dict(rule="no_rowsum")),
    ("vjp_diagonal_only", dict(rule="diagonal")),
    ("vjp_rowsum_of_grad", dict(rule="rowsum_of_grad")),
    ("vjp_sign", dict(rule="sign")),
    ("vjp_sum_without_keepdims", dict(rule="no_keepdims")),
    ("vjp_sum_wrong_axis", dict(rule="wrong_axis")),
]


def _softmax_backward_case(label, A, dA):
    expected = (reference.softmax_backward(A, dA),)

    def sim(rule):
        out = _sim_softmax_backward(A, dA, rule)
        return None if out.shape != A.shape else (out,)
    return _Case(f"{label}: weights {A.shape}, grad_weights {dA.shape}", (A, dA), {}, expected,
                 _variants(sim, _VJP_BUGS))


@_checker
def check_softmax_backward(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(weights, grad_weights) -> grad_scores``, the backward pass of a softmax over the last axis.

    ``weights`` = A = softmax(S) (rows normalised along the last axis), ``grad_weights`` = dL/dA; return dL/dS
    ``= A * (dA - rowsum(dA * A))``, same shape. Cases: a vector, a square matrix, a rectangular one, batch axes,
    masked entries and a fully masked row (all-zero weights), saturated one-hot rows, a batch of one, a non-contiguous
    input. Book: part II, 'The backward pass' (Theorem bwd-thm-softmax-jacobian, Eq. bwd-softmax-vjp); the same
    Jacobian: part I, 'Why divide by √d_k' (Eq. scaling-vjp).
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
        _softmax_backward_case("non-contiguous inputs (transposed views)", _t(weights((2, 4, 3))), _t(r((2, 4, 3)))),
    ]
    _run("check_softmax_backward", fn, backend, ("weights", "grad_weights"),
         (_Output("grad_scores", "A * (dA - rowsum(dA * A))", EQ_SOFTMAX_VJP),), cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_scaled_dot_product_attention_grad
# ---------------------------------------------------------------------------------------------------------------


def _sim_sdpa_grad(q, k, v, grad_out, mask=None, scale=None, *, scale_rule="given", chain_scale=True, vjp="correct",
                   dv_transpose=True, invert_mask=False, ignore_mask=False, mask_grad=False, **softmax_kw):
    """(dq, dk, dv) of scaled dot-product attention, the correct way or as a given bug computes them.

    ``mask_grad``: the masked scores get zero gradient, as under autograd (the fill is a constant); a hand-written
    backward pass without it uses dS as it comes out of the softmax backward.
    """
    c = _bug_scale(scale_rule, q, k, v, scale)
    if c is None or ((invert_mask or ignore_mask or mask_grad) and mask is None) or (ignore_mask and mask_grad):
        return None
    if ignore_mask:
        mask = None
    if invert_mask:
        mask = ~mask
    A = _sim_softmax(c * (q @ np.swapaxes(k, -1, -2)), mask, **softmax_kw)  # (..., L_q, L_kv)
    dv = (np.swapaxes(A, -1, -2) if dv_transpose else A) @ grad_out  # (..., L_kv, d_v)
    dS = _sim_softmax_backward(A, grad_out @ np.swapaxes(v, -1, -2), vjp)  # (..., L_q, L_kv)
    if mask_grad:
        dS = np.where(mask, dS, 0.0)
    factor = c if chain_scale else 1.0
    return factor * (dS @ k), factor * (np.swapaxes(dS, -1, -2) @ q), dv


_GRAD_BUGS = [
    ("grad_missing_scale", dict(chain_scale=False)),
    ("grad_dv_no_transpose", dict(dv_transpose=False)),
] + [(bug, dict(vjp=kw["rule"])) for bug, kw in _VJP_BUGS] + _SCALE_BUGS + [
    (bug, {**kw, "mask_grad": mask_grad}) for bug, kw in _MASK_BUGS for mask_grad in (False, True)
] + [("shift_not_row_max", dict(shift="global")), ("no_max_subtraction", dict(shift="none"))]


def _grad_case(label, q, k, v, grad_out, mask=None, scale=None, note=""):
    name = f"{label}: {_shapes(q=q, k=k, v=v, grad_out=grad_out)}"
    name += f", mask {tuple(mask.shape)}" if mask is not None else ", mask=None"
    name += f", scale={scale}" if scale is not None else ", scale=None"
    kwargs = {key: value for key, value in (("mask", mask), ("scale", scale)) if value is not None}
    expected = reference.scaled_dot_product_attention_grad(q, k, v, grad_out, mask, scale)
    variants = _variants(_sim_sdpa_grad, _GRAD_BUGS, q, k, v, grad_out, mask, scale)
    return _Case(name, (q, k, v, grad_out), kwargs, expected, variants, note)


@_checker
def check_scaled_dot_product_attention_grad(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(q, k, v, grad_out, mask=None, scale=None) -> (dq, dk, dv)``, the hand-derived backward pass.

    The gradients of ``sum(out * grad_out)`` for ``out = softmax(scale q k^T) v`` (the arguments of
    ``check_scaled_dot_product_attention``; q, k, v here share their batch axes, no broadcasting), as
    ``mha.reference.scaled_dot_product_attention_grad``. Cases: square and L_q != L_kv, d_v != d_k, batch axes, an
    explicit scale, a causal mask, a query row with no allowed key (zero gradient), large logits, a batch of one with
    one query, non-contiguous inputs. Book: part II, 'The backward pass' (Theorem bwd-thm-attention-grad,
    Eqs. bwd-attn-dv-da, bwd-attn-ds, bwd-attn-dq-dk).
    """
    rng = np.random.default_rng(1010)
    r = rng.standard_normal
    cases = [
        _grad_case("square (L_q = L_kv)", r((5, 4)), r((5, 4)), r((5, 3)), r((5, 3))),
        _grad_case("L_q != L_kv, d_v != d_k", r((4, 8)), r((6, 8)), r((6, 5)), r((4, 5))),
        _grad_case("batch and head axes", r((2, 3, 5, 8)), r((2, 3, 7, 8)), r((2, 3, 7, 6)), r((2, 3, 5, 6))),
        _grad_case("explicit scale", r((2, 4, 6)), r((2, 5, 6)), r((2, 5, 3)), r((2, 4, 3)), scale=0.5),
        _grad_case("causal mask", r((2, 5, 8)), r((2, 5, 8)), r((2, 5, 4)), r((2, 5, 4)), mask=_causal(5, 5)),
        _grad_case("query row 2 has no allowed key", r((4, 8)), r((5, 8)), r((5, 3)), r((4, 3)),
                   mask=_row_with_no_key(rng, (4, 5), 2),
                   note="A row with no allowed key has zero weights, so it contributes zero gradient."),
        _grad_case("large logits (scaled scores in the thousands)", 40 * r((3, 8)), 40 * r((6, 8)), r((6, 4)),
                   r((3, 4)), note="Subtract the row maximum in the forward softmax."),
        _grad_case("a batch of one, one head, one query", r((1, 1, 1, 4)), r((1, 1, 3, 4)), r((1, 1, 3, 4)),
                   r((1, 1, 1, 4))),
        _grad_case("non-contiguous inputs (transposed views)", _t(r((2, 5, 8))), _t(r((2, 6, 8))), _t(r((2, 6, 4))),
                   _t(r((2, 5, 4))), mask=_causal(5, 6)),
    ]
    outputs = (
        _Output("dq", "scale * dS K", EQ_DQ_DK),
        _Output("dk", "scale * dS^T Q", EQ_DQ_DK),
        _Output("dv", "A^T dO", EQ_DV_DA),
    )
    _run("check_scaled_dot_product_attention_grad", fn, backend, ("q", "k", "v", "grad_out"), outputs, cases, timeout)
