"""Exact parameter, FLOP and memory counts for one multi-head attention layer.

Symbols: N = batch, L_q / L_kv = query / key-value sequence lengths (the arguments ``l_q``, ``l_kv``), d = d_model,
h = n_heads, g = n_kv_heads (defaults to h), hd = head_dim (defaults to d / h). Every function validates its arguments
(positive integers; g divides h; h divides d when head_dim is None) and raises TypeError/ValueError naming the
argument otherwise.

Book: part II, 'Counting everything' (and 'Autoregressive decoding and the KV cache' for ``decode_step_flops`` and
``kv_cache_bytes``; 'From the recurrence to a kernel' for ``attention_core_flops``, the count kernel benchmarks use).

Today's models (part IV): ``param_count`` and ``flops`` take ``gate=`` (gated attention's output gate), and the
``latent_*`` functions count multi-head latent attention (``mha.MultiHeadLatentAttention``, DeepSeek-V2/V3).
"""

from __future__ import annotations

import functools
import warnings

from mha._checks import check_bool, check_choice, check_int, head_shape

__all__ = [
    "param_count", "flops", "matmul_flops", "decode_step_flops", "FlopCount", "kv_cache_bytes",
    "attention_matrix_bytes", "attention_core_flops", "GATES", "latent_param_count", "latent_flops_per_token",
    "latent_kv_cache_bytes", "MACHINE_SPECS",
]

# Published specifications (not measurements) of the GPUs the book's rooflines use: (dense 16-bit FLOP/s, HBM
# bytes/s). Their ratio is the roofline's ridge point, in FLOPs per byte. A100: NVIDIA's A100 datasheet (312 TFLOP/s
# fp16/bf16 tensor core, about 2 TB/s for the 80 GB SXM part); H100 SXM: NVIDIA's H100 datasheet (989 TFLOP/s dense,
# 3.35 TB/s HBM3).
MACHINE_SPECS = {"A100": (312e12, 2.0e12), "H100 SXM": (989e12, 3.35e12)}
# Elementwise operations counted per attention score in the softmax step (documented in ``flops``).
SOFTMAX_FLOPS_PER_SCORE = 5
# Operations counted per rotated coordinate in the RoPE step (documented in ``flops``).
ROPE_FLOPS_PER_COORDINATE = 3
# Operations counted per gate value for the sigmoid of gated attention (documented in ``flops``).
SIGMOID_FLOPS_PER_VALUE = 3
# Operations counted per coordinate of an RMSNorm (documented in ``latent_flops_per_token``).
RMS_NORM_FLOPS_PER_COORDINATE = 4
GATES = (None, "headwise", "elementwise")  # gated attention: one gate per head, or one per output coordinate


def _gate_width(gate, h, hd):
    """The number of gate values per token: 0 (no gate), h (headwise) or h hd (elementwise)."""
    check_choice("gate", gate, GATES)
    return {None: 0, "headwise": h, "elementwise": h * hd}[gate]


def param_count(d_model, n_heads, n_kv_heads=None, head_dim=None, bias=True, *, gate=None):
    """Number of trainable scalars in one attention layer.

    Counted: ``W_q`` (d x h*hd), ``W_k`` and ``W_v`` (d x g*hd each), ``W_o`` (h*hd x d), and with ``bias=True``
    ``b_q`` (h*hd), ``b_k``, ``b_v`` (g*hd each), ``b_o`` (d)::

        weights = 2 d h hd + 2 d g hd        biases = h hd + 2 g hd + d

    For MHA with head_dim = d / h this is ``4 d^2 (+ 4 d)``. Equals ``sum(p.numel())`` of the torch module.

    ``gate`` (gated attention: each head's output times sigmoid(x W_theta) before W_o): None, ``"headwise"`` (W_theta
    d x h, one gate per head) or ``"elementwise"`` (d x h*hd, one per coordinate) adds W_theta's ``d h`` or
    ``d h hd`` weights, and with ``bias=True`` its bias, ``h`` or ``h hd`` (``MultiHeadAttention``'s ``gate_proj``
    has a bias when the layer has biases).
    """
    d, h, g, hd = head_shape(d_model, n_heads, n_kv_heads, head_dim)
    bias = check_bool("bias", bias)
    n_gates = _gate_width(gate, h, hd)
    weights = 2 * d * h * hd + 2 * d * g * hd + d * n_gates
    biases = h * hd + 2 * g * hd + d + n_gates
    return weights + (biases if bias else 0)


class FlopCount(dict):
    """A dict of FLOPs per step that also allows attribute access: ``c['total'] == c.total``."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def flops(batch, l_q, l_kv, d_model, n_heads, n_kv_heads=None, head_dim=None, *, rope=False, gate=None):
    """FLOPs of one forward pass of the naive (materialised) attention layer, by step.

    Returns a ``FlopCount`` (a dict, also readable as attributes) with keys:

    * ``'q_proj'`` = 2 N L_q d (h hd), ``'k_proj'`` = ``'v_proj'`` = 2 N L_kv d (g hd): ``X W``, a multiply-add = 2.
    * ``'qk'`` = 2 N h L_q L_kv hd: the scores ``Q K^T``, for every *query* head (GQA shares K, not the work).
    * ``'scale'`` = N h L_q L_kv: one multiply per score.
    * ``'softmax'`` = 5 N h L_q L_kv: per score one max comparison, one subtract, one exp, one add to the row sum
      and one divide (exp counted as 1 FLOP).
    * ``'av'`` = 2 N h L_q L_kv hd: ``A V``.
    * ``'o_proj'`` = 2 N L_q (h hd) d: ``Concat(heads) W_o``.
    * ``'matmul_total'``: q_proj + k_proj + v_proj + qk + av + o_proj. This is exactly what
      ``torch.utils.flop_counter.FlopCounterMode`` reports for the naive torch computation (it counts a matmul as
      2 m n k and ignores elementwise operations and bias adds).
    * ``'total'``: matmul_total + scale + softmax (+ rope).

    With ``rope=True`` (True or False; head_dim must then be even) one more step, counted in ``'total'`` (not in
    ``'matmul_total'``: it is elementwise):

    * ``'rope'`` = 3 hd (N L_q h + N L_kv g): every query vector of every query head and every key vector of every
      *key/value* head (GQA rotates each shared key once) is rotated, and a vector of size hd costs 3 hd FLOPs:
      per pair ``(a, b) -> (a cos - b sin, a sin + b cos)`` four multiplies and two adds, 6 per 2 coordinates
      (the rotate-half form ``x cos + rotate_half(x) sin`` costs the same: per coordinate two multiplies and an
      add; the sign flip is data movement). The cos/sin tables are not counted: computed once per position and
      shared by every head, layer and sequence of a batch.

    With ``gate`` ("headwise" or "elementwise", see ``param_count``; None: none of these keys), gated attention's
    output gate, ``head output * sigmoid(x W_theta)`` before W_o, with G = h (headwise) or h hd (elementwise) gate
    values per query position:

    * ``'gate_proj'`` = 2 N L_q d G: ``X W_theta``, a matmul, counted in ``'matmul_total'`` too;
    * ``'sigmoid'`` = 3 N L_q G: ``1 / (1 + exp(-z))``, an exp, an add and a divide per gate value (exp counted as 1
      FLOP as in the softmax; the sign flip is free);
    * ``'gate'`` = N L_q h hd: one multiply per coordinate of the heads' output (headwise: a head's gate multiplies
      its hd coordinates);

    the last two in ``'total'``.

    Not counted: bias adds (the gate's too) (N L width per projection; FlopCounterMode ignores them too), masking (a select, no
    arithmetic), the K/V repeat for GQA and reshapes/transposes (data movement). A causal mask does not lower the
    count: every query is charged all L_kv scores of its row, the masked ones included, as the materialised layer
    computes them (the sum of ``decode_step_flops`` over the steps of a sequence counts only the unmasked ones).

    Book: part II, 'Counting everything'; RoPE: part IV, 'Rotary position embeddings (RoPE)'.
    """
    N = check_int("batch", batch)
    L_q, L_kv = check_int("l_q", l_q), check_int("l_kv", l_kv)
    d, h, g, hd = head_shape(d_model, n_heads, n_kv_heads, head_dim)
    return _count(N, L_q, L_kv, L_kv, d, h, g, hd, _check_rope(rope, hd), _gate_width(gate, h, hd))


def _check_rope(rope, hd):
    """``rope`` as a bool; ValueError for rope=True with an odd head_dim (RoPE rotates pairs of coordinates)."""
    rope = check_bool("rope", rope)
    if rope and hd % 2:
        raise ValueError(f"rope=True needs an even head_dim (RoPE rotates pairs of coordinates), got head_dim = {hd}")
    return rope


def _count(N, L_q, L_new_kv, L_kv, d, h, g, hd, rope=False, n_gates=0):
    """The steps of ``flops`` on checked sizes: L_q queries and L_new_kv key/value positions are projected (and,
    with ``rope``, rotated), and the L_q queries attend over L_kv keys (L_new_kv = L_kv without a cache, = L_q with
    one)."""
    scores = N * h * L_q * L_kv
    count = FlopCount(
        q_proj=2 * N * L_q * d * h * hd,
        k_proj=2 * N * L_new_kv * d * g * hd,
        v_proj=2 * N * L_new_kv * d * g * hd,
        qk=2 * scores * hd,
        scale=scores,
        softmax=SOFTMAX_FLOPS_PER_SCORE * scores,
        av=2 * scores * hd,
        o_proj=2 * N * L_q * h * hd * d,
    )
    if rope:
        count["rope"] = ROPE_FLOPS_PER_COORDINATE * hd * (N * L_q * h + N * L_new_kv * g)
    if n_gates:  # gated attention, G = n_gates gate values per query position
        count.update(gate_proj=2 * N * L_q * d * n_gates, sigmoid=SIGMOID_FLOPS_PER_VALUE * N * L_q * n_gates,
                     gate=N * L_q * h * hd)
    matmuls = ("q_proj", "k_proj", "v_proj", "qk", "av", "o_proj", "gate_proj")
    count["matmul_total"] = sum(count.get(key, 0) for key in matmuls)
    elementwise = ("scale", "softmax", "rope", "sigmoid", "gate")
    count["total"] = count["matmul_total"] + sum(count.get(key, 0) for key in elementwise)
    return count


def matmul_flops(batch, l_q, l_kv, d_model, n_heads, n_kv_heads=None, head_dim=None):
    """Matmul FLOPs only (= ``flops(...)['matmul_total']``): what ``FlopCounterMode`` counts for the naive form."""
    return flops(batch, l_q, l_kv, d_model, n_heads, n_kv_heads, head_dim)["matmul_total"]


def attention_core_flops(batch, l_q, l_kv, n_heads, head_dim, is_causal=False, backward=False):
    """FLOPs of the attention core alone, ``softmax(scale q k^T) v`` on (N, h, L, hd) heads, by the convention
    FlashAttention benchmarks convert to TFLOP/s: its two matrix products, no projections, no softmax.

    * forward: ``flops(...)['qk'] + flops(...)['av']`` = 4 N h L_q L_kv hd (GQA shares K and V, not the work);
    * ``is_causal=True`` with L_q = L_kv: half of it (the FlashAttention papers' convention; the exact number of
      allowed scores, L (L + 1) / 2 per head, differs by a factor 1 + 1/L); with L_q != L_kv, not halved;
    * ``backward=True``: forward and backward, 3.5 times the forward. The backward is counted as five products of
      the forward's size (the scores recomputed, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q): 2.5 forwards,
      as ``torch.utils.flop_counter`` counts SDPA's backward. (The naive backward, which keeps P, does four.)

    Book: part II, 'Counting everything'; 'From the recurrence to a kernel' (the kernel benchmark's TFLOP/s).
    """
    n_heads, head_dim = check_int("n_heads", n_heads), check_int("head_dim", head_dim)
    count = flops(batch, l_q, l_kv, n_heads * head_dim, n_heads, head_dim=head_dim)
    forward = count["qk"] + count["av"]
    if check_bool("is_causal", is_causal) and l_q == l_kv:
        forward //= 2  # 4 N h L^2 hd is even
    return forward * 7 // 2 if check_bool("backward", backward) else forward


def decode_step_flops(batch, cache_len, d_model, n_heads, n_kv_heads=None, head_dim=None, *, rope=False):
    """FLOPs of one cached decoding step of the naive attention layer, by step (same keys as ``flops``).

    The step brings one new token per sequence while the KV cache already holds ``cache_len`` positions
    (``cache_len = 0``: the first token, empty cache). The new token's key and value are appended to the cache
    first, so its query attends over ``L_kv = cache_len + 1`` positions, itself included, exactly as
    ``MultiHeadAttention(...)(x_new, is_causal=True, kv_cache=cache)`` does with ``x_new`` of shape (N, 1, d_model).
    Only the new position is projected (its q, k, v and its output); the cached keys and values are read, not
    recomputed:

    * ``'q_proj'`` = ``'o_proj'`` = 2 N d (h hd); ``'k_proj'`` = ``'v_proj'`` = 2 N d (g hd): one token each.
    * ``'qk'`` = ``'av'`` = 2 N h L_kv hd, ``'scale'`` = N h L_kv, ``'softmax'`` = 5 N h L_kv: one query per
      query head against L_kv keys (GQA shares the cached K/V, not this work).
    * ``'matmul_total'`` (what ``FlopCounterMode`` reports for the step) and ``'total'``, as in ``flops``.
    * with ``rope=True``: ``'rope'`` = 3 hd N (h + g), the new token's query and key only (the cached keys were
      stored rotated, at their own positions), counted in ``'total'`` as in ``flops``.

    So this is ``flops(batch, 1, cache_len + 1, ...)`` with the key/value projections of one position instead of
    ``cache_len + 1``; recomputing the whole prefix instead costs ``flops(batch, L, L, ...)``.

    Book: part II, 'Autoregressive decoding and the KV cache'; with ``rope=True``: part IV, 'Rotary position
    embeddings (RoPE)'.
    """
    N = check_int("batch", batch)
    L_kv = check_int("cache_len", cache_len, minimum=0) + 1
    d, h, g, hd = head_shape(d_model, n_heads, n_kv_heads, head_dim)
    return _count(N, 1, 1, L_kv, d, h, g, hd, _check_rope(rope, hd))


def kv_cache_bytes(batch, seq_len, n_layers, n_kv_heads, head_dim, dtype_bytes, *, window=None, n_sink_tokens=0):
    """Bytes of a key/value cache: ``2 (K and V) * batch * P * n_layers * n_kv_heads * head_dim * dtype_bytes``,
    where P = the positions cached per sequence, ``seq_len`` for a full cache.

    Only the cached tensors are counted (no bookkeeping). Fewer kv heads (GQA/MQA) shrink it by h/g.

    A sliding window (``window``, an integer >= 1: each query sees the ``window`` most recent keys, itself included,
    as in ``mha.reference.sliding_window_mask``) caps it: a key older than the window is never read again, so the
    cache keeps ``P = min(seq_len, window)`` positions (the new token's key is appended first, then read with the
    window - 1 before it). ``n_sink_tokens`` (an integer >= 0; only with a window) keeps the first tokens of the
    sequence too, the "attention sink" tokens of StreamingLLM (Xiao et al. 2023): ``P = min(seq_len, window +
    n_sink_tokens)``. (Learned sink *logits*, ``params['sinks']`` of ``mha.reference``, are parameters and cost no
    cache.) A model whose layers mix windowed and full attention (gpt-oss and Gemma 2 alternate them, Gemma 3 has
    five windowed layers per full one) adds the two counts, one call per kind of layer.

    Book: part II, 'Autoregressive decoding and the KV cache'; windows: part IV, 'Sliding windows and attention
    sinks' and 'Attention in today's open models'.
    """
    names = ("batch", "seq_len", "n_layers", "n_kv_heads", "head_dim", "dtype_bytes")
    values = (batch, seq_len, n_layers, n_kv_heads, head_dim, dtype_bytes)
    N, L, layers, g, hd, nbytes = (check_int(n, v) for n, v in zip(names, values))
    n_sink_tokens = check_int("n_sink_tokens", n_sink_tokens, minimum=0)
    if window is not None:
        L = min(L, check_int("window", window) + n_sink_tokens)
    elif n_sink_tokens:
        raise ValueError(f"n_sink_tokens = {n_sink_tokens} needs a window: without one every position is cached "
                         f"already, the first tokens included")
    return 2 * N * L * layers * g * hd * nbytes


def attention_matrix_bytes(batch, l_q, l_kv, n_heads, dtype_bytes):
    """Bytes of one materialised score (or weights) tensor: ``batch * n_heads * L_q * L_kv * dtype_bytes``.

    One tensor of shape (N, h, L_q, L_kv); the naive form holds scores and weights (x2 at peak, not included).
    GQA does not shrink it: every query head has its own weights.

    Book: part II, 'Counting everything' and 'Exact attention without the L × L matrix (online softmax)'.
    """
    names = ("batch", "l_q", "l_kv", "n_heads", "dtype_bytes")
    values = (batch, l_q, l_kv, n_heads, dtype_bytes)
    N, L_q, L_kv, h, nbytes = (check_int(n, v) for n, v in zip(names, values))
    return N * h * L_q * L_kv * nbytes


# ------------------------------------------------------------------------ multi-head latent attention (MLA)
def _latent_sizes(d_model, n_heads, kv_rank, nope, rope, v, q_rank):
    names = ("d_model", "n_heads", "kv_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    sizes = tuple(check_int(name, value) for name, value in zip(names, (d_model, n_heads, kv_rank, nope, rope, v)))
    if sizes[4] % 2:
        raise ValueError(f"qk_rope_head_dim must be even (RoPE rotates pairs of coordinates), got {sizes[4]}")
    return sizes + (None if q_rank is None else check_int("q_rank", q_rank),)


def latent_param_count(d_model, n_heads, kv_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, q_rank=None):
    """Trainable scalars of one multi-head latent attention layer (``mha.MultiHeadLatentAttention``, no biases).

    With n = qk_nope_head_dim, r = qk_rope_head_dim, d_v = v_head_dim, d_c = kv_rank, q_r = q_rank::

        queries   d h (n + r)                           (q_rank None: W_q)
                  d q_r + q_r + q_r h (n + r)           (W_dq, q_norm, W_uq)
        latent    d (d_c + r) + d_c + d_c h (n + d_v)   (W_dkv, kv_norm, W_ukv)
        output    h d_v d                               (W_o)

    DeepSeek-V3 (d 7168, h 128, q_r 1536, d_c 512, n 128, r 64, d_v 128): 187,107,328 per layer.
    Book: part IV, 'Multi-head latent attention (MLA)'.
    """
    d, h, c, n, r, v, q_r = _latent_sizes(d_model, n_heads, kv_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                                          q_rank)
    queries = d * h * (n + r) if q_r is None else d * q_r + q_r + q_r * h * (n + r)
    return queries + d * (c + r) + c + c * h * (n + v) + h * v * d


def latent_flops_per_token(seq_len, d_model, n_heads, kv_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                           q_rank=None, *, absorb=False, decode=False):
    """FLOPs per token of multi-head latent attention, by step: the naive form (per-head keys and values rebuilt from
    the latents) or the absorbed one (scores and outputs on the latents), for a prefill or for a decoding step.

    * ``decode=False``: a prefill of ``seq_len`` tokens (no cache), divided by ``seq_len``: each query is charged all
      ``L_kv = seq_len`` scores (the materialised causal layer, as ``flops``).
    * ``decode=True``: one new token while the cache holds ``seq_len`` positions (latents and rotary keys): it attends
      over ``L_kv = seq_len + 1`` (as ``decode_step_flops``'s cache_len).

    Multiply-adds count 2. Keys (n, r, d_v, d_c, q_r as in ``latent_param_count``)::

        'q_proj'    2 d h (n + r), or 2 d q_r + 2 q_r h (n + r) with a query rank
        'kv_a_proj' 2 d (d_c + r)                                (the new token's latent and rotary key)
        'kv_b_proj' naive only: 2 d_c h (n + d_v) per expanded latent: 1 per token in a prefill, all L_kv cached
                    ones in a decoding step (the cache holds latents, so naive decoding re-expands them every step)
        'q_absorb'  absorbed only: 2 h n d_c   (q_nope_i W_uk_i^T)
        'qk'        2 h L_kv (n + r) naive, 2 h L_kv (d_c + r) absorbed
        'av'        2 h L_kv d_v naive,     2 h L_kv d_c absorbed
        'v_up'      absorbed only: 2 h d_c d_v   ((A_i c) W_uv_i)
        'o_proj'    2 h d_v d
        'scale' = h L_kv,  'softmax' = 5 h L_kv    (as ``flops``)
        'rope'      3 r (h + 1): the token's h query parts and its one shared key (as ``flops``'s rope)
        'norm'      4 (d_c + q_r): RMSNorm's square, add, multiply by 1/rms and by the gain per coordinate (the one
                    rsqrt per vector not counted)

    ``'matmul_total'`` (every product above, what ``FlopCounterMode`` reports for ``mha.MultiHeadLatentAttention``
    per token) and ``'total'`` (plus scale, softmax, rope, norm). Decoding at DeepSeek-V3's sizes is cheaper
    absorbed (no expansion of L_kv latents per step); a prefill is cheaper naive (scores n + r = 192 wide instead
    of d_c + r = 576). Book: part IV, 'Multi-head latent attention (MLA)'.
    """
    absorb, decode = check_bool("absorb", absorb), check_bool("decode", decode)
    seq_len = check_int("seq_len", seq_len, minimum=0 if decode else 1)  # decode: the cached positions, maybe none
    d, h, c, n, r, v, q_r = _latent_sizes(d_model, n_heads, kv_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                                          q_rank)
    L_kv = seq_len + 1 if decode else seq_len
    count = FlopCount(q_proj=2 * d * h * (n + r) if q_r is None else 2 * d * q_r + 2 * q_r * h * (n + r),
                      kv_a_proj=2 * d * (c + r))
    if absorb:
        count.update(q_absorb=2 * h * n * c, qk=2 * h * L_kv * (c + r), av=2 * h * L_kv * c, v_up=2 * h * c * v)
    else:
        count.update(kv_b_proj=2 * c * h * (n + v) * (L_kv if decode else 1), qk=2 * h * L_kv * (n + r),
                     av=2 * h * L_kv * v)
    count.update(o_proj=2 * h * v * d, scale=h * L_kv, softmax=SOFTMAX_FLOPS_PER_SCORE * h * L_kv,
                 rope=ROPE_FLOPS_PER_COORDINATE * r * (h + 1), norm=RMS_NORM_FLOPS_PER_COORDINATE * (c + (q_r or 0)))
    elementwise = ("scale", "softmax", "rope", "norm")
    count["matmul_total"] = sum(value for key, value in count.items() if key not in elementwise)
    count["total"] = count["matmul_total"] + sum(count[key] for key in elementwise)
    return count


def latent_kv_cache_bytes(batch, seq_len, n_layers, kv_rank, qk_rope_head_dim, dtype_bytes):
    """Bytes of multi-head latent attention's cache: ``batch * seq_len * n_layers * (kv_rank + qk_rope_head_dim) *
    dtype_bytes``: per token and layer one latent and one rotary key shared by every head (``LatentCache``), whatever
    the number of heads. DeepSeek-V3: 512 + 64 = 576 numbers, where its 128 heads of keys (192) and values (128)
    would cache 128 (192 + 128) = 40,960 (``kv_cache_bytes`` with g = 128 and the mean width 160).

    Book: part IV, 'Multi-head latent attention (MLA)'.
    """
    names = ("batch", "seq_len", "n_layers", "kv_rank", "qk_rope_head_dim", "dtype_bytes")
    values = (batch, seq_len, n_layers, kv_rank, qk_rope_head_dim, dtype_bytes)
    N, L, layers, c, r, nbytes = (check_int(name, value) for name, value in zip(names, values))
    return N * L * layers * (c + r) * nbytes


# The old keyword names, accepted for one release with a DeprecationWarning (the book called flops(seq_len_q=...,
# seq_len_kv=...)): seq_len_q -> l_q, seq_len_kv -> l_kv. Remove this block in the next release.
_OLD_KEYWORDS = {"seq_len_q": "l_q", "seq_len_kv": "l_kv"}


def _accept_old_keywords(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for old, new in _OLD_KEYWORDS.items():
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{fn.__name__}() got both {new!r} and its old name {old!r}")
                warnings.warn(f"{fn.__name__}(): the keyword {old!r} is now {new!r}; {old!r} will be removed in the "
                              "next release", DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
        return fn(*args, **kwargs)

    return wrapper


flops = _accept_old_keywords(flops)
matmul_flops = _accept_old_keywords(matmul_flops)
attention_core_flops = _accept_old_keywords(attention_core_flops)
attention_matrix_bytes = _accept_old_keywords(attention_matrix_bytes)
