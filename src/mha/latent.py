"""``MultiHeadLatentAttention`` (MLA: DeepSeek-V2, DeepSeek-V3, Kimi K2) and ``LatentCache``, the cache that holds
only its latent vectors and its shared rotary keys.

Book: part IV, 'Multi-head latent attention (MLA)'. The layer, its ``params`` dict and why
the two forms are one function are derived in ``mha.reference.latent``'s docstring, the NumPy float64 twin this
module is tested against. In short (row vectors, n = qk_nope_head_dim, r = qk_rope_head_dim, d_c = kv_rank)::

    q = rms_norm(x W_dq) W_uq (or x W_q), per head [q_nope_i, q_rope_i]      [c, k_rope] = [rms_norm(.), .] of x W_dkv
    naive     k_i = [c W_uk_i, k_rope], v_i = c W_uv_i, softmax(scale q_i k_i^T) v_i        (per-head K, V rebuilt)
    absorbed  softmax(scale ((q_nope_i W_uk_i^T) c^T + q_rope_i k_rope^T)) c, then W_uv_i    (scored on the latent)

then the heads concatenated and W_o. The cache stores c (d_c per token) and the rotated k_rope (r per token): 576
numbers per token and layer for DeepSeek-V3, where 128 heads of keys and values would be 40,960.

Which form runs: ``forward(..., absorb=None)`` takes the absorbed form for a decoding step (a ``kv_cache`` and one new
token) and the naive one otherwise. That is this package's choice, by the counts below: DeepSeek's inference code
(inference/model.py, attn_impl "absorb", its default) runs both absorbed, and Hugging Face's ``DeepseekV3Attention``
(transformers 5.24) runs both naive, re-expanding every cached latent with kv_b_proj at each step; all three cache
the latent and the rotated shared key. One query against L cached latents is cheapest absorbed (no L x h expansion of
keys and values per step); a prefill of L queries is cheapest naive (the expansion is paid once per token, and
its scores are n + r wide instead of d_c + r): ``mha.counting.latent_flops_per_token`` counts both. ``absorb=True``
or ``False`` forces one; both give the same result (to rounding), with or without a cache.

Like ``mha.MultiHeadAttention`` the forward pass never reads tensor values (no host-device synchronisation): NaN or
inf propagate instead of raising (the NumPy reference refuses them). No biases (DeepSeek's ``attention_bias=False``),
no dropout, self-attention only.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch
from torch import nn

from mha._checks import attention_scale, check_bool, check_choice, check_float, check_int, check_like, check_type
from mha.attention import causal_mask
from mha.kv_cache import _check_device
from mha.params import export_specs, load_specs
from mha.rope import ROPE_STYLES, apply_rope, check_positions, rms_norm, rope_cos_sin

__all__ = ["MultiHeadLatentAttention", "LatentCache"]


class LatentCache:
    """The latents ``c`` (N, max_len, kv_rank) and rotated shared keys ``k_rope`` (N, max_len, rope_dim) of the
    positions decoded so far: all an MLA layer needs to attend over them (no per-head keys or values).

    As ``mha.KVCache``: preallocated once, ``length`` a host ``int`` (settable within ``[0, max_len]``, to rewind),
    every check before anything is written, one layer's cache (refused to another module until :meth:`reset`).
    Build it with ``MultiHeadLatentAttention.new_cache``.
    """

    def __init__(self, batch_size: int, max_len: int, kv_rank: int, rope_dim: int,
                 dtype: torch.dtype = torch.float32, device=None):
        for name, value in [("batch_size", batch_size), ("max_len", max_len), ("kv_rank", kv_rank),
                            ("rope_dim", rope_dim)]:
            check_int(name, value)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        device = _check_device(device)
        self.batch_size, self.max_len, self.kv_rank, self.rope_dim = batch_size, max_len, kv_rank, rope_dim
        self.c = torch.zeros(batch_size, max_len, kv_rank, dtype=dtype, device=device)  # (N, max_len, d_c)
        self.k_rope = torch.zeros(batch_size, max_len, rope_dim, dtype=dtype, device=device)  # (N, max_len, r)
        self._length = 0
        self._owner = None  # weakref to the module whose latents fill the cache

    @property
    def length(self) -> int:
        """The number of positions filled, in ``[0, max_len]``; may be set by hand (to rewind)."""
        return self._length

    @length.setter
    def length(self, value: int) -> None:
        self._length = check_int("length", value, minimum=0, maximum=self.max_len)

    @property
    def dtype(self) -> torch.dtype:
        return self.c.dtype

    @property
    def device(self) -> torch.device:
        return self.c.device

    @property
    def nbytes(self) -> int:
        """Bytes of the two buffers: ``batch_size * max_len * (kv_rank + rope_dim) * itemsize``."""
        return self.c.numel() * self.c.element_size() + self.k_rope.numel() * self.k_rope.element_size()

    def check_append(self, batch_size: int, n_new: int, dtype: torch.dtype, device: torch.device,
                     owner=None) -> None:
        """Raise if ``n_new`` positions of this batch size, dtype and device cannot be appended; touches nothing."""
        if owner is not None and self._length > 0 and self._owner is not None and self._owner() is not owner:
            raise ValueError("kv_cache holds latents written by another MultiHeadLatentAttention (one LatentCache "
                             "holds one layer's latents): give each layer its own cache, or call kv_cache.reset()")
        if batch_size != self.batch_size:
            raise ValueError(f"x has batch size {batch_size} but the LatentCache was built for batch_size "
                             f"{self.batch_size}")
        if dtype != self.dtype:
            raise TypeError(f"x has dtype {dtype} but the LatentCache holds {self.dtype}")
        if torch.device(device) != self.device:
            raise ValueError(f"x is on device {device} but the LatentCache is on {self.device}")
        if self._length + n_new > self.max_len:
            raise ValueError(f"LatentCache overflow: {self._length} cached + {n_new} new > max_len {self.max_len}")

    def append(self, c_new: torch.Tensor, k_rope_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``c_new`` (N, T, kv_rank) and ``k_rope_new`` (N, T, rope_dim) after the filled prefix and return
        views of everything cached, (N, length, kv_rank) and (N, length, rope_dim). Raises, writing nothing, on a
        shape, dtype or device mismatch or on overflow."""
        check_type("c_new", c_new, torch.Tensor, "a torch.Tensor")
        check_type("k_rope_new", k_rope_new, torch.Tensor, "a torch.Tensor")
        n, t = c_new.shape[:2]
        if c_new.shape != (n, t, self.kv_rank) or k_rope_new.shape != (n, t, self.rope_dim):
            raise ValueError(f"c_new and k_rope_new must have shapes (N, T, kv_rank) = (N, T, {self.kv_rank}) and "
                             f"(N, T, rope_dim) = (N, T, {self.rope_dim}), got {tuple(c_new.shape)} and "
                             f"{tuple(k_rope_new.shape)}")
        check_like("k_rope_new", k_rope_new, "c_new", c_new)
        self.check_append(n, t, c_new.dtype, c_new.device)
        start, stop = self._length, self._length + t
        self.c[:, start:stop] = c_new  # (N, T, d_c) into (N, max_len, d_c)
        self.k_rope[:, start:stop] = k_rope_new  # (N, T, r) into (N, max_len, r)
        self._length = stop
        return self.c[:, :stop], self.k_rope[:, :stop]  # (N, length, d_c), (N, length, r)

    def _claim(self, owner) -> None:
        if self._owner is None or self._owner() is not owner:
            self._owner = weakref.ref(owner)

    def reset(self) -> None:
        """Forget every cached position and the module that wrote them (the buffers are kept, not zeroed)."""
        self._length = 0
        self._owner = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_owner": None}

    def __repr__(self) -> str:
        return (f"LatentCache(batch_size={self.batch_size}, max_len={self.max_len}, kv_rank={self.kv_rank}, "
                f"rope_dim={self.rope_dim}, dtype={self.dtype}, device={self.device}, length={self.length})")


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention (self-attention, causal by default), the module twin of
    ``mha.reference.multi_head_latent_attention``.

    Args:
        d_model: model width. n_heads: h.
        kv_rank: d_c, the width of the cached latent (DeepSeek-V3: 512).
        q_rank: None (a plain ``q_proj``) or the width of the query latent (DeepSeek-V3: 1536).
        qk_nope_head_dim: n, the query/key coordinates without position; None means d_model // n_heads.
        qk_rope_head_dim: r (even), the rotary coordinates; None means n // 2 (DeepSeek's 128 and 64).
        v_head_dim: d_v; None means n.
        rope_base: RoPE's base (> 0). rope_style: "interleaved" (DeepSeek; Hugging Face's ``rope_interleave=True``)
            or "half" (``rope_interleave=False``).
        scale: multiplier of the scores; None means (n + r) ** -0.5.
        norm_eps: the epsilon of the two RMSNorms (> 0).

    Submodules and parameters (Hugging Face's ``DeepseekV3Attention`` names in brackets): ``q_proj`` [q_proj] or
    ``q_a_proj`` [q_a_proj], ``q_a_norm`` (a parameter, (q_rank,)) [q_a_layernorm.weight], ``q_b_proj`` [q_b_proj];
    ``kv_a_proj`` [kv_a_proj_with_mqa], ``kv_a_norm`` (a parameter, (kv_rank,)) [kv_a_layernorm.weight],
    ``kv_b_proj`` [kv_b_proj], ``o_proj`` [o_proj]. All ``nn.Linear`` without bias, weights (out, in) as torch's.
    """

    def __init__(self, d_model: int, n_heads: int, kv_rank: int, q_rank: int | None = None,
                 qk_nope_head_dim: int | None = None, qk_rope_head_dim: int | None = None,
                 v_head_dim: int | None = None, rope_base: float = 10000.0, rope_style: str = "interleaved",
                 scale: float | None = None, norm_eps: float = 1e-6):
        super().__init__()
        d_model, n_heads = check_int("d_model", d_model), check_int("n_heads", n_heads)
        kv_rank = check_int("kv_rank", kv_rank)
        q_rank = None if q_rank is None else check_int("q_rank", q_rank)
        nope, rope, v = self._head_widths(d_model, n_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
        self.d_model, self.n_heads, self.kv_rank, self.q_rank = d_model, n_heads, kv_rank, q_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = nope, rope, v
        self.rope_base = check_float("rope_base", rope_base, minimum=0.0, min_inclusive=False)
        self.rope_style = check_choice("rope_style", rope_style, ROPE_STYLES)
        self.scale = float(attention_scale(scale, nope + rope))
        self.norm_eps = check_float("norm_eps", norm_eps, minimum=0.0, min_inclusive=False)
        qk = n_heads * (nope + rope)
        if q_rank is None:
            self.q_proj = nn.Linear(d_model, qk, bias=False)
            self.q_a_proj = self.q_b_proj = None
            self.register_parameter("q_a_norm", None)
        else:
            self.q_proj = None
            self.q_a_proj = nn.Linear(d_model, q_rank, bias=False)
            self.q_a_norm = nn.Parameter(torch.ones(q_rank))  # (q_rank,)
            self.q_b_proj = nn.Linear(q_rank, qk, bias=False)
        self.kv_a_proj = nn.Linear(d_model, kv_rank + rope, bias=False)  # -> [latent, shared rotary key]
        self.kv_a_norm = nn.Parameter(torch.ones(kv_rank))  # (kv_rank,)
        self.kv_b_proj = nn.Linear(kv_rank, n_heads * (nope + v), bias=False)  # head i: [W_uk_i, W_uv_i]
        self.o_proj = nn.Linear(n_heads * v, d_model, bias=False)

    @staticmethod
    def _head_widths(d_model, n_heads, nope, rope, v) -> tuple[int, int, int]:
        """n, r, d_v with their defaults (d_model // h, n // 2, n); r must be even."""
        if nope is None:
            if d_model % n_heads:
                raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads}) when "
                                 f"qk_nope_head_dim is None; pass qk_nope_head_dim explicitly")
            nope = d_model // n_heads
        nope = check_int("qk_nope_head_dim", nope)
        rope = check_int("qk_rope_head_dim", nope // 2 if rope is None else rope)
        if rope % 2:
            raise ValueError(f"qk_rope_head_dim must be even (RoPE rotates pairs of coordinates), got {rope}")
        return nope, rope, check_int("v_head_dim", nope if v is None else v)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, kv_rank={self.kv_rank}, q_rank={self.q_rank}, "
                f"qk_nope_head_dim={self.qk_nope_head_dim}, qk_rope_head_dim={self.qk_rope_head_dim}, "
                f"v_head_dim={self.v_head_dim}, rope_base={self.rope_base:g}, rope_style={self.rope_style!r}, "
                f"scale={self.scale:.6g}")

    def new_cache(self, batch_size: int, max_len: int) -> LatentCache:
        """A :class:`LatentCache` of ``max_len`` positions with the parameters' dtype and device."""
        weight = self.kv_a_proj.weight
        return LatentCache(batch_size, max_len, self.kv_rank, self.qk_rope_head_dim, dtype=weight.dtype,
                           device=weight.device)

    # ------------------------------------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, is_causal: bool = True, kv_cache: LatentCache | None = None,
                absorb: bool | None = None, positions: torch.Tensor | None = None, need_weights: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(out, weights)``: out (N, L, d_model) (unbatched: (L, d_model)); weights (N, h, L, L_kv) or None.

        ``kv_cache``: this call's latents are appended and the queries attend over every cached position (causal:
        bottom-right aligned, query i sees keys j <= cache.length + i). ``absorb``: None (absorbed for one new token
        with a cache, naive otherwise), True or False. ``positions``: RoPE's positions, an integer tensor (L,) or
        (N, L), >= 0; None means arange(L), with a cache cache.length + arange(L). The cache advances only when
        the call succeeds.
        """
        unbatched, absorb = self._check_inputs(x, is_causal, kv_cache, absorb, positions, need_weights)
        x = x.unsqueeze(0) if unbatched else x  # (N, L, d_model)
        l_q = x.shape[1]
        if positions is None:
            start = 0 if kv_cache is None else kv_cache.length
            positions = torch.arange(start, start + l_q, device=x.device)  # (L,)
        cos, sin = rope_cos_sin(positions, self.qk_rope_head_dim, self.rope_base, x.dtype)  # (.., L, r/2) each
        q_nope, q_rope = self._queries(x, cos, sin)
        c, k_rope = self._latents(x, cos, sin)
        if kv_cache is None:
            return self._attend_and_project(q_nope, q_rope, c, k_rope, is_causal, absorb, need_weights, unbatched)
        cached = kv_cache.length
        try:
            c, k_rope = kv_cache.append(c, k_rope)  # (N, L_kv, d_c), (N, L_kv, r): everything cached
            result = self._attend_and_project(q_nope, q_rope, c, k_rope, is_causal, absorb, need_weights, unbatched)
        except BaseException:  # leave the cache as it was (what was written past `cached` is never read)
            kv_cache.length = cached
            raise
        kv_cache._claim(self)
        return result

    def _queries(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """q_nope (N, h, L, n) and the rotated q_rope (N, h, L, r)."""
        n, l_q = x.shape[:2]
        if self.q_rank is None:
            q = self.q_proj(x)  # (N, L, h (n + r))
        else:
            q = self.q_b_proj(rms_norm(self.q_a_proj(x), self.q_a_norm, self.norm_eps))  # (N, L, h (n + r))
        q = q.view(n, l_q, self.n_heads, -1).transpose(1, 2)  # (N, h, L, n + r)
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        return q_nope, apply_rope(q_rope, cos, sin, self.rope_style)  # (N, h, L, n), (N, h, L, r)

    def _latents(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalised latent c (N, L, d_c) and the rotated shared key k_rope (N, L, r): what the cache holds."""
        c, k_rope = self.kv_a_proj(x).split([self.kv_rank, self.qk_rope_head_dim], dim=-1)  # (N, L, d_c), (N, L, r)
        c = rms_norm(c, self.kv_a_norm, self.norm_eps)
        k_rope = apply_rope(k_rope.unsqueeze(1), cos, sin, self.rope_style).squeeze(1)  # (N, 1, L, r) -> (N, L, r)
        return c, k_rope

    def _up_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_uk^T (h, n, d_c) and W_uv^T (h, d_v, d_c): kv_b_proj's weight, head by head."""
        w = self.kv_b_proj.weight.view(self.n_heads, -1, self.kv_rank)  # (h (n + d_v), d_c) -> (h, n + d_v, d_c)
        return w.split([self.qk_nope_head_dim, self.v_head_dim], dim=1)  # (h, n + d_v, d_c) -> two blocks

    def _attend_and_project(self, q_nope, q_rope, c, k_rope, is_causal, absorb, need_weights, unbatched):
        """Attention over the latents c (N, L_kv, d_c) and keys k_rope (N, L_kv, r), heads merged, o_proj."""
        n, h, l_q, _ = q_nope.shape
        l_kv = c.shape[1]
        mask = causal_mask(l_q, l_kv, q_nope.device) if is_causal and l_q > 1 else None  # (L_q, L_kv)
        attend = self._absorbed_attention if absorb else self._naive_attention
        heads, weights = attend(q_nope, q_rope, c, k_rope, mask)  # (N, h, L_q, d_v), (N, h, L_q, L_kv)
        out = self.o_proj(heads.transpose(1, 2).reshape(n, l_q, h * self.v_head_dim))  # (N, L_q, d_model)
        if unbatched:
            out, weights = out[0], weights[0]
        return out, weights if need_weights else None

    def _naive_attention(self, q_nope, q_rope, c, k_rope, mask):
        """Rebuild every head's key [c W_uk_i, k_rope] and value c W_uv_i from the latents, then attend."""
        n, h, _, _ = q_nope.shape
        l_kv = c.shape[1]
        kv = self.kv_b_proj(c).view(n, l_kv, h, -1).transpose(1, 2)  # (N, h, L_kv, n + d_v)
        k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)  # (N, h, L_kv, n), (.., d_v)
        k = torch.cat([k_nope, k_rope.unsqueeze(1).expand(n, h, l_kv, -1)], dim=-1)  # (N, h, L_kv, n + r)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (N, h, L_q, n + r)
        weights = self._softmax((q @ k.transpose(-2, -1)) * self.scale, mask)  # (N, h, L_q, L_kv)
        return weights @ v, weights  # (N, h, L_q, d_v)

    def _absorbed_attention(self, q_nope, q_rope, c, k_rope, mask):
        """Score on the latents: (q_nope_i W_uk_i^T) c^T + q_rope_i k_rope^T; output (A_i c) W_uv_i. The h heads and
        L_q queries are stacked into rows against the one shared key head, as MQA (nothing expanded per head)."""
        n, h, l_q, _ = q_nope.shape
        l_kv = c.shape[1]
        w_uk_t, w_uv_t = self._up_weights()  # (h, n, d_c), (h, d_v, d_c)
        q_lat = q_nope @ w_uk_t  # (N, h, L_q, d_c): W_uk_i absorbed into the query
        rows = h * l_q
        scores = q_lat.reshape(n, rows, self.kv_rank) @ c.transpose(1, 2)  # (N, h L_q, L_kv)
        scores = scores + q_rope.reshape(n, rows, self.qk_rope_head_dim) @ k_rope.transpose(1, 2)  # (N, h L_q, L_kv)
        weights = self._softmax(scores.view(n, h, l_q, l_kv) * self.scale, mask)  # (N, h, L_q, L_kv)
        o_lat = weights.reshape(n, rows, l_kv) @ c  # (N, h L_q, d_c): weighted sums of latents
        heads = o_lat.view(n, h, l_q, self.kv_rank) @ w_uv_t.transpose(1, 2)  # (N, h, L_q, d_v)
        return heads, weights

    @staticmethod
    def _softmax(scores, mask):
        """softmax over the keys, masked entries -inf; float16/bfloat16 scores in float32 (as mha.attention)."""
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores,
                             dim=-1).to(scores.dtype)

    # --------------------------------------------------------------------------------------------- validation
    def _check_inputs(self, x, is_causal, kv_cache, absorb, positions, need_weights) -> tuple[bool, bool]:
        """Metadata checks only (no device reads, except positions on the CPU). Returns (unbatched, absorb)."""
        check_bool("is_causal", is_causal)
        check_bool("need_weights", need_weights)
        if absorb is not None:
            check_bool("absorb", absorb)
        check_type("x", x, torch.Tensor, "a torch.Tensor")
        if x.ndim not in (2, 3) or x.shape[-1] != self.d_model or x.shape[-2] == 0:
            raise ValueError(f"x must be (N, L, d_model) or unbatched (L, d_model) with d_model={self.d_model} and "
                             f"L >= 1, got shape {tuple(x.shape)}")
        weight = self.kv_a_proj.weight
        if x.dtype != weight.dtype:
            raise TypeError(f"x has dtype {x.dtype} but the module's parameters have dtype {weight.dtype}")
        if x.device != weight.device:
            raise ValueError(f"x is on device {x.device} but the module's parameters are on {weight.device}")
        unbatched = x.ndim == 2
        n, l_q = (1 if unbatched else x.shape[0]), x.shape[-2]
        if kv_cache is not None:
            check_type("kv_cache", kv_cache, LatentCache, "a mha.latent.LatentCache or None")
            if (kv_cache.kv_rank, kv_cache.rope_dim) != (self.kv_rank, self.qk_rope_head_dim):
                raise ValueError(f"kv_cache has kv_rank={kv_cache.kv_rank}, rope_dim={kv_cache.rope_dim} but the "
                                 f"module has kv_rank={self.kv_rank}, qk_rope_head_dim={self.qk_rope_head_dim} "
                                 f"(build it with module.new_cache(batch_size, max_len))")
            kv_cache.check_append(n, l_q, x.dtype, x.device, owner=self)
        if positions is not None:
            check_positions(positions, n, l_q, unbatched, x.device, length="L", tensor="x")
        if absorb is None:
            absorb = kv_cache is not None and l_q == 1  # a decoding step
        return unbatched, absorb

    # ---------------------------------------------------------------------------------------- NumPy exchange
    def _param_specs(self) -> dict[str, tuple[torch.Tensor, tuple[int, ...], bool]]:
        """key of ``mha.reference.latent``'s params dict -> (tensor, shape in the dict, stored transposed?)."""
        d, h, c, r = self.d_model, self.n_heads, self.kv_rank, self.qk_rope_head_dim
        qk, kv = h * (self.qk_nope_head_dim + r), h * (self.qk_nope_head_dim + self.v_head_dim)
        if self.q_rank is None:
            specs = {"W_q": (self.q_proj.weight, (d, qk), True)}
        else:
            specs = {"W_dq": (self.q_a_proj.weight, (d, self.q_rank), True),
                     "q_norm": (self.q_a_norm, (self.q_rank,), False),
                     "W_uq": (self.q_b_proj.weight, (self.q_rank, qk), True)}
        specs.update({"W_dkv": (self.kv_a_proj.weight, (d, c + r), True), "kv_norm": (self.kv_a_norm, (c,), False),
                      "W_ukv": (self.kv_b_proj.weight, (c, kv), True),
                      "W_o": (self.o_proj.weight, (h * self.v_head_dim, d), True)})
        return specs

    def export_params(self) -> dict[str, np.ndarray]:
        """The weights as ``mha.reference.multi_head_latent_attention``'s params dict (float64 arrays, W = weight.T).
        Round-trips with :meth:`load_params`."""
        return export_specs(self._param_specs())

    def load_params(self, params: dict) -> None:
        """Copy weights from a reference params dict (arrays or tensors); every key and shape is checked before
        anything is written; the module keeps its dtype and device. A key whose value is None counts as absent."""
        load_specs(self._param_specs(), params, f"q_rank={self.q_rank}",
                   f"d_model={self.d_model}, n_heads={self.n_heads}, q_rank={self.q_rank}, kv_rank={self.kv_rank}, "
                   f"qk_nope_head_dim={self.qk_nope_head_dim}, qk_rope_head_dim={self.qk_rope_head_dim}, "
                   f"v_head_dim={self.v_head_dim}")
