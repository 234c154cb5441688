"""The checker of gated attention (part IV), and what its known bugs compute.

``check_gated_attention`` runs your gated multi-head layer on its cases; ``gated_attention_variants`` says what each
known bug would return on a case. The simulator follows the scheme of ``mha.exercises.simulators`` (whose layer
simulator ``_sim_mha`` it reuses for everything before the gate, so that the layer's own bugs, a wrong scale, a
split without the transpose, a forgotten bias, a ``-1e9`` mask, are still named): ``_sim_gated`` computes the gated
layer the book's way when its knobs keep their defaults and the way a known bug does when one is turned;
``_GATE_BUGS`` pairs each bug id of ``KNOWN_BUGS`` with the knobs that produce it.

Book: part IV, 'Gated attention' (Eq. gate-layer).
"""

from __future__ import annotations

import numpy as np

from mha import reference
from mha.exercises.catalogue import EQ_GATE_LAYER, EQ_MHA_HEAD
from mha.exercises.runner import (TIMEOUT, Case, Output, public_checker, row_with_no_key, run_cases, shapes_of,
                                  transposed)
from mha.exercises.simulators import _MHA_BUGS, _merge, _sim_mha, _variants

# ---------------------------------------------------------------------------------------------------------------
# What the known bugs compute.
# ---------------------------------------------------------------------------------------------------------------


def _sigmoid(a):
    """``1 / (1 + exp(-a))`` without overflow for any finite a."""
    return np.exp(-np.logaddexp(0.0, -a))


def _gate_logits(x, p, *, bias=True):
    """``x W_gate (+ b_gate)``: (N, L, G), G = n_heads (headwise) or n_heads*head_dim (elementwise)."""
    a = x @ p["W_gate"]
    return a + p["b_gate"] if (bias and "b_gate" in p) else a


def _activate(a, activation):
    return {"sigmoid": _sigmoid(a), "none": a, "silu": a * _sigmoid(a)}[activation]


def _gate_in_heads(G, n_heads, head_dim, layout="book"):
    """The gate (N, L, G) laid out against the heads (N, h, L, head_dim), the book's way or as a bug does it; None
    where the bug's broadcast cannot happen on these shapes (its code would raise)."""
    N, L, width = G.shape
    if layout == "no_transpose":  # reshaped straight to (N, h, L, .): for L = h the same as G[..., None] headwise
        return G.reshape(N, n_heads, L, width // n_heads)
    if width == n_heads:  # headwise: one value per head and position
        if layout == "tile":  # widened to the concatenation with np.tile: coordinate c gets head c mod h
            return reference.split_heads(np.tile(G, (1, 1, head_dim)), n_heads)
        return G.transpose(0, 2, 1)[..., None]  # (N, h, L, 1)
    if layout == "tile":
        return None
    return reference.split_heads(G, n_heads)  # (N, h, L, head_dim)


def _sim_gated(x_q, x_kv, p, n_heads, gate, mask=None, *, source="x_q", activation="sigmoid", gate_bias=True,
               place="heads", layout="book", merge="transpose", out_proj=True, skip_bias=(), average=False,
               **mha_kw):
    """(out, weights) of the gated layer, the way a given bug computes them (defaults: the book's, Eq. gate-layer).

    source: what the gate reads: 'x_q' (the book), 'x_kv' (the keys' and values' input), 'concat' (the concatenated
    heads' output), 'output' (the ungated layer's output); activation: 'sigmoid', 'none' (the logits), 'silu';
    gate_bias: whether b_gate is added; place: 'heads' (each head's output, before W^O), 'none' (no gate),
    'after_o' / 'after_o_bias' (the layer's output after W^O, before / after b^O), 'weights' (the attention
    weights), 'values' (each value, by its own key position's gate); layout: how the gate meets the heads
    (``_gate_in_heads``). The other knobs are those of ``simulators._sim_mha`` (merge, out_proj, skip_bias and
    average are applied here, after the gate).
    """
    head_dim = p["W_q"].shape[1] // n_heads
    if place == "values":
        return _sim_gated_values(x_q, x_kv, p, n_heads, mask, **mha_kw)
    input_skip = tuple(b for b in skip_bias if b != "b_o")
    result = _sim_mha(x_q, x_kv, p, n_heads, mask, out_proj=False, skip_bias=input_skip, **mha_kw)
    if result is None:
        return None
    concat, weights = result  # (N, L_q, h*head_dim) merged the right way, (N, h, L_q, L_kv)
    heads = reference.split_heads(concat, n_heads)  # (N, h, L_q, head_dim): the attention's output Y

    def project(merged):
        if not out_proj:
            return merged
        out = merged @ p["W_o"]  # (N, L_q, d_model)
        return out + p["b_o"] if ("b_o" in p and "b_o" not in skip_bias) else out

    if source == "x_q":
        gate_input = x_q
    elif source == "x_kv":
        gate_input = x_kv
    elif source == "concat":
        gate_input = concat
    else:  # "output": the ungated layer's output
        gate_input = project(_merge(heads, merge))
    if gate_input.shape[-1] != p["W_gate"].shape[0] or gate_input.shape[1] != x_q.shape[1]:
        return None  # this bug's matrix product or broadcast cannot happen on these shapes
    G = _activate(_gate_logits(gate_input, p, bias=gate_bias), activation)  # (N, L_q, G)

    if place in ("after_o", "after_o_bias"):
        out = _merge(heads, merge) @ p["W_o"]  # (N, L_q, d_model)
        with_bias = "b_o" in p and "b_o" not in skip_bias
        if place == "after_o_bias" and with_bias:
            out = out + p["b_o"]
        d_model = out.shape[-1]
        if G.shape[-1] == d_model:
            out = out * G
        elif G.shape[-1] == n_heads and d_model % n_heads == 0:  # headwise: the output cut into n_heads blocks
            out = (out.reshape(*out.shape[:-1], n_heads, -1) * G[..., None]).reshape(out.shape)
        else:
            return None
        if place == "after_o" and with_bias:
            out = out + p["b_o"]
        return out, weights
    if place == "none":
        gated, returned = heads, weights
    else:
        G_heads = _gate_in_heads(G, n_heads, head_dim, layout)  # broadcastable to (N, h, L_q, head_dim)
        if G_heads is None:
            return None
        gated = heads * G_heads
        returned = weights
        if place == "weights":  # headwise only: (G A) V = G (A V), so the output is right, the weights are not
            if G.shape[-1] != n_heads:
                return None
            returned = weights * G_heads
    out = project(_merge(gated, merge))
    return out, (returned.mean(axis=1) if average else returned)


def _sim_gated_values(x_q, x_kv, p, n_heads, mask=None, **mha_kw):
    """Each value v_j times the gate of its own key position, sigmoid(x_kv[j] W_gate + b_gate), before the weighted
    sum (query head i's copy of its key/value head gated with head i's gate); the rest the book's layer."""
    if mha_kw:
        return None
    head_dim = p["W_q"].shape[1] // n_heads
    n_kv_heads = p["W_k"].shape[1] // head_dim
    n_rep = n_heads // n_kv_heads

    def heads(x, name, n):
        y = x @ p[f"W_{name}"]
        return reference.split_heads(y + p[f"b_{name}"] if f"b_{name}" in p else y, n)

    q = heads(x_q, "q", n_heads)  # (N, h, L_q, head_dim)
    k = reference.repeat_kv(heads(x_kv, "k", n_kv_heads), n_rep)  # (N, h, L_kv, head_dim)
    v = reference.repeat_kv(heads(x_kv, "v", n_kv_heads), n_rep)  # (N, h, L_kv, head_dim)
    G = _gate_in_heads(_sigmoid(_gate_logits(x_kv, p)), n_heads, head_dim)  # (N, h, L_kv, 1 or head_dim)
    out, weights = reference.scaled_dot_product_attention(q, k, v * G, mask)
    out = reference.merge_heads(out) @ p["W_o"]
    return (out + p["b_o"] if "b_o" in p else out), weights


# When two bugs give the same result on a case, the first in the list is named.
_GATE_BUGS = [
    ("gate_missing", dict(place="none")),
    ("gate_no_sigmoid", dict(activation="none")),
    ("gate_silu", dict(activation="silu")),
    ("gate_bias_ignored", dict(gate_bias=False)),
    ("gate_after_output_projection", dict(place="after_o")),
    ("gate_after_output_projection", dict(place="after_o_bias")),
    ("gate_on_attention_weights", dict(place="weights")),
    ("gate_on_values", dict(place="values")),
    ("gate_from_kv_input", dict(source="x_kv")),
    ("gate_from_output", dict(source="concat")),
    ("gate_from_output", dict(source="output")),
    ("gate_tiled", dict(layout="tile")),
    ("gate_split_no_transpose", dict(layout="no_transpose")),
]


def gated_attention_variants(x_q, x_kv, params, n_heads, gate, mask):
    """check_gated_attention: where the gate sits, what it reads, its sigmoid and bias, how it meets the heads; then
    the multi-head layer's own bugs (simulators._MHA_BUGS) under a correct gate."""
    return _variants(_sim_gated, _GATE_BUGS + _MHA_BUGS, x_q, x_kv, params, n_heads, gate, mask)


# ---------------------------------------------------------------------------------------------------------------
# check_gated_attention
# ---------------------------------------------------------------------------------------------------------------


def _gated_case(label, rng, gate, *, N=2, L_q=5, L_kv=None, d_model=12, n_heads=3, n_kv_heads=None, head_dim=None,
                bias=True, mask=None, cross=False, gate_scale=2.0, gate_bias=None, non_contiguous=False, note=""):
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    head_dim = d_model // n_heads if head_dim is None else head_dim
    params = reference.init_params(d_model, n_heads, n_kv_heads, head_dim, bias=bias, gate=gate,
                                   seed=int(rng.integers(1 << 30)))
    params["W_gate"] = gate_scale * params["W_gate"]  # gates spread over (0, 1), not all near 1/2
    if gate_bias is not None:
        params["b_gate"] = gate_bias
    elif bias:
        params["b_gate"] = 10 * params["b_gate"]
    L_kv = L_q if L_kv is None else L_kv
    x_q = rng.standard_normal((N, L_q, d_model))
    x_kv = rng.standard_normal((N, L_kv, d_model)) if cross else x_q
    if non_contiguous:
        x_q, x_kv = transposed(x_q), transposed(x_kv)
        params["W_gate"] = transposed(params["W_gate"])
    kind = "cross-attention" if cross else "self-attention (x_kv is x_q)"
    name = (f"{label}: {gate} gate, {kind}, {shapes_of(x_q=x_q, x_kv=x_kv, W_gate=params['W_gate'])}, "
            f"n_heads={n_heads}, n_kv_heads={n_kv_heads}, head_dim={head_dim}, "
            f"{'with' if bias or gate_bias is not None else 'no'} biases, "
            + (f"mask {mask.shape}" if mask is not None else "mask=None"))
    kwargs = {"gate": gate} if mask is None else {"gate": gate, "mask": mask}
    expected = reference.multi_head_attention(x_q, x_kv, params, n_heads, mask, gate=gate)
    variants = gated_attention_variants(x_q, x_kv, params, n_heads, gate, mask)
    return Case(name, (x_q, x_kv, params, n_heads), kwargs, expected, variants, note)


@public_checker
def check_gated_attention(fn, *, backend: str = "auto", timeout: float | None = TIMEOUT) -> None:
    """Check ``fn(x_q, x_kv, params, n_heads, gate, mask=None) -> (out, weights)``: gated multi-head attention.

    The layer of ``check_multi_head_attention`` (the same ``params``, ``mask``, shapes and GQA convention) with an
    output gate (Qiu et al. 2025; Qwen3-Next): after the attention, each head's output ``Y_i`` (its rows
    ``sum_j a_ij v_j``) is multiplied by ``sigmoid(x_q W_gate + b_gate)``, computed from the *queries'* input, and
    only then are the heads merged and projected by ``W_o``::

        out = Concat(Y_1 * G_1, ..., Y_h * G_h) W^O + b^O,     G = sigmoid(x_q W_gate + b_gate)

    ``gate`` (always passed, as a keyword) is ``"headwise"``: ``params['W_gate']`` is ``(d_model, n_heads)``, one
    gate per head and query position, multiplying all head_dim coordinates of that head's output row; or
    ``"elementwise"``: ``W_gate`` is ``(d_model, n_heads*head_dim)``, one gate per coordinate, column block i gating
    head i (split like the queries). ``params['b_gate']`` (the gate's width) is there in some cases. The weights
    returned are the softmax's, not gated (each row sums to 1 over its allowed keys). ``mha.reference.
    multi_head_attention`` has this signature and passes.

    Cases: headwise and elementwise; with and without biases; L_q = n_heads; cross-attention with L_q = L_kv and
    with L_q != L_kv and a causal mask; GQA; head_dim != d_model / n_heads; query rows with no allowed key; one head;
    gates shut and fully open (logits in the thousands); a batch of one with one query; non-contiguous inputs.
    Book: part IV, 'Gated attention' (Eq. gate-layer); the layer itself: part I, 'From one head to h heads'.
    """
    rng = np.random.default_rng(2505)
    empty_rows = row_with_no_key(rng, (2, 3, 4, 6), 2)  # query 2 has no allowed key in any head
    shut_open = np.tile([-3000.0, 3000.0], 6)  # elementwise, 3 heads x 4: every other coordinate shut / open
    cases = [
        _gated_case("headwise, no biases, L_q = n_heads", rng, "headwise", L_q=3, bias=False,
                    note="A headwise gate is (N, L_q, h): move its head axis before it meets the (N, h, L_q, "
                         "head_dim) heads, G.transpose(0, 2, 1)[..., None]."),
        _gated_case("headwise, biases", rng, "headwise"),
        _gated_case("elementwise, biases", rng, "elementwise"),
        _gated_case("elementwise, L_q = L_kv, x_kv is not x_q", rng, "elementwise", L_q=4, cross=True,
                    note="The gate of query i is computed from x_q[:, i], the queries' input, never from x_kv."),
        _gated_case("headwise, L_q != L_kv, causal mask", rng, "headwise", L_q=3, L_kv=6, cross=True,
                    mask=reference.causal_mask(3, 6)),
        _gated_case("elementwise, GQA (groups of 2), causal mask", rng, "elementwise", d_model=16, n_heads=4,
                    n_kv_heads=2, mask=reference.causal_mask(5, 5),
                    note="The gate has one column block per *query* head (n_heads*head_dim columns), even when the "
                         "key/value heads are shared."),
        _gated_case("elementwise, head_dim != d_model / n_heads", rng, "elementwise", d_model=8, n_heads=2,
                    head_dim=6,
                    note="Here head_dim = 6, not d_model / n_heads = 4: read it from the weights, head_dim = "
                         "W_q.shape[1] // n_heads; W_gate is (d_model, n_heads*head_dim) = (8, 12)."),
        _gated_case("headwise, query rows with no allowed key", rng, "headwise", L_q=4, L_kv=6, cross=True,
                    mask=empty_rows,
                    note="A query row with no allowed key gets zero weights and a zero head output; gated, it "
                         "stays zero, so its output row is b_o."),
        _gated_case("headwise, one head", rng, "headwise", d_model=8, n_heads=1),
        _gated_case("elementwise, gates shut and fully open (logits in the thousands)", rng, "elementwise",
                    gate_scale=0.0, gate_bias=shut_open,
                    note="sigmoid(-3000) is 0 and sigmoid(3000) is 1: 1 / (1 + exp(-a)) gets there (exp overflows "
                         "to inf, 1 / inf = 0), exp(a) / (1 + exp(a)) gives inf / inf = NaN."),
        _gated_case("headwise, a batch of one, one query", rng, "headwise", N=1, L_q=1, L_kv=4, cross=True),
        _gated_case("elementwise, non-contiguous x_q, x_kv and W_gate (transposed views)", rng, "elementwise",
                    L_q=4, L_kv=5, cross=True, non_contiguous=True),
    ]
    outputs = (
        Output("out", "Concat(Y_1 * G_1, ..., Y_h * G_h) W^O + b^O with G = sigmoid(x_q W_gate + b_gate), each "
                      "head's output gated before W^O", EQ_GATE_LAYER),
        Output("weights", "softmax(Q_i K_i^T / sqrt(head_dim)) for every head i, not gated", EQ_MHA_HEAD),
    )
    run_cases("check_gated_attention", fn, backend, ("x_q", "x_kv", "params", "n_heads"), outputs, cases, timeout)
