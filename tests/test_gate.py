"""Gated attention (Qiu et al. 2025; Qwen3-Next's full-attention layers) and partial RoPE, in ``mha.reference`` and in
``mha.MultiHeadAttention``.

Each is checked against something written here, independently of the package:

* ``spelled_out``: the layer by its definition in NumPy, one Python loop over sequences, heads and queries, with the
  per-head blocks of the matrices, RoPE by explicit 2x2 rotations of the pairs Hugging Face's ``apply_rotary_pos_emb``
  rotates when its cos/sin are narrower than the head (pairs (j, j + r/2) of the first r coordinates, frequencies
  base^(-2j/r)), a softmax over the allowed keys (and the sink), and the gate sigmoid(x_q . w + b) of each head (one
  number) or of each coordinate, multiplying the head's output before W_o;
* ``torch_layer``: the batched layer in torch, float64, RoPE as complex multiplication, and torch autograd through it
  (for the hand-derived backward, ``multi_head_attention_grad``);
* analytic cases: W_gate = 0 makes the gate the constant sigmoid(b_gate); a gate fully open or shut;
* the module's own full forward (for KV-cache decoding) and the NumPy reference (for the module).

Hugging Face's Qwen3-Next is in tests/test_from_hf_qwen3next.py.
"""

import math

import numpy as np
import pytest
import torch

from mha import MultiHeadAttention
from mha import reference as R

from _params import randn

torch.set_num_threads(1)
F64 = torch.float64
TIGHT = dict(rtol=1e-10, atol=1e-12)
GRAD = dict(rtol=1e-9, atol=1e-11)
GATES = ["headwise", "elementwise"]


def gate_params(d_model=12, h=4, g=2, hd=6, gate="elementwise", bias=True, qk_norm=False, sinks=False, seed=0):
    """init_params with the gate, its bias and the other extras scaled up so that every part matters."""
    p = R.init_params(d_model, h, g, hd, bias=bias, seed=seed, qk_norm=qk_norm, sinks=sinks, gate=gate)
    if qk_norm:  # visibly not the all-ones start
        rng = np.random.default_rng(seed + 7)
        p["q_norm"], p["k_norm"] = 1 + 0.3 * rng.standard_normal(hd), 1 + 0.3 * rng.standard_normal(hd)
    if gate is not None:  # gates spread over (0, 1), not all near 1/2
        p["W_gate"] = 3 * p["W_gate"]
        if bias:
            p["b_gate"] = 10 * p["b_gate"]
    return p


# ------------------------------------------------------------------------------------ the spelled-out layer
def _sigmoid(a):
    return 1.0 / (1.0 + math.exp(-a))


def _rotate_pairs(x, positions, base, r):
    """x (L, hd): pairs (j, j + r/2), j < r/2, turned by position * base^(-2j/r); coordinates >= r untouched."""
    out = x.copy()
    for t in range(x.shape[0]):
        for j in range(r // 2):
            a, b = x[t, j], x[t, j + r // 2]
            angle = int(positions[t]) * base ** (-2 * j / r)
            out[t, j] = a * math.cos(angle) - b * math.sin(angle)
            out[t, j + r // 2] = a * math.sin(angle) + b * math.cos(angle)
    return out


def spelled_out(x_q, x_kv, p, h, gate, *, causal=False, window=None, rope_base=None, rope_dim=None, pos_q=None,
                pos_kv=None, eps=1e-6):
    """The layer by its definition: x_q (N, L_q, d), x_kv (N, L_kv, d) -> out (N, L_q, d). Causal and window are
    bottom-right aligned (query t is at sequence index L_kv - L_q + t)."""
    N, L_q, d = x_q.shape
    L_kv = x_kv.shape[1]
    hd = p["W_q"].shape[1] // h
    g = p["W_k"].shape[1] // hd
    zeros = np.zeros(max(p["W_q"].shape[1], p["W_o"].shape[1], h * hd))
    out = np.zeros((N, L_q, d))
    for b in range(N):
        for i in range(h):
            c = i // (h // g)  # the key/value head of query head i
            qi, ci = slice(i * hd, (i + 1) * hd), slice(c * hd, (c + 1) * hd)
            q = x_q[b] @ p["W_q"][:, qi] + p.get("b_q", zeros)[qi]
            k = x_kv[b] @ p["W_k"][:, ci] + p.get("b_k", zeros)[ci]
            v = x_kv[b] @ p["W_v"][:, ci] + p.get("b_v", zeros)[ci]
            if "q_norm" in p:
                q = q / np.sqrt((q * q).mean(-1, keepdims=True) + eps) * p["q_norm"]
                k = k / np.sqrt((k * k).mean(-1, keepdims=True) + eps) * p["k_norm"]
            if rope_base is not None:
                r = hd if rope_dim is None else rope_dim
                q = _rotate_pairs(q, pos_q, rope_base, r)
                k = _rotate_pairs(k, pos_kv, rope_base, r)
            head = np.zeros((L_q, hd))
            for t in range(L_q):
                now = L_kv - L_q + t
                keys = [j for j in range(L_kv)
                        if (not causal or j <= now) and (window is None or now - window < j <= now)]
                logits = [float(q[t] @ k[j]) / math.sqrt(hd) for j in keys]
                if "sinks" in p:
                    logits.append(float(p["sinks"][i]))
                top = max(logits)
                e = [math.exp(s - top) for s in logits]
                for n, j in enumerate(keys):
                    head[t] += e[n] / sum(e) * v[j]
                if gate == "headwise":
                    head[t] *= _sigmoid(float(x_q[b, t] @ p["W_gate"][:, i]) + p.get("b_gate", zeros)[i])
                elif gate == "elementwise":
                    for col in range(hd):
                        a = float(x_q[b, t] @ p["W_gate"][:, i * hd + col]) + p.get("b_gate", zeros)[i * hd + col]
                        head[t, col] *= _sigmoid(a)
            out[b] += head @ p["W_o"][qi, :]
        out[b] += p.get("b_o", zeros[:d])
    return out


LOOP_CASES = {  # keywords of the layer, and the params' extras
    "plain": (dict(), dict()),
    "causal-gqa": (dict(is_causal=True), dict()),
    "partial-rope": (dict(is_causal=True, rope_base=100.0, rope_dim=4), dict()),
    "rope-whole-head": (dict(is_causal=True, rope_base=30.0), dict()),
    "everything": (dict(is_causal=True, rope_base=50.0, rope_dim=4, window=3), dict(qk_norm=True, sinks=True)),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("case", list(LOOP_CASES))
@pytest.mark.parametrize("gate", GATES)
def test_reference_matches_the_spelled_out_loop(gate, case, bias):
    kw, extras = LOOP_CASES[case]
    p = gate_params(gate=gate, bias=bias, **extras)
    x = np.random.default_rng(1).standard_normal((2, 6, 12))
    out, _ = R.multi_head_attention(x, None, p, 4, gate=gate, **kw)
    pos = np.arange(6)
    expected = spelled_out(x, x, p, 4, gate, causal=kw.get("is_causal", False), window=kw.get("window"),
                           rope_base=kw.get("rope_base"), rope_dim=kw.get("rope_dim"), pos_q=pos, pos_kv=pos)
    np.testing.assert_allclose(out, expected, **TIGHT)
    ungated, _ = R.multi_head_attention(x, None, {k: v for k, v in p.items() if "gate" not in k}, 4, **kw)
    assert np.abs(out - ungated).max() > 0.1  # the gate is visible


@pytest.mark.parametrize("gate", GATES)
def test_reference_cross_attention_gates_from_the_query_side(gate):
    rng = np.random.default_rng(2)
    p = gate_params(gate=gate, sinks=True)
    x_q, x_kv = rng.standard_normal((2, 3, 12)), rng.standard_normal((2, 7, 12))
    pos_q, pos_kv = 4 + np.arange(3), np.arange(7)
    kw = dict(rope_base=100.0, rope_dim=4, positions=(pos_q, pos_kv), is_causal=True)
    out, _ = R.multi_head_attention(x_q, x_kv, p, 4, gate=gate, **kw)
    expected = spelled_out(x_q, x_kv, p, 4, gate, causal=True, rope_base=100.0, rope_dim=4, pos_q=pos_q,
                           pos_kv=pos_kv)
    np.testing.assert_allclose(out, expected, **TIGHT)


def test_partial_rope_of_the_whole_head_is_rope_and_odd_heads_work():
    p = gate_params(d_model=10, h=2, g=1, hd=5, gate=None)  # head_dim 5: only rope_dim needs to be even
    x = np.random.default_rng(3).standard_normal((1, 7, 10))
    out, _ = R.multi_head_attention(x, None, p, 2, is_causal=True, rope_base=10.0, rope_dim=4)
    pos = np.arange(7)
    np.testing.assert_allclose(out, spelled_out(x, x, p, 2, None, causal=True, rope_base=10.0, rope_dim=4,
                                                pos_q=pos, pos_kv=pos), **TIGHT)
    p, x = gate_params(gate=None), np.random.default_rng(3).standard_normal((1, 7, 12))
    whole, _ = R.multi_head_attention(x, None, p, 4, is_causal=True, rope_base=10.0)
    same, _ = R.multi_head_attention(x, None, p, 4, is_causal=True, rope_base=10.0, rope_dim=6)  # = head_dim
    np.testing.assert_array_equal(whole, same)


def test_partial_rope_scores_depend_only_on_relative_positions():
    """Shifting every position by the same amount changes nothing (the rotated part turns by the difference, the
    rest does not turn at all)."""
    p = gate_params(gate="headwise")
    x = np.random.default_rng(4).standard_normal((2, 6, 12))
    kw = dict(is_causal=True, rope_base=20.0, rope_dim=4, gate="headwise")
    a, wa = R.multi_head_attention(x, None, p, 4, positions=np.arange(6), **kw)
    b, wb = R.multi_head_attention(x, None, p, 4, positions=np.arange(6) + 37, **kw)
    np.testing.assert_allclose(a, b, **TIGHT)
    np.testing.assert_allclose(wa, wb, **TIGHT)
    c, _ = R.multi_head_attention(x, None, p, 4, positions=np.array([0, 1, 2, 3, 5, 4]), **kw)
    assert np.abs(c - a).max() > 1e-3  # but positions matter


# ----------------------------------------------------------------------------------------- analytic cases
@pytest.mark.parametrize("gate", GATES)
def test_a_zero_gate_projection_scales_each_head_by_sigmoid_of_its_bias(gate):
    """W_gate = 0: the gate is sigmoid(b_gate), a constant. One constant c for every head and coordinate scales the
    whole pre-bias output by sigmoid(c); b_gate = 0 halves it; +-1000 opens it fully or shuts it (no overflow)."""
    p = gate_params(gate=gate, qk_norm=True, sinks=True)
    x = np.random.default_rng(5).standard_normal((2, 5, 12))
    kw = dict(is_causal=True, rope_base=100.0, rope_dim=4)
    plain = {k: v for k, v in p.items() if "gate" not in k}
    ungated, weights = R.multi_head_attention(x, None, plain, 4, **kw)
    width = p["W_gate"].shape[1]
    for c in (0.0, 1.3, -2.0):
        q = dict(p, W_gate=np.zeros_like(p["W_gate"]), b_gate=np.full(width, c))
        out, w = R.multi_head_attention(x, None, q, 4, gate=gate, **kw)
        np.testing.assert_allclose(out - p["b_o"], (ungated - p["b_o"]) / (1 + math.exp(-c)), **TIGHT)
        np.testing.assert_array_equal(w, weights)  # the weights are the softmax's, ungated
    shut, _ = R.multi_head_attention(x, None, dict(q, b_gate=np.full(width, -1000.0)), 4, gate=gate, **kw)
    np.testing.assert_array_equal(shut, np.broadcast_to(p["b_o"], shut.shape))
    opened, _ = R.multi_head_attention(x, None, dict(q, b_gate=np.full(width, 1000.0)), 4, gate=gate, **kw)
    np.testing.assert_allclose(opened, ungated, **TIGHT)
    # one constant per head: the output is the sum over heads of sigmoid(b_i) head_i W_o_i (+ b_o)
    b_heads = np.array([-1.0, 0.5, 2.0, -3.0])
    q = dict(p, W_gate=np.zeros_like(p["W_gate"]), b_gate=np.repeat(b_heads, width // 4))
    out, _ = R.multi_head_attention(x, None, q, 4, gate=gate, **kw)
    expected = p["b_o"] + sum(
        R.multi_head_attention(x, None, dict(plain, W_o=plain["W_o"] * (np.arange(24) // 6 == i)[:, None],
                                             b_o=np.zeros(12)), 4, **kw)[0] / (1 + math.exp(-b_heads[i]))
        for i in range(4))
    np.testing.assert_allclose(out, expected, **TIGHT)


@pytest.mark.parametrize("gate", GATES)
def test_module_zero_gate_projection_is_sigmoid_of_the_bias(gate):
    m = MultiHeadAttention(12, 4, 2, head_dim=6, gate=gate, rope_base=100.0, rope_dim=4).double().eval()
    plain = MultiHeadAttention(12, 4, 2, head_dim=6, rope_base=100.0, rope_dim=4).double().eval()
    plain.load_state_dict({k: v for k, v in m.state_dict().items() if "gate" not in k})
    with torch.no_grad():
        m.gate_proj.weight.zero_()
        m.gate_proj.bias.fill_(0.7)
        x = randn(2, 5, 12)
        out, _ = m(x, is_causal=True)
        ref, _ = plain(x, is_causal=True)
    b_o = m.o_proj.bias
    torch.testing.assert_close(out - b_o, (ref - b_o) / (1 + math.exp(-0.7)), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------- hand backward vs autograd
def _rope_complex(x, positions, base, r):
    """RoPE on the first r coordinates as complex multiplication: (x_j + i x_{j+r/2}) e^{i pos base^(-2j/r)}."""
    z = torch.complex(x[..., : r // 2], x[..., r // 2: r])
    theta = base ** (-torch.arange(0, r, 2, dtype=F64) / r)
    angles = torch.as_tensor(positions, dtype=F64)[..., None] * theta  # (L, r/2) or (N, L, r/2)
    if angles.ndim == 3:
        angles = angles[:, None]  # (N, 1, L, r/2)
    z = z * torch.polar(torch.ones_like(angles), angles)
    return torch.cat([z.real, z.imag, x[..., r:]], dim=-1)


def torch_layer(X_q, X_kv, P, h, gate, *, mask=None, rope_base=None, rope_dim=None, pos_q=None, pos_kv=None,
                eps=1e-6):
    """The batched layer in torch (for autograd): X (N, L, d), P a dict of float64 tensors, mask (.., L_q, L_kv)."""
    N, L_q, _ = X_q.shape
    hd = P["W_q"].shape[1] // h
    g = P["W_k"].shape[1] // hd

    def heads(X, name, n):
        y = X @ P[f"W_{name}"] + (P[f"b_{name}"] if f"b_{name}" in P else 0.0)
        return y.view(N, X.shape[1], n, -1).transpose(1, 2)

    q, k, v = heads(X_q, "q", h), heads(X_kv, "k", g), heads(X_kv, "v", g)
    if "q_norm" in P:
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) * P["q_norm"]
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps) * P["k_norm"]
    if rope_base is not None:
        r = hd if rope_dim is None else rope_dim
        q, k = _rope_complex(q, pos_q, rope_base, r), _rope_complex(k, pos_kv, rope_base, r)
    k, v = k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(hd)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if "sinks" in P:
        s = torch.cat([s, P["sinks"].view(1, h, 1, 1).expand(N, h, L_q, 1)], dim=-1)
        a = torch.softmax(s, dim=-1)[..., :-1]
    else:
        a = torch.softmax(s, dim=-1)
    o = a @ v  # (N, h, L_q, hd)
    if gate is not None:
        G = torch.sigmoid(X_q @ P["W_gate"] + (P["b_gate"] if "b_gate" in P else 0.0))
        o = o * G.view(N, L_q, h, -1).transpose(1, 2)  # (N, h, L_q, 1 or hd)
    return o.transpose(1, 2).reshape(N, L_q, -1) @ P["W_o"] + (P["b_o"] if "b_o" in P else 0.0)


def _mask(L_q, L_kv, causal, window):
    now = torch.arange(L_q)[:, None] + L_kv - L_q
    j = torch.arange(L_kv)[None, :]
    ok = (j <= now) if causal or window else torch.ones(L_q, L_kv, dtype=torch.bool)
    return ok & (j > now - window) if window else ok


GRAD_CASES = {  # (N (0: unbatched), L_q, L_kv (None: self-attention), layer keywords, params extras)
    "self-gqa-partial-rope-everything": (2, 6, None, dict(is_causal=True, rope_base=50.0, rope_dim=4, window=4),
                                         dict(qk_norm=True, sinks=True)),
    "self-plain": (2, 5, None, dict(), dict()),
    "cross-cache-like": (2, 3, 7, dict(is_causal=True, rope_base=100.0, rope_dim=4), dict(sinks=True)),
    "unbatched-full-rope": (0, 5, None, dict(is_causal=True, rope_base=10.0), dict(qk_norm=True)),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("case", list(GRAD_CASES))
@pytest.mark.parametrize("gate", GATES)
def test_hand_backward_matches_autograd(gate, case, bias):
    N, L_q, L_kv, kw, extras = GRAD_CASES[case]
    p = gate_params(gate=gate, bias=bias, **extras)
    rng = np.random.default_rng(6)
    n = max(N, 1)
    x_q = rng.standard_normal((n, L_q, 12))
    x_kv = None if L_kv is None else rng.standard_normal((n, L_kv, 12))
    l_kv = L_q if L_kv is None else L_kv
    dO = rng.standard_normal((n, L_q, 12))
    kw = dict(kw)
    pos_q, pos_kv = l_kv - L_q + np.arange(L_q), np.arange(l_kv)
    if L_kv is not None and "rope_base" in kw:
        kw["positions"] = (pos_q, pos_kv)
    if N == 0:
        x_q, dO = x_q[0], dO[0]
    grads = R.multi_head_attention_grad(x_q, x_kv, p, 4, dO, gate=gate, **kw)

    P = {key: torch.tensor(value, requires_grad=True) for key, value in p.items()}
    X_q = torch.tensor(x_q if N else x_q[None], requires_grad=True)
    X_kv = X_q if x_kv is None else torch.tensor(x_kv, requires_grad=True)
    mask = _mask(L_q, l_kv, kw.get("is_causal", False), kw.get("window"))
    out = torch_layer(X_q, X_kv, P, 4, gate, mask=mask, rope_base=kw.get("rope_base"), rope_dim=kw.get("rope_dim"),
                      pos_q=pos_q, pos_kv=pos_kv)
    np.testing.assert_allclose(R.multi_head_attention(x_q, x_kv, p, 4, gate=gate, **kw)[0],
                               (out if N else out[0]).detach().numpy(), **TIGHT)
    (out * torch.tensor(dO if N else dO[None])).sum().backward()
    assert set(grads) == set(p) | {"x_q", "x_kv"}
    assert ("b_gate" in grads) == bias and "W_gate" in grads
    for key, leaf in dict(P, x_q=X_q).items():
        expected = leaf.grad.numpy() if (N or key != "x_q") else leaf.grad.numpy()[0]
        np.testing.assert_allclose(grads[key], expected, err_msg=key, **GRAD)
    if x_kv is None:
        assert grads["x_kv"] is None
    else:
        np.testing.assert_allclose(grads["x_kv"], X_kv.grad.numpy(), **GRAD)


@pytest.mark.parametrize("gate", GATES)
def test_gate_gradients_match_central_finite_differences(gate):
    """Autograd-free: W_gate, b_gate and x_q (which the gate reads) at a few coordinates."""
    p = gate_params(d_model=6, h=2, g=1, hd=3, gate=gate, sinks=True)
    rng = np.random.default_rng(8)
    x, dO = rng.standard_normal((1, 4, 6)), rng.standard_normal((1, 4, 6))
    kw = dict(is_causal=True, rope_base=100.0, rope_dim=2, gate=gate)
    grads = R.multi_head_attention_grad(x, None, p, 2, dO, **kw)

    def loss(x_, p_):
        return float(np.sum(R.multi_head_attention(x_, None, p_, 2, **kw)[0] * dO))

    eps = 1e-6
    for key in ("W_gate", "b_gate", "x_q"):
        target = x if key == "x_q" else p[key]
        for idx in list(np.ndindex(target.shape))[::3][:5]:
            values = []
            for sign in (1, -1):
                changed = target.copy()
                changed[idx] += sign * eps
                values.append(loss(changed, p) if key == "x_q" else loss(x, {**p, key: changed}))
            assert grads[key][idx] == pytest.approx((values[0] - values[1]) / (2 * eps), rel=1e-6, abs=1e-8)


# ------------------------------------------------------------------------------------------- the module
def module_for(p, gate, impl="sdpa", **kwargs):
    h, hd = 4, p["W_q"].shape[1] // 4
    m = MultiHeadAttention(p["W_q"].shape[0], h, p["W_k"].shape[1] // hd, head_dim=hd, bias="b_q" in p, impl=impl,
                           gate=gate, qk_norm="q_norm" in p, sinks="sinks" in p, **kwargs).double().eval()
    m.load_params(p)
    return m


MODULE_CASES = {  # (module keywords, params extras, reference-only keywords)
    "gqa-rope": (dict(rope_base=100.0), dict()),
    "gqa-partial-rope": (dict(rope_base=100.0, rope_dim=4), dict()),
    "partial-rope-interleaved": (dict(rope_base=30.0, rope_dim=4, rope_style="interleaved"), dict()),
    "sinks-window": (dict(window=3), dict(sinks=True)),
    "everything": (dict(rope_base=50.0, rope_dim=4, window=3, softcap=2.0), dict(qk_norm=True, sinks=True)),
}


@pytest.mark.parametrize("impl", ["sdpa", "naive"])
@pytest.mark.parametrize("case", list(MODULE_CASES))
@pytest.mark.parametrize("gate", GATES)
def test_module_matches_the_reference(gate, case, impl):
    kw, extras = MODULE_CASES[case]
    p = gate_params(gate=gate, **extras)
    m = module_for(p, gate, impl, **kw)
    x = np.random.default_rng(9).standard_normal((2, 7, 12))
    expected, weights = R.multi_head_attention(x, None, p, 4, is_causal=True, gate=gate, **kw)
    with torch.no_grad():
        out, w = m(torch.tensor(x), is_causal=True)
        fast, _ = m(torch.tensor(x), is_causal=True, need_weights=False)
        single, _ = m(torch.tensor(x[1]), is_causal=True)  # unbatched
    np.testing.assert_allclose(out.numpy(), expected, **TIGHT)
    np.testing.assert_allclose(fast.numpy(), expected, **TIGHT)
    np.testing.assert_allclose(single.numpy(), expected[1], **TIGHT)
    np.testing.assert_allclose(w.numpy(), weights, **TIGHT)
    exported = m.export_params()
    assert set(exported) == set(p) and all(np.array_equal(exported[k], p[k]) for k in p)


@pytest.mark.parametrize("impl", ["sdpa", "naive"])
@pytest.mark.parametrize("gate", GATES)
def test_module_with_a_padding_mask_and_cross_attention_matches_the_reference(gate, impl):
    p = gate_params(gate=gate, sinks=True)
    m = module_for(p, gate, impl)
    rng = np.random.default_rng(10)
    x_q, x_kv = rng.standard_normal((2, 4, 12)), rng.standard_normal((2, 6, 12))
    mask = np.ones((2, 1, 1, 6), dtype=bool)
    mask[0, ..., 4:] = False
    expected, _ = R.multi_head_attention(x_q, x_kv, p, 4, mask=mask, gate=gate)
    with torch.no_grad():
        out, _ = m(torch.tensor(x_q), torch.tensor(x_kv), mask=torch.tensor(mask), need_weights=False)
    np.testing.assert_allclose(out.numpy(), expected, **TIGHT)


@pytest.mark.parametrize("gate", GATES)
def test_module_gradients_match_the_hand_derived_ones(gate):
    p = gate_params(gate=gate, qk_norm=True, sinks=True)
    kw = dict(rope_base=50.0, rope_dim=4, window=4)
    m = module_for(p, gate, "naive", **kw)
    rng = np.random.default_rng(11)
    x, dO = rng.standard_normal((2, 6, 12)), rng.standard_normal((2, 6, 12))
    grads = R.multi_head_attention_grad(x, None, p, 4, dO, is_causal=True, gate=gate, **kw)
    X = torch.tensor(x, requires_grad=True)
    out, _ = m(X, is_causal=True, need_weights=False)
    (out * torch.tensor(dO)).sum().backward()
    np.testing.assert_allclose(m.gate_proj.weight.grad.T.numpy(), grads["W_gate"], **GRAD)
    np.testing.assert_allclose(m.gate_proj.bias.grad.numpy(), grads["b_gate"], **GRAD)
    np.testing.assert_allclose(m.q_proj.weight.grad.T.numpy(), grads["W_q"], **GRAD)
    np.testing.assert_allclose(X.grad.numpy(), grads["x_q"], **GRAD)


def test_module_parameters_state_dict_and_repr():
    plain = MultiHeadAttention(16, 4)
    assert plain.gate is None and plain.gate_proj is None and plain.rope_dim is None
    assert "gate" not in repr(plain) and "rope_dim" not in repr(plain)
    keys = list(plain.state_dict())
    head = MultiHeadAttention(16, 4, gate="headwise")
    elem = MultiHeadAttention(16, 4, bias=False, gate="elementwise", rope_base=10.0, rope_dim=2)
    assert list(head.state_dict()) == keys + ["gate_proj.weight", "gate_proj.bias"]
    assert head.gate_proj.weight.shape == (4, 16) and elem.gate_proj.weight.shape == (16, 16)
    assert elem.gate_proj.bias is None and elem.rope_dim == 2
    assert MultiHeadAttention(16, 4, rope_base=10.0).rope_dim == 4  # the whole head
    assert "gate='headwise'" in repr(head) and "rope_dim=2" in repr(elem) and "gate='elementwise'" in repr(elem)
    assert sorted(elem.export_params()) == ["W_gate", "W_k", "W_o", "W_q", "W_v"]
    assert head.export_params()["W_gate"].shape == (16, 4) and head.export_params()["b_gate"].shape == (4,)
    torch.manual_seed(0)
    a = MultiHeadAttention(16, 4)
    torch.manual_seed(0)
    b = MultiHeadAttention(16, 4, gate="elementwise")  # the gate's weights are drawn last: the others are the same
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in keys)


# ------------------------------------------------------------------------------------------- decoding
CACHE_CASES = {
    "full-cache": dict(n_kv_heads=2, rope_base=100.0, rope_dim=4, qk_norm=True),
    "ring-buffer": dict(n_kv_heads=2, rope_base=100.0, rope_dim=4, window=3, sinks=True),
}


@pytest.mark.parametrize("impl", ["sdpa", "naive"])
@pytest.mark.parametrize("chunks", [[1] * 11, [4, 1, 3, 1, 2]], ids=["one-token", "chunked"])
@pytest.mark.parametrize("case", list(CACHE_CASES))
@pytest.mark.parametrize("gate", GATES)
def test_decoding_with_a_kv_cache_equals_recomputation(gate, case, chunks, impl):
    torch.manual_seed(3)
    m = MultiHeadAttention(12, 4, head_dim=6, impl=impl, gate=gate, **CACHE_CASES[case]).double().eval()
    with torch.no_grad():
        for prm in m.parameters():
            prm.normal_(0.0, 0.6)
    x = randn(2, 11, 12, seed=4)
    with torch.no_grad():
        expected, _ = m(x, is_causal=True, need_weights=False)
        cache = m.new_cache(2, 11)
        outs, start = [], 0
        for size in chunks:
            outs.append(m(x[:, start:start + size], kv_cache=cache, is_causal=True, need_weights=False)[0])
            start += size
    torch.testing.assert_close(torch.cat(outs, 1), expected, rtol=1e-10, atol=1e-10)
    assert cache.length == 11
    p = m.export_params()  # and the reference, by recomputation
    kw = {k: v for k, v in CACHE_CASES[case].items() if k in ("rope_base", "rope_dim", "window")}
    full, _ = R.multi_head_attention(x.numpy(), None, p, 4, is_causal=True, gate=gate, **kw)
    np.testing.assert_allclose(expected.numpy(), full, **TIGHT)


@pytest.mark.parametrize("gate", GATES)
def test_reference_cache_identity_with_a_gate_and_partial_rope(gate):
    """The last queries against every key (positions (L_kv - L_q + i, j)) are the last rows of the full layer."""
    p = gate_params(gate=gate, qk_norm=True)
    x = np.random.default_rng(12).standard_normal((2, 9, 12))
    kw = dict(is_causal=True, rope_base=100.0, rope_dim=4, gate=gate)
    full, _ = R.multi_head_attention(x, None, p, 4, **kw)
    for start in (0, 5, 8):
        part, _ = R.multi_head_attention(x[:, start:], x, p, 4, positions=(start + np.arange(9 - start), np.arange(9)),
                                         **kw)
        np.testing.assert_allclose(part, full[:, start:], **TIGHT)


# ---------------------------------------------------------------------------------------------- errors
P_GATE = gate_params(gate="elementwise")
P_HEAD = gate_params(gate="headwise")
P_PLAIN = gate_params(gate=None)
X = np.zeros((1, 3, 12))


def _without(p, *keys):
    return {k: v for k, v in p.items() if k not in keys}


REFERENCE_ERRORS = [
    (dict(params=P_GATE, gate="both"), ValueError, r"gate must be one of None, 'headwise', 'elementwise', got 'both'"),
    (dict(params=P_GATE, gate=1), TypeError, r"gate must be one of None, 'headwise', 'elementwise', got 1 of type int"),
    (dict(params=P_PLAIN, gate="headwise"), ValueError,
     r"gate='headwise' needs params\['W_gate'\] .* but params has none"),
    (dict(params=P_GATE), ValueError, r"params has 'W_gate' \(shape \(12, 24\)\) but gate is None"),
    (dict(params=P_GATE, gate="headwise"), ValueError,
     r"gate='headwise' needs params\['W_gate'\] of shape \(d_model, n_heads\) = \(12, 4\), got \(12, 24\)"),
    (dict(params=P_HEAD, gate="elementwise"), ValueError,
     r"gate='elementwise' needs params\['W_gate'\] of shape \(d_model, n_heads\*head_dim\) = \(12, 24\), "
     r"got \(12, 4\)"),
    (dict(params=dict(P_GATE, W_gate=np.zeros((12, 5)), b_gate=np.zeros(5)), gate="elementwise"), ValueError,
     r"params\['W_gate'\] must have shape \(d_model, n_heads\) = \(12, 4\) \(headwise gate\) or \(d_model, "
     r"n_heads\*head_dim\) = \(12, 24\) \(elementwise gate\), got \(12, 5\)"),
    (dict(params=dict(P_GATE, W_gate=np.zeros((11, 24))), gate="elementwise"), ValueError,
     r"params\['W_gate'\] must have shape .* got \(11, 24\)"),
    (dict(params=dict(P_GATE, W_gate=np.zeros(24)), gate="elementwise"), ValueError,
     r"params\['W_gate'\] must have shape .* got \(24,\)"),
    (dict(params=dict(P_GATE, b_gate=np.zeros(4)), gate="elementwise"), ValueError,
     r"params\['b_gate'\] must have shape \(W_gate.shape\[1\],\) = \(24,\), got \(4,\)"),
    (dict(params=_without(P_GATE, "W_gate"), gate="elementwise"), ValueError,
     r"params has 'b_gate' but not 'W_gate'"),
    (dict(params=dict(P_GATE, W_gate=np.full((12, 24), np.nan)), gate="elementwise"), ValueError,
     r"params\['W_gate'\] contains NaN or inf"),
    (dict(params=dict(P_GATE, W_gate=np.full((12, 24), "a")), gate="elementwise"), TypeError,
     r"params\['W_gate'\] must be a real numeric array"),
    (dict(params=P_PLAIN, rope_base=10.0, rope_dim=3), ValueError, r"rope_dim must be even .* got rope_dim = 3"),
    (dict(params=P_PLAIN, rope_base=10.0, rope_dim=8), ValueError,
     r"rope_dim must be an integer in \[2, 6\], got 8"),
    (dict(params=P_PLAIN, rope_base=10.0, rope_dim=0), ValueError, r"rope_dim must be an integer in \[2, 6\], got 0"),
    (dict(params=P_PLAIN, rope_base=10.0, rope_dim=2.0), TypeError,
     r"rope_dim must be an integer in \[2, 6\], got 2.0"),
    (dict(params=P_PLAIN, rope_dim=2), ValueError, r"rope_dim = 2 is given but rope_base is None"),
]


@pytest.mark.parametrize("kwargs,error,match", REFERENCE_ERRORS)
@pytest.mark.parametrize("function", ["forward", "grad"])
def test_reference_refuses_bad_gates_and_rope_dims(function, kwargs, error, match):
    kwargs = dict(kwargs)
    params = kwargs.pop("params")
    with pytest.raises(error, match=match):
        if function == "forward":
            R.multi_head_attention(X, None, params, 4, **kwargs)
        else:
            R.multi_head_attention_grad(X, None, params, 4, np.zeros_like(X), **kwargs)


def test_other_reference_functions_and_init_params_with_gates():
    with pytest.raises(ValueError, match=r"computes the plain layer, but params has \['W_gate', 'b_gate'\]"):
        R.multi_head_attention_per_head(X, None, P_GATE, 4)
    with pytest.raises(ValueError, match=r"gate must be one of None, 'headwise', 'elementwise', got 'yes'"):
        R.init_params(12, 4, gate="yes")
    plain, gated = R.init_params(12, 4, 2, 4, seed=5), R.init_params(12, 4, 2, 4, seed=5, gate="headwise")
    assert set(gated) - set(plain) == {"W_gate", "b_gate"} and all(np.array_equal(plain[k], gated[k]) for k in plain)
    assert gated["W_gate"].shape == (12, 4) and gated["b_gate"].shape == (4,)
    nobias = R.init_params(12, 4, 2, 4, bias=False, gate="elementwise")
    assert nobias["W_gate"].shape == (12, 16) and "b_gate" not in nobias
    assert "W_gate" not in R.head_weights(P_GATE, 4)[0]
    p, dims = R.check_params(P_HEAD, 4)
    assert p["W_gate"].shape == (12, 4) and dims.head_dim == 6
    # head_dim 1: the two widths coincide, and the gate keyword says which it is
    q = R.init_params(4, 4, head_dim=1, gate="headwise")
    a, _ = R.multi_head_attention(X[..., :4], None, q, 4, gate="headwise")
    b, _ = R.multi_head_attention(X[..., :4], None, q, 4, gate="elementwise")
    np.testing.assert_array_equal(a, b)


MODULE_ERRORS = [
    (dict(gate="both"), ValueError, r"gate must be one of None, 'headwise', 'elementwise', got 'both'"),
    (dict(gate=True), TypeError, r"gate must be one of None, 'headwise', 'elementwise', got True of type bool"),
    (dict(rope_base=10.0, rope_dim=3), ValueError, r"rope_dim must be even .* got rope_dim = 3"),
    (dict(rope_base=10.0, rope_dim=8), ValueError, r"rope_dim must be an integer in \[2, 4\], got 8"),
    (dict(rope_base=10.0, rope_dim="2"), TypeError, r"rope_dim must be an integer in \[2, 4\], got '2'"),
    (dict(rope_dim=2), ValueError, r"rope_dim = 2 is given but rope_base is None"),
    (dict(impl="triton", gate="headwise"), ValueError,
     r"impl='triton' .* no output gate either\) takes none of .* got gate='headwise': use impl='sdpa'"),
    (dict(impl="triton", rope_base=10.0, rope_dim=2), ValueError, r"impl='triton' .* got rope_base=10, "
                                                                  r"rope_style='half', rope_dim=2"),
]


@pytest.mark.parametrize("kwargs,error,match", MODULE_ERRORS)
def test_module_refuses_bad_gates_and_rope_dims(kwargs, error, match):
    with pytest.raises(error, match=match):
        MultiHeadAttention(16, 4, **kwargs)


def test_module_load_params_checks_the_gate():
    head = MultiHeadAttention(12, 4, 2, head_dim=6, gate="headwise").double()
    with pytest.raises(ValueError, match=r"params is missing \['W_gate', 'b_gate'\] \(module has bias=True, "
                                         r"gate='headwise'\)"):
        head.load_params(P_PLAIN)
    with pytest.raises(ValueError, match=r"params\['W_gate'\] must have shape \(12, 4\) .* got shape \(12, 24\)"):
        head.load_params(P_GATE)
    with pytest.raises(ValueError, match=r"params has unexpected keys \['W_gate', 'b_gate'\] \(module has bias=True\)"):
        MultiHeadAttention(12, 4, 2, head_dim=6).double().load_params(P_GATE)
    head.load_params(P_HEAD)
    assert torch.equal(head.gate_proj.weight, torch.tensor(P_HEAD["W_gate"]).T)
