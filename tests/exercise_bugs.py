"""Implementations a reader might write, for tests/test_exercises.py: correct ones and a catalogue of buggy ones.

Everything here is written independently of ``mha.exercises`` (and, except where a name says "reference", of
``mha.reference``): loops over rows, torch versions, and the classic bugs written the way a reader writes them.
Each buggy implementation is a whole function with its mistake written out in plain code where it happens (a
forgotten scale, a ``-1e9``, a ``np.tile``); the parts it gets right call the reader's own correct building blocks
(``_np_softmax_rows``, ``_np_attention``, ``_np_heads``, or a correct implementation below). None is generated from
a table of switches: the package's bug simulators (``mha.exercises.simulators``) compute what each bug returns from
knobs, and the catalogue must not share that structure, or the two could not disagree.

``CORRECT``: checker name -> list of (label, fn, checker kwargs); every checker must accept every one.
``BUGGY``: list of ``Bug(label, checker, fn, expected diagnosis, checker kwargs)``; the checker must reject each with
exactly that diagnosis (``ExerciseError.bug``).
"""

from __future__ import annotations

import cmath
import functools
import itertools
import math
from typing import Callable, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from mha import reference as R


# ---------------------------------------------------------------------------------------------------------------
# Small shared pieces (correct).
# ---------------------------------------------------------------------------------------------------------------


def _np(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


def _tt(x):
    """A float64 (or bool) tensor from whatever the checker passed."""
    if isinstance(x, torch.Tensor):
        return x
    x = np.asarray(x)
    return torch.from_numpy(np.ascontiguousarray(x))


def _loop_softmax_row(row):
    """Softmax of a 1-D sequence of (finite or -inf) scores, in plain Python; all -inf -> zeros."""
    finite = [s for s in row if s != -math.inf]
    if not finite:
        return [0.0] * len(row)
    top = max(finite)
    e = [0.0 if s == -math.inf else math.exp(s - top) for s in row]
    total = sum(e)
    return [x / total for x in e]


def _torch_masked_softmax(scores, mask):
    """torch softmax over the last dim; masked entries 0, rows with no allowed key 0 (no NaN, differentiable)."""
    if mask is None:
        return torch.softmax(scores, dim=-1)
    mask = torch.broadcast_to(mask, scores.shape)
    has_key = mask.any(dim=-1, keepdim=True)
    allowed = mask | ~has_key  # empty rows: attend everywhere, then zeroed
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return weights * has_key


def _bottom_right(l_q, l_kv):
    return np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q)


def _np_softmax_rows(scores, mask=None):
    """The reader's masked softmax over the last axis: -inf where masked, the row maximum subtracted, empty rows 0."""
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def _np_attention(q, k, v, mask=None, scale=None):
    """The reader's scaled dot-product attention in NumPy: (out, weights)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    weights = _np_softmax_rows(scale * (q @ np.swapaxes(k, -1, -2)), mask)
    return weights @ v, weights


def _np_heads(y, n_heads):
    """The reader's split into heads: (N, L, n_heads*head_dim) -> (N, n_heads, L, head_dim)."""
    N, L, width = y.shape
    return y.reshape(N, L, n_heads, width // n_heads).transpose(0, 2, 1, 3)


# ---------------------------------------------------------------------------------------------------------------
# Correct implementations.
# ---------------------------------------------------------------------------------------------------------------


def softmax_loop(x, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    moved = np.moveaxis(x, axis, -1)  # (..., n)
    out = np.empty_like(moved)
    for index in np.ndindex(moved.shape[:-1]):
        out[index] = _loop_softmax_row(list(moved[index]))
    return np.moveaxis(out, -1, axis)


def softmax_torch(x, axis=-1):
    return torch.softmax(_tt(x), dim=axis)


def softmax_logsumexp(x, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    top = np.max(x, axis=axis, keepdims=True)
    lse = top + np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True))
    return np.exp(x - lse)


def sdpa_loop(q, k, v, mask=None, scale=None):
    q, k, v = _np(q), _np(k), _np(v)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n_q, n_k, d_k = q.shape[-2], k.shape[-2], q.shape[-1]
    c = 1 / math.sqrt(d_k) if scale is None else scale
    m = np.ones(batch + (n_q, n_k), dtype=bool) if mask is None else np.broadcast_to(_np(mask).astype(bool),
                                                                                    batch + (n_q, n_k))
    qb, kb, vb = (np.broadcast_to(a, batch + a.shape[-2:]) for a in (q, k, v))
    out, weights = np.zeros(batch + (n_q, v.shape[-1])), np.zeros(batch + (n_q, n_k))
    for b in np.ndindex(batch):
        for i in range(n_q):
            row = [c * float(qb[b][i] @ kb[b][j]) if m[b][i, j] else -math.inf for j in range(n_k)]
            weights[b][i] = _loop_softmax_row(row)
            out[b][i] = sum(weights[b][i, j] * vb[b][j] for j in range(n_k))
    return out, weights


def sdpa_torch(q, k, v, mask=None, scale=None):
    q, k, v = _tt(q), _tt(k), _tt(v)
    c = q.shape[-1] ** -0.5 if scale is None else scale
    weights = _torch_masked_softmax(c * q @ k.transpose(-2, -1), None if mask is None else _tt(mask))
    return weights @ v, weights


def split_heads_loop(y, n_heads):
    y = _np(y)
    N, L, width = y.shape
    head_dim = width // n_heads
    out = np.empty((N, n_heads, L, head_dim))
    for n, i, l in itertools.product(range(N), range(n_heads), range(L)):
        out[n, i, l] = y[n, l, i * head_dim:(i + 1) * head_dim]
    return out


def split_heads_torch(y, n_heads):
    y = _tt(y)
    return y.unflatten(-1, (n_heads, -1)).transpose(1, 2)  # (N, L, h, hd) -> (N, h, L, hd)


def split_heads_stack(y, n_heads):
    return np.stack(np.split(np.asarray(y), n_heads, axis=-1), axis=1)  # h blocks of (N, L, hd) -> (N, h, L, hd)


def merge_heads_loop(y):
    y = _np(y)
    N, h, L, hd = y.shape
    out = np.empty((N, L, h * hd))
    for n, i, l in itertools.product(range(N), range(h), range(L)):
        out[n, l, i * hd:(i + 1) * hd] = y[n, i, l]
    return out


def merge_heads_torch(y):
    y = _tt(y)
    return torch.cat([y[:, i] for i in range(y.shape[1])], dim=-1)  # h x (N, L, hd) -> (N, L, h*hd)


def mha_loop(x_q, x_kv, params, n_heads, mask=None):
    """The literal per-head definition: a loop over heads with each head's column blocks."""
    x_q, x_kv = _np(x_q), _np(x_kv)
    p = {key: _np(value) for key, value in params.items()}
    N, L_q, _ = x_q.shape
    hd = p["W_q"].shape[1] // n_heads
    g = p["W_k"].shape[1] // hd
    L_kv = x_kv.shape[1]
    m = None if mask is None else np.broadcast_to(_np(mask).astype(bool), (N, n_heads, L_q, L_kv))
    heads, weights = [], np.zeros((N, n_heads, L_q, L_kv))
    for i in range(n_heads):
        c = i // (n_heads // g)
        cols_q, cols_kv = slice(i * hd, (i + 1) * hd), slice(c * hd, (c + 1) * hd)
        q = x_q @ p["W_q"][:, cols_q] + p.get("b_q", np.zeros(n_heads * hd))[cols_q]
        k = x_kv @ p["W_k"][:, cols_kv] + p.get("b_k", np.zeros(g * hd))[cols_kv]
        v = x_kv @ p["W_v"][:, cols_kv] + p.get("b_v", np.zeros(g * hd))[cols_kv]
        head, weights[:, i] = sdpa_torch(q, k, v, None if m is None else torch.from_numpy(m[:, i].copy()))
        heads.append(_np(head))
    out = np.concatenate(heads, axis=-1) @ p["W_o"] + p.get("b_o", 0.0)
    return out, weights


def mha_torch(x_q, x_kv, params, n_heads, mask=None):
    x_q, x_kv = _tt(x_q), _tt(x_kv)
    p = {key: _tt(value) for key, value in params.items()}
    N, L_q, _ = x_q.shape
    L_kv = x_kv.shape[1]
    hd = p["W_q"].shape[1] // n_heads
    g = p["W_k"].shape[1] // hd

    def heads(x, w, b, n):
        y = x @ p[w] + p[b] if b in p else x @ p[w]  # (N, L, n*hd)
        return y.reshape(x.shape[0], x.shape[1], n, hd).permute(0, 2, 1, 3)  # (N, n, L, hd)

    q = heads(x_q, "W_q", "b_q", n_heads)
    k = heads(x_kv, "W_k", "b_k", g).repeat_interleave(n_heads // g, dim=1)  # (N, h, L_kv, hd)
    v = heads(x_kv, "W_v", "b_v", g).repeat_interleave(n_heads // g, dim=1)
    weights = _torch_masked_softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), None if mask is None else _tt(mask))
    concat = (weights @ v).permute(0, 2, 1, 3).reshape(N, L_q, n_heads * hd)  # (N, L_q, h*hd)
    out = concat @ p["W_o"] + (p["b_o"] if "b_o" in p else 0.0)
    return out, weights


def causal_np(l_q, l_kv):
    return _bottom_right(l_q, l_kv)


def causal_loop(l_q, l_kv):
    offset = l_kv - l_q
    return np.array([[j <= offset + i for j in range(l_kv)] for i in range(l_q)], dtype=bool)


def causal_torch(l_q, l_kv):
    return torch.ones(l_q, l_kv, dtype=torch.bool).tril(diagonal=l_kv - l_q)


def repeat_kv_loop(y, n_rep):
    y = _np(y)
    return np.stack([y[:, j // n_rep] for j in range(y.shape[1] * n_rep)], axis=1)


def repeat_kv_torch(y, n_rep):
    return _tt(y).repeat_interleave(n_rep, dim=1)


def repeat_kv_expand(y, n_rep):
    y = np.asarray(y)
    N, g, L, d = y.shape
    return np.broadcast_to(y[:, :, None], (N, g, n_rep, L, d)).reshape(N, g * n_rep, L, d)  # group-major


def decode_np(q, k_new, v_new, k_cache, v_cache):
    k_all = np.concatenate([k_cache, k_new], axis=2)  # (N, g, c+T, hd)
    v_all = np.concatenate([v_cache, v_new], axis=2)
    n_rep = q.shape[1] // k_all.shape[1]
    out, _ = sdpa_torch(q, np.repeat(k_all, n_rep, 1), np.repeat(v_all, n_rep, 1),
                        torch.from_numpy(_bottom_right(q.shape[2], k_all.shape[2])))
    return out, k_all, v_all


def decode_torch(q, k_new, v_new, k_cache, v_cache):
    q, k_new, v_new, k_cache, v_cache = (_tt(a) for a in (q, k_new, v_new, k_cache, v_cache))
    k_all, v_all = torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)
    T, L = q.shape[2], k_all.shape[2]
    mask = torch.ones(T, L, dtype=torch.bool).tril(diagonal=L - T)
    out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=True)
    return out, k_all, v_all


def decode_loop(q, k_new, v_new, k_cache, v_cache):
    """Per head and per new query, plain NumPy: query t (absolute position c + t) reads keys 0..c+t."""
    k_all = np.concatenate([k_cache, k_new], axis=2)
    v_all = np.concatenate([v_cache, v_new], axis=2)
    N, h, T, hd = q.shape
    g, c = k_all.shape[1], k_cache.shape[2]
    out = np.zeros((N, h, T, hd))
    for n, j, t in itertools.product(range(N), range(h), range(T)):
        kv = j // (h // g)
        keys, values = k_all[n, kv, :c + t + 1], v_all[n, kv, :c + t + 1]
        w = _loop_softmax_row(list(keys @ q[n, j, t] / math.sqrt(hd)))
        out[n, j, t] = np.asarray(w) @ values
    return out, k_all, v_all


def online_loop(q, k, v, block_size, mask=None, scale=None):
    """One query row at a time, Python floats for the running max and sum."""
    q, k, v = _np(q), _np(k), _np(v)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n_q, n_k = q.shape[-2], k.shape[-2]
    c = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    m = np.ones(batch + (n_q, n_k), dtype=bool) if mask is None else np.broadcast_to(mask, batch + (n_q, n_k))
    qb, kb, vb = (np.broadcast_to(a, batch + a.shape[-2:]) for a in (q, k, v))
    out = np.zeros(batch + (n_q, v.shape[-1]))
    for b in np.ndindex(batch):
        for i in range(n_q):
            run_max, run_sum, acc = -math.inf, 0.0, np.zeros(v.shape[-1])
            for start in range(0, n_k, block_size):
                block = [j for j in range(start, min(start + block_size, n_k)) if m[b][i, j]]
                if not block:
                    continue
                scores = [c * float(qb[b][i] @ kb[b][j]) for j in block]
                new_max = max(run_max, max(scores))
                alpha = math.exp(run_max - new_max) if run_max > -math.inf else 0.0
                weights = [math.exp(s - new_max) for s in scores]
                run_sum = alpha * run_sum + sum(weights)
                acc = alpha * acc + sum(w * vb[b][j] for w, j in zip(weights, block))
                run_max = new_max
            out[b][i] = acc / run_sum if run_sum > 0 else 0.0
    return out


def online_torch(q, k, v, block_size, mask=None, scale=None):
    q, k, v = _tt(q), _tt(k), _tt(v)
    c = q.shape[-1] ** -0.5 if scale is None else scale
    n_q, n_k = q.shape[-2], k.shape[-2]
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    m = None if mask is None else torch.broadcast_to(_tt(mask), batch + (n_q, n_k))
    run_max = torch.full(batch + (n_q, 1), float("-inf"), dtype=q.dtype)
    run_sum = torch.zeros(batch + (n_q, 1), dtype=q.dtype)
    acc = torch.zeros(batch + (n_q, v.shape[-1]), dtype=q.dtype)
    for start in range(0, n_k, block_size):
        s = c * q @ k[..., start:start + block_size, :].transpose(-1, -2)
        if m is not None:
            s = s.masked_fill(~m[..., start:start + block_size], float("-inf"))
        new_max = torch.maximum(run_max, s.amax(dim=-1, keepdim=True))
        safe = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
        p = torch.exp(s - safe)
        alpha = torch.exp(run_max - safe)
        run_sum = alpha * run_sum + p.sum(dim=-1, keepdim=True)
        acc = alpha * acc + p @ v[..., start:start + block_size, :]
        run_max = new_max
    return torch.where(run_sum > 0, acc / run_sum.clamp_min(1e-300), torch.zeros_like(acc))


def softmax_backward_jacobian(weights, grad_weights):
    """Build each row's Jacobian diag(a) - a a^T and multiply (it is symmetric)."""
    A, dA = _np(weights), _np(grad_weights)
    out = np.empty_like(A)
    for index in np.ndindex(A.shape[:-1]):
        a = A[index]
        out[index] = (np.diag(a) - np.outer(a, a)) @ dA[index]
    return out


def softmax_backward_torch(weights, grad_weights):
    A, dA = _tt(weights), _tt(grad_weights)
    J = torch.diag_embed(A) - A.unsqueeze(-1) * A.unsqueeze(-2)  # (..., n, n)
    return (J @ dA.unsqueeze(-1)).squeeze(-1)


def sdpa_grad_autograd(q, k, v, grad_out, mask=None, scale=None):
    q, k, v = (_tt(a).clone().requires_grad_(True) for a in (q, k, v))
    out, _ = sdpa_torch(q, k, v, mask, scale)
    (out * _tt(grad_out)).sum().backward()
    return q.grad, k.grad, v.grad


def sdpa_grad_rows(q, k, v, grad_out, mask=None, scale=None):
    """Row by row: each query row contributes to dV and dK, and owns its dQ row."""
    q, k, v, dO = _np(q), _np(k), _np(v), _np(grad_out)
    c = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    m = np.ones(q.shape[:-1] + (k.shape[-2],), dtype=bool) if mask is None else np.broadcast_to(
        mask, q.shape[:-1] + (k.shape[-2],))
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in np.ndindex(q.shape[:-2]):
        for i in range(q.shape[-2]):
            scores = [c * float(q[b][i] @ k[b][j]) if m[b][i, j] else -math.inf for j in range(k.shape[-2])]
            a = np.asarray(_loop_softmax_row(scores))
            dv[b] += np.outer(a, dO[b][i])
            da = v[b] @ dO[b][i]
            ds = a * (da - a @ da)
            dq[b][i] = c * ds @ k[b]
            dk[b] += c * np.outer(ds, q[b][i])
    return dq, dk, dv


# --- part IV: RoPE, a decode step with RoPE, the sliding-window mask, sinks, RMSNorm ------------------------------


def _rope_loop(x, positions, base, partner):
    """Pair by pair in complex numbers: (x[a] + i x[b]) e^{i m theta_i}, partner(i, d) = (a, b)."""
    x = _np(x)
    pos = np.broadcast_to(_np(positions), x.shape[:-1])
    d = x.shape[-1]
    out = np.empty_like(x)
    for index in np.ndindex(x.shape[:-1]):
        m = int(pos[index])
        for i in range(d // 2):
            a, b = partner(i, d)
            z = complex(x[index][a], x[index][b]) * cmath.exp(1j * m * base ** (-2 * i / d))
            out[index][a], out[index][b] = z.real, z.imag
    return out


def rope_loop(x, positions, base=10000.0):
    """Rotate-half pairs (x[i], x[i + d/2]), one complex multiplication per pair."""
    return _rope_loop(x, positions, base, lambda i, d: (i, i + d // 2))


def rope_loop_interleaved(x, positions, base=10000.0):
    """Adjacent pairs (x[2i], x[2i+1]), one complex multiplication per pair."""
    return _rope_loop(x, positions, base, lambda i, d: (2 * i, 2 * i + 1))


def rope_torch(x, positions, base=10000.0):
    """Hugging Face's form: x * cos + rotate_half(x) * sin, the angles [m theta, m theta] concatenated."""
    x, pos = _tt(x), _tt(positions)
    d = x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    freqs = pos.to(torch.float64)[..., None] * inv_freq  # (..., L, d/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (..., L, d), angles in float64, cos and sin in x's dtype
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * emb.cos().to(x.dtype) + torch.cat([-x2, x1], dim=-1) * emb.sin().to(x.dtype)


def rope_torch_complex(x, positions, base=10000.0):
    """Meta's original form: adjacent pairs viewed as complex numbers, times e^{i m theta}."""
    x, pos = _tt(x), _tt(positions)
    d = x.shape[-1]
    freqs = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = pos.to(torch.float64)[..., None] * freqs  # (..., L, d/2)
    rotation = torch.polar(torch.ones_like(angles), angles)  # e^{i m theta}
    xc = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(xc * rotation).flatten(-2).to(x.dtype)  # (..., L, d)


def rope_decode_reference(q, k_new, v_new, k_cache, v_cache):
    """The reference's RoPE at positions c .. c+T-1, then its attention over the caches (causal, bottom-right)."""
    positions = k_cache.shape[2] + np.arange(q.shape[2])
    k_all = np.concatenate([k_cache, R.rope(k_new, positions)], axis=2)  # the cache stores rotated keys
    v_all = np.concatenate([v_cache, v_new], axis=2)
    n_rep = q.shape[1] // k_all.shape[1]
    out, _ = R.scaled_dot_product_attention(R.rope(q, positions), R.repeat_kv(k_all, n_rep), R.repeat_kv(v_all, n_rep),
                                            mask=R.causal_mask(q.shape[2], k_all.shape[2]))
    return out, k_all, v_all


def rope_decode_torch(q, k_new, v_new, k_cache, v_cache):
    q, k_new, v_new, k_cache, v_cache = (_tt(a) for a in (q, k_new, v_new, k_cache, v_cache))
    c, T = k_cache.shape[2], q.shape[2]
    positions = torch.arange(c, c + T)
    return decode_torch(rope_torch(q, positions), rope_torch(k_new, positions), v_new, k_cache, v_cache)


def rope_decode_loop(q, k_new, v_new, k_cache, v_cache):
    positions = k_cache.shape[2] + np.arange(q.shape[2])
    return decode_loop(rope_loop(q, positions), rope_loop(k_new, positions), v_new, k_cache, v_cache)


def rope_decode_torch_interleaved(q, k_new, v_new, k_cache, v_cache):
    q, k_new, v_new, k_cache, v_cache = (_tt(a) for a in (q, k_new, v_new, k_cache, v_cache))
    positions = torch.arange(k_cache.shape[2], k_cache.shape[2] + q.shape[2])
    q, k_new = rope_torch_complex(q, positions), rope_torch_complex(k_new, positions)
    return decode_torch(q, k_new, v_new, k_cache, v_cache)


def window_loop(l_q, l_kv, window):
    offset = l_kv - l_q  # query i sits at position offset + i
    return np.array([[offset + i - window < j <= offset + i for j in range(l_kv)] for i in range(l_q)], dtype=bool)


def window_torch(l_q, l_kv, window):
    ones = torch.ones(l_q, l_kv, dtype=torch.bool)
    return ones.tril(diagonal=l_kv - l_q) & ~ones.tril(diagonal=l_kv - l_q - window)


def window_distance(l_q, l_kv, window):
    distance = (l_kv - l_q + np.arange(l_q))[:, None] - np.arange(l_kv)[None, :]  # p - j
    return (distance >= 0) & (distance < window)


def sink_reference(q, k, v, sinks, mask=None, scale=None):
    return R.scaled_dot_product_attention(q, k, v, mask, scale, sinks=sinks)


def sink_loop(q, k, v, sinks, mask=None, scale=None):
    """Row by row: the row's scores and its head's sink in one Python softmax, the sink's share dropped."""
    q, k, v, sinks = _np(q), _np(k), _np(v), _np(sinks)
    batch = q.shape[:-2]
    n_q, n_k = q.shape[-2], k.shape[-2]
    c = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    m = np.ones(batch + (n_q, n_k), dtype=bool) if mask is None else np.broadcast_to(_np(mask).astype(bool),
                                                                                    batch + (n_q, n_k))
    out, weights = np.zeros(batch + (n_q, v.shape[-1])), np.zeros(batch + (n_q, n_k))
    for b in np.ndindex(batch):
        head = b[-1]
        for i in range(n_q):
            row = [c * float(q[b][i] @ k[b][j]) if m[b][i, j] else -math.inf for j in range(n_k)]
            probs = _loop_softmax_row(row + [float(sinks[head])])
            weights[b][i] = probs[:-1]
            out[b][i] = sum(probs[j] * v[b][j] for j in range(n_k))
    return out, weights


def sink_torch(q, k, v, sinks, mask=None, scale=None):
    """gpt-oss's form: the sink as one more column of the scores, softmax, the column dropped."""
    q, k, v, sinks = _tt(q), _tt(k), _tt(v), _tt(sinks)
    c = q.shape[-1] ** -0.5 if scale is None else scale
    scores = c * q @ k.transpose(-2, -1)  # (..., h, L_q, L_kv)
    if mask is not None:
        scores = scores.masked_fill(~_tt(mask), float("-inf"))
    column = sinks.reshape(-1, 1, 1).expand(*scores.shape[:-1], 1)  # (..., h, L_q, 1)
    probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)
    weights = probs[..., :-1]
    return weights @ v, weights


def sink_logsumexp(q, k, v, sinks, mask=None, scale=None):
    """NumPy: log Z over the allowed scores and the sink (np.logaddexp), then weights = exp(S - log Z)."""
    c = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = c * (q @ np.swapaxes(k, -1, -2))
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):  # a row with no allowed key: log 0 = -inf, and log Z is the sink's
        log_z = np.logaddexp(top + np.log(np.exp(scores - top).sum(axis=-1, keepdims=True)), sinks[..., None, None])
    weights = np.exp(scores - log_z)
    return weights @ v, weights


def rms_norm_loop(x, weight, eps=1e-6):
    x, weight = _np(x), _np(weight)
    out = np.empty_like(x)
    for index in np.ndindex(x.shape[:-1]):
        row = list(x[index])
        root = math.sqrt(sum(a * a for a in row) / len(row) + eps)
        out[index] = [a / root * w for a, w in zip(row, weight)]
    return out


def rms_norm_torch(x, weight, eps=1e-6):
    x, weight = _tt(x), _tt(weight)
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rms_norm_functional(x, weight, eps=1e-6):
    x, weight = _tt(x), _tt(weight)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


CORRECT: dict[str, list[tuple[str, Callable, dict]]] = {
    "check_softmax": [("reference", R.softmax, {}), ("loop", softmax_loop, {}), ("torch", softmax_torch, {}),
                      ("logsumexp", softmax_logsumexp, {})],
    "check_scaled_dot_product_attention": [("reference", R.scaled_dot_product_attention, {}), ("loop", sdpa_loop, {}),
                                           ("torch", sdpa_torch, {})],
    "check_split_heads": [("reference", R.split_heads, {}), ("loop", split_heads_loop, {}),
                          ("torch", split_heads_torch, {}), ("stack", split_heads_stack, {})],
    "check_merge_heads": [("reference", R.merge_heads, {}), ("loop", merge_heads_loop, {}),
                          ("torch", merge_heads_torch, {})],
    "check_multi_head_attention": [("reference", R.multi_head_attention, {"gqa": True}),
                                   ("reference per head", R.multi_head_attention_per_head, {"gqa": True}),
                                   ("loop", mha_loop, {"gqa": True}), ("torch", mha_torch, {"gqa": True}),
                                   ("torch, MHA cases only", mha_torch, {})],
    "check_causal_mask": [("numpy", causal_np, {}), ("loop", causal_loop, {}), ("torch", causal_torch, {})],
    "check_repeat_kv": [("reference", R.repeat_kv, {}), ("loop", repeat_kv_loop, {}), ("torch", repeat_kv_torch, {}),
                        ("expand", repeat_kv_expand, {})],
    "check_decode_step": [("numpy", decode_np, {}), ("torch sdpa", decode_torch, {}), ("loop", decode_loop, {})],
    "check_online_softmax_attention": [("reference", R.online_softmax_attention, {}), ("loop", online_loop, {}),
                                       ("torch", online_torch, {})],
    "check_softmax_backward": [("reference", R.softmax_backward, {}), ("jacobian", softmax_backward_jacobian, {}),
                               ("torch jacobian", softmax_backward_torch, {})],
    "check_scaled_dot_product_attention_grad": [("reference", R.scaled_dot_product_attention_grad, {}),
                                                ("autograd", sdpa_grad_autograd, {}), ("rows", sdpa_grad_rows, {})],
    "check_rope": [("reference", R.rope, {}), ("loop", rope_loop, {}), ("torch rotate_half", rope_torch, {}),
                   ("reference, interleaved", functools.partial(R.rope, style="interleaved"), {"style": "interleaved"}),
                   ("loop, interleaved", rope_loop_interleaved, {"style": "interleaved"}),
                   ("torch complex, interleaved", rope_torch_complex, {"style": "interleaved"})],
    "check_rope_decode_step": [("reference (rope, attention)", rope_decode_reference, {}),
                               ("torch sdpa", rope_decode_torch, {}), ("loop", rope_decode_loop, {}),
                               ("torch complex, interleaved", rope_decode_torch_interleaved, {"style": "interleaved"})],
    "check_sliding_window_mask": [("reference", R.sliding_window_mask, {}), ("loop", window_loop, {}),
                                  ("torch", window_torch, {}), ("distance", window_distance, {})],
    "check_sink_attention": [("reference (scaled_dot_product_attention, sinks=)", sink_reference, {}),
                             ("loop", sink_loop, {}), ("torch, gpt-oss style", sink_torch, {}),
                             ("logsumexp", sink_logsumexp, {})],
    "check_rms_norm": [("reference", R.rms_norm, {}), ("loop", rms_norm_loop, {}), ("torch", rms_norm_torch, {}),
                       ("torch F.rms_norm", rms_norm_functional, {})],
}


# ---------------------------------------------------------------------------------------------------------------
# The catalogue of buggy implementations, each with the diagnosis it must get.
# ---------------------------------------------------------------------------------------------------------------


class Bug(NamedTuple):
    label: str
    checker: str
    fn: Callable
    diagnosis: str  # the expected ExerciseError.bug
    kwargs: dict = {}


BUGGY: list[Bug] = []


def bug(checker, diagnosis, **kwargs):
    def register(fn):
        BUGGY.append(Bug(fn.__name__, checker, fn, diagnosis, kwargs))
        return fn
    return register


# --- softmax -----------------------------------------------------------------------------------------------------

@bug("check_softmax", "no_max_subtraction")
def softmax_naive(x, axis=-1):
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


@bug("check_softmax", "no_max_subtraction")
def softmax_naive_torch(x, axis=-1):
    e = torch.exp(torch.as_tensor(x))
    return e / e.sum(dim=axis, keepdim=True)


@bug("check_softmax", "shift_not_row_max")
def softmax_global_max(x, axis=-1):
    e = np.exp(x - np.max(x))
    return e / e.sum(axis=axis, keepdims=True)


@bug("check_softmax", "softmax_wrong_axis")
def softmax_last_axis_only(x, axis=-1):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@bug("check_softmax", "sum_without_keepdims")
def softmax_no_keepdims(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis)


@bug("check_softmax", "modifies_input")
def softmax_in_place(x, axis=-1):
    x -= x.max(axis=axis, keepdims=True)
    np.exp(x, out=x)
    return x / x.sum(axis=axis, keepdims=True)


# --- scaled dot-product attention ------------------------------------------------------------------------------
# Each function is a whole attention with one mistake written out; the parts it gets right call the reader's
# softmax (_np_softmax_rows).

@bug("check_scaled_dot_product_attention", "no_scale")
def sdpa_unscaled(q, k, v, mask=None, scale=None):
    scores = q @ np.swapaxes(k, -1, -2)  # the scale is forgotten
    weights = _np_softmax_rows(scores, mask)
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "scale_d_k_not_sqrt")
def sdpa_divide_by_d_k(q, k, v, mask=None, scale=None):
    if scale is None:
        scale = 1 / q.shape[-1]  # 1/d_k, not 1/sqrt(d_k)
    weights = _np_softmax_rows(scale * (q @ np.swapaxes(k, -1, -2)), mask)
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "scale_inverted")
def sdpa_multiply_by_sqrt(q, k, v, mask=None, scale=None):
    if scale is None:
        scale = math.sqrt(q.shape[-1])  # multiplies by sqrt(d_k)
    weights = _np_softmax_rows(scale * (q @ np.swapaxes(k, -1, -2)), mask)
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "scale_d_v")
def sdpa_scale_by_d_v(q, k, v, mask=None, scale=None):
    if scale is None:
        scale = v.shape[-1] ** -0.5  # the width of the values
    weights = _np_softmax_rows(scale * (q @ np.swapaxes(k, -1, -2)), mask)
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "scale_seq_len")
def sdpa_scale_by_length(q, k, v, mask=None, scale=None):
    if scale is None:
        scale = k.shape[-2] ** -0.5  # the number of keys
    weights = _np_softmax_rows(scale * (q @ np.swapaxes(k, -1, -2)), mask)
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "scale_ignored")
def sdpa_ignores_scale(q, k, v, mask=None, scale=None):
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])  # `scale` is accepted and never read
    weights = _np_softmax_rows(scores, mask)
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "softmax_over_queries")
def sdpa_softmax_over_queries(q, k, v, mask=None, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = scale * (q @ np.swapaxes(k, -1, -2))
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    top = scores.max(axis=-2, keepdims=True)  # axis -2: over the queries
    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-2, keepdims=True)
    weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "mask_fill_large_negative")
def sdpa_fill_minus_1e9(q, k, v, mask=None, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = scale * (q @ np.swapaxes(k, -1, -2))
    if mask is not None:
        scores = np.where(mask, scores, -1e9)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = e / e.sum(axis=-1, keepdims=True)
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "mask_nan_empty_rows")
def sdpa_fill_minus_inf_unguarded(q, k, v, mask=None, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = scale * (q @ np.swapaxes(k, -1, -2))
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))  # a row of -inf: exp(-inf - (-inf)) = NaN
    weights = e / e.sum(axis=-1, keepdims=True)
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "mask_inverted")
def sdpa_mask_inverted(q, k, v, mask=None, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = scale * (q @ np.swapaxes(k, -1, -2))
    weights = _np_softmax_rows(scores, None if mask is None else ~mask)  # True read as "blocked"
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "no_max_subtraction")
def sdpa_no_max(q, k, v, mask=None, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = scale * (q @ np.swapaxes(k, -1, -2))
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    e = np.exp(scores)  # no row maximum subtracted
    total = e.sum(axis=-1, keepdims=True)
    weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "mask_after_softmax")
def sdpa_mask_after_softmax(q, k, v, mask=None, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    weights = _np_softmax_rows(scale * (q @ np.swapaxes(k, -1, -2)))
    if mask is not None:
        weights = weights * mask  # masked after the softmax: the rows no longer sum to 1
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "mask_fill_zero")
def sdpa_mask_multiplies_scores(q, k, v, mask=None, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = scale * (q @ np.swapaxes(k, -1, -2))
    if mask is not None:
        scores = scores * mask  # a forbidden key gets score 0, not -inf
    weights = _np_softmax_rows(scores)
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "mask_fill_large_negative")
def sdpa_torch_masked_fill_minus_1e9(q, k, v, mask=None, scale=None):
    q, k, v = torch.as_tensor(q), torch.as_tensor(k), torch.as_tensor(v)
    scores = q @ k.transpose(-2, -1) * (q.size(-1) ** -0.5 if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(~torch.as_tensor(mask), -1e9)
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "mask_nan_empty_rows")
def sdpa_torch_masked_fill_minus_inf(q, k, v, mask=None, scale=None):
    q, k, v = torch.as_tensor(q), torch.as_tensor(k), torch.as_tensor(v)
    scores = q @ k.transpose(-2, -1) * (q.size(-1) ** -0.5 if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(~torch.as_tensor(mask), float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "mask_ignored")
def sdpa_ignores_mask(q, k, v, mask=None, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    weights = _np_softmax_rows(scale * (q @ np.swapaxes(k, -1, -2)))  # the mask is accepted and never applied
    return weights @ v, weights


@bug("check_scaled_dot_product_attention", "outputs_swapped")
def sdpa_returns_weights_first(q, k, v, mask=None, scale=None):
    out, weights = _np_attention(q, k, v, mask, scale)
    return weights, out


@bug("check_scaled_dot_product_attention", "outputs_swapped")
def sdpa_torch_returns_weights_first(q, k, v, mask=None, scale=None):
    out, weights = sdpa_torch(q, k, v, mask, scale)
    return weights, out


# --- split and merge heads ---------------------------------------------------------------------------------------

@bug("check_split_heads", "split_no_transpose")
def split_reshape_only(y, n_heads):
    N, L, width = y.shape
    return y.reshape(N, n_heads, L, width // n_heads)


@bug("check_split_heads", "split_strided")
def split_head_dim_outer(y, n_heads):
    N, L, width = y.shape
    return y.reshape(N, L, width // n_heads, n_heads).transpose(0, 3, 1, 2)


@bug("check_split_heads", "split_wrong_axes")
def split_transpose_wrong_axes(y, n_heads):
    N, L, width = y.shape
    return y.reshape(N, L, n_heads, width // n_heads).transpose(0, 2, 3, 1)


@bug("check_merge_heads", "merge_no_transpose")
def merge_reshape_only(y):
    N, h, L, hd = y.shape
    return y.reshape(N, L, h * hd)


@bug("check_merge_heads", "merge_strided")
def merge_head_dim_outer(y):
    N, h, L, hd = y.shape
    return np.transpose(y, (0, 2, 3, 1)).reshape(N, L, h * hd)


@bug("check_merge_heads", "view_non_contiguous")
def merge_torch_view(y):
    N, h, L, hd = y.shape
    return y.transpose(1, 2).view(N, L, h * hd)


# --- multi-head attention ----------------------------------------------------------------------------------------
# A reader's layer from part I (one key/value head per query head: these cases are MHA) with one mistake written out;
# the split into heads and the attention of each head are the reader's own (_np_heads, _np_attention).

@bug("check_multi_head_attention", "scale_d_model")
def mha_scaled_by_d_model(x_q, x_kv, params, n_heads, mask=None):
    """The lecture bug: C ** -0.5 with C the embedding width."""
    N, L_q, d_model = x_q.shape
    q = _np_heads(x_q @ params["W_q"] + params.get("b_q", 0.0), n_heads)
    k = _np_heads(x_kv @ params["W_k"] + params.get("b_k", 0.0), n_heads)
    v = _np_heads(x_kv @ params["W_v"] + params.get("b_v", 0.0), n_heads)
    heads, weights = _np_attention(q, k, v, mask, scale=d_model ** -0.5)  # C ** -0.5, C = d_model
    concat = heads.transpose(0, 2, 1, 3).reshape(N, L_q, -1)
    return concat @ params["W_o"] + params.get("b_o", 0.0), weights


@bug("check_multi_head_attention", "split_merge_no_transpose")
def mha_reshape_without_transpose(x_q, x_kv, params, n_heads, mask=None):
    N, L_q, _ = x_q.shape
    L_kv = x_kv.shape[1]
    head_dim = params["W_q"].shape[1] // n_heads
    q = (x_q @ params["W_q"] + params.get("b_q", 0.0)).reshape(N, n_heads, L_q, head_dim)  # no transpose
    k = (x_kv @ params["W_k"] + params.get("b_k", 0.0)).reshape(N, n_heads, L_kv, head_dim)
    v = (x_kv @ params["W_v"] + params.get("b_v", 0.0)).reshape(N, n_heads, L_kv, head_dim)
    heads, weights = _np_attention(q, k, v, mask)
    concat = heads.reshape(N, L_q, n_heads * head_dim)  # and none back
    return concat @ params["W_o"] + params.get("b_o", 0.0), weights


@bug("check_multi_head_attention", "merge_no_transpose")
def mha_merge_without_transpose(x_q, x_kv, params, n_heads, mask=None):
    N, L_q, _ = x_q.shape
    q = _np_heads(x_q @ params["W_q"] + params.get("b_q", 0.0), n_heads)
    k = _np_heads(x_kv @ params["W_k"] + params.get("b_k", 0.0), n_heads)
    v = _np_heads(x_kv @ params["W_v"] + params.get("b_v", 0.0), n_heads)
    heads, weights = _np_attention(q, k, v, mask)
    concat = heads.reshape(N, L_q, -1)  # (N, h, L_q, head_dim) read as (N, L_q, h*head_dim)
    return concat @ params["W_o"] + params.get("b_o", 0.0), weights


@bug("check_multi_head_attention", "no_output_projection")
def mha_forgets_w_o(x_q, x_kv, params, n_heads, mask=None):
    N, L_q, _ = x_q.shape
    q = _np_heads(x_q @ params["W_q"] + params.get("b_q", 0.0), n_heads)
    k = _np_heads(x_kv @ params["W_k"] + params.get("b_k", 0.0), n_heads)
    v = _np_heads(x_kv @ params["W_v"] + params.get("b_v", 0.0), n_heads)
    heads, weights = _np_attention(q, k, v, mask)
    return heads.transpose(0, 2, 1, 3).reshape(N, L_q, -1), weights  # the heads concatenated, and no W_o


@bug("check_multi_head_attention", "missing_bias_o")
def mha_forgets_b_o(x_q, x_kv, params, n_heads, mask=None):
    N, L_q, _ = x_q.shape
    q = _np_heads(x_q @ params["W_q"] + params.get("b_q", 0.0), n_heads)
    k = _np_heads(x_kv @ params["W_k"] + params.get("b_k", 0.0), n_heads)
    v = _np_heads(x_kv @ params["W_v"] + params.get("b_v", 0.0), n_heads)
    heads, weights = _np_attention(q, k, v, mask)
    return heads.transpose(0, 2, 1, 3).reshape(N, L_q, -1) @ params["W_o"], weights  # + b_o forgotten


@bug("check_multi_head_attention", "missing_bias_q")
def mha_forgets_b_q(x_q, x_kv, params, n_heads, mask=None):
    N, L_q, _ = x_q.shape
    q = _np_heads(x_q @ params["W_q"], n_heads)  # + b_q forgotten
    k = _np_heads(x_kv @ params["W_k"] + params.get("b_k", 0.0), n_heads)
    v = _np_heads(x_kv @ params["W_v"] + params.get("b_v", 0.0), n_heads)
    heads, weights = _np_attention(q, k, v, mask)
    return heads.transpose(0, 2, 1, 3).reshape(N, L_q, -1) @ params["W_o"] + params.get("b_o", 0.0), weights


@bug("check_multi_head_attention", "missing_bias_v")
def mha_forgets_b_v(x_q, x_kv, params, n_heads, mask=None):
    N, L_q, _ = x_q.shape
    q = _np_heads(x_q @ params["W_q"] + params.get("b_q", 0.0), n_heads)
    k = _np_heads(x_kv @ params["W_k"] + params.get("b_k", 0.0), n_heads)
    v = _np_heads(x_kv @ params["W_v"], n_heads)  # + b_v forgotten
    heads, weights = _np_attention(q, k, v, mask)
    return heads.transpose(0, 2, 1, 3).reshape(N, L_q, -1) @ params["W_o"] + params.get("b_o", 0.0), weights


@bug("check_multi_head_attention", "missing_input_biases")
def mha_projections_without_bias(x_q, x_kv, params, n_heads, mask=None):
    N, L_q, _ = x_q.shape
    q = _np_heads(x_q @ params["W_q"], n_heads)  # Q = X W^Q, K = X W^K, V = X W^V: no biases here ...
    k = _np_heads(x_kv @ params["W_k"], n_heads)
    v = _np_heads(x_kv @ params["W_v"], n_heads)
    heads, weights = _np_attention(q, k, v, mask)
    return heads.transpose(0, 2, 1, 3).reshape(N, L_q, -1) @ params["W_o"] + params.get("b_o", 0.0), weights  # ... b_o


@bug("check_multi_head_attention", "missing_biases")
def mha_ignores_biases(x_q, x_kv, params, n_heads, mask=None):
    N, L_q, _ = x_q.shape
    q = _np_heads(x_q @ params["W_q"], n_heads)  # the biases in params are never read
    k = _np_heads(x_kv @ params["W_k"], n_heads)
    v = _np_heads(x_kv @ params["W_v"], n_heads)
    heads, weights = _np_attention(q, k, v, mask)
    return heads.transpose(0, 2, 1, 3).reshape(N, L_q, -1) @ params["W_o"], weights


@bug("check_multi_head_attention", "values_from_W_k")
def mha_values_with_w_k(x_q, x_kv, params, n_heads, mask=None):
    N, L_q, _ = x_q.shape
    q = _np_heads(x_q @ params["W_q"] + params.get("b_q", 0.0), n_heads)
    k = _np_heads(x_kv @ params["W_k"] + params.get("b_k", 0.0), n_heads)
    v = _np_heads(x_kv @ params["W_k"] + params.get("b_k", 0.0), n_heads)  # copied from the line above
    heads, weights = _np_attention(q, k, v, mask)
    return heads.transpose(0, 2, 1, 3).reshape(N, L_q, -1) @ params["W_o"] + params.get("b_o", 0.0), weights


@bug("check_multi_head_attention", "kv_from_x_q")
def mha_self_attention_only(x_q, x_kv, params, n_heads, mask=None):
    N, L_q, _ = x_q.shape
    q = _np_heads(x_q @ params["W_q"] + params.get("b_q", 0.0), n_heads)
    k = _np_heads(x_q @ params["W_k"] + params.get("b_k", 0.0), n_heads)  # x_q: right for self-attention only
    v = _np_heads(x_q @ params["W_v"] + params.get("b_v", 0.0), n_heads)
    heads, weights = _np_attention(q, k, v, mask)
    return heads.transpose(0, 2, 1, 3).reshape(N, L_q, -1) @ params["W_o"] + params.get("b_o", 0.0), weights


@bug("check_multi_head_attention", "weights_averaged_over_heads")
def mha_average_weights(x_q, x_kv, params, n_heads, mask=None):
    N, L_q, _ = x_q.shape
    q = _np_heads(x_q @ params["W_q"] + params.get("b_q", 0.0), n_heads)
    k = _np_heads(x_kv @ params["W_k"] + params.get("b_k", 0.0), n_heads)
    v = _np_heads(x_kv @ params["W_v"] + params.get("b_v", 0.0), n_heads)
    heads, weights = _np_attention(q, k, v, mask)
    out = heads.transpose(0, 2, 1, 3).reshape(N, L_q, -1) @ params["W_o"] + params.get("b_o", 0.0)
    return out, weights.mean(axis=1)  # as torch.nn.MultiheadAttention's default


@bug("check_multi_head_attention", "mask_fill_large_negative")
def mha_fill_minus_1e9(x_q, x_kv, params, n_heads, mask=None):
    N, L_q, _ = x_q.shape
    q = _np_heads(x_q @ params["W_q"] + params.get("b_q", 0.0), n_heads)
    k = _np_heads(x_kv @ params["W_k"] + params.get("b_k", 0.0), n_heads)
    v = _np_heads(x_kv @ params["W_v"] + params.get("b_v", 0.0), n_heads)
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -1e9)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = e / e.sum(axis=-1, keepdims=True)
    out = (weights @ v).transpose(0, 2, 1, 3).reshape(N, L_q, -1) @ params["W_o"] + params.get("b_o", 0.0)
    return out, weights


@bug("check_multi_head_attention", "kv_map_tile", gqa=True)
def mha_gqa_tiled(x_q, x_kv, params, n_heads, mask=None):
    N, L_q, _ = x_q.shape
    head_dim = params["W_q"].shape[1] // n_heads
    g = params["W_k"].shape[1] // head_dim
    q = _np_heads(x_q @ params["W_q"] + params.get("b_q", 0.0), n_heads)
    k = np.tile(_np_heads(x_kv @ params["W_k"] + params.get("b_k", 0.0), g), (1, n_heads // g, 1, 1))  # j % g
    v = np.tile(_np_heads(x_kv @ params["W_v"] + params.get("b_v", 0.0), g), (1, n_heads // g, 1, 1))
    heads, weights = _np_attention(q, k, v, mask)
    return heads.transpose(0, 2, 1, 3).reshape(N, L_q, -1) @ params["W_o"] + params.get("b_o", 0.0), weights


@bug("check_multi_head_attention", "kv_map_tile", gqa=True)
def mha_gqa_torch_repeat(x_q, x_kv, params, n_heads, mask=None):
    """torch's Tensor.repeat tiles: head j reads kv head j % g."""
    x_q, x_kv = torch.as_tensor(x_q), torch.as_tensor(x_kv)
    p = {key: torch.as_tensor(value) for key, value in params.items()}
    N, L_q, _ = x_q.shape
    hd = p["W_q"].shape[1] // n_heads
    g = p["W_k"].shape[1] // hd
    q = (x_q @ p["W_q"] + p.get("b_q", 0.0)).reshape(N, L_q, n_heads, hd).transpose(1, 2)
    k = (x_kv @ p["W_k"] + p.get("b_k", 0.0)).reshape(N, -1, g, hd).transpose(1, 2).repeat(1, n_heads // g, 1, 1)
    v = (x_kv @ p["W_v"] + p.get("b_v", 0.0)).reshape(N, -1, g, hd).transpose(1, 2).repeat(1, n_heads // g, 1, 1)
    mask = None if mask is None else torch.as_tensor(mask)
    weights = _torch_masked_softmax(q @ k.transpose(-2, -1) / hd ** 0.5, mask)
    out = (weights @ v).transpose(1, 2).reshape(N, L_q, -1) @ p["W_o"] + p.get("b_o", 0.0)
    return out, weights


@bug("check_multi_head_attention", "mask_nan_empty_rows")
def mha_torch_minus_inf(x_q, x_kv, params, n_heads, mask=None):
    x_q, x_kv = torch.as_tensor(x_q), torch.as_tensor(x_kv)
    p = {key: torch.as_tensor(value) for key, value in params.items()}
    N, L_q, _ = x_q.shape
    hd = p["W_q"].shape[1] // n_heads
    q = (x_q @ p["W_q"] + p.get("b_q", 0.0)).reshape(N, L_q, n_heads, hd).transpose(1, 2)
    k = (x_kv @ p["W_k"] + p.get("b_k", 0.0)).reshape(N, -1, n_heads, hd).transpose(1, 2)
    v = (x_kv @ p["W_v"] + p.get("b_v", 0.0)).reshape(N, -1, n_heads, hd).transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / hd ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~torch.as_tensor(mask), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = (weights @ v).transpose(1, 2).reshape(N, L_q, -1) @ p["W_o"] + p.get("b_o", 0.0)
    return out, weights


@bug("check_multi_head_attention", "mask_ignored")
def mha_ignores_mask(x_q, x_kv, params, n_heads, mask=None):
    N, L_q, _ = x_q.shape
    q = _np_heads(x_q @ params["W_q"] + params.get("b_q", 0.0), n_heads)
    k = _np_heads(x_kv @ params["W_k"] + params.get("b_k", 0.0), n_heads)
    v = _np_heads(x_kv @ params["W_v"] + params.get("b_v", 0.0), n_heads)
    heads, weights = _np_attention(q, k, v)  # the mask is never passed on to the attention
    return heads.transpose(0, 2, 1, 3).reshape(N, L_q, -1) @ params["W_o"] + params.get("b_o", 0.0), weights


@bug("check_multi_head_attention", "mask_ignored")
def mha_torch_ignores_mask(x_q, x_kv, params, n_heads, mask=None):
    return mha_torch(x_q, x_kv, params, n_heads)


@bug("check_multi_head_attention", "outputs_swapped")
def mha_returns_weights_first(x_q, x_kv, params, n_heads, mask=None):
    out, weights = mha_torch(x_q, x_kv, params, n_heads, mask)
    return weights, out


# --- causal mask -------------------------------------------------------------------------------------------------

@bug("check_causal_mask", "causal_top_left")
def causal_top_left(l_q, l_kv):
    return np.tril(np.ones((l_q, l_kv), dtype=bool))


@bug("check_causal_mask", "causal_top_left")
def causal_torch_top_left(l_q, l_kv):
    return torch.ones(l_q, l_kv).tril().bool()


@bug("check_causal_mask", "causal_strict")
def causal_without_diagonal(l_q, l_kv):
    return np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q - 1)


@bug("check_causal_mask", "causal_inverted")
def causal_marks_future(l_q, l_kv):
    return np.triu(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q + 1)


@bug("check_causal_mask", "causal_transposed")
def causal_upper_triangle(l_q, l_kv):
    return np.triu(np.ones((l_q, l_kv), dtype=bool))


@bug("check_causal_mask", "causal_transposed")
def causal_keys_on_rows(l_q, l_kv):
    return np.tril(np.ones((l_kv, l_q), dtype=bool))  # (l_kv, l_q): right only when square


@bug("check_causal_mask", "mask_not_boolean")
def causal_ones_and_zeros(l_q, l_kv):
    return np.tril(np.ones((l_q, l_kv)), k=l_kv - l_q)


@bug("check_causal_mask", "additive_mask")
def causal_additive(l_q, l_kv):
    return np.where(_bottom_right(l_q, l_kv), 0.0, -np.inf)


@bug("check_causal_mask", "causal_one_future_key")
def causal_one_future_key(l_q, l_kv):
    return np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q + 1)  # off by one: +1 on the diagonal


@bug("check_causal_mask", "causal_one_future_key")
def causal_torch_range_to_i_plus_1(l_q, l_kv):
    """Query i sees keys j < offset + i + 2: the + 1 that turns j <= offset + i into a strict bound, added twice."""
    offset = l_kv - l_q
    return torch.tensor([[j < offset + i + 2 for j in range(l_kv)] for i in range(l_q)], dtype=torch.bool)


# --- repeat_kv ---------------------------------------------------------------------------------------------------

@bug("check_repeat_kv", "kv_map_tile")
def repeat_kv_tile(y, n_rep):
    return np.tile(y, (1, n_rep, 1, 1))


@bug("check_repeat_kv", "kv_map_tile")
def repeat_kv_torch_repeat(y, n_rep):
    return torch.as_tensor(y).repeat(1, n_rep, 1, 1)


@bug("check_repeat_kv", "repeat_wrong_axis")
def repeat_kv_positions(y, n_rep):
    return np.repeat(y, n_rep, axis=2)


@bug("check_repeat_kv", "repeat_not_merged")
def repeat_kv_expand_only(y, n_rep):
    N, g, L, d = y.shape
    return np.broadcast_to(y[:, :, None], (N, g, n_rep, L, d))


# --- KV-cache decode step ----------------------------------------------------------------------------------------
# A reader's step: append the new keys and values to the caches, repeat the key/value heads for their query heads,
# attend with the causal mask aligned bottom-right. Each function writes out the step with one mistake.

@bug("check_decode_step", "causal_top_left")
def decode_top_left_mask(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = np.concatenate([k_cache, k_new], axis=2), np.concatenate([v_cache, v_new], axis=2)
    n_rep = q.shape[1] // k_all.shape[1]
    mask = np.tril(np.ones((q.shape[2], k_all.shape[2]), dtype=bool))  # new query i sees keys 0..i
    out, _ = _np_attention(q, np.repeat(k_all, n_rep, axis=1), np.repeat(v_all, n_rep, axis=1), mask)
    return out, k_all, v_all


@bug("check_decode_step", "causal_top_left")
def decode_torch_is_causal(q, k_new, v_new, k_cache, v_cache):
    """F.scaled_dot_product_attention(is_causal=True) aligns the mask top-left when L_q != L_kv."""
    q, k_new, v_new, k_cache, v_cache = (torch.as_tensor(a) for a in (q, k_new, v_new, k_cache, v_cache))
    k_all, v_all = torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)
    out = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=q.shape[2] > 1, enable_gqa=True)
    return out, k_all, v_all


@bug("check_decode_step", "no_causal_mask")
def decode_without_mask(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = np.concatenate([k_cache, k_new], axis=2), np.concatenate([v_cache, v_new], axis=2)
    n_rep = q.shape[1] // k_all.shape[1]
    out, _ = _np_attention(q, np.repeat(k_all, n_rep, axis=1), np.repeat(v_all, n_rep, axis=1))  # "the past only"
    return out, k_all, v_all


@bug("check_decode_step", "cache_prepended")
def decode_prepends(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = np.concatenate([k_new, k_cache], axis=2), np.concatenate([v_new, v_cache], axis=2)  # new first
    n_rep = q.shape[1] // k_all.shape[1]
    T, L = q.shape[2], k_all.shape[2]
    out, _ = _np_attention(q, np.repeat(k_all, n_rep, axis=1), np.repeat(v_all, n_rep, axis=1), _bottom_right(T, L))
    return out, k_all, v_all


@bug("check_decode_step", "new_position_not_attended")
def decode_attends_cache_only(q, k_new, v_new, k_cache, v_cache):
    n_rep = q.shape[1] // k_new.shape[1]
    if k_cache.shape[2] == 0:  # nothing cached yet: this reader special-cases the prefill correctly
        out, _ = _np_attention(q, np.repeat(k_new, n_rep, axis=1), np.repeat(v_new, n_rep, axis=1),
                               _bottom_right(q.shape[2], k_new.shape[2]))
    else:  # attends over the cache, then appends
        out, _ = _np_attention(q, np.repeat(k_cache, n_rep, axis=1), np.repeat(v_cache, n_rep, axis=1))
    return out, np.concatenate([k_cache, k_new], axis=2), np.concatenate([v_cache, v_new], axis=2)


@bug("check_decode_step", "kv_map_tile")
def decode_tiled_heads(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = np.concatenate([k_cache, k_new], axis=2), np.concatenate([v_cache, v_new], axis=2)
    n_rep = q.shape[1] // k_all.shape[1]
    T, L = q.shape[2], k_all.shape[2]
    k_rep, v_rep = np.tile(k_all, (1, n_rep, 1, 1)), np.tile(v_all, (1, n_rep, 1, 1))  # head j reads j % g
    out, _ = _np_attention(q, k_rep, v_rep, _bottom_right(T, L))
    return out, k_all, v_all


@bug("check_decode_step", "scale_d_model")
def decode_scaled_by_width(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = np.concatenate([k_cache, k_new], axis=2), np.concatenate([v_cache, v_new], axis=2)
    N, h, T, head_dim = q.shape
    n_rep = h // k_all.shape[1]
    out, _ = _np_attention(q, np.repeat(k_all, n_rep, axis=1), np.repeat(v_all, n_rep, axis=1),
                           _bottom_right(T, k_all.shape[2]), scale=(h * head_dim) ** -0.5)  # d_model, not head_dim
    return out, k_all, v_all


@bug("check_decode_step", "cache_not_updated")
def decode_returns_old_cache(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = np.concatenate([k_cache, k_new], axis=2), np.concatenate([v_cache, v_new], axis=2)
    n_rep = q.shape[1] // k_all.shape[1]
    out, _ = _np_attention(q, np.repeat(k_all, n_rep, axis=1), np.repeat(v_all, n_rep, axis=1),
                           _bottom_right(q.shape[2], k_all.shape[2]))
    return out, k_cache, v_cache  # the caches passed in, not k_all and v_all


@bug("check_decode_step", "cache_repeated_heads")
def decode_caches_repeated_heads(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = np.concatenate([k_cache, k_new], axis=2), np.concatenate([v_cache, v_new], axis=2)
    n_rep = q.shape[1] // k_all.shape[1]
    k_all, v_all = np.repeat(k_all, n_rep, axis=1), np.repeat(v_all, n_rep, axis=1)  # repeated, and cached so
    out, _ = _np_attention(q, k_all, v_all, _bottom_right(q.shape[2], k_all.shape[2]))
    return out, k_all, v_all


@bug("check_decode_step", "causal_one_future_key")
def decode_mask_one_future_key(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = np.concatenate([k_cache, k_new], axis=2), np.concatenate([v_cache, v_new], axis=2)
    n_rep = q.shape[1] // k_all.shape[1]
    T, L = q.shape[2], k_all.shape[2]
    mask = np.tril(np.ones((T, L), dtype=bool), k=L - T + 1)  # off by one: j <= c + i + 1
    out, _ = _np_attention(q, np.repeat(k_all, n_rep, axis=1), np.repeat(v_all, n_rep, axis=1), mask)
    return out, k_all, v_all


@bug("check_decode_step", "outputs_swapped")
def decode_returns_caches_swapped(q, k_new, v_new, k_cache, v_cache):
    out, k_all, v_all = decode_np(q, k_new, v_new, k_cache, v_cache)
    return out, v_all, k_all


# --- online softmax ----------------------------------------------------------------------------------------------
# A reader's blocked loop (batched like q), written out in full with one mistake each: the running maximum m, the
# running sum l and the accumulator acc, rescaled by alpha = exp(m_old - m_new) whenever the maximum grows.

@bug("check_online_softmax_attention", "drop_last_partial_block")
def online_full_blocks_only(q, k, v, block_size, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    L_kv = k.shape[-2]
    mask = None if mask is None else np.broadcast_to(mask, q.shape[:-1] + (L_kv,))
    m = np.full(q.shape[:-1] + (1,), -np.inf)  # running maximum
    l = np.zeros(q.shape[:-1] + (1,))  # running sum
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])  # running accumulator
    for b in range(L_kv // block_size):  # whole blocks only: a shorter last block is never visited
        start, stop = b * block_size, (b + 1) * block_size
        s = scale * (q @ np.swapaxes(k[..., start:stop, :], -1, -2))
        if mask is not None:
            s = np.where(mask[..., start:stop], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isinf(m_new), 0.0, m_new)
        p, alpha = np.exp(s - shift), np.exp(m - shift)
        l = alpha * l + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + p @ v[..., start:stop, :]
        m = m_new
    return np.divide(acc, l, out=np.zeros_like(acc), where=l > 0)


@bug("check_online_softmax_attention", "no_rescale_acc")
def online_forgets_acc_rescale(q, k, v, block_size, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    L_kv = k.shape[-2]
    mask = None if mask is None else np.broadcast_to(mask, q.shape[:-1] + (L_kv,))
    m = np.full(q.shape[:-1] + (1,), -np.inf)  # running maximum
    l = np.zeros(q.shape[:-1] + (1,))  # running sum
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])  # running accumulator
    for start in range(0, L_kv, block_size):
        s = scale * (q @ np.swapaxes(k[..., start:start + block_size, :], -1, -2))
        if mask is not None:
            s = np.where(mask[..., start:start + block_size], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isinf(m_new), 0.0, m_new)
        p, alpha = np.exp(s - shift), np.exp(m - shift)
        l = alpha * l + p.sum(axis=-1, keepdims=True)
        acc = acc + p @ v[..., start:start + block_size, :]  # the old terms keep the old maximum
        m = m_new
    return np.divide(acc, l, out=np.zeros_like(acc), where=l > 0)


@bug("check_online_softmax_attention", "no_rescale_l")
def online_forgets_l_rescale(q, k, v, block_size, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    L_kv = k.shape[-2]
    mask = None if mask is None else np.broadcast_to(mask, q.shape[:-1] + (L_kv,))
    m = np.full(q.shape[:-1] + (1,), -np.inf)  # running maximum
    l = np.zeros(q.shape[:-1] + (1,))  # running sum
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])  # running accumulator
    for start in range(0, L_kv, block_size):
        s = scale * (q @ np.swapaxes(k[..., start:start + block_size, :], -1, -2))
        if mask is not None:
            s = np.where(mask[..., start:start + block_size], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isinf(m_new), 0.0, m_new)
        p, alpha = np.exp(s - shift), np.exp(m - shift)
        l = l + p.sum(axis=-1, keepdims=True)  # the running sum is never rescaled
        acc = alpha * acc + p @ v[..., start:start + block_size, :]
        m = m_new
    return np.divide(acc, l, out=np.zeros_like(acc), where=l > 0)


@bug("check_online_softmax_attention", "no_rescale")
def online_forgets_rescale(q, k, v, block_size, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    L_kv = k.shape[-2]
    mask = None if mask is None else np.broadcast_to(mask, q.shape[:-1] + (L_kv,))
    m = np.full(q.shape[:-1] + (1,), -np.inf)  # running maximum
    l = np.zeros(q.shape[:-1] + (1,))  # running sum
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])  # running accumulator
    for start in range(0, L_kv, block_size):
        s = scale * (q @ np.swapaxes(k[..., start:start + block_size, :], -1, -2))
        if mask is not None:
            s = np.where(mask[..., start:start + block_size], s, -np.inf)
        m = np.maximum(m, s.max(axis=-1, keepdims=True))  # the maximum moves on, the old terms stay as they were
        p = np.exp(s - np.where(np.isinf(m), 0.0, m))
        l = l + p.sum(axis=-1, keepdims=True)
        acc = acc + p @ v[..., start:start + block_size, :]
    return np.divide(acc, l, out=np.zeros_like(acc), where=l > 0)


@bug("check_online_softmax_attention", "alpha_inverted")
def online_alpha_upside_down(q, k, v, block_size, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    L_kv = k.shape[-2]
    mask = None if mask is None else np.broadcast_to(mask, q.shape[:-1] + (L_kv,))
    m = np.full(q.shape[:-1] + (1,), -np.inf)  # running maximum
    l = np.zeros(q.shape[:-1] + (1,))  # running sum
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])  # running accumulator
    for start in range(0, L_kv, block_size):
        s = scale * (q @ np.swapaxes(k[..., start:start + block_size, :], -1, -2))
        if mask is not None:
            s = np.where(mask[..., start:start + block_size], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isinf(m_new), 0.0, m_new)
        p, alpha = np.exp(s - shift), np.exp(shift - m)  # exp(m_new - m_old): upside down
        l = alpha * l + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + p @ v[..., start:start + block_size, :]
        m = m_new
    return np.divide(acc, l, out=np.zeros_like(acc), where=l > 0)


@bug("check_online_softmax_attention", "no_final_division")
def online_returns_accumulator(q, k, v, block_size, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    L_kv = k.shape[-2]
    mask = None if mask is None else np.broadcast_to(mask, q.shape[:-1] + (L_kv,))
    m = np.full(q.shape[:-1] + (1,), -np.inf)  # running maximum
    l = np.zeros(q.shape[:-1] + (1,))  # running sum
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])  # running accumulator
    for start in range(0, L_kv, block_size):
        s = scale * (q @ np.swapaxes(k[..., start:start + block_size, :], -1, -2))
        if mask is not None:
            s = np.where(mask[..., start:start + block_size], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isinf(m_new), 0.0, m_new)
        p, alpha = np.exp(s - shift), np.exp(m - shift)
        l = alpha * l + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + p @ v[..., start:start + block_size, :]
        m = m_new
    return acc  # never divided by l


@bug("check_online_softmax_attention", "online_nan_empty_state")
def online_unguarded_state(q, k, v, block_size, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    L_kv = k.shape[-2]
    mask = None if mask is None else np.broadcast_to(mask, q.shape[:-1] + (L_kv,))
    m = np.full(q.shape[:-1] + (1,), -np.inf)  # running maximum
    l = np.zeros(q.shape[:-1] + (1,))  # running sum
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])  # running accumulator
    for start in range(0, L_kv, block_size):
        s = scale * (q @ np.swapaxes(k[..., start:start + block_size, :], -1, -2))
        if mask is not None:
            s = np.where(mask[..., start:start + block_size], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        p, alpha = np.exp(s - m_new), np.exp(m - m_new)  # while m_new is -inf: exp(-inf - (-inf)) = NaN
        l = alpha * l + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + p @ v[..., start:start + block_size, :]
        m = m_new
    return acc / l


@bug("check_online_softmax_attention", "mask_nan_empty_rows")
def online_unguarded_division(q, k, v, block_size, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    L_kv = k.shape[-2]
    mask = None if mask is None else np.broadcast_to(mask, q.shape[:-1] + (L_kv,))
    m = np.full(q.shape[:-1] + (1,), -np.inf)  # running maximum
    l = np.zeros(q.shape[:-1] + (1,))  # running sum
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])  # running accumulator
    for start in range(0, L_kv, block_size):
        s = scale * (q @ np.swapaxes(k[..., start:start + block_size, :], -1, -2))
        if mask is not None:
            s = np.where(mask[..., start:start + block_size], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isinf(m_new), 0.0, m_new)
        p, alpha = np.exp(s - shift), np.exp(m - shift)
        l = alpha * l + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + p @ v[..., start:start + block_size, :]
        m = m_new
    return acc / l  # a query with no allowed key: 0 / 0


@bug("check_online_softmax_attention", "no_max_subtraction")
def online_without_max(q, k, v, block_size, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    L_kv = k.shape[-2]
    mask = None if mask is None else np.broadcast_to(mask, q.shape[:-1] + (L_kv,))
    l = np.zeros(q.shape[:-1] + (1,))  # running sum
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])  # running accumulator
    for start in range(0, L_kv, block_size):  # no running maximum: plain sums of exp(s)
        s = scale * (q @ np.swapaxes(k[..., start:start + block_size, :], -1, -2))
        if mask is not None:
            s = np.where(mask[..., start:start + block_size], s, -np.inf)
        p = np.exp(s)
        l = l + p.sum(axis=-1, keepdims=True)
        acc = acc + p @ v[..., start:start + block_size, :]
    return np.divide(acc, l, out=np.zeros_like(acc), where=l > 0)


@bug("check_online_softmax_attention", "mask_fill_large_negative")
def online_fill_minus_1e9(q, k, v, block_size, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    L_kv = k.shape[-2]
    mask = None if mask is None else np.broadcast_to(mask, q.shape[:-1] + (L_kv,))
    m = np.full(q.shape[:-1] + (1,), -np.inf)  # running maximum
    l = np.zeros(q.shape[:-1] + (1,))  # running sum
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])  # running accumulator
    for start in range(0, L_kv, block_size):
        s = scale * (q @ np.swapaxes(k[..., start:start + block_size, :], -1, -2))
        if mask is not None:
            s = np.where(mask[..., start:start + block_size], s, -1e9)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        p, alpha = np.exp(s - m_new), np.exp(m - m_new)
        l = alpha * l + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + p @ v[..., start:start + block_size, :]
        m = m_new
    return acc / l


@bug("check_online_softmax_attention", "mask_ignored")
def online_ignores_mask(q, k, v, block_size, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    m = np.full(q.shape[:-1] + (1,), -np.inf)  # running maximum
    l = np.zeros(q.shape[:-1] + (1,))  # running sum
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])  # running accumulator
    for start in range(0, k.shape[-2], block_size):  # `mask` is accepted and never applied
        s = scale * (q @ np.swapaxes(k[..., start:start + block_size, :], -1, -2))
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        p, alpha = np.exp(s - m_new), np.exp(m - m_new)
        l = alpha * l + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + p @ v[..., start:start + block_size, :]
        m = m_new
    return acc / l


# --- softmax backward --------------------------------------------------------------------------------------------

@bug("check_softmax_backward", "vjp_missing_rowsum")
def softmax_backward_elementwise(weights, grad_weights):
    return weights * grad_weights


@bug("check_softmax_backward", "vjp_diagonal_only")
def softmax_backward_sigmoid_style(weights, grad_weights):
    return weights * (1 - weights) * grad_weights


@bug("check_softmax_backward", "vjp_rowsum_of_grad")
def softmax_backward_plain_rowsum(weights, grad_weights):
    return weights * (grad_weights - grad_weights.sum(axis=-1, keepdims=True))


@bug("check_softmax_backward", "vjp_sign")
def softmax_backward_plus(weights, grad_weights):
    return weights * (grad_weights + (weights * grad_weights).sum(axis=-1, keepdims=True))


@bug("check_softmax_backward", "vjp_sum_without_keepdims")
def softmax_backward_no_keepdims(weights, grad_weights):
    return weights * (grad_weights - (weights * grad_weights).sum(axis=-1))


@bug("check_softmax_backward", "vjp_sum_wrong_axis")
def softmax_backward_column_sum(weights, grad_weights):
    if weights.ndim == 1:
        return weights * (grad_weights - weights @ grad_weights)
    return weights * (grad_weights - (weights * grad_weights).sum(axis=-2, keepdims=True))


# --- attention backward ------------------------------------------------------------------------------------------
# A reader's hand-written backward pass: the forward weights A (the reader's softmax), then
# dV = A^T dO, dA = dO V^T, dS = A * (dA - rowsum(dA * A)), dQ = scale dS K, dK = scale dS^T Q; one mistake each.

@bug("check_scaled_dot_product_attention_grad", "full_score_matrix", tiled=True)
def grad_right_but_whole_matrices(q, k, v, grad_out, mask=None, scale=None, tile=3):
    # Right gradients, with a `tile` argument it never uses: the scores and weights are built whole (L_q x L_kv).
    return R.scaled_dot_product_attention_grad(q, k, v, grad_out, mask, scale)


@bug("check_scaled_dot_product_attention_grad", "grad_missing_scale")
def grad_forgets_scale(q, k, v, grad_out, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    A = _np_softmax_rows(scale * (q @ np.swapaxes(k, -1, -2)), mask)
    dA = grad_out @ np.swapaxes(v, -1, -2)
    dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))
    return dS @ k, np.swapaxes(dS, -1, -2) @ q, np.swapaxes(A, -1, -2) @ grad_out  # no factor scale in dQ, dK


@bug("check_scaled_dot_product_attention_grad", "grad_dv_no_transpose")
def grad_dv_without_transpose(q, k, v, grad_out, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    A = _np_softmax_rows(scale * (q @ np.swapaxes(k, -1, -2)), mask)
    dA = grad_out @ np.swapaxes(v, -1, -2)
    dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))
    return scale * dS @ k, scale * np.swapaxes(dS, -1, -2) @ q, A @ grad_out  # dV = A dO: A^T wanted


@bug("check_scaled_dot_product_attention_grad", "vjp_missing_rowsum")
def grad_softmax_elementwise(q, k, v, grad_out, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    A = _np_softmax_rows(scale * (q @ np.swapaxes(k, -1, -2)), mask)
    dS = A * (grad_out @ np.swapaxes(v, -1, -2))  # the softmax treated as elementwise: no row sum
    return scale * dS @ k, scale * np.swapaxes(dS, -1, -2) @ q, np.swapaxes(A, -1, -2) @ grad_out


@bug("check_scaled_dot_product_attention_grad", "mask_fill_large_negative")
def grad_forward_minus_1e9(q, k, v, grad_out, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = scale * (q @ np.swapaxes(k, -1, -2))
    if mask is not None:
        scores = np.where(mask, scores, -1e9)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    A = e / e.sum(axis=-1, keepdims=True)
    dA = grad_out @ np.swapaxes(v, -1, -2)
    dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))
    return scale * dS @ k, scale * np.swapaxes(dS, -1, -2) @ q, np.swapaxes(A, -1, -2) @ grad_out


@bug("check_scaled_dot_product_attention_grad", "mask_nan_empty_rows")
def grad_autograd_minus_inf(q, k, v, grad_out, mask=None, scale=None):
    q, k, v = (torch.as_tensor(a).clone().requires_grad_(True) for a in (q, k, v))
    scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(~torch.as_tensor(mask), float("-inf"))
    (torch.softmax(scores, dim=-1) @ v * torch.as_tensor(grad_out)).sum().backward()
    return q.grad, k.grad, v.grad


@bug("check_scaled_dot_product_attention_grad", "mask_ignored")
def grad_ignores_mask(q, k, v, grad_out, mask=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    A = _np_softmax_rows(scale * (q @ np.swapaxes(k, -1, -2)))  # the forward pass without the mask
    dA = grad_out @ np.swapaxes(v, -1, -2)
    dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))
    return scale * dS @ k, scale * np.swapaxes(dS, -1, -2) @ q, np.swapaxes(A, -1, -2) @ grad_out


@bug("check_scaled_dot_product_attention_grad", "outputs_swapped")
def grad_returns_dv_first(q, k, v, grad_out, mask=None, scale=None):
    dq, dk, dv = sdpa_grad_rows(q, k, v, grad_out, mask, scale)
    return dv, dk, dq


# --- part IV: RoPE -----------------------------------------------------------------------------------------------
# A reader's RoPE: frequencies base^(-2i/d), angles m theta_i, each pair (a, b) turned to (a cos - b sin,
# a sin + b cos). Each function writes it out with one mistake; the pairing is rotate-half unless the checker is
# told style="interleaved".

def _half_rope_np(x, angles):
    """Rotate-half pairs (x[i], x[i + d/2]) turned by the (..., L, d/2) angles (correct)."""
    d = x.shape[-1]
    a, b = x[..., : d // 2], x[..., d // 2:]
    cos, sin = np.cos(angles), np.sin(angles)
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def _angles_np(positions, d, base=10000.0):
    return np.asarray(positions)[..., None] * base ** (-np.arange(0, d, 2) / d)  # (..., L, d/2)


@bug("check_rope", "rope_wrong_pairing")
def rope_adjacent_pairs(x, positions, base=10000.0):
    """Meta's adjacent pairs, checked as rotate-half (the checker's default)."""
    angles = _angles_np(positions, x.shape[-1], base)
    a, b = x[..., 0::2], x[..., 1::2]  # pairs (x[2i], x[2i+1])
    cos, sin = np.cos(angles), np.sin(angles)
    return np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)


@bug("check_rope", "rope_wrong_pairing", style="interleaved")
def rope_torch_rotate_half_as_interleaved(x, positions, base=10000.0):
    """Hugging Face's rotate_half, handed in as the interleaved (Meta) convention."""
    return rope_torch(x, positions, base)


@bug("check_rope", "rope_angle_layout")
def rope_repeat_interleaved_angles(x, positions, base=10000.0):
    """rotate_half with the cos/sin table of the interleaved layout: theta_0, theta_0, theta_1, theta_1, ..."""
    d = x.shape[-1]
    emb = np.repeat(_angles_np(positions, d, base), 2, axis=-1)  # (..., L, d), should be [angles, angles]
    rotated_half = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    return x * np.cos(emb) + rotated_half * np.sin(emb)


@bug("check_rope", "rope_angle_layout", style="interleaved")
def rope_torch_every_two_with_half_tables(x, positions, base=10000.0):
    """Adjacent pairs in real arithmetic, with Hugging Face's cos/sin tables [angles, angles]."""
    x, pos = _tt(x), _tt(positions)
    d = x.shape[-1]
    freqs = pos.to(torch.float64)[..., None] * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    emb = torch.cat([freqs, freqs], dim=-1)  # laid out for rotate-half: coordinate 2i gets theta_(2i mod d/2)
    turned = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    return x * emb.cos() + turned * emb.sin()


@bug("check_rope", "rope_rotation_sign")
def rope_rotate_half_wrong_sign(x, positions, base=10000.0):
    d = x.shape[-1]
    angles = _angles_np(positions, d, base)
    emb = np.concatenate([angles, angles], axis=-1)
    rotated_half = np.concatenate([x[..., d // 2:], -x[..., : d // 2]], axis=-1)  # (x2, -x1): should be (-x2, x1)
    return x * np.cos(emb) + rotated_half * np.sin(emb)


@bug("check_rope", "rope_rotation_sign", style="interleaved")
def rope_torch_complex_conjugate(x, positions, base=10000.0):
    x, pos = _tt(x), _tt(positions)
    d = x.shape[-1]
    angles = pos.to(torch.float64)[..., None] * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rotation = torch.polar(torch.ones_like(angles), -angles)  # e^{-i m theta}
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(xc * rotation).flatten(-2)


@bug("check_rope", "rope_positions_ignored")
def rope_arange_positions(x, positions, base=10000.0):
    L = x.shape[-2]
    return _half_rope_np(x, _angles_np(np.arange(L), x.shape[-1], base))  # the sequence is assumed to start at 0


@bug("check_rope", "rope_freq_missing_2")
def rope_frequencies_without_2(x, positions, base=10000.0):
    d = x.shape[-1]
    theta = base ** (-np.arange(d // 2) / d)  # i/d: the 2 of 2i/d is gone
    return _half_rope_np(x, np.asarray(positions)[..., None] * theta)


@bug("check_rope", "rope_freq_missing_2")
def rope_torch_frequencies_without_2(x, positions, base=10000.0):
    x, pos = _tt(x), _tt(positions)
    d = x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(d // 2, dtype=torch.float64) / d)  # arange(d // 2), not arange(0, d, 2)
    freqs = pos.to(torch.float64)[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return x * emb.cos() + torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1) * emb.sin()


@bug("check_rope", "rope_freq_inverted")
def rope_frequencies_growing(x, positions, base=10000.0):
    d = x.shape[-1]
    theta = base ** (np.arange(0, d, 2) / d)  # the minus sign is lost
    return _half_rope_np(x, np.asarray(positions)[..., None] * theta)


@bug("check_rope", "rope_base_ignored")
def rope_base_hardcoded(x, positions, base=10000.0):
    return _half_rope_np(x, _angles_np(positions, x.shape[-1], 10000.0))  # always 10000


@bug("check_rope", "modifies_input")
def rope_in_place(x, positions, base=10000.0):
    d = x.shape[-1]
    angles = _angles_np(positions, d, base)
    cos, sin = np.cos(angles), np.sin(angles)
    a, b = x[..., : d // 2].copy(), x[..., d // 2:].copy()
    x[..., : d // 2] = a * cos - b * sin  # writes into the caller's array
    x[..., d // 2:] = a * sin + b * cos
    return x


# --- part IV: a decode step with RoPE ----------------------------------------------------------------------------
# A reader's step: rotate the new queries and keys at positions c .. c+T-1, append the rotated keys and the values,
# attend with the bottom-right causal mask (the reader's decode_np); one mistake each.

def _rope_np(x, positions):
    return _half_rope_np(x, _angles_np(positions, x.shape[-1]))


@bug("check_rope_decode_step", "rope_after_caching")
def rope_decode_rotates_whole_cache(q, k_new, v_new, k_cache, v_cache):
    """The cache keeps raw keys; every step rotates all of them at 0 .. c+T-1 (the given cache is already rotated)."""
    c, T = k_cache.shape[2], q.shape[2]
    k_all, v_all = np.concatenate([k_cache, k_new], axis=2), np.concatenate([v_cache, v_new], axis=2)
    k_rot = _rope_np(k_all, np.arange(c + T))
    n_rep = q.shape[1] // k_all.shape[1]
    out, _ = _np_attention(_rope_np(q, c + np.arange(T)), np.repeat(k_rot, n_rep, axis=1),
                           np.repeat(v_all, n_rep, axis=1), _bottom_right(T, c + T))
    return out, k_all, v_all


@bug("check_rope_decode_step", "rope_after_caching")
def rope_decode_torch_caches_raw_keys(q, k_new, v_new, k_cache, v_cache):
    """The cache is written first, RoPE applied afterwards for the attention only."""
    q, k_new, v_new, k_cache, v_cache = (_tt(a) for a in (q, k_new, v_new, k_cache, v_cache))
    k_cache_out, v_cache_out = torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)
    positions = torch.arange(k_cache.shape[2], k_cache.shape[2] + q.shape[2])
    q, k_new = rope_torch(q, positions), rope_torch(k_new, positions)  # after the cache was written
    out, _, _ = decode_torch(q, k_new, v_new, k_cache, v_cache)
    return out, k_cache_out, v_cache_out


@bug("check_rope_decode_step", "rope_no_position_offset")
def rope_decode_positions_from_zero(q, k_new, v_new, k_cache, v_cache):
    positions = np.arange(q.shape[2])  # the cached positions are forgotten
    return decode_np(_rope_np(q, positions), _rope_np(k_new, positions), v_new, k_cache, v_cache)


@bug("check_rope_decode_step", "rope_no_position_offset")
def rope_decode_torch_positions_from_zero(q, k_new, v_new, k_cache, v_cache):
    q, k_new = _tt(q), _tt(k_new)
    positions = torch.arange(q.shape[2])
    return decode_torch(rope_torch(q, positions), rope_torch(k_new, positions), v_new, k_cache, v_cache)


@bug("check_rope_decode_step", "rope_on_values")
def rope_decode_rotates_values(q, k_new, v_new, k_cache, v_cache):
    positions = k_cache.shape[2] + np.arange(q.shape[2])
    q, k_new, v_new = (_rope_np(a, positions) for a in (q, k_new, v_new))  # v too
    return decode_np(q, k_new, v_new, k_cache, v_cache)


@bug("check_rope_decode_step", "rope_query_not_rotated")
def rope_decode_rotates_keys_only(q, k_new, v_new, k_cache, v_cache):
    positions = k_cache.shape[2] + np.arange(q.shape[2])
    return decode_np(q, _rope_np(k_new, positions), v_new, k_cache, v_cache)


@bug("check_rope_decode_step", "rope_key_not_rotated")
def rope_decode_torch_rotates_queries_only(q, k_new, v_new, k_cache, v_cache):
    q = _tt(q)
    positions = torch.arange(k_cache.shape[2], k_cache.shape[2] + q.shape[2])
    return decode_torch(rope_torch(q, positions), k_new, v_new, k_cache, v_cache)


@bug("check_rope_decode_step", "rope_wrong_pairing")
def rope_decode_adjacent_pairs(q, k_new, v_new, k_cache, v_cache):
    """Meta's adjacent pairs, against a cache rotated with rotate-half."""
    positions = k_cache.shape[2] + np.arange(q.shape[2])
    return decode_np(rope_adjacent_pairs(q, positions), rope_adjacent_pairs(k_new, positions), v_new, k_cache,
                     v_cache)


@bug("check_rope_decode_step", "causal_top_left")
def rope_decode_torch_is_causal(q, k_new, v_new, k_cache, v_cache):
    q, k_new, v_new, k_cache, v_cache = (_tt(a) for a in (q, k_new, v_new, k_cache, v_cache))
    positions = torch.arange(k_cache.shape[2], k_cache.shape[2] + q.shape[2])
    k_all = torch.cat([k_cache, rope_torch(k_new, positions)], dim=2)
    v_all = torch.cat([v_cache, v_new], dim=2)
    out = F.scaled_dot_product_attention(rope_torch(q, positions), k_all, v_all, is_causal=q.shape[2] > 1,
                                         enable_gqa=True)  # top-left when L_q != L_kv
    return out, k_all, v_all


# --- part IV: the sliding-window mask ------------------------------------------------------------------------------

@bug("check_sliding_window_mask", "window_one_key_too_many")
def window_counts_past_keys(l_q, l_kv, window):
    p = (l_kv - l_q + np.arange(l_q))[:, None]
    j = np.arange(l_kv)[None, :]
    return (j <= p) & (p - j <= window)  # window past keys and the query: window + 1 in all


@bug("check_sliding_window_mask", "window_one_key_too_many")
def window_torch_flash_convention(l_q, l_kv, window):
    ones = torch.ones(l_q, l_kv, dtype=torch.bool)
    offset = l_kv - l_q
    return ones.tril(diagonal=offset) & ~ones.tril(diagonal=offset - window - 1)  # FlashAttention's left = window


@bug("check_sliding_window_mask", "window_one_key_too_few")
def window_strict_and_minus_one(l_q, l_kv, window):
    offset = l_kv - l_q
    return np.array([[offset + i - window + 1 < j <= offset + i for j in range(l_kv)] for i in range(l_q)],
                    dtype=bool)


@bug("check_sliding_window_mask", "window_top_left")
def window_from_query_index(l_q, l_kv, window):
    i = np.arange(l_q)[:, None]  # query i taken to be at position i
    j = np.arange(l_kv)[None, :]
    return (j <= i) & (j > i - window)


@bug("check_sliding_window_mask", "window_not_causal")
def window_lower_bound_only(l_q, l_kv, window):
    p = (l_kv - l_q + np.arange(l_q))[:, None]
    return np.arange(l_kv)[None, :] > p - window


@bug("check_sliding_window_mask", "window_symmetric")
def window_band(l_q, l_kv, window):
    p = (l_kv - l_q + np.arange(l_q))[:, None]
    return np.abs(p - np.arange(l_kv)[None, :]) < window  # Longformer's local window


@bug("check_sliding_window_mask", "window_ignored")
def window_torch_causal_only(l_q, l_kv, window):
    return torch.ones(l_q, l_kv, dtype=torch.bool).tril(diagonal=l_kv - l_q)


@bug("check_sliding_window_mask", "mask_not_boolean")
def window_ones_and_zeros(l_q, l_kv, window):
    ones = np.ones((l_q, l_kv))
    return np.tril(ones, k=l_kv - l_q) - np.tril(ones, k=l_kv - l_q - window)  # 1.0 / 0.0


# --- part IV: attention with sink logits -------------------------------------------------------------------------
# A reader's attention with sinks: the scores, one more column per row holding the head's sink logit, the softmax
# over L_kv + 1 entries, the column dropped; one mistake each.

def _sink_scores_np(q, k, mask, scale):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = scale * (q @ np.swapaxes(k, -1, -2))
    return scores if mask is None else np.where(mask, scores, -np.inf)


def _with_sink_column(scores, sinks):
    column = np.broadcast_to(sinks[:, None, None], scores.shape[:-1] + (1,))  # (..., h, L_q, 1)
    return np.concatenate([scores, column], axis=-1)


@bug("check_sink_attention", "sink_ignored")
def sink_left_out(q, k, v, sinks, mask=None, scale=None):
    return _np_attention(q, k, v, mask, scale)  # `sinks` accepted and never read


@bug("check_sink_attention", "sink_ignored")
def sink_torch_renormalised(q, k, v, sinks, mask=None, scale=None):
    _, weights = sink_torch(q, k, v, sinks, mask, scale)
    weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-300)  # "the rows must sum to 1"
    return weights @ _tt(v), weights


@bug("check_sink_attention", "sink_ignored")
def sink_added_to_scores(q, k, v, sinks, mask=None, scale=None):
    scores = _sink_scores_np(q, k, None, scale) + sinks[:, None, None]  # a constant per row: the softmax drops it
    weights = _np_softmax_rows(scores, mask)
    return weights @ v, weights


@bug("check_sink_attention", "sink_column_kept")
def sink_weights_with_column(q, k, v, sinks, mask=None, scale=None):
    probs = _np_softmax_rows(_with_sink_column(_sink_scores_np(q, k, mask, scale), sinks))
    return probs[..., :-1] @ v, probs  # the sink's column left in the weights


@bug("check_sink_attention", "sink_column_kept")
def sink_torch_column_first(q, k, v, sinks, mask=None, scale=None):
    q, k, v, sinks = _tt(q), _tt(k), _tt(v), _tt(sinks)
    c = q.shape[-1] ** -0.5 if scale is None else scale
    scores = c * q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~_tt(mask), float("-inf"))
    column = sinks.reshape(-1, 1, 1).expand(*scores.shape[:-1], 1)
    probs = torch.softmax(torch.cat([column, scores], dim=-1), dim=-1)  # the sink first
    return probs[..., 1:] @ v, probs


@bug("check_sink_attention", "sink_scaled")
def sink_scaled_with_scores(q, k, v, sinks, mask=None, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = _with_sink_column(q @ np.swapaxes(k, -1, -2), sinks)
    if mask is not None:
        logits = np.where(np.concatenate([np.broadcast_to(mask, logits.shape[:-1] + (k.shape[-2],)),
                                          np.ones(logits.shape[:-1] + (1,), dtype=bool)], axis=-1), logits, -np.inf)
    probs = _np_softmax_rows(scale * logits)  # the sink column scaled too
    return probs[..., :-1] @ v, probs[..., :-1]


@bug("check_sink_attention", "sink_not_shifted")
def sink_exp_unshifted(q, k, v, sinks, mask=None, scale=None):
    scores = _sink_scores_np(q, k, mask, scale)
    top = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True) + np.exp(sinks[:, None, None])  # exp(sink), not exp(sink - top)
    weights = e / total
    return weights @ v, weights


@bug("check_sink_attention", "sink_per_query")
def sink_broadcast_per_query(q, k, v, sinks, mask=None, scale=None):
    scores = _sink_scores_np(q, k, mask, scale)
    column = np.broadcast_to(sinks[:, None], scores.shape[:-1] + (1,))  # (h, 1) lines up with the queries
    probs = _np_softmax_rows(np.concatenate([scores, column], axis=-1))
    return probs[..., :-1] @ v, probs[..., :-1]


@bug("check_sink_attention", "no_scale")
def sink_torch_unscaled(q, k, v, sinks, mask=None, scale=None):
    return sink_torch(q, k, v, sinks, mask, 1.0)  # the scale is never applied


# --- part IV: RMSNorm ----------------------------------------------------------------------------------------------

@bug("check_rms_norm", "rmsnorm_subtracts_mean")
def rms_norm_as_layer_norm(x, weight, eps=1e-6):
    centred = x - x.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + eps) * weight


@bug("check_rms_norm", "rmsnorm_subtracts_mean")
def rms_norm_torch_layer_norm(x, weight, eps=1e-6):
    x = _tt(x)
    return F.layer_norm(x, (x.shape[-1],), _tt(weight), None, eps)


@bug("check_rms_norm", "rmsnorm_variance")
def rms_norm_by_std(x, weight, eps=1e-6):
    return x / np.sqrt(x.var(axis=-1, keepdims=True) + eps) * weight


@bug("check_rms_norm", "rmsnorm_sum_not_mean")
def rms_norm_unit_length(x, weight, eps=1e-6):
    return x / np.sqrt((x ** 2).sum(axis=-1, keepdims=True) + eps) * weight


@bug("check_rms_norm", "rmsnorm_sum_not_mean")
def rms_norm_torch_normalize(x, weight, eps=1e-6):
    return F.normalize(_tt(x), dim=-1, eps=eps) * _tt(weight)


@bug("check_rms_norm", "rmsnorm_eps_outside_sqrt")
def rms_norm_eps_after_sqrt(x, weight, eps=1e-6):
    return x / (np.sqrt((x ** 2).mean(axis=-1, keepdims=True)) + eps) * weight


@bug("check_rms_norm", "rmsnorm_eps_ignored")
def rms_norm_torch_without_eps(x, weight, eps=1e-6):
    x = _tt(x)
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True)) * _tt(weight)


@bug("check_rms_norm", "rmsnorm_eps_ignored")
def rms_norm_fixed_eps(x, weight, eps=1e-6):
    return x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + 1e-5) * weight  # PyTorch LayerNorm's default


@bug("check_rms_norm", "rmsnorm_one_plus_weight")
def rms_norm_gemma_gain(x, weight, eps=1e-6):
    return x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps) * (1.0 + weight)


@bug("check_rms_norm", "rmsnorm_no_weight")
def rms_norm_without_gain(x, weight, eps=1e-6):
    return x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps)


@bug("check_rms_norm", "rmsnorm_wrong_axis")
def rms_norm_over_axis_0(x, weight, eps=1e-6):
    return x / np.sqrt((x ** 2).mean(axis=0, keepdims=True) + eps) * weight


@bug("check_rms_norm", "rmsnorm_wrong_axis")
def rms_norm_torch_whole_tensor(x, weight, eps=1e-6):
    x = _tt(x)
    return x * torch.rsqrt(x.pow(2).mean() + eps) * _tt(weight)  # one RMS for everything


@bug("check_rms_norm", "rmsnorm_no_keepdims")
def rms_norm_mean_without_keepdims(x, weight, eps=1e-6):
    return x / np.sqrt((x ** 2).mean(axis=-1) + eps) * weight


@bug("check_rms_norm", "modifies_input")
def rms_norm_torch_in_place(x, weight, eps=1e-6):
    x = _tt(x)
    return x.mul_(torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)).mul_(_tt(weight))


# --- part IV: multi-head latent attention --------------------------------------------------------------------------
# The implementations (correct and buggy) live beside their own tests, in tests/test_exercises_latent.py.
import test_exercises_latent as _latent  # noqa: E402

CORRECT["check_latent_decode_step"] = list(_latent.CORRECT)
BUGGY.extend(Bug(b.label, "check_latent_decode_step", b.fn, b.diagnosis, b.kwargs) for b in _latent.BUGGY)


# --- part IV: gated attention ----------------------------------------------------------------------------------------
# The implementations (correct and buggy) live beside their own tests, in tests/test_exercises_gate.py.
import test_exercises_gate as _gate  # noqa: E402

CORRECT["check_gated_attention"] = list(_gate.CORRECT)
BUGGY.extend(Bug(b.label, "check_gated_attention", b.fn, b.diagnosis, b.kwargs) for b in _gate.BUGGY)
