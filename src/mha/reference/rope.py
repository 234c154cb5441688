"""Rotary position embedding (RoPE, Su et al. 2021): rotate q and k by angles proportional to their positions, so
that their dot product depends only on the *relative* position.

RoPE pairs the ``d`` coordinates of a vector (d even) into ``d/2`` planes and turns pair ``i`` of the vector at
absolute position ``m`` by the angle ``m theta_i``, with the frequencies::

    theta_i = base^(-2i/d),   i = 0 .. d/2 - 1

(base = 10000 by default: pair 0 turns once every 2 pi = 6.3 positions, the last pair about once every 2 pi base)

and each pair ``(a, b) -> (a cos(m theta_i) - b sin(m theta_i), a sin(m theta_i) + b cos(m theta_i))``: in complex
numbers, ``a + ib`` times ``e^{i m theta_i}``. Two ways of choosing the pairs are in use, and a checkpoint only works
with its own:

* ``style="half"``: pair ``(x[i], x[i + d/2])``, the "rotate-half" form of Hugging Face's Llama, Qwen, Gemma,
  Mistral (``x cos + rotate_half(x) sin`` with ``rotate_half(x) = (-x[d/2:], x[:d/2])``);
* ``style="interleaved"``: pair ``(x[2i], x[2i+1])``, Meta's original Llama (``torch.view_as_complex``), GPT-J and
  DeepSeek's rotary part. The two differ by a fixed permutation of the coordinates (of the columns of W_q and W_k).

Why relative: the rotation ``R(phi)`` of a plane is orthogonal with ``R(a)^T R(b) = R(b - a)``, so for a query at
position m and a key at position n, pair by pair ``<R(m theta) q, R(n theta) k> = <q, R((n - m) theta) k>``: the
score sees ``n - m`` only. Positions are absolute token indices (integers >= 0); with a KV cache the new queries sit
at ``cached + i``.

Book: part IV, 'Rotary position embeddings (RoPE)'.
"""

from __future__ import annotations

import numpy as np

from mha._checks import check_int
from mha.reference.checks import _as_float_array, _check_nonempty, _check_positions, _check_rope_args


def rope_frequencies(d, base=10000.0):
    """``theta_i = base^(-2i/d)`` for ``i = 0 .. d/2 - 1``: the ``(d/2,)`` angular frequencies (radians per position)
    of RoPE on vectors of size ``d`` (an even integer >= 2). ``base`` is a finite real number > 0.

    Book: part IV, 'Rotary position embeddings (RoPE)'.
    """
    d = check_int("d", d)
    if d % 2:
        raise ValueError(f"d must be even (RoPE rotates pairs of coordinates), got {d}")
    base, _ = _check_rope_args(base, "half")
    return base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (d/2,): exponents -2i/d


def _check_rope_call(x_name, x, positions, base, style):
    """The checks of ``rope`` and ``rope_backward``: x (..., L, d) finite, d even, positions fitting (..., L)."""
    base, style = _check_rope_args(base, style)
    x = _as_float_array(x_name, x)
    if x.ndim < 2:
        raise ValueError(f"{x_name} must have at least 2 axes (..., L, d), got shape {x.shape}")
    _check_nonempty(x_name, x)
    if x.shape[-1] % 2:
        raise ValueError(f"{x_name}'s last axis d must be even (RoPE rotates pairs of coordinates), got shape "
                         f"{x.shape}")
    positions = _check_positions("positions", positions, x.shape[:-1], "(x's leading axes, L)")
    return x, positions, base, style


def _rotate(x, positions, base, style, inverse=False, rope_dim=None):
    """Turn each pair of coordinates of ``x`` (..., L, d) by ``+-positions * theta_i``. No checks.

    ``rope_dim`` (even, <= d; None = d): partial RoPE, as Hugging Face's ``apply_rotary_pos_emb`` when its cos/sin
    are narrower than the head (Qwen3-Next's ``partial_rotary_factor``, GLM, Phi): RoPE of size rope_dim on the
    first rope_dim coordinates (pairs and frequencies ``base^(-2i/rope_dim)`` of a vector of that size), the other
    d - rope_dim coordinates passed through unchanged."""
    if rope_dim is not None and rope_dim < x.shape[-1]:
        turned = _rotate(x[..., :rope_dim], positions, base, style, inverse)
        return np.concatenate([turned, x[..., rope_dim:]], axis=-1)  # (..., L, d)
    d = x.shape[-1]
    theta = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (d/2,), as rope_frequencies
    angles = positions[..., None] * theta  # (..., L, d/2)
    cos, sin = np.cos(angles), np.sin(angles)
    if inverse:
        sin = -sin  # R(-phi) = R(phi)^T
    if style == "half":
        a, b = x[..., : d // 2], x[..., d // 2 :]  # pair i = (x[i], x[i + d/2])
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)  # (..., L, d)
    a, b = x[..., 0::2], x[..., 1::2]  # pair i = (x[2i], x[2i+1])
    return np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)  # re-interleaved


def rope(x, positions, base=10000.0, style="half"):
    """RoPE: rotate the last axis of ``x`` ``(..., L, d)`` (d even) at the integer ``positions``.

    ``positions`` has shape ``(L,)`` (every leading index at the same positions) or any shape broadcastable to
    ``x.shape[:-1]`` whose last axis is L, e.g. ``(N, 1, L)`` for ``(N, h, L, d)`` heads; integers >= 0. Pair i of the
    vector at position m turns by ``m theta_i``, ``theta_i = base^(-2i/d)``::

        (a, b) -> (a cos(m theta_i) - b sin(m theta_i),  a sin(m theta_i) + b cos(m theta_i))

    with the pairs ``(x[i], x[i + d/2])`` for ``style="half"`` (Hugging Face's Llama, Qwen, Gemma, Mistral) and
    ``(x[2i], x[2i+1])`` for ``style="interleaved"`` (Meta's original Llama, GPT-J, DeepSeek's rotary part). So for a
    row vector x, ``rope(x, [m], style="interleaved")`` is ``x R_m^T`` with R_m the block-diagonal matrix of 2 x 2
    rotations on adjacent coordinates, while the default ``style="half"`` gives ``x (S^T R_m S)^T``, S the
    permutation matrix that lists the coordinates as (0, 2, 4, ..., 1, 3, 5, ...): the same rotation, the coordinates
    in another order. Returns a new float64 array of x's shape. Applied to q and k (never v), after any QK-norm;
    then a query at position m and a key at position n meet with ``q R((n - m) theta) k``, a function of n - m only
    (see the module docstring).

    TypeError/ValueError before any computation: x not a real finite array of >= 2 axes or with an odd last axis,
    positions not integers, negative, of the wrong length or not broadcastable, base not a finite number > 0, style
    not one of "half", "interleaved".

    Book: part IV, 'Rotary position embeddings (RoPE)'.
    """
    x, positions, base, style = _check_rope_call("x", x, positions, base, style)
    return _rotate(x, positions, base, style)


def rope_backward(grad, positions, base=10000.0, style="half"):
    """Backward of :func:`rope`: ``dL/dx`` from ``grad = dL/dy``, same shapes and arguments.

    RoPE is linear, ``y = R x`` with R block-diagonal: a 2 x 2 rotation ``[[cos phi, -sin phi], [sin phi, cos phi]]``
    per pair, ``phi = m theta_i``. So ``dL/dx = R^T dL/dy``, and the transpose of a rotation is its inverse, the
    rotation by ``-phi``: the backward pass is RoPE with every angle negated (cos unchanged, sin flipped). It needs
    no saved activation, only the positions. ``rope_backward(rope(x, p), p) == x`` up to rounding.

    Book: part IV, 'Rotary position embeddings (RoPE)'.
    """
    grad, positions, base, style = _check_rope_call("grad", grad, positions, base, style)
    return _rotate(grad, positions, base, style, inverse=True)
