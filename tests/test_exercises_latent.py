"""Tests for ``mha.exercises.check_latent_decode_step``, the checker of part IV's multi-head latent attention chapter.

* Correct implementations written here independently (the book's absorbed NumPy solution, keys rebuilt per head
  through the reference, a loop over rows, torch, the interleaved pairing) pass, with NumPy inputs and with tensors.
* Each buggy implementation below, the bug written out where it happens, is rejected with exactly its diagnosis:
  RoPE on the no-position part, a cache of per-head keys, W^{UV} forgotten, the two wrong scales, and the bugs of a
  decoding step with RoPE; every new bug id of the catalogue is reached, every id the simulators give is known.
* Correct code in float32 and correct results with noise are never given a bug's name.
* The checker's expected step, driven over a whole sequence, is the reference layer's attention
  (``reference.multi_head_latent_attention`` after W^O); its equations and its title exist on the chapter's page, and
  the page's write-it-yourself solution passes.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pytest
import torch
from _optional_hypothesis import given, settings, st

from mha import exercises as E
from mha import reference as R
from mha.exercises import catalogue, latent_checks

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "book" / "part4" / "latent_attention.md"
CHECK = E.check_latent_decode_step
NEW_BUGS = {"mla_rope_on_absorbed", "mla_cache_per_head", "mla_value_up_forgotten", "mla_scale_nope_only",
            "mla_scale_latent_width", "mla_no_position_offset", "mla_cache_not_updated"}


# ---------------------------------------------------------------------------------------------------------------
# Small correct pieces, written here.
# ---------------------------------------------------------------------------------------------------------------


def _np(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


def _rope_half(x, positions, base=10000.0):
    """RoPE, pairs (x[i], x[i + d/2]), on the last axis; positions (T,) for the axis before it."""
    d = x.shape[-1]
    angles = np.asarray(positions)[:, None] * base ** (-np.arange(0, d, 2) / d)  # (T, d/2)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * np.cos(angles) - b * np.sin(angles), a * np.sin(angles) + b * np.cos(angles)], -1)


def _softmax_rows(scores, allowed):
    scores = np.where(allowed, scores, -np.inf)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _allowed(T, L):
    return np.arange(L)[None, :] <= (L - T) + np.arange(T)[:, None]  # (T, L): row t sees j <= c + t


# ---------------------------------------------------------------------------------------------------------------
# Correct implementations.
# ---------------------------------------------------------------------------------------------------------------


def latent_step_book(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    """The absorbed step as the chapter's solution writes it."""
    c, T = c_cache.shape[1], q_nope.shape[2]
    positions = c + np.arange(T)
    q_rope, k_rope_new = _rope_half(q_rope, positions), _rope_half(k_rope_new, positions)
    c_all = np.concatenate([c_cache, c_new], axis=1)
    k_rope_all = np.concatenate([k_rope_cache, k_rope_new], axis=1)
    q_lat = np.einsum("nhtd,hcd->nhtc", q_nope, W_uk)
    scores = q_lat @ np.swapaxes(c_all, -1, -2)[:, None] + q_rope @ np.swapaxes(k_rope_all, -1, -2)[:, None]
    weights = _softmax_rows(scores / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1]), _allowed(T, c + T))
    return np.einsum("nhtc,hcd->nhtd", weights @ c_all[:, None], W_uv), c_all, k_rope_all


def latent_step_reference_naive(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv,
                                style="half"):
    """Not absorbed: every head's keys and values rebuilt, then the reference's attention."""
    c, T = c_cache.shape[1], q_nope.shape[2]
    positions = c + np.arange(T)
    c_all = np.concatenate([c_cache, c_new], axis=1)
    k_rope_all = np.concatenate([k_rope_cache, R.rope(k_rope_new, positions, style=style)], axis=1)
    h = q_nope.shape[1]
    k = np.concatenate([c_all[:, None] @ W_uk, np.repeat(k_rope_all[:, None], h, axis=1)], axis=-1)
    v = c_all[:, None] @ W_uv
    q = np.concatenate([q_nope, R.rope(q_rope, positions, style=style)], axis=-1)
    out, _ = R.scaled_dot_product_attention(q, k, v, mask=R.causal_mask(T, c + T))
    return out, c_all, k_rope_all


def latent_step_loop(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    """One query row of one head at a time, the absorbed query built per row."""
    q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv = map(
        _np, (q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv))
    N, h, T, d_n = q_nope.shape
    c = c_cache.shape[1]
    c_all = np.concatenate([c_cache, c_new], axis=1)
    k_rope_all = np.concatenate([k_rope_cache, _rope_half(k_rope_new, c + np.arange(T))], axis=1)
    out = np.zeros((N, h, T, W_uv.shape[-1]))
    scale = 1 / math.sqrt(d_n + q_rope.shape[-1])
    for n in range(N):
        for i in range(h):
            for t in range(T):
                p = c + t
                q_lat = W_uk[i] @ q_nope[n, i, t]  # (d_c,)
                q_r = _rope_half(q_rope[n, i, t][None], [p])[0]
                row = [scale * (q_lat @ c_all[n, j] + q_r @ k_rope_all[n, j]) for j in range(p + 1)]
                top = max(row)
                w = [math.exp(s - top) for s in row]
                o_lat = sum(w_j * c_all[n, j] for j, w_j in enumerate(w)) / sum(w)
                out[n, i, t] = o_lat @ W_uv[i]
    return out, c_all, k_rope_all


def _rotate_half_torch(x, positions, base=10000.0):
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.to(torch.float64)[:, None] * theta  # (T, d/2)
    cos, sin = torch.cat([angles.cos(), angles.cos()], -1).to(x.dtype), torch.cat([angles.sin(), angles.sin()], -1)
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin.to(x.dtype)


def latent_step_torch(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    """Absorbed, in torch: the heads and queries stacked into rows against the one shared key head, as MQA."""
    q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv = (
        t if isinstance(t, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(t))
        for t in (q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv))
    N, h, T, d_n = q_nope.shape
    c = c_cache.shape[1]
    positions = torch.arange(c, c + T)
    c_all = torch.cat([c_cache, c_new], dim=1)
    k_rope_all = torch.cat([k_rope_cache, _rotate_half_torch(k_rope_new, positions)], dim=1)
    q_lat = q_nope @ W_uk.transpose(-1, -2)  # (N, h, T, d_c)
    q_abs = torch.cat([q_lat, _rotate_half_torch(q_rope, positions)], dim=-1)  # (N, h, T, d_c + d_r)
    rows = torch.cat([c_all, k_rope_all], dim=-1)  # (N, L, d_c + d_r)
    scores = (q_abs.reshape(N, h * T, -1) @ rows.transpose(1, 2)).view(N, h, T, c + T)
    scores = scores / math.sqrt(d_n + q_rope.shape[-1])
    mask = torch.ones(T, c + T, dtype=torch.bool).tril(diagonal=c)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    o_lat = weights.reshape(N, h * T, c + T) @ c_all  # (N, h T, d_c)
    return o_lat.view(N, h, T, -1) @ W_uv, c_all, k_rope_all


def latent_step_interleaved(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    """DeepSeek's own pairing, (x[2i], x[2i+1]), as complex numbers."""
    c, T = c_cache.shape[1], q_nope.shape[2]
    positions = c + np.arange(T)

    def turn(x):
        d = x.shape[-1]
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * positions[:, None] * 10000.0 ** (-np.arange(0, d, 2) / d))
        return np.stack([z.real, z.imag], axis=-1).reshape(x.shape)

    return _interleaved_absorbed(q_nope, turn(q_rope), c_new, turn(k_rope_new), c_cache, k_rope_cache, W_uk, W_uv)


def _interleaved_absorbed(q_nope, q_rope_turned, c_new, k_rope_turned, c_cache, k_rope_cache, W_uk, W_uv):
    c, T = c_cache.shape[1], q_nope.shape[2]
    c_all = np.concatenate([c_cache, c_new], axis=1)
    k_rope_all = np.concatenate([k_rope_cache, k_rope_turned], axis=1)
    scores = (np.einsum("nhtd,hcd,nlc->nhtl", q_nope, W_uk, c_all)
              + np.einsum("nhtr,nlr->nhtl", q_rope_turned, k_rope_all))
    weights = _softmax_rows(scores / math.sqrt(q_nope.shape[-1] + q_rope_turned.shape[-1]), _allowed(T, c + T))
    return np.einsum("nhtl,nlc,hcd->nhtd", weights, c_all, W_uv), c_all, k_rope_all


CORRECT = [
    ("the book's absorbed solution", latent_step_book, {}),
    ("reference, keys rebuilt per head", latent_step_reference_naive, {}),
    ("loop over rows", latent_step_loop, {}),
    ("torch, heads stacked as MQA", latent_step_torch, {}),
    ("torch, backend='torch'", latent_step_torch, {"backend": "torch"}),
    ("interleaved pairing, complex numbers", latent_step_interleaved, {"style": "interleaved"}),
]


@pytest.mark.parametrize("fn, kwargs", [(fn, kw) for _, fn, kw in CORRECT], ids=[label for label, _, _ in CORRECT])
def test_correct_implementations_pass(fn, kwargs):
    assert CHECK(fn, **kwargs) is None


def test_a_solution_checked_with_the_other_pairing_is_named():
    """The interleaved solution checked against the default pairing (and a "half" one against "interleaved") is
    rejected as rope_wrong_pairing, whose hint names the style= keyword."""
    for fn, kwargs in ((latent_step_interleaved, {}), (latent_step_book, {"style": "interleaved"})):
        with pytest.raises(E.ExerciseError) as info:
            CHECK(fn, **kwargs)
        assert info.value.bug == "rope_wrong_pairing" and "style=" in str(info.value), str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# Buggy implementations, each written out.
# ---------------------------------------------------------------------------------------------------------------


class Bug(NamedTuple):
    label: str
    fn: Callable
    diagnosis: str
    kwargs: dict = {}


BUGGY: list[Bug] = []


def bug(diagnosis, **kwargs):
    def register(fn):
        BUGGY.append(Bug(fn.__name__, fn, diagnosis, kwargs))
        return fn
    return register


def _attend(q_lat, q_rope, c_all, k_rope_all, W_uv, scale, allowed):
    scores = q_lat @ np.swapaxes(c_all, -1, -2)[:, None] + q_rope @ np.swapaxes(k_rope_all, -1, -2)[:, None]
    weights = _softmax_rows(scores * scale, allowed)
    return np.einsum("nhtc,hcd->nhtd", weights @ c_all[:, None], W_uv)


@bug("mla_rope_on_absorbed")
def latent_rotates_the_whole_query(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    c, T = c_cache.shape[1], q_nope.shape[2]
    positions = c + np.arange(T)
    q_nope = _rope_half(q_nope, positions)  # the bug: "every query gets RoPE", the no-position part too
    q_rope, k_rope_new = _rope_half(q_rope, positions), _rope_half(k_rope_new, positions)
    c_all = np.concatenate([c_cache, c_new], axis=1)
    k_rope_all = np.concatenate([k_rope_cache, k_rope_new], axis=1)
    q_lat = np.einsum("nhtd,hcd->nhtc", q_nope, W_uk)
    scale = 1 / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    return _attend(q_lat, q_rope, c_all, k_rope_all, W_uv, scale, _allowed(T, c + T)), c_all, k_rope_all


@bug("mla_rope_on_absorbed")
def latent_torch_rotates_the_latent_too(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv = (
        t if isinstance(t, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(t))
        for t in (q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv))
    N, h, T, d_n = q_nope.shape
    c = c_cache.shape[1]
    c_all = torch.cat([c_cache, c_new], dim=1)
    k_rope_all = torch.cat([k_rope_cache, _rotate_half_torch(k_rope_new, torch.arange(c, c + T))], dim=1)
    q_lat = _rotate_half_torch(q_nope @ W_uk.transpose(-1, -2), torch.arange(c, c + T))  # the bug: the latent part
    c_turned = _rotate_half_torch(c_all, torch.arange(c + T))  # ... and every cached latent, at its position
    scores = q_lat @ c_turned.unsqueeze(1).transpose(-1, -2)
    scores = scores + _rotate_half_torch(q_rope, torch.arange(c, c + T)) @ k_rope_all.unsqueeze(1).transpose(-1, -2)
    mask = torch.ones(T, c + T, dtype=torch.bool).tril(diagonal=c)
    weights = torch.softmax((scores / math.sqrt(d_n + q_rope.shape[-1])).masked_fill(~mask, float("-inf")), dim=-1)
    return (weights @ c_all.unsqueeze(1)) @ W_uv, c_all, k_rope_all


@bug("mla_cache_per_head")
def latent_caches_keys_and_values(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    out, c_all, k_rope_all = latent_step_book(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv)
    h = q_nope.shape[1]
    k = np.concatenate([c_all[:, None] @ W_uk, np.repeat(k_rope_all[:, None], h, axis=1)], axis=-1)  # (N, h, L, .)
    v = c_all[:, None] @ W_uv
    return out, k, v  # the bug: an ordinary KV cache, every head's keys and values


@bug("mla_cache_per_head")
def latent_copies_the_rotary_key_per_head(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    out, c_all, k_rope_all = latent_step_book(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv)
    return out, c_all, np.repeat(k_rope_all[:, None], q_nope.shape[1], axis=1)  # the bug: one copy per head


@bug("mla_value_up_forgotten")
def latent_returns_the_weighted_latents(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    c, T = c_cache.shape[1], q_nope.shape[2]
    positions = c + np.arange(T)
    q_rope, k_rope_new = _rope_half(q_rope, positions), _rope_half(k_rope_new, positions)
    c_all = np.concatenate([c_cache, c_new], axis=1)
    k_rope_all = np.concatenate([k_rope_cache, k_rope_new], axis=1)
    q_lat = np.einsum("nhtd,hcd->nhtc", q_nope, W_uk)
    scores = q_lat @ np.swapaxes(c_all, -1, -2)[:, None] + q_rope @ np.swapaxes(k_rope_all, -1, -2)[:, None]
    weights = _softmax_rows(scores / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1]), _allowed(T, c + T))
    return weights @ c_all[:, None], c_all, k_rope_all  # the bug: no W_uv after the weighted sum


def _book_with(scale_of, q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    c, T = c_cache.shape[1], q_nope.shape[2]
    positions = c + np.arange(T)
    q_rope, k_rope_new = _rope_half(q_rope, positions), _rope_half(k_rope_new, positions)
    c_all = np.concatenate([c_cache, c_new], axis=1)
    k_rope_all = np.concatenate([k_rope_cache, k_rope_new], axis=1)
    q_lat = np.einsum("nhtd,hcd->nhtc", q_nope, W_uk)
    scale = scale_of(q_nope, q_rope, q_lat)
    return _attend(q_lat, q_rope, c_all, k_rope_all, W_uv, scale, _allowed(T, c + T)), c_all, k_rope_all


@bug("mla_scale_nope_only")
def latent_scaled_by_the_nope_width(*args):
    return _book_with(lambda q_nope, q_rope, q_lat: q_nope.shape[-1] ** -0.5, *args)  # the bug: d_n only


@bug("mla_scale_latent_width")
def latent_scaled_by_the_absorbed_width(*args):
    def scale(q_nope, q_rope, q_lat):
        q_absorbed = np.concatenate([q_lat, q_rope], axis=-1)
        return 1 / math.sqrt(q_absorbed.shape[-1])  # the bug: d_c + d_r, the width of what is multiplied
    return _book_with(scale, *args)


@bug("mla_no_position_offset")
def latent_rotates_from_zero(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    c, T = c_cache.shape[1], q_nope.shape[2]
    positions = np.arange(T)  # the bug: the cached positions are not counted
    q_rope, k_rope_new = _rope_half(q_rope, positions), _rope_half(k_rope_new, positions)
    c_all = np.concatenate([c_cache, c_new], axis=1)
    k_rope_all = np.concatenate([k_rope_cache, k_rope_new], axis=1)
    q_lat = np.einsum("nhtd,hcd->nhtc", q_nope, W_uk)
    scale = 1 / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    return _attend(q_lat, q_rope, c_all, k_rope_all, W_uv, scale, _allowed(T, c + T)), c_all, k_rope_all


@bug("mla_cache_not_updated")
def latent_returns_the_old_caches(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    out, _, _ = latent_step_book(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv)
    return out, c_cache, k_rope_cache


@bug("rope_after_caching")
def latent_caches_raw_rotary_keys(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    out, c_all, _ = latent_step_book(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv)
    return out, c_all, np.concatenate([k_rope_cache, k_rope_new], axis=1)  # the bug: cached before rotating


@bug("rope_key_not_rotated")
def latent_forgets_to_rotate_the_key(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    c, T = c_cache.shape[1], q_nope.shape[2]
    q_rope = _rope_half(q_rope, c + np.arange(T))  # k_rope_new is never rotated
    c_all = np.concatenate([c_cache, c_new], axis=1)
    k_rope_all = np.concatenate([k_rope_cache, k_rope_new], axis=1)
    q_lat = np.einsum("nhtd,hcd->nhtc", q_nope, W_uk)
    scale = 1 / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    return _attend(q_lat, q_rope, c_all, k_rope_all, W_uv, scale, _allowed(T, c + T)), c_all, k_rope_all


@bug("causal_top_left")
def latent_mask_top_left(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    c, T = c_cache.shape[1], q_nope.shape[2]
    positions = c + np.arange(T)
    q_rope, k_rope_new = _rope_half(q_rope, positions), _rope_half(k_rope_new, positions)
    c_all = np.concatenate([c_cache, c_new], axis=1)
    k_rope_all = np.concatenate([k_rope_cache, k_rope_new], axis=1)
    q_lat = np.einsum("nhtd,hcd->nhtc", q_nope, W_uk)
    scale = 1 / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    allowed = np.tril(np.ones((T, c + T), dtype=bool))  # the bug: query t sees rows 0 .. t
    return _attend(q_lat, q_rope, c_all, k_rope_all, W_uv, scale, allowed), c_all, k_rope_all


@bug("new_position_not_attended")
def latent_attends_to_the_cache_only(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    c, T = c_cache.shape[1], q_nope.shape[2]
    positions = c + np.arange(T)
    q_rope, k_rope_new = _rope_half(q_rope, positions), _rope_half(k_rope_new, positions)
    q_lat = np.einsum("nhtd,hcd->nhtc", q_nope, W_uk)
    scale = 1 / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    out = _attend(q_lat, q_rope, c_cache, k_rope_cache, W_uv, scale, np.ones((T, c), dtype=bool))  # cache only
    return out, np.concatenate([c_cache, c_new], axis=1), np.concatenate([k_rope_cache, k_rope_new], axis=1)


@bug("no_max_subtraction")
def latent_softmax_without_the_shift(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    c, T = c_cache.shape[1], q_nope.shape[2]
    positions = c + np.arange(T)
    q_rope, k_rope_new = _rope_half(q_rope, positions), _rope_half(k_rope_new, positions)
    c_all = np.concatenate([c_cache, c_new], axis=1)
    k_rope_all = np.concatenate([k_rope_cache, k_rope_new], axis=1)
    q_lat = np.einsum("nhtd,hcd->nhtc", q_nope, W_uk)
    scores = q_lat @ np.swapaxes(c_all, -1, -2)[:, None] + q_rope @ np.swapaxes(k_rope_all, -1, -2)[:, None]
    e = np.where(_allowed(T, c + T), np.exp(scores / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])), 0.0)
    weights = e / e.sum(axis=-1, keepdims=True)  # the bug: exp of the raw scores
    return np.einsum("nhtc,hcd->nhtd", weights @ c_all[:, None], W_uv), c_all, k_rope_all


@bug("modifies_input")
def latent_rotates_in_place(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk, W_uv):
    c, T = c_cache.shape[1], q_nope.shape[2]
    q_rope[...] = _rope_half(q_rope, c + np.arange(T))  # the bug: the caller's q_rope is overwritten
    k_rope_new = _rope_half(k_rope_new, c + np.arange(T))
    c_all = np.concatenate([c_cache, c_new], axis=1)
    k_rope_all = np.concatenate([k_rope_cache, k_rope_new], axis=1)
    q_lat = np.einsum("nhtd,hcd->nhtc", q_nope, W_uk)
    scale = 1 / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    return _attend(q_lat, q_rope, c_all, k_rope_all, W_uv, scale, _allowed(T, c + T)), c_all, k_rope_all


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the buggy softmax overflows, as it should
@pytest.mark.parametrize("case", BUGGY, ids=[b.label for b in BUGGY])
def test_buggy_implementation_gets_its_diagnosis(case):
    with pytest.raises(E.ExerciseError) as info:
        CHECK(case.fn, **case.kwargs)
    error, message = info.value, str(info.value)
    assert error.bug == case.diagnosis, message
    assert error.checker == "check_latent_decode_step" and message.startswith(
        f"check_latent_decode_step: case '{error.case}'")
    known = E.KNOWN_BUGS[case.diagnosis]
    assert f"This matches a known bug: {known.description}" in message and f"Hint: {known.hint}" in message
    if "differs from" in message:
        assert "(book Eq. mla-decode-step, part IV 'Multi-head latent attention (MLA)')" in message
        assert re.search(r"expected \w+(\[[\d,:]+\] = \[| of shape)", message), message


def test_every_new_bug_is_reached_and_every_simulated_bug_is_known():
    assert NEW_BUGS <= {b.diagnosis for b in BUGGY}
    assert {key for key in E.KNOWN_BUGS if key.startswith("mla_")} == NEW_BUGS
    simulated = {bug_id for bug_id, _ in latent_checks._LATENT_BUGS} | {"mla_cache_per_head"}
    assert simulated <= set(E.KNOWN_BUGS) and NEW_BUGS <= simulated
    for key in NEW_BUGS:
        known = E.KNOWN_BUGS[key]
        assert known.description and known.hint and known.equation.chapter == catalogue.LATENT_CH


def test_the_four_named_bugs_of_the_brief_say_where_to_look():
    """RoPE on the absorbed part, a per-head cache, W_uv forgotten and the 1/sqrt(d_n) scale: each message names the
    bug and its hint points at the line to change."""
    expectations = {
        latent_rotates_the_whole_query: ("mla_rope_on_absorbed", "rotate q_rope and k_rope only"),
        latent_caches_keys_and_values: ("mla_cache_per_head", "return the latents themselves"),
        latent_returns_the_weighted_latents: ("mla_value_up_forgotten", "expected out of shape"),
        latent_scaled_by_the_nope_width: ("mla_scale_nope_only", "1 / sqrt(q_nope.shape[-1] + q_rope.shape[-1])"),
    }
    for fn, (diagnosis, text) in expectations.items():
        with pytest.raises(E.ExerciseError) as info:
            CHECK(fn)
        assert info.value.bug == diagnosis and text in str(info.value), str(info.value)
        assert info.value.case.startswith("one decoding step"), info.value.case  # caught on the first case


def test_the_per_head_cache_is_named_whatever_it_holds():
    """The rebuilt keys, or the values, or both merged into (N, L, h d): the predicate recognises each."""
    def merged_keys(*args):
        out, c_all, k_rope_all = latent_step_book(*args)
        N, L = c_all.shape[:2]
        k_nope = c_all[:, None] @ args[6]  # (N, h, L, d_n)
        return out, k_nope.transpose(0, 2, 1, 3).reshape(N, L, -1), k_rope_all

    with pytest.raises(E.ExerciseError) as info:
        CHECK(merged_keys)
    assert info.value.bug == "mla_cache_per_head", str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# No bug's name for a correct implementation that misses the tolerance.
# ---------------------------------------------------------------------------------------------------------------


def test_float32_correct_code_is_never_given_a_bug():
    def in_float32(*args):
        out = latent_step_torch(*(torch.from_numpy(np.ascontiguousarray(_np(a))).float() for a in args))
        return tuple(t.double() for t in out)

    try:
        CHECK(in_float32)
    except E.ExerciseError as error:
        assert error.bug is None and "matches none of the known bugs" in str(error), str(error)


@settings(max_examples=15, deadline=None)
@given(relative=st.floats(1e-3, 3e-2), seed=st.integers(0, 2**16))
def test_noisy_results_are_rejected_without_a_bug_name(relative, seed):
    rng = np.random.default_rng(seed)

    def noisy(*args):
        return tuple(a * (1 + relative * rng.standard_normal(a.shape)) + relative * rng.standard_normal(a.shape)
                     for a in latent_step_book(*args))

    with pytest.raises(E.ExerciseError) as info:
        CHECK(noisy)
    assert info.value.bug is None and "matches none of the known bugs" in str(info.value), str(info.value)


def test_bad_arguments():
    with pytest.raises(ValueError, match="style must be one of 'half', 'interleaved', got 'adjacent'"):
        CHECK(latent_step_book, style="adjacent")
    with pytest.raises(TypeError, match=r"check_latent_decode_step: fn must be a callable"):
        CHECK(3)
    with pytest.raises(ValueError, match="backend must be one of"):
        CHECK(latent_step_book, backend="jax")


def test_the_stub_is_reported_once_with_a_hint():
    def my_latent_decode_step(*args):
        raise NotImplementedError

    with pytest.raises(E.ExerciseError, match="replace the stub's `raise NotImplementedError`"):
        CHECK(my_latent_decode_step)


# ---------------------------------------------------------------------------------------------------------------
# The checker against the reference layer, and the book.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("q_rank", [None, 5])
def test_the_expected_step_is_the_reference_layers_attention(style, q_rank):
    """The pieces the whole-decode case feeds the reader, attended by the checker's expected step and projected by
    W^O, are multi_head_latent_attention's output, in both forms."""
    h, d_model, d_c, d_n, d_r, d_v = 4, 16, 6, 4, 4, 3
    params = R.init_latent_params(d_model, h, d_c, d_n, d_r, d_v, q_rank=q_rank, seed=3)
    x = np.random.default_rng(4).standard_normal((2, 9, d_model))
    q_nope, q_rope, c, kr, W_uk, W_uv = latent_checks._layer_pieces(params, x, h, d_n, d_r, style)
    empty_c, empty_kr = np.zeros((2, 0, d_c)), np.zeros((2, 0, d_r))
    heads, c_cache, kr_cache = latent_checks._latent_expected(q_nope, q_rope, c, kr, empty_c, empty_kr, W_uk, W_uv,
                                                              style)
    for absorb in (False, True):
        out, _ = R.multi_head_latent_attention(x, params, h, qk_nope_head_dim=d_n, qk_rope_head_dim=d_r,
                                               v_head_dim=d_v, rope_style=style, absorb=absorb)
        np.testing.assert_allclose(R.merge_heads(heads) @ params["W_o"], out, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(c_cache, c)
    np.testing.assert_allclose(kr_cache, R.rope(kr, np.arange(9), style=style), rtol=0, atol=0)


def test_the_whole_decode_catches_a_cache_that_forgets_after_the_prefill():
    """Single steps right, but the caches returned after a 3-position prefill are dropped: only the whole decode
    (which feeds the returned caches back) sees it."""
    def forgets(*args):
        out, c_all, k_rope_all = latent_step_book(*args)
        if args[4].shape[1] == 0 and args[0].shape[2] == 3 and args[0].shape[1] == 4:
            return out, c_all[:, :0], k_rope_all[:, :0]
        return out, c_all, k_rope_all

    with pytest.raises(E.ExerciseError) as info:
        CHECK(forgets)
    assert info.value.case.startswith("a whole decode"), str(info.value)


def _page_labels_and_title():
    text = PAGE.read_text(encoding="utf-8")
    labels = set(re.findall(r"^\$\$ \(([\w-]+)\)", text, flags=re.M)) | set(re.findall(r":label: ([\w-]+)", text))
    return text, labels


def test_the_equations_the_checker_names_are_on_the_chapters_page():
    text, labels = _page_labels_and_title()
    named = {value.label for value in vars(catalogue).values()
             if isinstance(value, E.Equation) and value.chapter == catalogue.LATENT_CH}
    assert named and named <= labels, named - labels
    cited = set(re.findall(r"(?:Eqs?\.|Proposition) (mla-[\w-]+)", CHECK.__doc__ + latent_checks.__doc__ + "".join(
        E.KNOWN_BUGS[key].hint for key in NEW_BUGS)))
    assert cited and cited <= labels, cited - labels
    title = re.search(r"'(.+)'", catalogue.LATENT_CH).group(1)
    assert f"\n# {title}\n" in "\n" + text


def test_the_pages_write_it_yourself_solution_passes():
    """The block at the end of the page: its stub, its solution, and the hidden cell that runs the solution (the
    same as the solution shown) through the checker."""
    text = PAGE.read_text(encoding="utf-8")
    block = re.search(r"^% write-it-yourself: (?P<checkers>[\w, ]+)\n(?P<body>.*?)^% end write-it-yourself\n", text,
                      re.M | re.S)
    assert block and block["checkers"].strip() == "check_latent_decode_step"
    assert text.index("## Exercises") < block.start() and not text[block.end():].strip()
    body = block["body"]
    assert "raise NotImplementedError" in re.search(r"^```python\n(.*?)^```", body, re.M | re.S).group(1)
    solution = re.search(r":class: dropdown\n```python\n(.*?)^```", body, re.M | re.S).group(1)
    cell = re.search(r"^```\{code-cell\} ipython3\n:tags: \[remove-input, translate-output\]\n\n(.*?)^```", body,
                     re.M | re.S).group(1)  # hidden; its printed line shown in Chinese on the Chinese page
    assert cell.startswith(solution) and "exercises.check_latent_decode_step(" in cell
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(cell, str(PAGE), "exec"), {})
    assert printed.getvalue().startswith("The solution above passes")


def test_the_appendix_lists_the_checker():
    page = (ROOT / "book" / "appendix" / "exercises.md").read_text(encoding="utf-8")
    assert "| `check_latent_decode_step(fn" in page and "../part4/latent_attention" in page
