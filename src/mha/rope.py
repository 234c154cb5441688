"""Rotary position embeddings (RoPE), per-head RMSNorm (QK-norm) and the sliding-window mask, for tensors.

Book: part IV, 'Rotary position embeddings (RoPE)', 'QK-norm and logit soft-capping' and 'Sliding windows and
attention sinks'. The helpers of ``mha.MultiHeadAttention``'s options for today's models, kept apart so that
``attention.py`` stays readable.

RoPE (Su et al. 2021). For a head of size d (even), frequencies theta_i = base ** (-2 i / d), i < d / 2; the
vector at absolute position p has its pairs rotated by the angles p * theta_i:
(a, b) -> (a cos - b sin, a sin + b cos). Two layouts of the pairs:

* ``"half"``: pair i is (x_i, x_{i + d/2}): Hugging Face's ``rotate_half`` (Llama, Mistral, Qwen, Gemma, gpt-oss).
* ``"interleaved"``: pair i is (x_{2i}, x_{2i+1}): Meta's original Llama code, GPT-J, DeepSeek's rope part.

Both rotate the same pairs by the same angles; they differ only in which coordinates form a pair, so a model trained
with one layout computes the same function with the other after permuting the columns of W_q and W_k.

Partial RoPE (Qwen3-Next's ``partial_rotary_factor``, GLM, Phi): cos and sin of a RoPE of size r < d (frequencies
base ** (-2 i / r), from ``rope_cos_sin(positions, r, ...)``) rotate the first r coordinates of each head, pairs
taken within them, and leave the other d - r as they are, as Hugging Face's ``apply_rotary_pos_emb`` does when its
cos/sin are narrower than the head.

The angles are computed in float64 (float32 on MPS, which has no float64) and only then rounded to the tensors'
dtype: at position 100,000 a float32 angle is already off by ~0.004 rad, which is what Hugging Face's float32
rotary module does. The cosines and sines are small ((L, d/2)) tensors, so this costs nothing measurable.
"""

from __future__ import annotations

import torch

from mha._checks import check_type

__all__ = ["ROPE_STYLES", "rope_cos_sin", "apply_rope", "rms_norm", "window_mask", "check_positions"]

ROPE_STYLES = ("half", "interleaved")


def rope_cos_sin(positions: torch.Tensor, head_dim: int, base: float, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles p * theta_i, each ``positions.shape + (head_dim // 2,)``, in ``dtype``.

    ``positions``: integer tensor of absolute positions, (L,) or (N, L). theta_i = base ** (-2 i / head_dim).
    """
    work = torch.float32 if positions.device.type == "mps" else torch.float64
    i = torch.arange(head_dim // 2, dtype=work, device=positions.device)  # (d/2,)
    theta = base ** (-2.0 * i / head_dim)  # (d/2,)
    angles = positions.to(work).unsqueeze(-1) * theta  # (..., L, d/2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str = "half") -> torch.Tensor:
    """Rotate the pairs of ``x`` (N, heads, L, d) by the angles whose cos/sin are given ((L, d/2) or (N, L, d/2)).

    ``style="half"`` pairs (x_i, x_{i+d/2}); ``style="interleaved"`` pairs (x_{2i}, x_{2i+1}). cos/sin of r/2 < d/2
    angles (partial RoPE): only the first r coordinates are rotated (pairs within them), the rest pass unchanged.
    """
    rotated = 2 * cos.shape[-1]
    if rotated < x.shape[-1]:  # partial RoPE: rotate x[..., :r], keep x[..., r:]
        return torch.cat((apply_rope(x[..., :rotated], cos, sin, style), x[..., rotated:]), dim=-1)
    if cos.ndim == 3:  # (N, L, d/2): one set of positions per sequence
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (N, 1, L, d/2)
    half = x.shape[-1] // 2
    if style == "half":
        a, b = x[..., :half], x[..., half:]  # each (N, heads, L, d/2)
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)  # (N, heads, L, d)
    a, b = x[..., 0::2], x[..., 1::2]  # each (N, heads, L, d/2)
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)  # (N, heads, L, d)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * weight (one weight of size d for every head).

    float16/bfloat16 inputs are normalised *and* multiplied by the gain in float32, then rounded back once: the order
    of Hugging Face's Gemma RMSNorms (``(x_hat * (1 + w')).type_as(x)``, all in float32). Its Llama and Qwen3 RMSNorms
    also normalise in float32 but round ``x_hat`` to the input's dtype first and multiply by the gain after, in that
    dtype (``w * x_hat.to(dtype)``), so in half precision they can differ from this by a rounding of the result.
    """
    dtype = x.dtype
    if dtype in (torch.float16, torch.bfloat16):
        x, weight = x.float(), weight.float()
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(x.dtype)
    return y.to(dtype)


def window_mask(query_index: torch.Tensor, key_index: torch.Tensor, window: int, n_sink_tokens: int = 0
                ) -> torch.Tensor:
    """Boolean (L_q, L_kv) mask, True = may attend: query at sequence index p sees key j iff p - window < j <= p,
    or j < n_sink_tokens and j <= p (StreamingLLM's sink tokens). Negative key indices (empty cache slots) are never
    seen. The window counts the query itself (gpt-oss's and Hugging Face's convention) and is causal by itself.
    """
    q = query_index.unsqueeze(-1)  # (L_q, 1)
    k = key_index.unsqueeze(0)  # (1, L_kv)
    recent = (k > q - window) | (k < n_sink_tokens)
    return recent & (k <= q) & (k >= 0)  # (L_q, L_kv)


def check_positions(positions, n: int, l_q: int, unbatched: bool, device, *, length: str = "L_q",
                    tensor: str = "x_q") -> None:
    """RoPE's ``positions`` for a module's call: an integer tensor ``(L,)`` or ``(N, L)`` (``(L,)`` only for unbatched
    input) on the input's device, and on the CPU also >= 0 (host memory: no device sync). ``length`` and ``tensor``
    name the sequence length and the input in the messages."""
    check_type("positions", positions, torch.Tensor, "an integer torch.Tensor or None")
    if positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
        raise TypeError(f"positions must be an integer tensor, got dtype {positions.dtype}")
    shapes = [(l_q,)] if unbatched else [(l_q,), (n, l_q)]
    if tuple(positions.shape) not in shapes:
        expected = f"({length},) = ({l_q},)" + ("" if unbatched else f" or (N, {length}) = ({n}, {l_q})")
        raise ValueError(f"positions must have shape {expected}, got shape {tuple(positions.shape)}")
    if positions.device != device:
        raise ValueError(f"device mismatch: positions is on {positions.device}, {tensor} is on {device}")
    if positions.device.type == "cpu" and bool((positions < 0).any()):
        raise ValueError(f"positions must be integers >= 0, got a minimum of {int(positions.min())}")
