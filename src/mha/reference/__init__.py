"""NumPy float64 reference for multi-head attention, written to be read next to the book.

Every function is short and carries the equation it computes. Conventions (shared with ``mha.attention``):

* Row vectors, ``Y = X W``. ``x`` is ``(N, L, d_model)``; a 2-D ``(L, d_model)`` input (no batch) is also accepted.
* ``params`` is a dict: ``W_q (d_model, h*head_dim)``, ``W_k`` and ``W_v (d_model, g*head_dim)``,
  ``W_o (h*head_dim, d_model)``, optional biases ``b_q (h*head_dim,)``, ``b_k``, ``b_v (g*head_dim,)``,
  ``b_o (d_model,)``. ``head_dim`` and ``g = n_kv_heads`` are read from the shapes. Optional parts of today's
  models: ``q_norm`` and ``k_norm (head_dim,)`` (QK-norm, both or neither) and ``sinks (h,)`` (attention sinks).
* Query head ``j`` uses key/value head ``j // (h/g)`` (``g = h``: MHA, ``g = 1``: MQA, between: GQA).
* Masks are boolean, ``True`` = may attend, broadcastable to the weights' shape ``(..., L_q, L_kv)``.
  ``is_causal=True`` adds the causal mask, bottom-right aligned (:func:`causal_mask`), combined with ``mask`` by
  logical and, as in ``mha.MultiHeadAttention``: the same names, order, defaults and errors.
* A query row with no allowed key gets all-zero weights and an all-zero output row (and zero gradient),
  never NaN. (Softmax over an empty set is undefined; zero is the "attends to nothing" convention.)
* Inputs containing NaN or inf are rejected with ``ValueError("<name> contains NaN or inf ...")``; every check
  runs before any computation. All arithmetic is float64 (inputs are converted). ``split_heads``, ``merge_heads``
  and ``repeat_kv`` do no arithmetic (they only move numbers) and let NaN and inf through.

Its modules follow the book (import the functions from ``mha.reference`` itself):

* ``checks``: the input checks every function runs first, and ``check_params`` / ``Dims``;
* ``masks``: ``causal_mask``, ``sliding_window_mask``, and how ``is_causal`` and ``window`` join a mask;
* ``scaled_dot_product``: ``softmax``, ``scaled_dot_product_attention`` (part I, 'Scaled dot-product attention'),
  with soft-capping and sinks (part IV, 'Attention in today's models');
* ``multi_head``: ``split_heads``, ``merge_heads``, ``repeat_kv``, ``multi_head_attention`` and its per-head loop
  form, ``head_weights``, ``init_params`` (part I, 'From one head to h heads'; part II, 'MQA and GQA');
* ``backward``: ``softmax_backward``, ``scaled_dot_product_attention_grad``, ``multi_head_attention_grad``
  (part II, 'The backward pass');
* ``online_softmax``: ``online_softmax_attention`` (part II, 'Exact attention without the L × L matrix (online
  softmax)');
* ``rope``: ``rope_frequencies``, ``rope``, ``rope_backward`` (part IV, 'Attention in today's models');
* ``norms``: ``rms_norm``, ``rms_norm_backward``, the normalisation of QK-norm (same section);
* ``latent``: ``multi_head_latent_attention`` (naive and absorbed forms), its hand-derived
  ``multi_head_latent_attention_grad`` and ``init_latent_params``: multi-head latent attention (DeepSeek-V2/V3).

The layer's keywords of today's models (``positions``, ``rope_base``, ``rope_style``, ``rope_dim``, ``window``,
``softcap``, ``qk_norm_eps``, ``scale``, ``gate``; ``params`` may then hold ``W_gate`` and ``b_gate``) and the order it applies them in are in ``multi_head_attention``'s docstring.
"""

from __future__ import annotations

from mha.reference.backward import multi_head_attention_grad, scaled_dot_product_attention_grad, softmax_backward
from mha.reference.checks import Dims, check_params
from mha.reference.latent import init_latent_params, multi_head_latent_attention, multi_head_latent_attention_grad
from mha.reference.masks import causal_mask, sliding_window_mask
from mha.reference.multi_head import (head_weights, init_params, merge_heads, multi_head_attention,
                                      multi_head_attention_per_head, repeat_kv, split_heads)
from mha.reference.norms import rms_norm, rms_norm_backward
from mha.reference.online_softmax import online_softmax_attention
from mha.reference.rope import rope, rope_backward, rope_frequencies
from mha.reference.scaled_dot_product import scaled_dot_product_attention, softmax

__all__ = [
    "softmax",
    "softmax_backward",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_grad",
    "multi_head_attention",
    "multi_head_attention_per_head",
    "multi_head_attention_grad",
    "online_softmax_attention",
    "split_heads",
    "merge_heads",
    "repeat_kv",
    "causal_mask",
    "head_weights",
    "check_params",
    "Dims",
    "init_params",
    "sliding_window_mask",
    "rope_frequencies",
    "rope",
    "rope_backward",
    "rms_norm",
    "rms_norm_backward",
    "multi_head_latent_attention",
    "multi_head_latent_attention_grad",
    "init_latent_params",
]
