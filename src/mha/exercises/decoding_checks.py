"""Checkers of decoding: the causal mask aligned bottom-right, and one cached decoding step (and a whole decode that
feeds back the caches your function returns).

Book: part II, 'Autoregressive decoding and the KV cache'; GQA caches: part II, 'MQA and GQA'.
"""

from __future__ import annotations

import numpy as np

from mha import reference
from mha.exercises.catalogue import EQ_CHUNK_MASK, EQ_KV_STEP
from mha.exercises.runner import TIMEOUT, Case, Output, public_checker, run_cases, shapes_of, to_numpy, transposed
from mha.exercises.simulators import causal_mask_variants, decode_step_variants


# ---------------------------------------------------------------------------------------------------------------
# check_causal_mask
# ---------------------------------------------------------------------------------------------------------------


def _causal_case(label, l_q, l_kv):
    expected = (reference.causal_mask(l_q, l_kv),)  # (l_q, l_kv), eq. kv-chunk-mask
    return Case(f"{label}: l_q={l_q}, l_kv={l_kv}", (l_q, l_kv), {}, expected, causal_mask_variants(l_q, l_kv))


@public_checker
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
    output = Output("mask", "mask[i, j] = (j <= l_kv - l_q + i), booleans", EQ_CHUNK_MASK)
    run_cases("check_causal_mask", fn, backend, ("l_q", "l_kv"), (output,), cases, timeout)


# ---------------------------------------------------------------------------------------------------------------
# check_decode_step
# ---------------------------------------------------------------------------------------------------------------


def _causal_attention(q, k, v):
    """The queries' attention over all the keys, query head j reading key/value head j // (h/g), with the causal mask
    aligned bottom-right (eq. kv-chunk-mask): q (N, h, T, d), k and v (N, g, L_kv, d) -> (N, h, T, d)."""
    n_rep = q.shape[1] // k.shape[1]
    mask = reference.causal_mask(q.shape[2], k.shape[2])  # (T, L_kv)
    return reference.scaled_dot_product_attention(q, reference.repeat_kv(k, n_rep), reference.repeat_kv(v, n_rep),
                                                  mask)[0]


def _decode_expected(q, k_new, v_new, k_cache, v_cache):
    """The step by the reference: attention over [cache; new] with the bottom-right causal mask."""
    k_all = np.concatenate([k_cache, k_new], axis=2)  # (N, g, c+T, head_dim)
    v_all = np.concatenate([v_cache, v_new], axis=2)  # (N, g, c+T, head_dim)
    return _causal_attention(q, k_all, v_all), k_all, v_all


def _decode_case(label, rng, *, N=2, n_heads=2, n_kv_heads=2, head_dim=4, T=1, cached=4, scale=1.0,
                 non_contiguous=False, note=""):
    r = rng.standard_normal
    q = scale * r((N, n_heads, T, head_dim))
    k_new, v_new = scale * r((N, n_kv_heads, T, head_dim)), r((N, n_kv_heads, T, head_dim))
    k_cache, v_cache = scale * r((N, n_kv_heads, cached, head_dim)), r((N, n_kv_heads, cached, head_dim))
    if non_contiguous:
        q, k_new, v_new, k_cache, v_cache = (transposed(a) for a in (q, k_new, v_new, k_cache, v_cache))
    name = (f"{label}: n_heads={n_heads}, n_kv_heads={n_kv_heads}, {T} new position{'s' if T > 1 else ''} after "
            f"{cached} cached; {shapes_of(q=q, k_new=k_new, k_cache=k_cache)}")
    args = (q, k_new, v_new, k_cache, v_cache)
    return Case(name, args, {}, _decode_expected(*args), decode_step_variants(*args), note)


def _decode_run(fn, args, kwargs):
    """Drive a whole decode: start from the empty caches, call fn once per step, feed back the caches it returns."""
    k_cache, v_cache, steps = args
    outs = []
    for q, k_new, v_new in steps:
        out, k_cache, v_cache = fn(q, k_new, v_new, k_cache, v_cache)
        outs.append(to_numpy(out))
    if any(o is None or o.ndim != 4 for o in outs):
        return outs[0], k_cache, v_cache  # reported as it is
    return np.concatenate(outs, axis=2), k_cache, v_cache  # (N, h, L, head_dim): every step's outputs


def _decode_whole_case(rng, chunks=(3, 1, 1, 2), N=2, n_heads=4, n_kv_heads=2, head_dim=4):
    r = rng.standard_normal
    L = sum(chunks)
    q, k, v = r((N, n_heads, L, head_dim)), r((N, n_kv_heads, L, head_dim)), r((N, n_kv_heads, L, head_dim))
    out = _causal_attention(q, k, v)  # (N, h, L, head_dim)
    bounds = np.cumsum((0,) + tuple(chunks))
    steps = [(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    empty = np.zeros((N, n_kv_heads, 0, head_dim))  # (N, g, 0, head_dim)
    name = (f"a whole decode: n_heads={n_heads}, n_kv_heads={n_kv_heads}, from empty caches (N, g, 0, head_dim), "
            f"steps of {', '.join(map(str, chunks))} positions, each call given the caches the previous one "
            f"returned; compared with causal attention over all {L} positions")
    note = ("out is every step's output, concatenated along the position axis. The single steps above passed, so "
            "look at what you return: the caches must hold every position so far, oldest first, n_kv_heads heads.")
    return Case(name, (empty, empty.copy(), steps), {}, (out, k, v), [], note, call=_decode_run,
                arg_names=("the initial k_cache", "the initial v_cache", "a step's q, k_new or v_new"))


@public_checker
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
                     note="The caches have 0 positions: np.concatenate of an empty (N, g, 0, head_dim) array works."),
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
        Output("out", "softmax(q [K_cache; k_new]^T / sqrt(head_dim), causal bottom-right) [V_cache; v_new]",
                EQ_KV_STEP),
        Output("k_cache", "[K_cache; k_new] (new positions appended along axis 2)", EQ_KV_STEP),
        Output("v_cache", "[V_cache; v_new] (new positions appended along axis 2)", EQ_KV_STEP),
    )
    run_cases("check_decode_step", fn, backend, ("q", "k_new", "v_new", "k_cache", "v_cache"), outputs, cases, timeout)
