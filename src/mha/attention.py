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
the NumPy reference ``mha.reference``, which refuses them.
"""

from __future__ import annotations


import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mha._checks import attention_scale, check_bool, check_choice, check_float, check_like, check_type, head_shape
from mha.kv_cache import KVCache

__all__ = ["MultiHeadAttention", "causal_mask"]

IMPLS = ("sdpa", "naive", "triton")


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

    Attributes: d_model, n_heads, n_kv_heads, head_dim, impl, dropout, and ``scale`` (the scale actually used,
    a float: 1 / sqrt(head_dim) when the argument was None). Submodules q_proj, k_proj, v_proj, o_proj.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, head_dim: int | None = None,
                 bias: bool = True, dropout: float = 0.0, impl: str = "sdpa", scale: float | None = None):
        super().__init__()
        d_model, n_heads, n_kv_heads, head_dim = head_shape(d_model, n_heads, n_kv_heads, head_dim)
        check_choice("impl", impl, IMPLS)
        check_bool("bias", bias)
        dropout = check_float("dropout", dropout, minimum=0.0, maximum=1.0, max_inclusive=False)
        if impl == "triton" and dropout != 0:
            raise ValueError(f"impl='triton' has no attention dropout: dropout must be 0, got {dropout!r}; use "
                             f"impl='sdpa' or impl='naive' for dropout")
        scale = attention_scale(scale, head_dim)  # the rule mha.reference applies

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

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"head_dim={self.head_dim}, impl={self.impl!r}, dropout={self.dropout}, scale={self.scale:.6g}")

    # ------------------------------------------------------------------------------------------------ forward
    def forward(self, x_q: torch.Tensor, x_kv: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                is_causal: bool = False, need_weights: bool = True, kv_cache: KVCache | None = None,
                head_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
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

        Returns:
            ``(out, weights)``: out (N, L_q, d_model) (unbatched: (L_q, d_model)); weights (N, h, L_q, L_kv)
            (unbatched: (h, L_q, L_kv)), the softmax probabilities before dropout, or None.
        """
        unbatched, l_q, l_kv = self._check_inputs(x_q, x_kv, mask, kv_cache, head_mask, is_causal, need_weights)
        if unbatched:
            x_q = x_q.unsqueeze(0)  # (1, L_q, d_model)
            x_kv = None if x_kv is None else x_kv.unsqueeze(0)  # (1, L_kv, d_model)
        if x_kv is None:
            x_kv = x_q
        n = x_q.shape[0]
        h, g, hd = self.n_heads, self.n_kv_heads, self.head_dim

        q = self.q_proj(x_q).view(n, l_q, h, hd).transpose(1, 2)  # (N, h, L_q, head_dim)
        l_new = x_kv.shape[1]
        k = self.k_proj(x_kv).view(n, l_new, g, hd).transpose(1, 2)  # (N, g, L_new, head_dim)
        v = self.v_proj(x_kv).view(n, l_new, g, hd).transpose(1, 2)  # (N, g, L_new, head_dim)
        if kv_cache is None:
            out, weights = self._attention(q, k, v, mask, is_causal, need_weights, l_q, l_kv)
            return self._merge_and_project(out, weights, head_mask, unbatched)
        cached = kv_cache.length
        try:
            k, v = kv_cache.append(k, v)  # each (N, g, L_kv, head_dim), L_kv = cached + L_q
            out, weights = self._attention(q, k, v, mask, is_causal, need_weights, l_q, l_kv)
            out, weights = self._merge_and_project(out, weights, head_mask, unbatched)
        except BaseException:  # an error in the kernel, out of memory, KeyboardInterrupt: leave the cache as it was
            # Setting length back is enough: the append wrote only at positions >= cached, which no read sees once
            # length is cached again (every read is of the filled prefix) and the next append overwrites.
            kv_cache.length = cached
            raise
        kv_cache._claim(self)  # the cache now holds this module's keys; other modules are refused (check_append)
        return out, weights

    def _attention(self, q, k, v, mask, is_causal, need_weights, l_q, l_kv):
        """(out (N, h, L_q, head_dim), weights (N, h, L_q, L_kv) or None) by the module's impl, masks applied."""
        if self.impl == "triton":
            return self._triton_attention(q, k, v, is_causal), None  # (N, h, L_q, head_dim)

        # Combine the user's mask and the causal mask into one boolean mask (or None), and note whether some
        # query row may have no allowed key (then its weights and output are set to zero, never NaN).
        sdpa_causal = False
        attn_mask = mask
        if is_causal:
            use_sdpa = self.impl == "sdpa" and not need_weights
            if use_sdpa and mask is None and l_q == l_kv:
                sdpa_causal = True  # SDPA's own causal path (top-left == bottom-right when L_q == L_kv)
            else:
                causal = causal_mask(l_q, l_kv, q.device)  # (L_q, L_kv)
                attn_mask = causal if mask is None else mask & causal  # broadcast to (.., L_q, L_kv)
        row_has_key = None  # (.., L_q, 1) boolean, only when a row could be fully masked
        if mask is not None or (is_causal and l_q > l_kv):
            row_has_key = attn_mask.any(dim=-1, keepdim=True)  # (.., L_q, 1)
            attn_mask = attn_mask | ~row_has_key  # a fully masked row attends everywhere; zeroed below

        if self.impl == "naive" or need_weights:
            out, weights = self._naive_attention(q, k, v, attn_mask, row_has_key)
            return out, weights if need_weights else None
        return self._sdpa_attention(q, k, v, attn_mask, row_has_key, sdpa_causal), None

    def _merge_and_project(self, out, weights, head_mask, unbatched):
        """head_mask, the concatenation of the heads, o_proj; the batch axis dropped again for unbatched input.

        Book: part I, "From one head to h heads" (Concat(head_1, ..., head_h) W^O).
        """
        n, h, l_q, hd = out.shape
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
        """
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal,
            scale=self.scale, enable_gqa=self.n_kv_heads < self.n_heads)  # (N, h, L_q, head_dim)
        if row_has_key is not None:
            out = torch.where(row_has_key, out, 0.0)  # fully masked rows -> 0, (N, h, L_q, head_dim)
        return out

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
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf"))  # (N, h, L_q, L_kv)
        weights = torch.softmax(scores, dim=-1).to(v.dtype)  # (N, h, L_q, L_kv)
        if row_has_key is not None:
            weights = torch.where(row_has_key, weights, 0.0)  # fully masked rows -> 0, (N, h, L_q, L_kv)
        dropped = F.dropout(weights, p=self.dropout, training=self.training)  # (N, h, L_q, L_kv)
        out = dropped.view(n, g, n_rep * l_q, l_kv) @ v  # (N, g, (h/g) * L_q, head_dim)
        out = out.view(n, h, l_q, hd)  # (N, h, L_q, head_dim)
        return out, weights

    # --------------------------------------------------------------------------------------------- validation
    def _check_inputs(self, x_q, x_kv, mask, kv_cache, head_mask, is_causal, need_weights) -> tuple[bool, int, int]:
        """Check shapes, dtypes and devices (metadata only, no device reads). Returns (unbatched, L_q, L_kv)."""
        check_choice("impl", self.impl, IMPLS)
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
        if self.impl == "triton":  # what the kernel cannot do, refused before anything (the cache) is touched
            if mask is not None:
                raise ValueError("impl='triton' supports is_causal=True but not an arbitrary mask; got a mask of shape "
                                 f"{tuple(mask.shape)}: use impl='sdpa' or impl='naive'")
            if need_weights:
                raise ValueError("impl='triton' never forms the attention weights, so need_weights must be False; "
                                 "use impl='sdpa' or impl='naive' to get them")
        return unbatched, l_q, l_kv

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
        return specs

    def export_params(self) -> dict[str, np.ndarray]:
        """The weights as the NumPy params dict (float64 arrays): W_q = q_proj.weight.T, b_q = q_proj.bias, ...

        Book: part I, "From one head to h heads" (the parameter names). Round-trips with :meth:`load_params`.
        """
        out = {}
        for name, (tensor, _, transposed) in self._param_specs().items():
            t = tensor.detach().to(device="cpu", dtype=torch.float64)
            out[name] = np.ascontiguousarray((t.T if transposed else t).numpy())
        return out

    def load_params(self, params: dict) -> None:
        """Copy weights from a NumPy-convention params dict (numpy arrays or tensors); keeps dtype and device.

        Every key and shape is checked before anything is written. With ``bias=False`` the dict must not contain
        biases; with ``bias=True`` it must contain all four. A key whose value is None counts as absent.
        """
        if not hasattr(params, "keys"):
            raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
        specs = self._param_specs()
        params = {key: value for key, value in params.items() if value is not None}  # None = absent (as in reference)
        missing = sorted(set(specs) - set(params))
        if missing:
            raise ValueError(f"params is missing {missing} (module has bias={self.q_proj.bias is not None}); "
                             f"expected keys {sorted(specs)}")
        extra = sorted(set(params) - set(specs))
        if extra:
            raise ValueError(f"params has unexpected keys {extra} (module has bias={self.q_proj.bias is not None}); "
                             f"expected keys {sorted(specs)}")
        values = {}
        for name, (tensor, shape, transposed) in specs.items():
            value = params[name]
            if not isinstance(value, torch.Tensor):
                value = torch.as_tensor(np.asarray(value))
            if tuple(value.shape) != shape:
                raise ValueError(f"params[{name!r}] must have shape {shape} (d_model={self.d_model}, "
                                 f"n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}), "
                                 f"got shape {tuple(value.shape)}")
            if not (value.dtype.is_floating_point or value.dtype in (torch.int32, torch.int64)):
                raise TypeError(f"params[{name!r}] must hold real numbers, got dtype {value.dtype}")
            values[name] = value.T if transposed else value
        with torch.no_grad():
            for name, (tensor, _, _) in specs.items():
                tensor.copy_(values[name].to(device=tensor.device, dtype=tensor.dtype))
