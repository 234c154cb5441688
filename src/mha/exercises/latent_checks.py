"""The checker of part IV's multi-head latent attention (MLA): one absorbed decoding step over a latent cache, and
what its known bugs compute.

The step (book Eq. mla-decode-step; row vectors; n = d_n, r = d_r as the chapter writes them): the new queries, at
positions P .. P+T-1 after P cached ones, score every cached row [c_j, k_rope_j] with the absorbed query
[q_nope_i W_uk_i^T, R q_rope_i], scale 1/sqrt(d_n + d_r), causal bottom-right; head i's output is the weighted sum of
the latents times W_uv_i; the cache grows by the new latents and the new rotary keys, rotated once at their positions.

The expected results come from ``mha.reference`` by the *naive* route: every head's keys [c W_uk_i, k_rope] and values
c W_uv_i are rebuilt and ``reference.scaled_dot_product_attention`` attends over them (Eq. mla-head). A reader's
absorbed step must agree with it because the two forms are one function (Proposition mla-prop-absorb); a reader who
rebuilds the keys passes too, as the results are the same.

The simulators follow the scheme of ``mha.exercises.simulators`` and ``frontier_simulators``: ``_sim_latent_decode``
computes the step the book's way when its knobs keep their defaults and the way a known bug does when one is turned;
``_LATENT_BUGS`` pairs each bug id of ``KNOWN_BUGS`` with the knobs that produce it; ``latent_decode_variants`` returns
``(bug id, thunk)`` pairs for one case (a thunk returns what the bug returns, None where it cannot show, or a
predicate on the outputs, for the caches that hold per-head tensors).

Book: part IV, 'Multi-head latent attention (MLA)'.
"""

from __future__ import annotations

import math

import numpy as np

from mha import reference
from mha._checks import check_choice
from mha.exercises.catalogue import EQ_MLA_DECODE
from mha.exercises.runner import (TIMEOUT, Case, Output, _same, public_checker, run_cases, shapes_of, to_numpy,
                                  transposed)
from mha.exercises.simulators import _sim_softmax, _variants

__all__ = ["check_latent_decode_step"]

_STYLES = ("half", "interleaved")
_ARGS = ("q_nope", "q_rope", "c_new", "k_rope_new", "c_cache", "k_rope_cache", "W_uk", "W_uv")


# ---------------------------------------------------------------------------------------------------------------
# The expected step: the naive route, through the reference.
# ---------------------------------------------------------------------------------------------------------------


def _rebuilt_keys_values(c_all, kr_all, W_uk, W_uv):
    """Every head's keys [c W_uk_i, k_rope] (N, h, L, d_n + d_r) and values c W_uv_i (N, h, L, d_v) (Eq. mla-head)."""
    k_nope = np.einsum("nlc,hcd->nhld", c_all, W_uk)  # (N, h, L, d_n)
    k_rope = np.broadcast_to(kr_all[:, None], k_nope.shape[:3] + (kr_all.shape[-1],))  # (N, h, L, d_r): shared
    return np.concatenate([k_nope, k_rope], axis=-1), np.einsum("nlc,hcd->nhld", c_all, W_uv)


def _latent_expected(q_nope, q_rope, c_new, kr_new, c_cache, kr_cache, W_uk, W_uv, style):
    """(out, c_cache, k_rope_cache) of the step, by rebuilding the heads' keys and values and attending over them."""
    cached, T = c_cache.shape[1], q_nope.shape[2]
    positions = cached + np.arange(T)  # the new tokens' absolute positions
    c_all = np.concatenate([c_cache, c_new], axis=1)  # (N, P + T, d_c)
    kr_all = np.concatenate([kr_cache, reference.rope(kr_new, positions, style=style)], axis=1)  # (N, P + T, d_r)
    k, v = _rebuilt_keys_values(c_all, kr_all, W_uk, W_uv)
    q = np.concatenate([q_nope, reference.rope(q_rope, positions, style=style)], axis=-1)  # (N, h, T, d_n + d_r)
    out, _ = reference.scaled_dot_product_attention(q, k, v, mask=reference.causal_mask(T, cached + T))
    return out, c_all, kr_all  # the default scale is 1/sqrt(q.shape[-1]) = 1/sqrt(d_n + d_r)


# ---------------------------------------------------------------------------------------------------------------
# What the known bugs compute.
# ---------------------------------------------------------------------------------------------------------------


def _sim_latent_decode(q_nope, q_rope, c_new, kr_new, c_cache, kr_cache, W_uk, W_uv, style, *, offset=True,
                       rotate="qk", pairing=None, rope_nope=None, after_caching=None, scale_rule="nope+rope",
                       value_up=True, mask="bottom_right", attend_new=True, shift="row", cache="append"):
    """The absorbed step the way a given bug computes it (defaults: the book's step, Eq. mla-decode-step).

    offset: the new positions are P .. P+T-1 (False: 0 .. T-1); rotate: which of q_rope ('q') and k_rope_new ('k')
    are rotated; pairing: RoPE's pairing (None: ``style``; the other one: the wrong convention); rope_nope: None,
    'query' (q_nope rotated at the query positions: only the query, by R_m, a rotation the layer does not apply to
    q_nope) or 'latent' (the absorbed query and every cached latent rotated at their positions, for the scores: a
    rotation by the key's position, which no absorbed matrix can hold); after_caching: None, 'raw' (the new rotary
    keys cached unrotated, rotated only to attend) or 'rerotate' (cached unrotated, and the whole rotary cache rotated
    at 0 .. P+T-1 to attend: the given cache turns twice); scale_rule: 'nope+rope' (1/sqrt(d_n + d_r)),
    'nope' (1/sqrt(d_n)), 'latent' (1/sqrt(d_c + d_r)); value_up: W_uv applied after the weighted sum; mask:
    'bottom_right', 'top_left', 'none'; attend_new: the new positions attend to themselves; shift: the softmax's
    ('row' or 'none'); cache: 'append' or 'none' (the old caches returned).
    """
    N, h, T, d_n = q_nope.shape
    cached, d_r, d_c = c_cache.shape[1], q_rope.shape[-1], c_new.shape[-1]
    positions = (cached if offset else 0) + np.arange(T)

    def turn(x, pos):
        return reference.rope(x, pos, style=style if pairing is None else pairing)

    q_r = turn(q_rope, positions) if "q" in rotate else q_rope  # (N, h, T, d_r)
    kr_turned = turn(kr_new, positions) if "k" in rotate else kr_new  # (N, T, d_r)
    c_all = np.concatenate([c_cache, c_new], axis=1)  # (N, P + T, d_c)
    if after_caching is None:
        kr_seen = kr_kept = np.concatenate([kr_cache, kr_turned], axis=1)  # (N, P + T, d_r)
    else:
        kr_kept = np.concatenate([kr_cache, kr_new], axis=1)  # what this bug caches: raw new keys
        kr_seen = (turn(kr_kept, np.arange(cached + T)) if after_caching == "rerotate"
                   else np.concatenate([kr_cache, kr_turned], axis=1))
    q_n = turn(q_nope, positions) if rope_nope == "query" else q_nope
    q_lat = np.einsum("nhtd,hcd->nhtc", q_n, W_uk)  # (N, h, T, d_c): W_uk_i absorbed into the query
    c_scored = c_all
    if rope_nope == "latent":
        q_lat, c_scored = turn(q_lat, positions), turn(c_all, np.arange(cached + T))
    c_values = c_all
    if not attend_new:
        if cached == 0:
            return None
        c_scored, kr_seen, c_values = c_scored[:, :cached], kr_seen[:, :cached], c_all[:, :cached]
    L_kv = c_values.shape[1]
    scores = q_lat @ np.swapaxes(c_scored, -1, -2)[:, None] + q_r @ np.swapaxes(kr_seen, -1, -2)[:, None]
    width = {"nope+rope": d_n + d_r, "nope": d_n, "latent": d_c + d_r}[scale_rule]
    scores = scores / math.sqrt(width)  # (N, h, T, L_kv)
    if not attend_new or mask == "none":
        allowed = None
    elif mask == "bottom_right":
        allowed = reference.causal_mask(T, L_kv)
    else:
        allowed = np.tril(np.ones((T, L_kv), dtype=bool))  # top-left
    weights = _sim_softmax(scores, allowed, shift=shift)  # (N, h, T, L_kv)
    o_lat = weights @ c_values[:, None]  # (N, h, T, d_c): weighted sums of latents
    out = np.einsum("nhtc,hcd->nhtd", o_lat, W_uv) if value_up else o_lat
    if cache == "none":
        return out, c_cache, kr_cache
    return out, c_all, kr_kept


_LATENT_BUGS = [
    ("mla_rope_on_absorbed", dict(rope_nope="query")),
    ("mla_rope_on_absorbed", dict(rope_nope="latent")),
    ("mla_value_up_forgotten", dict(value_up=False)),
    ("mla_scale_nope_only", dict(scale_rule="nope")),
    ("mla_scale_latent_width", dict(scale_rule="latent")),
    ("mla_no_position_offset", dict(offset=False)),
    ("mla_cache_not_updated", dict(cache="none")),
    ("rope_after_caching", dict(after_caching="raw")),
    ("rope_after_caching", dict(after_caching="rerotate")),
    ("rope_query_not_rotated", dict(rotate="k")),
    ("rope_key_not_rotated", dict(rotate="q")),
    ("rope_wrong_pairing", dict(pairing="half")),
    ("rope_wrong_pairing", dict(pairing="interleaved")),
    ("causal_top_left", dict(mask="top_left")),
    ("no_causal_mask", dict(mask="none")),
    ("new_position_not_attended", dict(attend_new=False)),
    ("no_max_subtraction", dict(shift="none")),
]


def _per_head_cache(q_nope, q_rope, c_new, kr_new, c_cache, kr_cache, W_uk, W_uv, style):
    """Predicate: a returned cache holds per-head tensors (rebuilt keys, values, or the rotary key per head)."""
    _, c_all, kr_all = _latent_expected(q_nope, q_rope, c_new, kr_new, c_cache, kr_cache, W_uk, W_uv, style)
    k, v = _rebuilt_keys_values(c_all, kr_all, W_uk, W_uv)  # (N, h, L, d_n + d_r), (N, h, L, d_v)
    d_n = q_nope.shape[-1]
    heads = [k[..., :d_n], k, v, np.concatenate([k[..., :d_n], v], axis=-1), k[..., d_n:]]  # (N, h, L, .) each
    N, h, L = k.shape[:3]
    forms = heads + [x.transpose(0, 2, 1, 3).reshape(N, L, -1) for x in heads]  # and heads merged, (N, L, h .)

    def matches(actual):
        return any(got is not None and got.shape != want.shape and any(_same(got, form) for form in forms)
                   for got, want in zip(actual[1:], (c_all, kr_all)))
    return matches


def latent_decode_variants(*args):
    """check_latent_decode_step: a per-head cache, RoPE on the no-position part, W_uv forgotten, the two wrong
    scales, the positions, the cache, where RoPE is applied and its pairing, the mask, the softmax."""
    return [("mla_cache_per_head", lambda: _per_head_cache(*args))] + _variants(_sim_latent_decode, _LATENT_BUGS,
                                                                                 *args)


# ---------------------------------------------------------------------------------------------------------------
# The cases.
# ---------------------------------------------------------------------------------------------------------------


def _latent_case(label, rng, style, *, N=2, h=2, T=1, cached=4, d_c=6, d_n=4, d_r=4, d_v=3, scale=1.0,
                 non_contiguous=False, note=""):
    r = rng.standard_normal
    q_nope, q_rope = scale * r((N, h, T, d_n)), scale * r((N, h, T, d_r))
    c_new, kr_new = scale * r((N, T, d_c)), scale * r((N, T, d_r))
    c_cache, kr_cache = scale * r((N, cached, d_c)), scale * r((N, cached, d_r))
    if cached:
        kr_cache = reference.rope(kr_cache, np.arange(cached), style=style)  # the cache holds rotated keys
    W_uk, W_uv = r((h, d_c, d_n)) / math.sqrt(d_c), r((h, d_c, d_v)) / math.sqrt(d_c)
    args = (q_nope, q_rope, c_new, kr_new, c_cache, kr_cache, W_uk, W_uv)
    if non_contiguous:
        args = tuple(transposed(a) for a in args)
    where = f"position {cached}" if T == 1 else f"positions {cached} .. {cached + T - 1}"
    name = (f"{label}: n_heads={h}, d_c={d_c}, d_n={d_n}, d_r={d_r}, d_v={d_v}, {T} new position"
            f"{'s' if T > 1 else ''} after {cached} cached (at {where}); "
            f"{shapes_of(q_nope=args[0], c_new=args[2], c_cache=args[4], W_uk=args[6])}")
    return Case(name, args, {}, _latent_expected(*args, style), latent_decode_variants(*args, style), note)


def _latent_run(fn, args, kwargs):
    """Drive a whole decode: start from empty caches, call fn once per step, feed back the caches it returns."""
    c_cache, kr_cache, steps, W_uk, W_uv = args
    outs = []
    for q_nope, q_rope, c_new, kr_new in steps:
        out, c_cache, kr_cache = fn(q_nope, q_rope, c_new, kr_new, c_cache, kr_cache, W_uk, W_uv)
        outs.append(to_numpy(out))
    if any(o is None or o.ndim != 4 for o in outs):
        return outs[0], c_cache, kr_cache  # reported as it is
    return np.concatenate(outs, axis=2), c_cache, kr_cache  # (N, h, L, d_v): every step's outputs


def _layer_pieces(params, x, n_heads, d_n, d_r, style, eps=1e-6):
    """What one MLA layer of ``mha.reference.multi_head_latent_attention`` feeds its attention, for x (N, L, d):
    q_nope (N, h, L, d_n), q_rope (N, h, L, d_r) and k_rope (N, L, d_r) not yet rotated, the normalised latents c
    (N, L, d_c), and W_uk (h, d_c, d_n), W_uv (h, d_c, d_v), the column blocks of W_ukv (the module docstring of
    ``mha.reference.latent``). Built from the reference's public pieces (rms_norm, split_heads)."""
    if "W_q" in params:
        q = x @ params["W_q"]
    else:
        q = reference.rms_norm(x @ params["W_dq"], params["q_norm"], eps) @ params["W_uq"]
    q = reference.split_heads(q, n_heads)  # (N, h, L, d_n + d_r)
    latent = x @ params["W_dkv"]  # (N, L, d_c + d_r)
    d_c = latent.shape[-1] - d_r
    c = reference.rms_norm(latent[..., :d_c], params["kv_norm"], eps)  # (N, L, d_c)
    blocks = params["W_ukv"].reshape(d_c, n_heads, -1).transpose(1, 0, 2)  # (h, d_c, d_n + d_v)
    return q[..., :d_n], q[..., d_n:], c, latent[..., d_c:], blocks[..., :d_n], blocks[..., d_n:]


def _latent_whole_case(style, chunks=(3, 1, 1, 2), N=2, h=4, d_model=16, d_c=6, d_n=4, d_r=4, d_v=3, q_rank=5):
    """A whole decode of a real layer's attention (``reference.init_latent_params``), step by step."""
    params = reference.init_latent_params(d_model, h, d_c, d_n, d_r, d_v, q_rank=q_rank, seed=1515)
    x = np.random.default_rng(1516).standard_normal((N, sum(chunks), d_model))
    q_nope, q_rope, c, kr, W_uk, W_uv = _layer_pieces(params, x, h, d_n, d_r, style)
    L = x.shape[1]
    empty_c, empty_kr = np.zeros((N, 0, d_c)), np.zeros((N, 0, d_r))
    expected = _latent_expected(q_nope, q_rope, c, kr, empty_c, empty_kr, W_uk, W_uv, style)  # causal over all L
    bounds = np.cumsum((0,) + tuple(chunks))
    steps = [(q_nope[:, :, a:b], q_rope[:, :, a:b], c[:, a:b], kr[:, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    name = (f"a whole decode of a layer's attention: n_heads={h}, d_c={d_c}, d_n={d_n}, d_r={d_r}, d_v={d_v}, from "
            f"empty caches (N, 0, d_c) and (N, 0, d_r), steps of {', '.join(map(str, chunks))} positions, each call "
            f"given the caches the previous one returned; compared with the layer's attention over all {L} positions")
    note = ("out is every step's output, concatenated along the position axis. The single steps above passed, so "
            "look at what you return: c_cache must hold every latent so far, oldest first, and k_rope_cache every "
            "rotary key, each rotated once at its own position.")
    return Case(name, (empty_c, empty_kr, steps, W_uk, W_uv), {}, expected, [], note, call=_latent_run,
                arg_names=("the initial c_cache", "the initial k_rope_cache", "a step's q_nope, q_rope, c_new or "
                           "k_rope_new", "W_uk", "W_uv"))


@public_checker
def check_latent_decode_step(fn, *, style: str = "half", backend: str = "auto",
                             timeout: float | None = TIMEOUT) -> None:
    """Check one absorbed decoding step of multi-head latent attention over a latent cache,
    ``fn(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv) -> (out, c_cache, k_rope_cache)``.

    The T new positions (T = 1 is a decoding step, T > 1 a prefill or a chunk) sit at P .. P+T-1 after P cached
    ones. ``q_nope`` ``(N, n_heads, T, d_n)``: their queries' no-position parts; ``q_rope`` ``(N, n_heads, T, d_r)``:
    their rotary parts, not yet rotated; ``c_new`` ``(N, T, d_c)``: their latents (already normalised);
    ``k_rope_new`` ``(N, T, d_r)``: their shared rotary keys, not yet rotated; ``c_cache`` ``(N, P, d_c)`` and
    ``k_rope_cache`` ``(N, P, d_r)``: those of the earlier positions, the rotary keys stored rotated (P may be 0);
    ``W_uk`` ``(n_heads, d_c, d_n)`` and ``W_uv`` ``(n_heads, d_c, d_v)``: head i's key and value up-projections.

    Rotate q_rope and k_rope_new at their positions (RoPE with base 10000, pairing ``style`` as in ``check_rope``);
    append the latents and the rotated rotary keys to the caches; score every cached row [c_j, k_rope_j] with the
    absorbed query [q_nope_i W_uk_i^T, R q_rope_i], scale ``1/sqrt(d_n + d_r)``, causal mask aligned bottom-right
    (new query t sees rows j <= P + t); head i's output is the weighted sum of the latents times ``W_uv_i``. Return
    ``out`` ``(N, n_heads, T, d_v)`` (the heads, before W^O) and the caches ``(N, P + T, d_c)`` and
    ``(N, P + T, d_r)``. Rebuilding each head's keys and values gives the same numbers and passes too.

    Cases: one step, a prefill into empty caches, a chunk after a cache, four narrow heads, one head far into a
    sequence, non-contiguous inputs, large logits, and a whole decode of a layer's attention that feeds back the
    caches you return. Book: part IV, 'Multi-head latent attention (MLA)' (Eqs. mla-decode-step, mla-absorb-score,
    mla-absorb-out, mla-cache).
    """
    style = check_choice("style", style, _STYLES)
    rng = np.random.default_rng(1717)
    cases = [
        _latent_case("one decoding step", rng, style),
        _latent_case("prefill into empty caches", rng, style, T=4, cached=0,
                     note="With empty caches the new positions are 0 .. T-1; the returned caches hold the T latents "
                          "and the T rotated rotary keys."),
        _latent_case("a chunk after a cache", rng, style, T=3, cached=5,
                     note="New query t sits at position P + t, P the cached positions: rotate its q_rope (and its "
                          "k_rope) there, and let it see the rows j <= P + t."),
        _latent_case("four narrow heads, h d_n = d_c", rng, style, h=4, d_c=8, d_n=2, d_r=2, d_v=5,
                     cached=6),
        _latent_case("one head, a batch of one, far into the sequence", rng, style, N=1, h=1, d_c=10, d_n=6, d_r=8,
                     d_v=4, cached=40),
        _latent_case("non-contiguous inputs (transposed views)", rng, style, h=3, T=2, cached=3,
                     non_contiguous=True),
        _latent_case("large logits (scores in the thousands)", rng, style, T=2, cached=3, scale=40.0,
                     note="exp of a score above about 709 overflows float64: subtract the row maximum first."),
        _latent_whole_case(style),
    ]
    outputs = (
        Output("out", "softmax([q_nope_i W_uk_i^T, R q_rope_i] [C; K_rope]^T / sqrt(d_n + d_r), causal "
                      "bottom-right) C W_uv_i, head by head, over the cached and the new rows", EQ_MLA_DECODE),
        Output("c_cache", "[c_cache; c_new]: the new latents appended along axis 1", EQ_MLA_DECODE),
        Output("k_rope_cache", "[k_rope_cache; R k_rope_new]: the new rotary keys rotated at their positions, "
                               "appended along axis 1", EQ_MLA_DECODE),
    )
    run_cases("check_latent_decode_step", fn, backend, _ARGS, outputs, cases, timeout)
