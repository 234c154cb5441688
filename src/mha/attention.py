"""``MultiHeadAttention``: the PyTorch module (MHA, GQA, MQA; an ``sdpa`` path and a textbook ``naive`` path).

Book: part I, "From one head to h heads" (the projections, the split into heads, the concatenation and W_o);
part I, "Scaled dot-product attention" and "Why divide by sqrt(d_k)" (the core and its scale);
part II, "Autoregressive decoding and the KV cache" (``kv_cache=``, bottom-right causal alignment);
part II, "MQA and GQA" (``n_kv_heads``).

Conventions (shared with the NumPy reference ``mha.reference``): row vectors, Y = X W; a ``params`` dict holds
W_q (d_model, h*head_dim), W_k and W_v (d_model, g*head_dim), W_o (h*head_dim, d_model) and, with ``bias=True``,
b_q (h*head_dim,), b_k and b_v (g*head_dim,), b_o (d_model,). ``nn.Linear`` stores W^T, so W_q = q_proj.weight.T.
Query head j uses key/value head j // (h / g), as ``repeat_interleave`` and
``F.scaled_dot_product_attention(..., enable_gqa=True)`` do. Masks are boolean, True = may attend.

The forward pass never synchronises host and device: every branch depends on shapes, dtypes, devices and flags,
never on tensor values (no ``.item()``, no ``isfinite`` checks). Rows whose every key is masked give zero weights
and zero output on both paths: such a row is first allowed every key (so no softmax over only -inf ever runs, on
any backend, and gradients stay finite), then zeroed with ``torch.where`` on a precomputed "row has an allowed key"
mask. This costs two small boolean ops and happens only when a user mask is given (or a causal mask with L_q > L_kv).
So tensor values are never checked either: NaN or infinity in the inputs (or the weights) raises nothing and
propagates into the output (within the sequences it is in) instead; check them yourself where they may occur, or use
the NumPy reference ``mha.reference``, which refuses them. (The one exception: ``positions`` on the CPU are checked
for negative values, which reads host memory only.)

Attention in today's models (all off by default; without them the module is exactly the one above). The layer, in
order: q = x W_q (+ b_q), k, v likewise; split into heads; QK-norm (``qk_norm``: RMSNorm over head_dim, one weight
(head_dim,) for q and one for k, shared by the heads); RoPE on q and k (``rope_base``, ``rope_style``: see
``mha.rope``) at absolute positions; scores = scale q k^T; soft-capping (``softcap``: scores <- c tanh(scores / c),
Gemma 2); masks (the user's, causal, and the sliding ``window``: query p sees keys p - W < j <= p, W counting the
query itself, gpt-oss's and Hugging Face's convention); softmax, with ``sinks`` (gpt-oss) one learned logit per
query head joining each row's softmax and then dropped (rows sum to 1 - p_sink; a row with no allowed key puts all
its weight on the sink and gives zero output); weights @ v; the output gate (``gate``, gated attention, Qiu et al.
2025, Qwen3-Next: each head's output times sigmoid(x_q W_gate + b_gate), one scalar per head and query "headwise" or
one per coordinate "elementwise", from ``gate_proj``); merge; W_o (+ b_o). ``rope_dim`` (partial RoPE, Qwen3-Next's
``partial_rotary_factor``) rotates only the first rope_dim coordinates of each head. A window is causal by itself, and
``rope_base``/``window`` are for self-attention (x_kv None). ``new_cache`` builds the cache the module needs (a ring
buffer of ``window`` slots when it has a window; ``mha.kv_cache`` explains why it is exact).

Which path computes what: ``softcap`` runs on the naive path (SDPA cannot cap scores), whatever ``impl``; ``sinks`` run
on the sdpa path as one extra key column (q gets one more coordinate, sink_h / scale; each key a 0 there; one extra
key (0, ..., 0, 1) with value 0 scores exactly sink_h: no copy of K/V per query head, GQA kept), and on the naive path
as an extra column of the scores, as gpt-oss's reference does; the tests check that both paths agree. The window is a
boolean mask on both paths. ``impl="triton"`` takes none of the new options.
"""

from __future__ import annotations


import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mha._checks import (attention_scale, check_bool, check_choice, check_float, check_int, check_like, check_type,
                         head_shape)
from mha.kv_cache import KVCache
from mha.params import export_specs, load_specs
from mha.rope import ROPE_STYLES, apply_rope, check_positions, rms_norm, rope_cos_sin, window_mask

__all__ = ["MultiHeadAttention", "causal_mask"]

IMPLS = ("sdpa", "naive", "triton")
GATES = (None, "headwise", "elementwise")  # the output gate: off, one per head and query, one per coordinate


def causal_mask(l_q: int, l_kv: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean (L_q, L_kv) mask, True = may attend, bottom-right aligned: query i (of the last L_q positions) sees
    keys j <= L_kv - L_q + i. For L_q == L_kv this is the usual lower triangle.

    The tensor twin of ``mha.reference.causal_mask`` (the package's causal mask for tensors), on ``device`` (None:
    torch's default device).

    Book: part II, "Autoregressive decoding and the KV cache" (with a cache, the L_q new queries are the *last*
    L_q positions of the L_kv keys).
    """
    return torch.ones(l_q, l_kv, dtype=torch.bool, device=device).tril(diagonal=l_kv - l_q)  # (L_q, L_kv)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with ``n_heads`` query heads sharing ``n_kv_heads`` key/value heads.

    Book: part I, "From one head to h heads"; part II, "MQA and GQA"; part II, "Autoregressive decoding and the
    KV cache".

    Args:
        d_model: model width (size of each input and output vector).
        n_heads: h, the number of query heads.
        n_kv_heads: g, the number of key/value heads; must divide h. None means h (MHA); 1 is MQA; between is GQA.
        head_dim: size of one head. None means d_model // n_heads (then d_model must be divisible by n_heads).
        bias: whether q_proj, k_proj, v_proj and o_proj have biases.
        dropout: probability of dropping an attention weight, applied in training mode only; in [0, 1).
        impl: "sdpa" (``F.scaled_dot_product_attention``), "naive" (the explicit textbook computation) or
            "triton" (the package's FlashAttention kernel, ``mha.kernels.flash_attention``; needs the optional
            extra ``mha-derived[kernels]``; no ``mask``, no weights (pass ``need_weights=False``), no dropout;
            book: part II, "From the recurrence to a kernel").
        scale: multiplier of q k^T. None means 1 / sqrt(head_dim); a float is used as given (1.0 disables
            scaling, for the book's scaling ablation, part III "The scaling ablation").
        rope_base: None (no RoPE) or the RoPE base (10000 in Llama 2; > 0): theta_i = base ** (-2 i / head_dim);
            needs an even head_dim.
        rope_style: "half" (pairs (x_i, x_{i+d/2}), Hugging Face's rotate_half) or "interleaved" (pairs
            (x_{2i}, x_{2i+1}), Meta's original code).
        rope_dim: None (RoPE on the whole head) or an even number <= head_dim: RoPE of that size (theta_i =
            base ** (-2 i / rope_dim)) on the first rope_dim coordinates of each head of q and k, the rest
            unrotated (Hugging Face's partial rotary factor); needs rope_base.
        window: None or W >= 1: query at position p sees keys p - W < j <= p (itself included; causal).
        sinks: one learned sink logit per query head (parameter ``sinks``, (n_heads,), zeros at first).
        qk_norm: RMSNorm of q and k over head_dim (parameters ``q_norm``, ``k_norm``, (head_dim,), ones at first).
        qk_norm_eps: the RMSNorm's epsilon (> 0).
        softcap: None or c > 0: scores <- c * tanh(scores / c) before the masks.
        gate: None, "headwise" or "elementwise": each head's attention output, before the merge and o_proj, times
            sigmoid(gate_proj(x_q)), a Linear(d_model, n_heads) (one scalar per head and query) or
            Linear(d_model, n_heads * head_dim) (one per coordinate, head i's in column block i), biased as ``bias``.

    Attributes: d_model, n_heads, n_kv_heads, head_dim, impl, dropout, and ``scale`` (the scale actually used,
    a float: 1 / sqrt(head_dim) when the argument was None); rope_base (a float or None), rope_style, rope_dim (the
    coordinates rotated: head_dim unless given; None without RoPE), window, softcap, qk_norm (bool), qk_norm_eps,
    gate. Submodules q_proj, k_proj, v_proj, o_proj and gate_proj (None when off); parameters ``sinks``, ``q_norm``,
    ``k_norm`` (None when off). What is off is absent from ``state_dict``.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, head_dim: int | None = None,
                 bias: bool = True, dropout: float = 0.0, impl: str = "sdpa", scale: float | None = None, *,
                 rope_base: float | None = None, rope_style: str = "half", window: int | None = None,
                 sinks: bool = False, qk_norm: bool = False, qk_norm_eps: float = 1e-6, softcap: float | None = None,
                 gate: str | None = None, rope_dim: int | None = None):
        super().__init__()
        d_model, n_heads, n_kv_heads, head_dim = head_shape(d_model, n_heads, n_kv_heads, head_dim)
        check_choice("impl", impl, IMPLS)
        check_bool("bias", bias)
        dropout = check_float("dropout", dropout, minimum=0.0, maximum=1.0, max_inclusive=False)
        if impl == "triton" and dropout != 0:
            raise ValueError(f"impl='triton' has no attention dropout: dropout must be 0, got {dropout!r}; use "
                             f"impl='sdpa' or impl='naive' for dropout")
        scale = attention_scale(scale, head_dim)  # the rule mha.reference applies
        check_choice("rope_style", rope_style, ROPE_STYLES)
        if rope_base is not None:
            rope_base = check_float("rope_base", rope_base, minimum=0.0, min_inclusive=False)
            if rope_dim is None and head_dim % 2:
                raise ValueError(f"rope_base needs an even head_dim (RoPE rotates pairs of coordinates), got "
                                 f"head_dim={head_dim}")
        rope_dim = _check_rope_dim(rope_dim, head_dim, rope_base)
        check_choice("gate", gate, GATES)
        if window is not None:
            window = check_int("window", window, minimum=1)
        check_bool("sinks", sinks)
        check_bool("qk_norm", qk_norm)
        qk_norm_eps = check_float("qk_norm_eps", qk_norm_eps, minimum=0.0, min_inclusive=False)
        if softcap is not None:
            softcap = check_float("softcap", softcap, minimum=0.0, min_inclusive=False)

        self.d_model = d_model  # width of the residual stream
        self.n_heads = n_heads  # h, query heads
        self.n_kv_heads = n_kv_heads  # g, key/value heads (g = h: MHA, g = 1: MQA)
        self.head_dim = head_dim  # size of one head
        self.impl = impl  # "sdpa" or "naive"
        self.dropout = float(dropout)  # attention-weight dropout probability (training mode only)
        self.scale = float(scale)  # multiplier of q k^T
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=bias)
        self.rope_base = rope_base  # None: no RoPE
        self.rope_style = rope_style  # "half" or "interleaved"
        self.rope_dim = rope_dim  # coordinates RoPE rotates (head_dim unless partial), None without RoPE
        self.gate = gate  # None, "headwise" or "elementwise"
        self.window = window  # None: no sliding window
        self.softcap = softcap  # None: no soft-capping
        self.qk_norm = bool(qk_norm)
        self.qk_norm_eps = float(qk_norm_eps)
        # Registered after the projections, and only when asked for: without the options, state_dict is today's.
        self.register_parameter("sinks", nn.Parameter(torch.zeros(n_heads)) if sinks else None)  # (h,)
        self.register_parameter("q_norm", nn.Parameter(torch.ones(head_dim)) if qk_norm else None)  # (head_dim,)
        self.register_parameter("k_norm", nn.Parameter(torch.ones(head_dim)) if qk_norm else None)  # (head_dim,)
        gate_width = n_heads if gate == "headwise" else n_heads * head_dim
        self.gate_proj = None if gate is None else nn.Linear(d_model, gate_width, bias=bias)  # last: others unchanged
        if impl == "triton":
            self._check_triton_options()

    def _options(self) -> list[str]:
        """The options of today's models that are on, in words ("rope_base=10000", "sinks=True", ...)."""
        out = [] if self.rope_base is None else [f"rope_base={self.rope_base:g}, rope_style={self.rope_style!r}"
                                                 + (f", rope_dim={self.rope_dim}" if self.rope_dim < self.head_dim
                                                    else "")]
        out += [] if self.window is None else [f"window={self.window}"]
        out += [] if self.sinks is None else ["sinks=True"]
        out += [f"qk_norm=True, qk_norm_eps={self.qk_norm_eps:g}"] if self.qk_norm else []
        out += [] if self.softcap is None else [f"softcap={self.softcap:g}"]
        out += [] if self.gate is None else [f"gate={self.gate!r}"]
        return out

    def _check_triton_options(self) -> None:
        if self._options():
            raise ValueError(f"impl='triton' (the package's FlashAttention kernel, which has no output gate "
                             f"either) takes none of rope_base, window, sinks, qk_norm, softcap; got "
                             f"{', '.join(self._options())}: use impl='sdpa' or impl='naive'")

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"head_dim={self.head_dim}, impl={self.impl!r}, dropout={self.dropout}, scale={self.scale:.6g}"
                + "".join(f", {option}" for option in self._options()))

    def new_cache(self, batch_size: int, max_len: int, *, n_sink_tokens: int = 0) -> KVCache:
        """The :class:`KVCache` this module needs, with its parameters' dtype and device: a full cache of ``max_len``
        positions, or with a window a ring buffer of ``n_sink_tokens + window`` slots that decodes up to ``max_len``
        positions (as gpt-fast's ``setup_caches``). ``n_sink_tokens`` (window only): StreamingLLM's kept tokens."""
        weight = self.q_proj.weight
        return KVCache(batch_size, max_len, self.n_kv_heads, self.head_dim, dtype=weight.dtype, device=weight.device,
                       window=self.window, n_sink_tokens=n_sink_tokens)

    # ------------------------------------------------------------------------------------------------ forward
    def forward(self, x_q: torch.Tensor, x_kv: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                is_causal: bool = False, need_weights: bool = True, kv_cache: KVCache | None = None,
                head_mask: torch.Tensor | None = None, positions: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``x_q`` to ``x_kv`` (or to ``x_q`` itself, or to everything in ``kv_cache``).

        Book: part I, "From one head to h heads"; part II, "Autoregressive decoding and the KV cache".

        Args:
            x_q: queries' inputs, (N, L_q, d_model), or unbatched (L_q, d_model).
            x_kv: keys'/values' inputs, (N, L_kv, d_model) (same rank as x_q); None means self-attention.
            mask: boolean, True = may attend, broadcastable to (N, h, L_q, L_kv) ((h, L_q, L_kv) when unbatched).
            is_causal: causal masking, bottom-right aligned (query i sees keys j <= L_kv - L_q + i). Combined with
                ``mask`` by logical and.
            need_weights: also return the attention weights (default True, as ``mha.reference`` and
                ``torch.nn.MultiheadAttention``); the sdpa path then computes them explicitly, so pass False
                when only the output is needed (training, decoding, timing).
            kv_cache: a :class:`~mha.kv_cache.KVCache`; this call's keys/values are appended and the queries
                attend over every cached position. Self-attention only (x_kv must be None). The cache advances only
                when the call succeeds (a failed call leaves it as it was), and it is this module's alone: a cache
                holding positions written by another module is refused.
            head_mask: (h,) float or bool; multiplies each head's output before o_proj (differentiable).
            positions: RoPE only: the queries' (and this call's keys') absolute positions, an integer tensor (L_q,) or
                (N, L_q), >= 0. None means arange(L_q), and with a cache cache.length + arange(L_q). The causal and
                window masks use the sequence index (cache.length + i), not ``positions`` (as Hugging Face's
                position_ids and cache_position).

            With a window, ``kv_cache`` must be a ring buffer with the same window (``new_cache``); ``mask`` then
            still covers the absolute positions (.., L_q, cache.length + L_q), and the weights returned are laid out
            over them too (zero outside the window).

        Returns:
            ``(out, weights)``: out (N, L_q, d_model) (unbatched: (L_q, d_model)); weights (N, h, L_q, L_kv)
            (unbatched: (h, L_q, L_kv)), the softmax probabilities before dropout, or None.
        """
        unbatched, l_q, l_kv = self._check_inputs(x_q, x_kv, mask, kv_cache, head_mask, is_causal, need_weights,
                                                  positions)
        if unbatched:
            x_q = x_q.unsqueeze(0)  # (1, L_q, d_model)
            x_kv = None if x_kv is None else x_kv.unsqueeze(0)  # (1, L_kv, d_model)
        if x_kv is None:
            x_kv = x_q
        n = x_q.shape[0]
        h, g, hd = self.n_heads, self.n_kv_heads, self.head_dim
        gate = None  # (N, h, L_q, 1 or head_dim): sigmoid(gate_proj(x_q)), from the query side
        if self.gate_proj is not None:
            gate = torch.sigmoid(self.gate_proj(x_q)).view(n, l_q, h, -1).transpose(1, 2)

        q = self.q_proj(x_q).view(n, l_q, h, hd).transpose(1, 2)  # (N, h, L_q, head_dim)
        l_new = x_kv.shape[1]
        k = self.k_proj(x_kv).view(n, l_new, g, hd).transpose(1, 2)  # (N, g, L_new, head_dim)
        v = self.v_proj(x_kv).view(n, l_new, g, hd).transpose(1, 2)  # (N, g, L_new, head_dim)
        if self.qk_norm:
            q = rms_norm(q, self.q_norm, self.qk_norm_eps)  # (N, h, L_q, head_dim)
            k = rms_norm(k, self.k_norm, self.qk_norm_eps)  # (N, g, L_new, head_dim)
        if self.rope_base is not None:  # self-attention: the keys are at the queries' positions
            if positions is None:
                start = 0 if kv_cache is None else kv_cache.length
                positions = torch.arange(start, start + l_q, device=q.device)  # (L_q,)
            cos, sin = rope_cos_sin(positions, self.rope_dim, self.rope_base, q.dtype)  # (L_q or N, L_q, r/2)
            q = apply_rope(q, cos, sin, self.rope_style)  # (N, h, L_q, head_dim)
            k = apply_rope(k, cos, sin, self.rope_style)  # (N, g, L_q, head_dim)
        if kv_cache is None:
            allowed = None  # (L_q, L_kv) sliding-window mask, or None
            if self.window is not None:
                index = torch.arange(l_q, device=q.device)  # (L_q,) = (L_kv,): self-attention
                allowed = window_mask(index, index, self.window)
            out, weights = self._attention(q, k, v, mask, is_causal, need_weights, l_q, l_kv, allowed)
            return self._merge_and_project(out, weights, head_mask, unbatched, gate)
        if kv_cache.window is not None:
            return self._ring_forward(q, k, v, mask, need_weights, head_mask, unbatched, kv_cache, gate)
        cached = kv_cache.length
        try:
            k, v = kv_cache.append(k, v)  # each (N, g, L_kv, head_dim), L_kv = cached + L_q
            out, weights = self._attention(q, k, v, mask, is_causal, need_weights, l_q, l_kv)
            out, weights = self._merge_and_project(out, weights, head_mask, unbatched, gate)
        except BaseException:  # an error in the kernel, out of memory, KeyboardInterrupt: leave the cache as it was
            # Setting length back is enough: the append wrote only at positions >= cached, which no read sees once
            # length is cached again (every read is of the filled prefix) and the next append overwrites.
            kv_cache.length = cached
            raise
        kv_cache._claim(self)  # the cache now holds this module's keys; other modules are refused (check_append)
        return out, weights

    def _ring_forward(self, q, k, v, mask, need_weights, head_mask, unbatched, cache, gate=None):
        """A call with a ring-buffer cache: attend over every slot followed by this call's keys (window mask from the
        absolute positions they hold), and write the new keys only once everything has succeeded, so that a failed
        call leaves the ring exactly as it was (see ``mha.kv_cache``)."""
        l_q, length = q.shape[2], cache.length
        k_all, v_all, key_positions = cache.window_keys(k, v)  # (N, g, S + W + L_q, head_dim) x2, (S + W + L_q,)
        query_positions = torch.arange(length, length + l_q, device=q.device)  # (L_q,)
        allowed = window_mask(query_positions, key_positions, self.window, cache.n_sink_tokens)  # (L_q, S+W+L_q)
        index = key_positions.clamp(min=0)  # empty slots (-1) read column 0, masked out by ``allowed`` anyway
        if mask is not None and mask.shape[-1] != 1:
            mask = mask.index_select(-1, index)  # absolute positions -> slot order, (.., L_q, S + W + L_q)
        out, weights = self._attention(q, k_all, v_all, mask, True, need_weights, l_q, k_all.shape[2], allowed)
        if weights is not None:  # back over the absolute positions, (N, h, L_q, length + L_q), zero outside
            full = weights.new_zeros(*weights.shape[:-1], length + l_q)
            weights = full.scatter_add_(-1, index.expand_as(weights), weights)
        out, weights = self._merge_and_project(out, weights, head_mask, unbatched, gate)
        cache.commit(k, v)  # only now: nothing was written if anything above failed
        cache._claim(self)
        return out, weights

    def _attention(self, q, k, v, mask, is_causal, need_weights, l_q, l_kv, allowed=None):
        """(out (N, h, L_q, head_dim), weights (N, h, L_q, L_kv) or None) by the module's impl, masks applied.

        ``allowed``: a (L_q, L_kv) sliding-window mask (causal by itself, so it replaces ``is_causal``), or None.
        """
        if self.impl == "triton":
            return self._triton_attention(q, k, v, is_causal), None  # (N, h, L_q, head_dim)

        # Combine the user's mask and the causal (or window) mask into one boolean mask (or None), and note whether
        # some query row may have no allowed key (then its weights and output are set to zero, never NaN).
        sdpa_causal = False
        attn_mask = mask
        if allowed is not None:
            attn_mask = allowed if mask is None else mask & allowed  # broadcast to (.., L_q, L_kv)
        elif is_causal:
            use_sdpa = self.impl == "sdpa" and not need_weights and self.sinks is None and self.softcap is None
            if use_sdpa and mask is None and l_q == l_kv:
                sdpa_causal = True  # SDPA's own causal path (top-left == bottom-right when L_q == L_kv)
            else:
                causal = causal_mask(l_q, l_kv, q.device)  # (L_q, L_kv)
                attn_mask = causal if mask is None else mask & causal  # broadcast to (.., L_q, L_kv)
        row_has_key = None  # (.., L_q, 1) boolean, only when a row could be fully masked
        if mask is not None or (allowed is None and is_causal and l_q > l_kv):
            row_has_key = attn_mask.any(dim=-1, keepdim=True)  # (.., L_q, 1)
            attn_mask = attn_mask | ~row_has_key  # a fully masked row attends everywhere; zeroed below

        if self.impl == "naive" or need_weights or self.softcap is not None:  # SDPA cannot soft-cap
            out, weights = self._naive_attention(q, k, v, attn_mask, row_has_key)
            return out, weights if need_weights else None
        return self._sdpa_attention(q, k, v, attn_mask, row_has_key, sdpa_causal), None

    def _merge_and_project(self, out, weights, head_mask, unbatched, gate=None):
        """The output gate (``gate`` (N, h, L_q, 1 or head_dim), or None), head_mask, the concatenation of the
        heads, o_proj; the batch axis dropped again for unbatched input.

        Book: part I, "From one head to h heads" (Concat(head_1, ..., head_h) W^O).
        """
        n, h, l_q, hd = out.shape
        if gate is not None:
            out = out * gate  # (N, h, L_q, head_dim): each head's output, gated before the merge
        if head_mask is not None:
            out = out * head_mask.to(out.dtype).view(1, h, 1, 1)  # (N, h, L_q, head_dim)
        out = out.transpose(1, 2).reshape(n, l_q, h * hd)  # (N, L_q, h * head_dim)
        out = self.o_proj(out)  # (N, L_q, d_model)
        if unbatched:
            out = out.squeeze(0)  # (L_q, d_model)
            weights = None if weights is None else weights.squeeze(0)  # (h, L_q, L_kv)
        return out, weights

    def _triton_attention(self, q, k, v, is_causal):
        """softmax(q k^T * scale) v with the package's Triton FlashAttention kernel (GQA without copying K/V,
        bottom-right causal, fully masked rows -> 0).

        Book: part II, "From the recurrence to a kernel".
        """
        from mha.kernels import flash_attention  # lazy: Triton is an optional extra

        return flash_attention(q, k, v, is_causal=is_causal, scale=self.scale)  # (N, h, L_q, head_dim)

    def _sdpa_attention(self, q, k, v, attn_mask, row_has_key, is_causal):
        """softmax(q k^T * scale) v with ``F.scaled_dot_product_attention``; GQA via ``enable_gqa`` (no K/V copy).

        Book: part I, "Scaled dot-product attention"; part II, "MQA and GQA".

        With sinks: one extra key column whose score is exactly sink_h for query head h (module docstring).
        """
        if self.sinks is not None:
            q, k, v, attn_mask = self._append_sink_key(q, k, v, attn_mask)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal,
            scale=self.scale, enable_gqa=self.n_kv_heads < self.n_heads)  # (N, h, L_q, head_dim)
        if row_has_key is not None:
            out = torch.where(row_has_key, out, 0.0)  # fully masked rows -> 0, (N, h, L_q, head_dim)
        return out

    def _append_sink_key(self, q, k, v, attn_mask):
        """q (N, h, L_q, d) -> (.., d + 1) with sink_h / scale last; k -> (N, g, L_kv + 1, d + 1): each key gets a 0,
        and one more key (0, ..., 0, 1); v -> (N, g, L_kv + 1, d) with a zero value; the mask gets an allowed column.
        Then scale * q' . k'_sink = sink_h for every query of head h, and the sink adds nothing to the output."""
        n, h, l_q, hd = q.shape
        g, l_kv = k.shape[1], k.shape[2]
        sink_q = (self.sinks.to(q.dtype) / self.scale).view(1, h, 1, 1).expand(n, h, l_q, 1)
        q = torch.cat([q, sink_q], dim=-1)  # (N, h, L_q, d + 1)
        sink_k = torch.zeros(n, g, 1, hd + 1, dtype=k.dtype, device=k.device)
        sink_k[..., -1] = 1.0
        k = torch.cat([torch.cat([k, k.new_zeros(n, g, l_kv, 1)], dim=-1), sink_k], dim=2)  # (N, g, L_kv + 1, d + 1)
        v = torch.cat([v, v.new_zeros(n, g, 1, hd)], dim=2)  # (N, g, L_kv + 1, d)
        if attn_mask is not None:
            attn_mask = attn_mask.expand(*attn_mask.shape[:-1], l_kv)  # a key axis of 1 -> L_kv
            attn_mask = torch.cat([attn_mask, attn_mask.new_ones(*attn_mask.shape[:-1], 1)], dim=-1)  # sink allowed
        return q, k, v, attn_mask

    def _naive_attention(self, q, k, v, attn_mask, row_has_key):
        """The textbook computation: scores = q k^T * scale, mask with -inf, softmax, dropout, @ v.

        Book: part I, "Scaled dot-product attention"; part II, "MQA and GQA". For GQA the h query heads are
        regrouped as (g, h/g) and the h/g queries of a group are stacked along the sequence axis, so each
        key/value head is read once and never copied (no ``repeat_interleave``).

        float16/bfloat16: the scores and the softmax are computed in float32, as PyTorch's math SDPA backend does
        (it upcasts q, k and v). In float16, q k^T overflows (max 65504) long before the scaled scores do (inputs
        of size ~200 gave NaN rows), and scores rounded to float16/bfloat16 before the softmax had 40 to 200 times
        the error of float32 scores at |scores| ~ 100 to 1000 (measured). The price: the scores matrix takes 4
        bytes per entry for half inputs (the softmax's output did already).
        """
        n, h, l_q, hd = q.shape
        g, l_kv = k.shape[1], k.shape[2]
        n_rep = h // g  # query heads per key/value head
        if q.dtype in (torch.float16, torch.bfloat16):  # scores and softmax in float32 (see above)
            q, k = q.float(), k.float()
        q_grouped = q.reshape(n, g, n_rep * l_q, hd)  # (N, g, (h/g) * L_q, head_dim): head j -> group j // (h/g)
        scores = (q_grouped @ k.transpose(-2, -1)) * self.scale  # (N, g, (h/g) * L_q, L_kv)
        scores = scores.view(n, h, l_q, l_kv)  # (N, h, L_q, L_kv)
        if self.softcap is not None:
            scores = self.softcap * torch.tanh(scores / self.softcap)  # soft-capped to (-softcap, softcap)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf"))  # (N, h, L_q, L_kv)
        if self.sinks is None:
            weights = torch.softmax(scores, dim=-1).to(v.dtype)  # (N, h, L_q, L_kv)
        else:  # one more column per row, sink_h, in the softmax; dropped after: rows sum to 1 - p_sink
            sink = self.sinks.to(scores.dtype).view(1, h, 1, 1).expand(n, h, l_q, 1)
            weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1].to(v.dtype)
        if row_has_key is not None:
            weights = torch.where(row_has_key, weights, 0.0)  # fully masked rows -> 0, (N, h, L_q, L_kv)
        dropped = F.dropout(weights, p=self.dropout, training=self.training)  # (N, h, L_q, L_kv)
        out = dropped.reshape(n, g, n_rep * l_q, l_kv) @ v  # (N, g, (h/g) * L_q, head_dim)
        out = out.view(n, h, l_q, hd)  # (N, h, L_q, head_dim)
        return out, weights

    # --------------------------------------------------------------------------------------------- validation
    def _check_inputs(self, x_q, x_kv, mask, kv_cache, head_mask, is_causal, need_weights,
                      positions=None) -> tuple[bool, int, int]:
        """Check shapes, dtypes and devices (metadata only, no device reads). Returns (unbatched, L_q, L_kv)."""
        check_choice("impl", self.impl, IMPLS)
        if self.impl == "triton":
            self._check_triton_options()
        check_bool("is_causal", is_causal)
        check_bool("need_weights", need_weights)
        weight = self.q_proj.weight
        check_type("x_q", x_q, torch.Tensor, "a torch.Tensor")
        if x_q.ndim not in (2, 3):
            raise ValueError(f"x_q must be (N, L_q, d_model) or unbatched (L_q, d_model), got shape "
                             f"{tuple(x_q.shape)} (d_model={self.d_model})")
        self._check_width_and_length("x_q", x_q)
        if x_q.dtype != weight.dtype:
            raise TypeError(f"x_q has dtype {x_q.dtype} but the module's parameters have dtype {weight.dtype}")
        if x_q.device != weight.device:
            raise ValueError(f"x_q is on device {x_q.device} but the module's parameters are on {weight.device}")
        unbatched = x_q.ndim == 2
        n = 1 if unbatched else x_q.shape[0]
        l_q = x_q.shape[-2]
        l_kv = l_q
        if x_kv is not None:
            if kv_cache is not None:
                raise ValueError("kv_cache is for self-attention only: x_kv must be None when kv_cache is given, "
                                 f"got x_kv of shape {tuple(x_kv.shape)}")
            if self.rope_base is not None or self.window is not None:
                raise ValueError(f"rope_base and window are for self-attention (the keys' positions are the queries'): "
                                 f"x_kv must be None for this module ({', '.join(self._options())}), got x_kv of "
                                 f"shape {tuple(x_kv.shape)}")
            check_type("x_kv", x_kv, torch.Tensor, "a torch.Tensor or None")
            if x_kv.ndim != x_q.ndim:
                raise ValueError(f"x_kv must have the same rank as x_q: x_q has shape {tuple(x_q.shape)}, x_kv has "
                                 f"shape {tuple(x_kv.shape)}")
            self._check_width_and_length("x_kv", x_kv)
            if not unbatched and x_kv.shape[0] != x_q.shape[0]:
                raise ValueError(f"batch size mismatch: x_q has shape {tuple(x_q.shape)}, x_kv has shape "
                                 f"{tuple(x_kv.shape)}")
            check_like("x_kv", x_kv, "x_q", x_q)
            l_kv = x_kv.shape[-2]
        if kv_cache is not None:
            check_type("kv_cache", kv_cache, KVCache, "a mha.KVCache or None")
            if kv_cache.window != self.window:
                raise ValueError(f"kv_cache has window={kv_cache.window} but the module has window={self.window}: a "
                                 f"module with a window needs a ring-buffer cache with the same window, a module "
                                 f"without one a full cache (build it with module.new_cache(batch_size, max_len))")
            kv_cache.check_append(n, l_q, self.n_kv_heads, self.head_dim, x_q.dtype, x_q.device,
                                  who="x_q (its keys/values)", owner=self)
            l_kv = kv_cache.length + l_q
        if mask is not None:
            check_type("mask", mask, torch.Tensor, "a boolean torch.Tensor or None")
            if mask.dtype != torch.bool:
                raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
            if mask.device != x_q.device:
                raise ValueError(f"device mismatch: mask is on {mask.device}, x_q is on {x_q.device}")
            target = (self.n_heads, l_q, l_kv) if unbatched else (n, self.n_heads, l_q, l_kv)
            names = "(h, L_q, L_kv)" if unbatched else "(N, h, L_q, L_kv)"
            try:
                ok = torch.broadcast_shapes(mask.shape, target) == torch.Size(target)
            except RuntimeError:
                ok = False
            if not ok:
                raise ValueError(f"mask of shape {tuple(mask.shape)} is not broadcastable to {names} = {target}")
        if head_mask is not None:
            check_type("head_mask", head_mask, torch.Tensor, "a torch.Tensor or None")
            if head_mask.shape != (self.n_heads,):
                raise ValueError(f"head_mask must have shape (n_heads,) = ({self.n_heads},), got shape "
                                 f"{tuple(head_mask.shape)}")
            if not (head_mask.dtype.is_floating_point or head_mask.dtype == torch.bool):
                raise TypeError(f"head_mask must be a float or bool tensor, got dtype {head_mask.dtype}")
            if head_mask.device != x_q.device:
                raise ValueError(f"device mismatch: head_mask is on {head_mask.device}, x_q is on {x_q.device}")
        if positions is not None:
            self._check_positions(positions, n, l_q, unbatched, x_q.device)
        if self.impl == "triton":  # what the kernel cannot do, refused before anything (the cache) is touched
            if mask is not None:
                raise ValueError("impl='triton' supports is_causal=True but not an arbitrary mask; got a mask of shape "
                                 f"{tuple(mask.shape)}: use impl='sdpa' or impl='naive'")
            if need_weights:
                raise ValueError("impl='triton' never forms the attention weights, so need_weights must be False; "
                                 "use impl='sdpa' or impl='naive' to get them")
        return unbatched, l_q, l_kv

    def _check_positions(self, positions, n: int, l_q: int, unbatched: bool, device: torch.device) -> None:
        """positions: an integer tensor (L_q,) or (N, L_q) on x_q's device; on the CPU also >= 0."""
        if self.rope_base is None:
            raise ValueError("positions are RoPE's positions, but this module has no RoPE (rope_base=None): pass "
                             "positions=None, or build the module with rope_base=...")
        check_positions(positions, n, l_q, unbatched, device)

    def _check_width_and_length(self, name: str, x: torch.Tensor) -> None:
        """x (.., L, d_model) with d_model the module's and at least one position."""
        if x.shape[-1] != self.d_model:
            raise ValueError(f"{name}'s last dimension must be d_model={self.d_model}, got shape {tuple(x.shape)}")
        if x.shape[-2] == 0:
            raise ValueError(f"{name} must have at least one position, got shape {tuple(x.shape)}")

    # ---------------------------------------------------------------------------------------- NumPy exchange
    def _param_specs(self) -> dict[str, tuple[torch.Tensor, tuple[int, ...], bool]]:
        """name -> (tensor, expected dict shape, stored transposed?) in the NumPy params-dict convention."""
        h, g, hd, d = self.n_heads, self.n_kv_heads, self.head_dim, self.d_model
        specs = {
            "W_q": (self.q_proj.weight, (d, h * hd), True),
            "W_k": (self.k_proj.weight, (d, g * hd), True),
            "W_v": (self.v_proj.weight, (d, g * hd), True),
            "W_o": (self.o_proj.weight, (h * hd, d), True),
        }
        if self.q_proj.bias is not None:
            specs.update({
                "b_q": (self.q_proj.bias, (h * hd,), False),
                "b_k": (self.k_proj.bias, (g * hd,), False),
                "b_v": (self.v_proj.bias, (g * hd,), False),
                "b_o": (self.o_proj.bias, (d,), False),
            })
        if self.sinks is not None:
            specs["sinks"] = (self.sinks, (h,), False)
        if self.qk_norm:
            specs.update({"q_norm": (self.q_norm, (hd,), False), "k_norm": (self.k_norm, (hd,), False)})
        if self.gate_proj is not None:
            width = self.gate_proj.out_features  # h (headwise) or h * head_dim (elementwise)
            specs["W_gate"] = (self.gate_proj.weight, (d, width), True)
            if self.gate_proj.bias is not None:
                specs["b_gate"] = (self.gate_proj.bias, (width,), False)
        return specs

    def _describe_params(self) -> str:
        """What decides the params dict's keys: "bias=True", plus the parameters of the options that have some."""
        extra = (", sinks=True" if self.sinks is not None else "") + (", qk_norm=True" if self.qk_norm else "")
        extra += "" if self.gate is None else f", gate={self.gate!r}"
        return f"bias={self.q_proj.bias is not None}{extra}"

    def export_params(self) -> dict[str, np.ndarray]:
        """The weights as the NumPy params dict (float64 arrays): W_q = q_proj.weight.T, b_q = q_proj.bias, ...;
        with the options, "sinks" (h,), "q_norm" and "k_norm" (head_dim,), "W_gate" = gate_proj.weight.T and
        "b_gate" (the keys ``mha.reference`` uses; pass it ``gate=module.gate``).

        Book: part I, "From one head to h heads" (the parameter names). Round-trips with :meth:`load_params`.
        """
        return export_specs(self._param_specs())

    def load_params(self, params: dict) -> None:
        """Copy weights from a NumPy-convention params dict (numpy arrays or tensors); keeps dtype and device.

        Every key and shape is checked before anything is written. With ``bias=False`` the dict must not contain
        biases; with ``bias=True`` it must contain all four. A key whose value is None counts as absent.
        """
        load_specs(self._param_specs(), params, self._describe_params(),
                   f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                   f"head_dim={self.head_dim}")


def _check_rope_dim(rope_dim, head_dim: int, rope_base) -> int | None:
    """The coordinates RoPE rotates: None without RoPE (and then rope_dim must be None), head_dim for None, else an
    even integer in [2, head_dim] (the rule of ``mha.reference``)."""
    if rope_dim is None:
        return None if rope_base is None else head_dim
    rope_dim = check_int("rope_dim", rope_dim, minimum=2, maximum=head_dim)
    if rope_dim % 2:
        raise ValueError(f"rope_dim must be even (RoPE rotates pairs of coordinates), got rope_dim = {rope_dim} "
                         f"(head_dim = {head_dim})")
    if rope_base is None:
        raise ValueError(f"rope_dim = {rope_dim} is given but rope_base is None: rope_dim is the part of each head "
                         f"RoPE rotates (pass rope_base, e.g. 10000.0)")
    return rope_dim
