"""Checkers of part IV, attention in today's models: RoPE and a decoding step with RoPE, the sliding-window mask,
attention with sink logits, and RMSNorm (QK-norm).

Book: part IV, 'Rotary position embeddings (RoPE)', 'Sliding windows and attention sinks', 'QK-norm and logit
soft-capping'.
"""

from __future__ import annotations

import numpy as np

from mha import reference
from mha._checks import check_choice
from mha.exercises.catalogue import EQ_RMSNORM, EQ_ROPE_CACHE, EQ_ROPE_ROTATION, EQ_SINK_SOFTMAX, EQ_WINDOW_MASK
from mha.exercises.decoding_checks import _decode_expected, _decode_run
from mha.exercises.frontier_simulators import (rms_norm_variants, rope_decode_variants, rope_variants,
                                               sink_attention_variants, window_mask_variants)
from mha.exercises.runner import (TIMEOUT, Case, Output, mask_and_scale, public_checker, row_with_no_key, run_cases,
                                  shapes_of, transposed)

_STYLES = ("half", "interleaved")
_PAIRS = {"half": "pairs (x[i], x[i + d/2])", "interleaved": "pairs (x[2i], x[2i+1])"}


def _positions_text(positions) -> str:
    p = np.asarray(positions)
    if p.ndim == 1 and p.size <= 6:
        return f"positions {p.tolist()}"
    return f"positions of shape {p.shape} ({p.min()} .. {p.max()})"


# ---------------------------------------------------------------------------------------------------------------
# check_rope
# ---------------------------------------------------------------------------------------------------------------


def _rope_case(label, x, positions, style, base=None, note=""):
    positions = np.asarray(positions, dtype=np.int64)
    given = 10000.0 if base is None else base
    name = f"{label}: x {x.shape}, {_positions_text(positions)}" + ("" if base is None else f", base={base:g}")
    return Case(name, (x, positions), {} if base is None else {"base": base},
                (reference.rope(x, positions, base=given, style=style),), rope_variants(x, positions, given, style),
                note)


@public_checker
def check_rope(fn, *, style: str = "half", backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(x, positions, base=10000.0)``: RoPE, the last axis of ``x`` ``(..., L, d)`` rotated by position.

    ``positions`` holds integers >= 0, of shape ``(L,)`` or broadcastable to ``x.shape[:-1]`` with last axis L (e.g.
    ``(N, 1, L)`` for ``(N, h, L, d)`` heads: one set of positions per sequence); ``base`` is passed only where a
    case uses another base than 10000. Pair i of the vector at position m turns by the angle ``m theta_i``,
    ``theta_i = base^(-2i/d)``: ``(a, b) -> (a cos - b sin, a sin + b cos)``. ``style`` says which pairing your
    function implements: ``"half"`` (the default: pairs ``(x[i], x[i + d/2])``, Hugging Face's rotate-half) or
    ``"interleaved"`` (pairs ``(x[2i], x[2i+1])``, Meta's original Llama and GPT-J). Return an array of x's shape.

    Cases: one pair (d = 2), several pairs, batch and head axes, positions that start after a cache, positions with
    gaps and out of order, another base, positions per sequence, a long context, a batch of one, a non-contiguous
    input. Book: part IV, 'Rotary position embeddings (RoPE)' (Eqs. rope-rotation, rope-freq).
    """
    style = check_choice("style", style, _STYLES)
    rng = np.random.default_rng(1111)
    r = rng.standard_normal
    per_sequence = np.array([[[0, 1, 2, 3]], [[5, 6, 7, 8]]])  # (N, 1, L): sequence 1 starts at position 5
    cases = [
        _rope_case("one pair (d = 2)", r((4, 2)), np.arange(4), style),
        _rope_case("several pairs", r((5, 8)), np.arange(5), style),
        _rope_case("batch and head axes", r((2, 3, 5, 8)), np.arange(5), style),
        _rope_case("positions after 7 cached tokens", r((2, 3, 3, 8)), [7, 8, 9], style,
                   note="Positions need not start at 0: after c cached tokens the new ones sit at c, c + 1, ..."),
        _rope_case("positions with gaps, out of order", r((4, 6)), [0, 5, 2, 11], style),
        _rope_case("base 500000 (Llama 3's)", r((3, 16)), [0, 100, 4000], style, base=500000.0),
        _rope_case("positions per sequence (N, 1, L)", r((2, 2, 4, 6)), per_sequence, style,
                   note="positions[..., None] * theta broadcasts (N, 1, L, 1) against the d/2 frequencies, then "
                        "against x (N, h, L, d/2 per half)."),
        _rope_case("a long context", r((4, 32)), [0, 1000, 16383, 32767], style),
        _rope_case("a batch of one, one head, one position", r((1, 1, 1, 4)), [3], style),
        _rope_case("non-contiguous x (a transposed view)", transposed(r((2, 5, 8))), np.arange(5), style),
    ]
    output = Output("rotated", f"pair i of the vector at position m turned by m theta_i, theta_i = base^(-2i/d) "
                               f"({_PAIRS[style]})", EQ_ROPE_ROTATION)
    run_cases("check_rope", fn, backend, ("x", "positions"), (output,), cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_rope_decode_step
# ---------------------------------------------------------------------------------------------------------------


def _rope_decode_expected(q, k_new, v_new, k_cache, v_cache, style):
    """The step by the reference: q and k_new rotated at c .. c+T-1, then the plain step over [cache; new]."""
    positions = k_cache.shape[2] + np.arange(q.shape[2])
    return _decode_expected(reference.rope(q, positions, style=style), reference.rope(k_new, positions, style=style),
                            v_new, k_cache, v_cache)


def _rope_decode_case(label, rng, style, *, N=2, n_heads=2, n_kv_heads=2, head_dim=8, T=1, cached=4, scale=1.0,
                      non_contiguous=False, note=""):
    r = rng.standard_normal
    q = scale * r((N, n_heads, T, head_dim))
    k_new, v_new = scale * r((N, n_kv_heads, T, head_dim)), r((N, n_kv_heads, T, head_dim))
    k_cache = scale * r((N, n_kv_heads, cached, head_dim))
    if cached:
        k_cache = reference.rope(k_cache, np.arange(cached), style=style)  # the cache holds rotated keys
    v_cache = r((N, n_kv_heads, cached, head_dim))
    if non_contiguous:
        q, k_new, v_new, k_cache, v_cache = (transposed(a) for a in (q, k_new, v_new, k_cache, v_cache))
    where = f"position {cached}" if T == 1 else f"positions {cached} .. {cached + T - 1}"
    name = (f"{label}: n_heads={n_heads}, n_kv_heads={n_kv_heads}, {T} new position{'s' if T > 1 else ''} after "
            f"{cached} cached (at {where}); {shapes_of(q=q, k_new=k_new, k_cache=k_cache)}")
    args = (q, k_new, v_new, k_cache, v_cache)
    return Case(name, args, {}, _rope_decode_expected(*args, style), rope_decode_variants(*args, style), note)


def _rope_decode_whole_case(rng, style, chunks=(3, 1, 1, 2), N=2, n_heads=4, n_kv_heads=2, head_dim=8):
    r = rng.standard_normal
    L = sum(chunks)
    q, k, v = r((N, n_heads, L, head_dim)), r((N, n_kv_heads, L, head_dim)), r((N, n_kv_heads, L, head_dim))
    positions = np.arange(L)
    q_rot, k_rot = reference.rope(q, positions, style=style), reference.rope(k, positions, style=style)
    out, _, _ = _decode_expected(q_rot, k_rot, v, k_rot[:, :, :0], v[:, :, :0])  # causal attention over all L
    bounds = np.cumsum((0,) + tuple(chunks))
    steps = [(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    empty = np.zeros((N, n_kv_heads, 0, head_dim))  # (N, g, 0, head_dim)
    name = (f"a whole decode: n_heads={n_heads}, n_kv_heads={n_kv_heads}, from empty caches (N, g, 0, head_dim), "
            f"steps of {', '.join(map(str, chunks))} positions, each call given the caches the previous one "
            f"returned; compared with causal attention over all {L} positions, q and k rotated at 0 .. {L - 1}")
    note = ("out is every step's output, concatenated along the position axis. The single steps above passed, so "
            "look at what you return: the key cache must hold every key so far, each rotated once at its own "
            "position, oldest first; the value cache the values as they came.")
    return Case(name, (empty, empty.copy(), steps), {}, (out, k_rot, v), [], note, call=_decode_run,
                arg_names=("the initial k_cache", "the initial v_cache", "a step's q, k_new or v_new"))


@public_checker
def check_rope_decode_step(fn, *, style: str = "half", backend: str = "auto",
                           timeout: float | None = TIMEOUT) -> None:
    """Check one cached decoding step with RoPE, ``fn(q, k_new, v_new, k_cache, v_cache) -> (out, k_cache, v_cache)``.

    The arguments of ``check_decode_step``: ``q`` ``(N, n_heads, T, head_dim)``, the new positions' queries and
    ``k_new``, ``v_new`` ``(N, n_kv_heads, T, head_dim)`` their keys and values, all three *not yet rotated*;
    ``k_cache``, ``v_cache`` ``(N, n_kv_heads, c, head_dim)`` those of the c earlier positions, the keys stored
    *rotated* (each at its own position, as the previous steps returned them). The new positions are c .. c+T-1.
    Rotate q and k_new at those positions (RoPE with base 10000, pairing ``style`` as in ``check_rope``), append the
    rotated keys and the values to the caches, and attend as in ``check_decode_step`` (causal mask aligned
    bottom-right, scale ``1/sqrt(head_dim)``, query head j reading key/value head ``j // (n_heads / n_kv_heads)``).
    Return ``out`` ``(N, n_heads, T, head_dim)`` and the caches ``(N, n_kv_heads, c + T, head_dim)``. Values are
    never rotated.

    Cases: one step, a prefill into empty caches, a chunk after a cache, GQA, MQA, one head far into a sequence,
    non-contiguous inputs, large logits, and a whole decode that feeds back the caches you return.
    Book: part IV, 'Rotary position embeddings (RoPE)' (Eqs. rope-cache, rope-relative); the step itself: part II,
    'Autoregressive decoding and the KV cache' (Eq. kv-step).
    """
    style = check_choice("style", style, _STYLES)
    rng = np.random.default_rng(1212)
    cases = [
        _rope_decode_case("one decoding step", rng, style),
        _rope_decode_case("prefill into empty caches", rng, style, T=4, cached=0,
                          note="With empty caches the new positions are 0 .. T-1; the returned key cache holds the "
                               "rotated keys."),
        _rope_decode_case("a chunk after a cache", rng, style, T=3, cached=5,
                          note="New query i sits at position c + i: rotate it (and its key) there, and let it see "
                               "the keys j <= c + i."),
        _rope_decode_case("GQA", rng, style, n_heads=4, n_kv_heads=2, cached=6),
        _rope_decode_case("MQA: one key/value head", rng, style, n_heads=4, n_kv_heads=1, T=2, cached=3),
        _rope_decode_case("one head, a batch of one, far into the sequence", rng, style, N=1, n_heads=1,
                          n_kv_heads=1, head_dim=16, cached=40),
        _rope_decode_case("non-contiguous inputs (transposed views)", rng, style, n_heads=4, n_kv_heads=2, T=2,
                          cached=3, non_contiguous=True),
        _rope_decode_case("large logits (scores in the thousands)", rng, style, T=2, cached=3, scale=30.0,
                          note="exp of a score above about 709 overflows float64: subtract the row maximum first."),
        _rope_decode_whole_case(rng, style),
    ]
    outputs = (
        Output("out", "softmax(R q [K_cache; R k_new]^T / sqrt(head_dim), causal bottom-right) [V_cache; v_new], "
                      "R = RoPE at the new positions c .. c+T-1", EQ_ROPE_CACHE),
        Output("k_cache", "[K_cache; R k_new]: the new keys rotated at their positions, appended along axis 2",
               EQ_ROPE_CACHE),
        Output("v_cache", "[V_cache; v_new]: the values, not rotated, appended along axis 2", EQ_ROPE_CACHE),
    )
    run_cases("check_rope_decode_step", fn, backend, ("q", "k_new", "v_new", "k_cache", "v_cache"), outputs, cases,
              timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_sliding_window_mask
# ---------------------------------------------------------------------------------------------------------------


def _window_case(label, l_q, l_kv, window, note=""):
    expected = (reference.sliding_window_mask(l_q, l_kv, window),)  # (l_q, l_kv)
    return Case(f"{label}: l_q={l_q}, l_kv={l_kv}, window={window}", (l_q, l_kv, window), {}, expected,
                window_mask_variants(l_q, l_kv, window), note)


@public_checker
def check_sliding_window_mask(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(l_q, l_kv, window)``: the boolean ``(l_q, l_kv)`` sliding-window mask, True = may attend.

    Bottom-right aligned like the causal mask: query i sits at position ``p = l_kv - l_q + i`` and may attend to key
    j iff ``p - window < j <= p``: the ``window`` most recent keys, its own included (gpt-oss's and Hugging Face's
    convention). Cases: square, a window of 1, one query after a cache, a chunk after a cache, a window as long as
    the sequence and one longer (the causal mask), a small window on a longer sequence.
    Book: part IV, 'Sliding windows and attention sinks' (Eq. window-mask).
    """
    cases = [
        _window_case("self-attention (square)", 6, 6, 3),
        _window_case("window 1: each query sees itself only", 4, 4, 1),
        _window_case("one new query after 8 cached positions", 1, 9, 4,
                     note="The query is position 8, the last of the 9: it sees keys 5, 6, 7, 8."),
        _window_case("a chunk of 3 new queries after 7 cached positions", 3, 10, 4),
        _window_case("a window as long as the sequence (the causal mask)", 5, 5, 5),
        _window_case("a window longer than the sequence (the causal mask)", 4, 4, 10),
        _window_case("self-attention (square), a small window", 8, 8, 2),
    ]
    output = Output("mask", "mask[i, j] = (p - window < j <= p) with p = l_kv - l_q + i, booleans", EQ_WINDOW_MASK)
    run_cases("check_sliding_window_mask", fn, backend, ("l_q", "l_kv", "window"), (output,), cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_sink_attention
# ---------------------------------------------------------------------------------------------------------------


def _sink_case(label, q, k, v, sinks, mask=None, scale=None, note=""):
    sinks = np.asarray(sinks, dtype=np.float64)
    options, kwargs = mask_and_scale(mask, scale)
    expected = reference.scaled_dot_product_attention(q, k, v, mask, scale, sinks=sinks)
    return Case(f"{label}: {shapes_of(q=q, k=k, v=v, sinks=sinks)}{options}", (q, k, v, sinks), kwargs, expected,
                sink_attention_variants(q, k, v, sinks, mask, scale, expected[1]), note)


@public_checker
def check_sink_attention(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(q, k, v, sinks, mask=None, scale=None) -> (out, weights)``: attention with a sink logit per head.

    q ``(h, L_q, d_k)`` or ``(N, h, L_q, d_k)``, k and v likewise with L_kv keys (d_v may differ), ``sinks``
    ``(h,)``: one learned logit per head (gpt-oss). The sink joins each row's softmax as one more column, not scaled
    and never masked, and is dropped afterwards: ``weights_ij = exp(S_ij) / (sum_j' exp(S_ij') + exp(sink_h))`` over
    the allowed keys, ``S = scale q k^T``, so each row sums to ``1 - p_sink``; ``out = weights v``. Return the L_kv
    columns only. ``mask`` and ``scale`` as in ``check_scaled_dot_product_attention``; a query with no allowed key
    puts all its weight on the sink (zero weights, zero output).

    Cases: one head, batch and head axes, an explicit scale, a causal mask, sinks far above the scores, a query with
    no allowed key, large logits and sinks, a batch of one with one query, non-contiguous inputs.
    Book: part IV, 'Sliding windows and attention sinks' (Eq. sink-softmax).
    """
    rng = np.random.default_rng(1313)
    r = rng.standard_normal
    cases = [
        _sink_case("one head", r((1, 4, 8)), r((1, 6, 8)), r((1, 6, 5)), [0.5]),
        _sink_case("batch and head axes (L_q = h = 3)", r((2, 3, 3, 8)), r((2, 3, 6, 8)), r((2, 3, 6, 4)), r(3),
                   note="One sink logit per head: in (N, h, L_q, L_kv) scores, head j's rows all get sinks[j]."),
        _sink_case("explicit scale, L_q != h", r((2, 5, 6)), r((2, 4, 6)), r((2, 4, 3)), r(2), scale=0.3),
        _sink_case("causal mask", r((2, 2, 5, 8)), r((2, 2, 5, 8)), r((2, 2, 5, 4)), r(2),
                   mask=reference.causal_mask(5, 5)),
        _sink_case("sinks far above the scores (most weight on the sink)", r((2, 4, 8)), r((2, 5, 8)), r((2, 5, 3)),
                   [4.0, 6.0]),
        _sink_case("query row 2 has no allowed key", r((2, 4, 8)), r((2, 5, 8)), r((2, 5, 3)), r(2),
                   mask=row_with_no_key(rng, (4, 5), 2),
                   note="A row with no allowed key puts all its weight on the sink: zero weights, a zero output "
                        "row."),
        _sink_case("large logits and sinks (in the thousands)", 40 * r((2, 3, 8)), 40 * r((2, 6, 8)), r((2, 6, 4)),
                   [1500.0, -1500.0],
                   note="exp of a number above about 709 overflows float64: shift every term of a row, the sink's "
                        "included, by the largest of them."),
        _sink_case("a batch of one, one head, one query", r((1, 1, 1, 4)), r((1, 1, 3, 4)), r((1, 1, 3, 4)), [0.0]),
        _sink_case("non-contiguous q, k, v (transposed views), L_q != L_kv", transposed(r((2, 2, 4, 8))),
                   transposed(r((2, 2, 6, 8))), transposed(r((2, 2, 6, 4))), r(2), mask=reference.causal_mask(4, 6)),
    ]
    outputs = (
        Output("out", "weights V, the weights of softmax([scale QK^T | sink]) without the sink's column",
               EQ_SINK_SOFTMAX),
        Output("weights", "exp(S_ij) / (sum_j exp(S_ij) + exp(sink_h)) over the allowed keys (rows sum to "
                          "1 - p_sink)", EQ_SINK_SOFTMAX),
    )
    run_cases("check_sink_attention", fn, backend, ("q", "k", "v", "sinks"), outputs, cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_rms_norm
# ---------------------------------------------------------------------------------------------------------------


def _rms_case(label, x, weight, eps, note=""):
    return Case(f"{label}: {shapes_of(x=x, weight=weight)}, eps={eps:g}", (x, weight), {"eps": eps},
                (reference.rms_norm(x, weight, eps),), rms_norm_variants(x, weight, eps), note)


@public_checker
def check_rms_norm(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(x, weight, eps=1e-6)``: RMSNorm over the last axis, ``x / sqrt(mean(x^2) + eps) * weight``.

    ``x`` ``(..., d)``, ``weight`` ``(d,)``; ``eps`` is always passed. For QK-norm x holds the heads' query or key
    vectors ``(N, h, L, head_dim)`` and one weight of size head_dim serves every head. No mean is subtracted, no bias
    added. Cases: a vector, a square matrix, rows, per-head vectors, a large eps, small activations (RMS near
    sqrt(eps)), a zero vector, a batch of one, a non-contiguous input.
    Book: part IV, 'QK-norm and logit soft-capping' (Eq. rmsnorm).
    """
    rng = np.random.default_rng(1414)
    r = rng.standard_normal
    with_zero_row = r((3, 6))
    with_zero_row[1] = 0.0
    cases = [
        _rms_case("a vector", r(8), r(8), 1e-6),
        _rms_case("a square matrix", r((5, 5)), r(5), 1e-5),
        _rms_case("rows", r((3, 6)), r(6), 1e-6),
        _rms_case("per head (QK-norm): one weight for every head", r((2, 3, 5, 8)), r(8), 1e-6),
        _rms_case("a large eps", r((3, 4)), r(4), 0.1),
        _rms_case("small activations (RMS near sqrt(eps))", 1e-3 * r((4, 8)), r(8), 1e-6,
                  note="Here eps is as large as mean(x^2): where you add it matters."),
        _rms_case("row 1 is all zeros", with_zero_row, r(6), 1e-6,
                  note="A zero vector stays zero: eps under the square root keeps 0 / 0 away."),
        _rms_case("a batch of one, one head, one position", r((1, 1, 1, 4)), r(4), 1e-6),
        _rms_case("non-contiguous x (a transposed view)", transposed(r((2, 5, 6))), r(6), 1e-6),
    ]
    output = Output("normalised", "x / sqrt(mean(x^2 over the last axis) + eps) * weight", EQ_RMSNORM)
    run_cases("check_rms_norm", fn, backend, ("x", "weight"), (output,), cases, timeout)
