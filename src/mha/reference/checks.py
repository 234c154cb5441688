"""Input checks of ``mha.reference``, shared by its functions. Each raises TypeError/ValueError naming the argument
and the shapes, and every function of the package runs all of its checks before any computation.

``check_params`` (public; ``mha.convert`` uses it too) reads a layer's sizes, :class:`Dims`, from its ``params`` dict.
The private helpers: ``_check_attention_args`` (the attention functions, on q, k, v), ``_check_mha_inputs`` (the
multi-head functions, on x_q, x_kv, params), ``_check_softmax_output`` (``softmax_backward``), ``_heads_array`` (the
head helpers), ``_check_seed`` (``init_params``) and the small checks they are built from; for the parts of today's
models (part IV, 'Attention in today's models'), ``_check_core_extras`` (sinks, window and softcap of the attention
core), ``_check_positions`` and ``_check_rope_args`` (RoPE), ``_check_rope_dim`` (partial RoPE), ``_check_gate`` (gated
attention) and ``_check_layer_extras`` (the layer's new keywords).
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from mha._checks import attention_scale, check_bool, check_choice, check_float, check_int
from mha.reference.masks import _check_mask, _sliding_window, _with_causal

_WEIGHT_KEYS = ("W_q", "W_k", "W_v", "W_o")
_BIAS_KEYS = ("b_q", "b_k", "b_v", "b_o")
# QK-norm weights (head_dim,) each; one sink logit per query head (h,); the output gate's projection
# (d_model, h) or (d_model, h*head_dim) and its optional bias.
_EXTRA_KEYS = ("q_norm", "k_norm", "sinks", "W_gate", "b_gate")
ROPE_STYLES = ("half", "interleaved")
GATES = (None, "headwise", "elementwise")  # gated attention (Qiu et al. 2025): off, one gate per head, per coordinate


class Dims(NamedTuple):
    """The sizes of a layer, read from its ``params`` dict by :func:`check_params`."""

    d_model: int  # model width, W_q.shape[0]
    n_heads: int  # h, query heads
    n_kv_heads: int  # g, key/value heads (divides h)
    head_dim: int  # width of one head, W_q.shape[1] // h


def _as_float_array(name, x, finite=True):
    """``x`` as a float64 array; TypeError for non-numeric data, ValueError for NaN/inf (unless ``finite=False``)."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    if finite and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf (shape {arr.shape}); inputs must be finite")
    return arr


def _check_flag(name, value):
    return check_bool(name, value)


def _check_scale(scale, d_k):
    """Default ``1/sqrt(d_k)``; otherwise a finite real number > 0 (the rule ``mha.MultiHeadAttention`` applies)."""
    return attention_scale(scale, d_k)


def _check_nonempty(name, arr):
    if 0 in arr.shape:
        raise ValueError(f"{name} has an empty axis (shape {arr.shape}); every axis must have length >= 1")


def _check_qkv(q, k, v):
    """Shapes for attention: q (..., L_q, d_k), k (..., L_kv, d_k), v (..., L_kv, d_v), leading axes broadcast."""
    q, k, v = (_as_float_array(n, a) for n, a in (("q", q), ("k", k), ("v", v)))
    for name, arr in (("q", q), ("k", k), ("v", v)):
        if arr.ndim < 2:
            raise ValueError(f"{name} must have at least 2 axes (..., L, d), got shape {arr.shape}")
        _check_nonempty(name, arr)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the last axis d_k: q shape {q.shape}, k shape {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must share the key axis L_kv: k shape {k.shape}, v shape {v.shape}")
    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(
            f"leading (batch) axes of q {q.shape}, k {k.shape}, v {v.shape} do not broadcast"
        ) from None
    return q, k, v, batch


def _check_attention_args(q, k, v, mask, scale, is_causal=False):
    """Checks shared by the attention functions; returns float64 q, k, v, batch axes, mask (the causal mask
    included), scale."""
    q, k, v, batch = _check_qkv(q, k, v)
    scale = _check_scale(scale, q.shape[-1])
    mask = _check_mask(mask, batch + (q.shape[-2], k.shape[-2]), "(..., L_q, L_kv)")
    mask = _with_causal(mask, is_causal, q.shape[-2], k.shape[-2])
    return q, k, v, batch, mask, scale


def check_params(params, n_heads):
    """Check a ``params`` dict (the convention of ``mha.reference``'s docstring) for a layer with ``n_heads`` query
    heads.

    Returns ``(p, dims)``: ``p`` a new dict of float64 arrays (a bias given as None is left out) and ``dims`` the
    layer's :class:`Dims` (d_model, n_heads, n_kv_heads, head_dim), read from the shapes. TypeError/ValueError, naming
    the key and the shapes, for a missing or unexpected key, a non-numeric or non-finite entry, shapes that do not fit
    together, ``n_heads`` not dividing W_q's width, or ``n_kv_heads`` not dividing ``n_heads``. Every function of
    ``mha.reference`` that takes ``params`` starts with it, and so does ``mha.convert``.

    Optional keys of today's models: ``q_norm`` and ``k_norm`` (QK-norm's RMSNorm weights, shape ``(head_dim,)``
    each, shared by all heads; both or neither), ``sinks`` (one learned sink logit per query head, shape
    ``(n_heads,)``) and the output gate's ``W_gate`` (shape ``(d_model, n_heads)``, headwise, or ``(d_model,
    n_heads*head_dim)``, elementwise) with its optional bias ``b_gate`` (``(W_gate.shape[1],)``; not without
    W_gate). Like the biases, an entry given as None counts as absent.
    """
    if not isinstance(params, dict):
        raise TypeError(
            f"params must be a dict with keys {_WEIGHT_KEYS} (+ optional biases), got {type(params).__name__}"
        )
    missing = [key for key in _WEIGHT_KEYS if key not in params]
    if missing:
        raise ValueError(
            f"params is missing key(s) {missing}; expected W_q, W_k, W_v, W_o (and optional b_q, b_k, b_v, b_o)"
        )
    allowed = _WEIGHT_KEYS + _BIAS_KEYS + _EXTRA_KEYS
    unknown = sorted(set(params) - set(allowed), key=repr)  # keys of any type
    if unknown:
        raise ValueError(f"params has unexpected key(s) {unknown}; allowed: {allowed}")
    p = {key: _as_float_array(f"params['{key}']", value) for key, value in params.items() if value is not None}
    for key in _WEIGHT_KEYS:
        if p[key].ndim != 2:
            raise ValueError(f"params['{key}'] must be a 2-D matrix, got shape {p[key].shape}")
        _check_nonempty(f"params['{key}']", p[key])
    d_model, q_width = p["W_q"].shape
    if p["W_k"].shape[0] != d_model:
        raise ValueError(
            f"params['W_k'] must have d_model = {d_model} rows (W_q.shape[0]), got shape {p['W_k'].shape}"
        )
    if p["W_v"].shape != p["W_k"].shape:
        raise ValueError(f"params['W_v'] shape {p['W_v'].shape} must equal params['W_k'] shape {p['W_k'].shape}")
    if p["W_o"].shape != (q_width, d_model):
        raise ValueError(
            f"params['W_o'] must have shape (h*head_dim, d_model) = {(q_width, d_model)}, got {p['W_o'].shape}"
        )
    n_heads = check_int("n_heads", n_heads)
    if q_width % n_heads:
        raise ValueError(
            f"n_heads = {n_heads} must divide W_q's width h*head_dim = {q_width} (params['W_q'] shape {p['W_q'].shape})"
        )
    head_dim = q_width // n_heads
    kv_width = p["W_k"].shape[1]
    if kv_width % head_dim:
        raise ValueError(
            f"n_kv_heads = W_k width / head_dim = {kv_width} / {head_dim} is not an integer "
            f"(params['W_k'] shape {p['W_k'].shape}, head_dim = W_q width {q_width} / n_heads {n_heads})"
        )
    n_kv_heads = kv_width // head_dim
    if n_heads % n_kv_heads:
        raise ValueError(
            f"n_kv_heads = {n_kv_heads} (W_k width {kv_width} / head_dim {head_dim}) must divide n_heads = {n_heads}"
        )
    bias_shapes = {"b_q": (q_width,), "b_k": (kv_width,), "b_v": (kv_width,), "b_o": (d_model,)}
    for key, shape in bias_shapes.items():
        if key in p and p[key].shape != shape:
            raise ValueError(f"params['{key}'] must have shape {shape}, got {p[key].shape}")
    _check_extra_params(p, head_dim, n_heads)
    return p, Dims(d_model, n_heads, n_kv_heads, head_dim)


def _check_extra_params(p, head_dim, n_heads):
    """``q_norm``/``k_norm`` (both or neither, shape (head_dim,)), ``sinks`` (shape (n_heads,)) and the gate's
    ``W_gate`` ((d_model, n_heads) or (d_model, n_heads*head_dim)) and ``b_gate`` (only with W_gate)."""
    if ("q_norm" in p) != ("k_norm" in p):
        have, missing = ("q_norm", "k_norm") if "q_norm" in p else ("k_norm", "q_norm")
        raise ValueError(f"params has '{have}' but not '{missing}'; QK-norm normalises both q and k: give both "
                         f"(shape (head_dim,) = ({head_dim},)) or neither")
    for key, shape, desc in (("q_norm", (head_dim,), "(head_dim,)"), ("k_norm", (head_dim,), "(head_dim,)"),
                             ("sinks", (n_heads,), "(n_heads,)")):
        if key in p and p[key].shape != shape:
            raise ValueError(f"params['{key}'] must have shape {desc} = {shape}, got {p[key].shape}")
    if "b_gate" in p and "W_gate" not in p:
        raise ValueError(f"params has 'b_gate' but not 'W_gate': the gate's bias needs its projection W_gate "
                         f"(shape (d_model, n_heads) or (d_model, n_heads*head_dim))")
    if "W_gate" in p:
        d_model, W_gate = p["W_q"].shape[0], p["W_gate"]
        widths = (n_heads, n_heads * head_dim)
        if W_gate.ndim != 2 or W_gate.shape[0] != d_model or W_gate.shape[1] not in widths:
            raise ValueError(f"params['W_gate'] must have shape (d_model, n_heads) = {(d_model, n_heads)} (headwise "
                             f"gate) or (d_model, n_heads*head_dim) = {(d_model, n_heads * head_dim)} (elementwise "
                             f"gate), got {W_gate.shape}")
        if "b_gate" in p and p["b_gate"].shape != (W_gate.shape[1],):
            raise ValueError(f"params['b_gate'] must have shape (W_gate.shape[1],) = ({W_gate.shape[1]},), got "
                             f"{p['b_gate'].shape}")


def _check_mha_inputs(x_q, x_kv, params, n_heads, mask, is_causal=False):
    """All checks for the multi-head functions. Returns 3-D x_q, x_kv, params, dims, mask (the causal mask
    included), unbatched flag."""
    p, dims = check_params(params, n_heads)
    x_q = _as_float_array("x_q", x_q)
    if x_q.ndim not in (2, 3):
        raise ValueError(f"x_q must be 2-D (L, d_model) or 3-D (N, L, d_model), got shape {x_q.shape}")
    _check_nonempty("x_q", x_q)
    if x_kv is None:
        x_kv = x_q
    else:
        x_kv = _as_float_array("x_kv", x_kv)
        if x_kv.ndim != x_q.ndim:
            raise ValueError(
                f"x_kv must have the same rank as x_q ({x_q.ndim}-D, shape {x_q.shape}), got shape {x_kv.shape}"
            )
        _check_nonempty("x_kv", x_kv)
    for name, x in (("x_q", x_q), ("x_kv", x_kv)):
        if x.shape[-1] != dims.d_model:
            raise ValueError(
                f"{name} last dimension must be d_model = {dims.d_model} (params['W_q'].shape[0]), got shape {x.shape}"
            )
    if x_q.ndim == 3 and x_kv.shape[0] != x_q.shape[0]:
        raise ValueError(
            f"x_kv batch size {x_kv.shape[0]} must equal x_q batch size {x_q.shape[0]} "
            f"(x_q shape {x_q.shape}, x_kv shape {x_kv.shape})"
        )
    unbatched = x_q.ndim == 2
    if unbatched:
        target, desc = (dims.n_heads, x_q.shape[0], x_kv.shape[0]), "(h, L_q, L_kv)"
        x_q, x_kv = x_q[None], x_kv[None]  # (1, L, d_model)
    else:
        target, desc = (x_q.shape[0], dims.n_heads, x_q.shape[1], x_kv.shape[1]), "(N, h, L_q, L_kv)"
    mask = _check_mask(mask, target, desc)
    mask = _with_causal(mask, is_causal, x_q.shape[1], x_kv.shape[1])
    return x_q, x_kv, p, dims, mask, unbatched


def _heads_array(y, shape_desc):
    """``y`` as a float64 array of rank ``len(shape_desc)``. NaN and inf are let through: the head helpers only move
    numbers, and a NaN moved is still the same NaN."""
    y = _as_float_array("y", y, finite=False)
    if y.ndim != len(shape_desc):
        raise ValueError(f"y must be {len(shape_desc)}-D ({', '.join(shape_desc)}), got shape {y.shape}")
    return y


def _check_softmax_output(weights, grad_weights):
    """The checks of ``softmax_backward``: real finite arrays of one shape, with a non-empty last axis, and
    ``weights`` a (masked) softmax output along it: entries >= 0, each row summing to 1, or to 0 (fully masked).

    Those rows are exactly the outputs of a masked softmax (a row with entries > 0 summing to 1 is softmax(log A)),
    the only points where ``A * (dA - rowsum(dA * A))`` is a gradient. The sum may be off by ``max(1e-6, n eps)``
    (n = row length, eps of the input's float type: rounding of a float32 softmax of a long row).
    """
    raw = np.asarray(weights)
    A, dA = _as_float_array("weights", raw), _as_float_array("grad_weights", grad_weights)
    if A.ndim == 0:
        raise ValueError(f"weights must have at least 1 axis (..., n), got a scalar (shape {A.shape})")
    if A.shape != dA.shape:
        raise ValueError(f"grad_weights shape {dA.shape} must equal weights shape {A.shape}")
    if A.shape[-1] == 0:
        raise ValueError(f"softmax over an empty axis is undefined: weights has shape {A.shape}, last axis of length 0")
    rule = ("weights must be a softmax output along the last axis (entries >= 0, each row summing to 1, or to 0 "
            "for a fully masked row)")
    negative = np.argwhere(A < 0)
    if negative.size:
        index = tuple(int(i) for i in negative[0])
        raise ValueError(f"{rule}, but weights[{', '.join(map(str, index))}] = {A[index]:.6g} < 0")
    eps = np.finfo(raw.dtype if raw.dtype.kind == "f" else np.float64).eps
    tol = max(1e-6, A.shape[-1] * float(eps))
    sums = A.sum(axis=-1)  # (...,): one per row
    bad = np.flatnonzero((np.abs(sums - 1.0) > tol) & (sums != 0))  # flat row numbers (sums is 0-d for 1-D A)
    if bad.size:
        row = tuple(int(i) for i in np.unravel_index(bad[0], sums.shape))
        raise ValueError(f"{rule}, but weights[{', '.join(map(str, row + (':',)))}] sums to {sums[row]:.6g} "
                         f"(rows failing: {bad.size} of {sums.size}; tolerance {tol:.3g})")


def _check_seed(seed):
    """An int >= 0 (reproducible draws), None (fresh entropy) or a ``np.random.Generator`` (drawn from)."""
    expected = "an integer >= 0, None or a numpy Generator"
    if seed is None or isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be {expected}, got {seed!r} of type {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be {expected}, got {seed}")
    return int(seed)


# --- today's models: sinks, windows, soft-capping, RoPE, QK-norm (part IV, 'Attention in today's models') ---------


def _check_core_extras(batch, l_q, l_kv, mask, sinks=None, window=None, softcap=None):
    """The attention core's keywords of today's models. Returns ``mask`` (with the sliding window joined by logical
    and), ``sinks`` (float64, broadcastable to the leading axes ``batch``, or None) and ``softcap`` (float or None)."""
    if softcap is not None:
        softcap = check_float("softcap", softcap, minimum=0.0, min_inclusive=False)
    if sinks is not None:
        sinks = _as_float_array("sinks", sinks)
        try:
            fits = np.broadcast_shapes(sinks.shape, batch) == tuple(batch)
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"sinks shape {sinks.shape} is not broadcastable to the leading axes {tuple(batch)} of "
                             f"q, k, v (one sink logit per softmax, e.g. (h,) for (N, h, L, d) inputs)")
    return _sliding_window(mask, window, l_q, l_kv), sinks, softcap


def _check_positions(name, positions, target, desc):
    """Integer positions >= 0 whose last axis has length ``target[-1]`` (L) and which broadcast to ``target``."""
    pos = np.asarray(positions)
    if pos.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers (absolute token positions), got dtype {pos.dtype}")
    try:
        fits = pos.ndim >= 1 and pos.shape[-1] == target[-1] and np.broadcast_shapes(pos.shape, target) == target
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{name} must have shape (L,) = ({target[-1]},) or one broadcastable to {target} {desc}, "
                         f"got shape {pos.shape}")
    if pos.size and pos.min() < 0:
        raise ValueError(f"{name} must be integers >= 0 (absolute token positions), got {pos.min()}")
    return pos


def _check_rope_args(base, style):
    """RoPE's ``base`` (a finite real number > 0) and ``style`` (one of ``ROPE_STYLES``)."""
    check_choice("style", style, ROPE_STYLES)
    return check_float("base", base, minimum=0.0, min_inclusive=False), style


class _LayerOptions(NamedTuple):
    """The layer's keywords of today's models, checked (see ``multi_head_attention``)."""

    positions_q: np.ndarray | None  # broadcastable to (N, h, L_q): RoPE positions of the queries (None: no RoPE)
    positions_kv: np.ndarray | None  # broadcastable to (N, g, L_kv)
    rope_base: float | None
    rope_style: str
    eps: float  # QK-norm's epsilon (used when params has q_norm and k_norm)
    scale: float | None
    softcap: float | None
    sinks: np.ndarray | None  # params["sinks"], shape (h,)
    rope_dim: int | None  # RoPE on the first rope_dim coordinates of each head (None: no RoPE)
    gate: str | None  # None, "headwise" or "elementwise"

    @property
    def sdpa(self):
        """The keywords of ``scaled_dot_product_attention`` (the sliding window is already in the mask)."""
        return {"scale": self.scale, "softcap": self.softcap, "sinks": self.sinks}


def _layer_positions(positions, L, n_batch, unbatched, name):
    """Positions of one sequence axis, as an array broadcastable to (N, heads, L)."""
    target, desc = ((L,), "(L,)") if unbatched else ((n_batch, L), "(N, L)")
    pos = _check_positions(name, positions, target, desc)
    return pos[:, None, :] if pos.ndim == 2 else pos  # (N, L) -> (N, 1, L): the same positions for every head


def _check_rope_dim(rope_dim, head_dim):
    """``rope_dim``: None (the whole head) or an even integer in [2, head_dim]; returns it as an int or None."""
    if rope_dim is None:
        return None
    rope_dim = check_int("rope_dim", rope_dim, minimum=2, maximum=head_dim)
    if rope_dim % 2:
        raise ValueError(f"rope_dim must be even (RoPE rotates pairs of coordinates), got rope_dim = {rope_dim} "
                         f"(head_dim = {head_dim})")
    return rope_dim


def _check_gate(gate, p, dims):
    """``gate`` (one of ``GATES``) against params: W_gate present exactly when a gate is asked for, of the width
    of the mode, (d_model, n_heads) headwise or (d_model, n_heads*head_dim) elementwise."""
    check_choice("gate", gate, GATES)
    if gate is None:
        if "W_gate" in p:
            raise ValueError(f"params has 'W_gate' (shape {p['W_gate'].shape}) but gate is None: pass "
                             f"gate='headwise' or gate='elementwise', or leave W_gate and b_gate out")
        return None
    if "W_gate" not in p:
        raise ValueError(f"gate={gate!r} needs params['W_gate'] (shape (d_model, n_heads) headwise, (d_model, "
                         f"n_heads*head_dim) elementwise), but params has none")
    width = dims.n_heads if gate == "headwise" else dims.n_heads * dims.head_dim
    if p["W_gate"].shape[1] != width:
        desc = "(d_model, n_heads)" if gate == "headwise" else "(d_model, n_heads*head_dim)"
        raise ValueError(f"gate={gate!r} needs params['W_gate'] of shape {desc} = {(dims.d_model, width)}, got "
                         f"{p['W_gate'].shape}")
    return gate


def _check_layer_extras(self_attention, x_q, x_kv, p, dims, mask, unbatched, positions, rope_base, rope_style,
                        window, softcap, qk_norm_eps, scale, gate=None, rope_dim=None):
    """All checks of the layer's new keywords, after ``_check_mha_inputs``. Returns ``(opts, mask)``: the
    :class:`_LayerOptions` and the mask with the sliding window joined."""
    check_choice("rope_style", rope_style, ROPE_STYLES)
    gate = _check_gate(gate, p, dims)
    rope_dim = _check_rope_dim(rope_dim, dims.head_dim)
    eps = check_float("qk_norm_eps", qk_norm_eps, minimum=0.0, min_inclusive=False)
    scale = None if scale is None else attention_scale(scale, dims.head_dim)
    if softcap is not None:
        softcap = check_float("softcap", softcap, minimum=0.0, min_inclusive=False)
    (N, L_q), L_kv = x_q.shape[:2], x_kv.shape[1]
    mask = _sliding_window(mask, window, L_q, L_kv)
    pos_q = pos_kv = None
    if rope_base is None:
        if positions is not None:
            raise ValueError("positions is given but rope_base is None: positions are used only by RoPE (pass "
                             "rope_base, e.g. 10000.0, to rotate q and k)")
        if rope_dim is not None:
            raise ValueError(f"rope_dim = {rope_dim} is given but rope_base is None: rope_dim is the part of each "
                             f"head RoPE rotates (pass rope_base, e.g. 10000.0)")
    else:
        rope_base = check_float("rope_base", rope_base, minimum=0.0, min_inclusive=False)
        if rope_dim is None and dims.head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of coordinates: head_dim must be even, got head_dim = "
                             f"{dims.head_dim} (params['W_q'] width {dims.n_heads * dims.head_dim} / n_heads "
                             f"{dims.n_heads})")
        rope_dim = dims.head_dim if rope_dim is None else rope_dim
        if self_attention:
            pos_q = pos_kv = _layer_positions(np.arange(L_q) if positions is None else positions, L_q, N, unbatched,
                                              "positions")
        else:
            expected = "positions=(positions_q, positions_kv), the absolute positions of the queries and of the keys"
            if positions is None:
                raise ValueError(f"RoPE in cross-attention (x_kv given) needs {expected}; got positions=None")
            if not isinstance(positions, (tuple, list)):
                raise TypeError(f"RoPE in cross-attention (x_kv given) needs {expected}; got "
                                f"{type(positions).__name__}")
            if len(positions) != 2:
                raise ValueError(f"RoPE in cross-attention (x_kv given) needs {expected}; got a "
                                 f"{type(positions).__name__} of length {len(positions)}")
            pos_q = _layer_positions(positions[0], L_q, N, unbatched, "positions[0] (queries)")
            pos_kv = _layer_positions(positions[1], L_kv, N, unbatched, "positions[1] (keys)")
    return _LayerOptions(pos_q, pos_kv, rope_base, rope_style, eps, scale, softcap, p.get("sinks"), rope_dim,
                         gate), mask
