"""Converting a layer's parameters: multi-head attention to grouped-query attention and back, and our layer's
weights into PyTorch's ``torch.nn.MultiheadAttention``.

Ainslie et al. (2023) build a GQA model from a multi-head checkpoint by mean-pooling, within each group, the key and
value projection heads, then briefly continue training ("uptraining"). The conversion is a transformation of the
parameter dict only (the NumPy convention of ``mha.reference``: W_q (d_model, h*head_dim), W_k and W_v
(d_model, g*head_dim), W_o (h*head_dim, d_model), optional biases); load the result into
``mha.MultiHeadAttention(..., n_kv_heads=g)`` with ``load_params`` or pass it to ``mha.reference``.

``gqa_to_mha`` is the exact inverse direction: every key/value head copied to each query head of its group, so that
an MHA layer computes the same function with an h / g times larger KV cache (the fair baseline of a GQA/MQA timing).
``copy_to_torch_mha`` copies a ``mha.MultiHeadAttention``'s weights into ``torch.nn.MultiheadAttention`` (whose
packed ``in_proj_weight`` is [W_q^T; W_k^T; W_v^T]).

``from_hf`` builds a ``mha.MultiHeadAttention`` holding the weights and settings of one of Hugging Face's attention
layers (Llama, Mistral, Qwen3, Gemma 2, Gemma 3, gpt-oss; sliding and full layers), so that the same inputs give the
same outputs (tests/test_from_hf.py checks it against tiny random models, prefill and ring-buffer decoding), and of
Qwen3-Next's gated full-attention layers, partial RoPE included (tests/test_from_hf_qwen3next.py).

Book: part II, 'MQA and GQA'; appendix 'Benchmarks' (the contenders of the side-by-side timings); part IV,
'Rotary position embeddings (RoPE)' (``from_hf`` and the RoPE it accepts).
"""

from __future__ import annotations

import math

import numpy as np

from mha._checks import check_choice, check_int, check_type
from mha.reference import check_params

__all__ = ["mha_to_gqa", "gqa_to_mha", "copy_to_torch_mha", "from_hf", "METHODS", "HF_ATTENTION_CLASSES"]

METHODS = ("mean", "first")  # mean-pool each group's key/value heads, or keep the group's first head


def mha_to_gqa(params, n_heads, n_kv_heads, method="mean"):
    """Params of a layer with ``n_heads`` query heads -> params of a GQA layer with ``n_kv_heads`` key/value heads.

    Query head j reads key/value head ``j // (h/g)``, so the new key/value head c serves the consecutive query heads
    ``c*(h/g), ..., (c+1)*(h/g) - 1``; it replaces the key/value heads those query heads read before, a group of
    ``n_pooled = g_in / g`` consecutive heads (``g_in`` = the layer's current number of key/value heads, ``h`` for
    MHA)::

        method="mean":   W^K_c = (1/n_pooled) sum_{i in group c} W^K_i   (same for W^V, b_k, b_v)  (Ainslie et al.)
        method="first":  W^K_c = W^K_{c*n_pooled}                        (keep the group's first head)

    ``W_q``, ``W_o``, ``b_q``, ``b_o`` are unchanged. Returns a new dict of new float64 arrays (the input is not
    modified, and nothing in the result aliases it): ``W_k``, ``W_v`` (d_model, n_kv_heads*head_dim) and ``b_k``,
    ``b_v`` (n_kv_heads*head_dim,) when the input has biases. ``n_kv_heads = g_in`` returns a copy; mean-pooling a
    group of equal heads reproduces the layer exactly. The input may already be GQA (pooling further is the same as
    pooling the equivalent MHA layer, whose repeated heads have the same means), but not with fewer key/value heads
    than asked for.

    Raises TypeError/ValueError, before any computation, for a malformed params dict (as ``mha.reference`` does),
    ``n_kv_heads`` not a positive integer, not dividing ``n_heads``, larger than the layer's current number of
    key/value heads or not dividing it, and ``method`` not in ``METHODS``.

    Book: part II, 'MQA and GQA' (section 'Converting a multi-head layer to grouped-query').
    """
    p, dims = check_params(params, n_heads)
    n_kv_heads = check_int("n_kv_heads", n_kv_heads)
    check_choice("method", method, METHODS)
    if dims.n_heads % n_kv_heads:
        raise ValueError(
            f"n_kv_heads = {n_kv_heads} must divide n_heads = {dims.n_heads} (each key/value head serves "
            f"n_heads / n_kv_heads query heads)"
        )
    g_in = dims.n_kv_heads
    if n_kv_heads > g_in:
        raise ValueError(
            f"n_kv_heads = {n_kv_heads} is more than the layer's {g_in} key/value heads (params['W_k'] shape "
            f"{p['W_k'].shape}, head_dim {dims.head_dim}); pooling can only reduce the number of key/value heads"
        )
    if g_in % n_kv_heads:
        raise ValueError(
            f"n_kv_heads = {n_kv_heads} must divide the layer's current number of key/value heads {g_in} "
            f"(params['W_k'] shape {p['W_k'].shape}, head_dim {dims.head_dim}) so that each new head replaces "
            f"whole heads"
        )
    n_pooled = g_in // n_kv_heads  # old key/value heads pooled into each new one
    out = {key: value.copy() for key, value in p.items()}
    for key in ("W_k", "W_v", "b_k", "b_v"):
        if key not in p:
            continue
        lead = out[key].shape[:-1]  # (d_model,) for weights, () for biases
        blocks = out[key].reshape(*lead, n_kv_heads, n_pooled, dims.head_dim)  # (.., g, g_in/g, head_dim), of the copy
        pooled = blocks.mean(axis=-2) if method == "mean" else blocks[..., 0, :]  # (.., g, head_dim)
        out[key] = np.ascontiguousarray(pooled.reshape(*lead, n_kv_heads * dims.head_dim))  # (.., g*head_dim)
    return out


def gqa_to_mha(params, n_heads):
    """Params of a GQA/MQA layer -> params of the MHA layer (``n_heads`` key/value heads) computing the same function.

    Query head j of the GQA layer reads key/value head ``j // (h/g)``; the MHA layer gives query head j its own
    key/value head holding exactly those weights (``W_k``, ``W_v``, ``b_k``, ``b_v`` repeated head by head, each
    ``h/g`` times in place). ``W_q``, ``W_o``, ``b_q``, ``b_o`` are copied. ``mha_to_gqa`` of the result, with either
    method, returns the input: the inverse direction.

    Book: part II, 'MQA and GQA'; appendix 'Benchmarks' (the decoding section's MHA contender).
    """
    p, dims = check_params(params, n_heads)
    n_rep = dims.n_heads // dims.n_kv_heads  # query heads per key/value head
    out = {key: value.copy() for key, value in p.items()}
    for key in ("W_k", "W_v", "b_k", "b_v"):
        if key not in p:
            continue
        lead = p[key].shape[:-1]  # (d_model,) for weights, () for biases
        heads = p[key].reshape(*lead, dims.n_kv_heads, dims.head_dim)  # (.., g, head_dim)
        repeated = np.repeat(heads, n_rep, axis=-2)  # (.., h, head_dim): head c at c*(h/g) .. (c+1)*(h/g) - 1
        out[key] = np.ascontiguousarray(repeated.reshape(*lead, dims.n_heads * dims.head_dim))  # (.., h*head_dim)
    return out


def copy_to_torch_mha(ours, theirs) -> None:
    """Copy a ``mha.MultiHeadAttention`` into a ``torch.nn.MultiheadAttention`` computing the same function: its
    packed ``in_proj_weight`` = [W_q^T; W_k^T; W_v^T] and ``in_proj_bias``, ``out_proj`` = our ``o_proj``.

    Refused with one ValueError listing every difference, before anything is copied, is every pair that would not
    compute the same function: another d_model, n_heads or head_dim; ours GQA/MQA (torch has one key/value head per
    query head: expand ours first with :func:`gqa_to_mha`); ours with a scale other than torch's fixed
    1/sqrt(head_dim); another dropout; theirs with ``add_bias_kv``, ``add_zero_attn`` or kdim/vdim other than
    embed_dim (no packed projection); ours with biases and theirs without; another dtype (``copy_`` would round or
    widen the weights, and the two would compute in different precisions). Accepted: ours without biases into theirs
    with biases (theirs' biases are set to zero); theirs with ``batch_first=False`` (the same function, of inputs
    laid out (L, N, d_model)); another device (the values are copied exactly); any ``impl`` of ours.

    Book: appendix 'Benchmarks' (ours against PyTorch's module, same weights).
    """
    import torch

    from mha.attention import MultiHeadAttention

    check_type("ours", ours, MultiHeadAttention, "a mha.MultiHeadAttention")
    check_type("theirs", theirs, torch.nn.MultiheadAttention, "a torch.nn.MultiheadAttention")
    differences = _torch_mha_differences(ours, theirs)
    if differences:
        raise ValueError("copy_to_torch_mha: ours and theirs would not compute the same function: "
                         + "; ".join(differences))
    ours_bias = ours.q_proj.bias is not None
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.out_proj.weight.copy_(ours.o_proj.weight)
        if theirs.in_proj_bias is not None:  # ours has biases too, or none: then theirs' are zero
            theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]) if ours_bias
                                      else torch.zeros_like(theirs.in_proj_bias))
            theirs.out_proj.bias.copy_(ours.o_proj.bias if ours_bias else torch.zeros_like(theirs.out_proj.bias))


def _torch_mha_differences(ours, theirs) -> list[str]:
    """Every way in which ``theirs`` (torch.nn.MultiheadAttention) cannot compute ``ours``' function, in words."""
    out = []
    if theirs.embed_dim != ours.d_model:
        out.append(f"d_model: ours {ours.d_model}, theirs embed_dim {theirs.embed_dim}")
    if theirs.num_heads != ours.n_heads:
        out.append(f"n_heads: ours {ours.n_heads}, theirs num_heads {theirs.num_heads}")
    if theirs.head_dim != ours.head_dim:
        out.append(f"head_dim: ours {ours.head_dim}, theirs {theirs.head_dim} (embed_dim / num_heads)")
    if ours.n_kv_heads != ours.n_heads:
        out.append(f"n_kv_heads: ours {ours.n_kv_heads}, theirs {theirs.num_heads} (one key/value head per query "
                   f"head; expand ours first with mha.convert.gqa_to_mha and load_params)")
    their_scale = 1.0 / math.sqrt(theirs.head_dim)  # torch.nn.MultiheadAttention has no other scale
    if not math.isclose(ours.scale, their_scale, rel_tol=1e-12):
        out.append(f"scale: ours {ours.scale:g}, theirs {their_scale:g} (torch's is always 1/sqrt(head_dim))")
    if theirs.dropout != ours.dropout:
        out.append(f"dropout: ours {ours.dropout!r}, theirs {float(theirs.dropout)!r}")
    if theirs.bias_k is not None:
        out.append("add_bias_kv: theirs appends learned bias_k/bias_v to the keys/values, ours does not")
    if theirs.add_zero_attn:
        out.append("add_zero_attn: theirs appends a zero key/value, ours does not")
    if theirs.in_proj_weight is None:  # kdim or vdim != embed_dim: separate q/k/v weights of other widths
        out.append(f"kdim/vdim: theirs kdim={theirs.kdim}, vdim={theirs.vdim}, ours projects keys and values from "
                   f"d_model={ours.d_model} (a packed in_proj_weight needs kdim = vdim = embed_dim)")
    if ours.q_proj.bias is not None and theirs.in_proj_bias is None:
        out.append("bias: ours has biases, theirs has none (bias=False)")
    their_dtype = theirs.out_proj.weight.dtype
    if their_dtype != ours.q_proj.weight.dtype:
        out.append(f"dtype: ours {ours.q_proj.weight.dtype}, theirs {their_dtype} (they would compute in different "
                   f"precisions; convert one with .to(dtype) first)")
    return out


# ------------------------------------------------------------------------------------------- Hugging Face layers
HF_ATTENTION_CLASSES = ("LlamaAttention", "MistralAttention", "Qwen3Attention", "Gemma2Attention", "Gemma3Attention",
                        "GptOssAttention", "Qwen3NextAttention")


def from_hf(attention_module, config=None, *, dtype=None, impl: str = "sdpa"):
    """A ``mha.MultiHeadAttention`` computing what Hugging Face's ``attention_module`` computes, with its weights.

    A ``DeepseekV3Attention`` (multi-head latent attention, DeepSeek-V2/V3) gives a ``mha.MultiHeadLatentAttention``
    instead (``impl`` does not apply): see ``_from_hf_deepseek_v3`` for what is read and what is refused.

    ``attention_module``: a ``LlamaAttention``, ``MistralAttention``, ``Qwen3Attention``, ``Gemma2Attention``,
    ``Gemma3Attention``, ``GptOssAttention`` or ``Qwen3NextAttention`` (Qwen3-Next's full-attention layers)
    (``model.layers[i].self_attn``) of transformers 5; ``config``: the model's configuration (default: the module's
    own ``config``); ``dtype``: of the result (default: the HF module's; ``torch.float64`` for a float64 copy);
    ``impl``: "sdpa" or "naive". The result is on the module's device, in eval mode if the module is.

    What is read (the layer's type is ``config.layer_types[attention_module.layer_idx]`` where the config has
    ``layer_types``):

    * projections (any bias present is copied; a missing one among present ones becomes zero), ``scaling`` (Gemma:
      ``query_pre_attn_scalar ** -0.5``), ``attention_dropout``;
    * RoPE: ``rope_parameters["rope_theta"]`` (Gemma 3: the entry of the layer's type), rotate-half pairing
      (``rope_style="half"``, gpt-oss's ``_apply_rotary_emb`` included); only ``rope_type="default"`` and a full
      rotary dimension (YaRN, linear scaling, the "llama3" rule, partial rotary factors are refused: ValueError).
      So the released Llama 3.1 ("llama3"), Gemma 3's global layers ("linear") and gpt-oss ("yarn") are refused;
      ``MultiHeadAttention`` has a ``rope_base`` and no frequency scaling. Qwen3-Next's ``partial_rotary_factor``
      (0.25 by default) is read: ``rope_dim = int(head_dim * factor)``, RoPE on the first rope_dim coordinates;
    * the sliding window: ``config.sliding_window`` on sliding layers (Mistral: every layer when it is set). Hugging
      Face's mask lets query i see key j iff i - sliding_window < j <= i (``sliding_window_overlay``), so the window
      counts the query itself, as ours: ``window = sliding_window`` for every family here (checked by
      tests/test_from_hf.py by reading the attention weights back);
    * QK-norm (Qwen3: weight w; Gemma 3 and Qwen3-Next: Gemma's RMSNorm multiplies by (1 + w), folded into the
      weight), its eps;
    * Qwen3-Next's output gate: its ``q_proj`` gives each head [query | gate] (2 head_dim outputs per head), and the
      attention output is multiplied by sigmoid(gate) before ``o_proj``: ``gate="elementwise"``, ``gate_proj``
      holding the gate's rows;
    * gpt-oss's sinks; Gemma 2's ``attn_logit_softcapping`` (Gemma 3's attention does not apply it, so neither do
      we).

    Refused (ValueError): another class, a bidirectional layer (``use_bidirectional_attention``), an unknown layer
    type. Hugging Face's eager paths round the softmax (and Qwen3/Gemma's RMSNorm, and its rotary module's angles)
    to float32, so float64 copies agree to about 1e-8, not 1e-15.
    """
    import torch

    from mha.attention import MultiHeadAttention

    check_type("attention_module", attention_module, torch.nn.Module,
               "a Hugging Face attention module (" + ", ".join(HF_ATTENTION_CLASSES) + ")")
    family = type(attention_module).__name__
    if family == "DeepseekV3Attention":  # multi-head latent attention: another module, mha.latent
        return _from_hf_deepseek_v3(attention_module, config, dtype=dtype)
    if family not in HF_ATTENTION_CLASSES:
        raise ValueError(f"attention_module must be one of {', '.join(HF_ATTENTION_CLASSES)} (transformers 5), got "
                         f"{family}")
    theirs = attention_module
    config = theirs.config if config is None else config
    if dtype is None:
        dtype = theirs.q_proj.weight.dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
    layer_type = _hf_layer_type(theirs, config)
    window = _hf_window(family, config, layer_type)
    if getattr(theirs, "sliding_window", window) != window:
        raise ValueError(f"{family} layer {theirs.layer_idx}: its sliding_window={theirs.sliding_window} does not "
                         f"match the config's {window} for layer type {layer_type!r}: pass the config the module was "
                         f"built with")
    if not getattr(theirs, "is_causal", True):
        raise ValueError(f"{family} layer {theirs.layer_idx} is bidirectional (use_bidirectional_attention): "
                         f"MultiHeadAttention's windows are causal")
    linears = [theirs.q_proj, theirs.k_proj, theirs.v_proj, theirs.o_proj]
    gate = None  # Qwen3-Next: q_proj holds [query | gate] per head; linears[0] becomes the query's part
    if family == "Qwen3NextAttention":
        linears[0], gate = _hf_split_query_gate(theirs.q_proj, config.num_attention_heads, theirs.head_dim)
    has_qk_norm = getattr(theirs, "q_norm", None) is not None
    ours = MultiHeadAttention(
        config.hidden_size, config.num_attention_heads, config.num_key_value_heads, theirs.head_dim,
        bias=any(lin.bias is not None for lin in linears), dropout=float(getattr(config, "attention_dropout", 0.0)),
        impl=impl, scale=float(theirs.scaling), rope_base=_hf_rope_base(family, config, layer_type),
        rope_style="half", window=window, sinks=getattr(theirs, "sinks", None) is not None, qk_norm=has_qk_norm,
        qk_norm_eps=_hf_norm_eps(theirs.q_norm) if has_qk_norm else 1e-6,
        softcap=getattr(theirs, "attn_logit_softcapping", None) if family == "Gemma2Attention" else None,
        gate=None if gate is None else "elementwise", rope_dim=_hf_rope_dim(config, layer_type, theirs.head_dim))
    if has_qk_norm and _hf_norm_eps(theirs.k_norm) != ours.qk_norm_eps:
        raise ValueError(f"{family}: q_norm and k_norm have different eps ({ours.qk_norm_eps}, "
                         f"{_hf_norm_eps(theirs.k_norm)}); MultiHeadAttention has one qk_norm_eps")
    ours = ours.to(device=theirs.q_proj.weight.device, dtype=dtype)
    with torch.no_grad():
        for mine, hf in zip([ours.q_proj, ours.k_proj, ours.v_proj, ours.o_proj], linears):
            mine.weight.copy_(hf.weight)
            if mine.bias is not None:
                mine.bias.copy_(hf.bias if hf.bias is not None else torch.zeros_like(mine.bias))
        if ours.sinks is not None:
            ours.sinks.copy_(theirs.sinks)
        if gate is not None:
            ours.gate_proj.weight.copy_(gate.weight)
            if ours.gate_proj.bias is not None:
                ours.gate_proj.bias.copy_(gate.bias if gate.bias is not None else torch.zeros_like(ours.gate_proj.bias))
        if has_qk_norm:  # Gemma's RMSNorm (Qwen3-Next's too): x_hat * (1 + w), w starting at 0
            gemma = family in ("Gemma3Attention", "Qwen3NextAttention")
            ours.q_norm.copy_(theirs.q_norm.weight.double() + 1 if gemma else theirs.q_norm.weight)
            ours.k_norm.copy_(theirs.k_norm.weight.double() + 1 if gemma else theirs.k_norm.weight)
    return ours.train(theirs.training)


def _hf_layer_type(theirs, config):
    """The layer's type from ``config.layer_types`` (None where the config has none, e.g. Llama, Mistral)."""
    layer_types = getattr(config, "layer_types", None)
    if not layer_types:
        return None
    layer_type = layer_types[theirs.layer_idx]
    if layer_type not in ("full_attention", "sliding_attention"):
        raise ValueError(f"layer {theirs.layer_idx} has layer type {layer_type!r}: only 'full_attention' and "
                         f"'sliding_attention' layers are supported")
    return layer_type


def _hf_window(family, config, layer_type):
    """Our window (keys a query sees, itself included) = Hugging Face's ``sliding_window`` on sliding layers: its mask
    is i - sliding_window < j <= i for every family here (``masking_utils.sliding_window_overlay``)."""
    if family == "LlamaAttention":
        return None
    if family == "MistralAttention":  # no layer types: every layer slides when sliding_window is set
        return getattr(config, "sliding_window", None)
    return config.sliding_window if layer_type == "sliding_attention" else None


def _hf_rope_base(family, config, layer_type):
    """rope_theta of a default (unscaled, full-dimension) RoPE; anything else is refused."""
    rope = getattr(config, "rope_parameters", None) or {}
    if layer_type in rope and isinstance(rope[layer_type], dict):  # Gemma 3: one entry per layer type
        rope = rope[layer_type]
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"{family}: rope_type {rope_type!r} (rope_parameters={rope}) is not supported, only "
                         f"'default' RoPE (no YaRN, no linear or dynamic scaling)")
    factor = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    if factor != 1.0 and family not in _HF_PARTIAL_ROPE:
        raise ValueError(f"{family}: partial_rotary_factor={factor} is not supported (RoPE on the whole head only; "
                         f"partial RoPE is read for {', '.join(_HF_PARTIAL_ROPE)})")
    base = rope.get("rope_theta", getattr(config, "rope_theta", None))
    if base is None:
        raise ValueError(f"{family}: the config has no rope_theta (rope_parameters={rope})")
    return float(base)


_HF_PARTIAL_ROPE = ("Qwen3NextAttention",)  # the families whose partial_rotary_factor is read (rope_dim)


def _hf_rope_dim(config, layer_type, head_dim):
    """Our ``rope_dim`` from ``partial_rotary_factor`` (None for 1.0: the whole head; ``_hf_rope_base`` refuses
    other factors for the other families). Hugging Face's rotary module computes its frequencies for
    ``dim = int(head_dim * factor)`` and ``apply_rotary_pos_emb`` rotates the first ``dim`` coordinates of each head
    (rotate-half pairs within them), passing the rest: our rope_dim exactly."""
    rope = getattr(config, "rope_parameters", None) or {}
    if layer_type in rope and isinstance(rope[layer_type], dict):
        rope = rope[layer_type]
    factor = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    return None if factor == 1.0 else int(head_dim * factor)


def _hf_split_query_gate(q_proj, n_heads, head_dim):
    """Qwen3-Next's ``q_proj`` (n_heads * 2 head_dim outputs) as two stand-ins for ``nn.Linear`` (``weight``,
    ``bias``), the query's and the gate's, n_heads * head_dim outputs each in head order: Hugging Face views its
    output as (..., n_heads, 2 head_dim) and splits each head's 2 head_dim into [query | gate] (interleaved by
    head, not two halves); the gate's outputs, in head order, multiply the attention output elementwise."""
    from types import SimpleNamespace

    weight = q_proj.weight.view(n_heads, 2, head_dim, -1)  # (h, [query, gate], head_dim, d_model)
    bias = None if q_proj.bias is None else q_proj.bias.view(n_heads, 2, head_dim)

    def part(i):  # 0: the query, 1: the gate
        return SimpleNamespace(weight=weight[:, i].reshape(n_heads * head_dim, -1),
                               bias=None if bias is None else bias[:, i].reshape(n_heads * head_dim))

    return part(0), part(1)


def _hf_norm_eps(norm) -> float:
    """The epsilon of a Qwen3RMSNorm (``variance_epsilon``) or a Gemma RMSNorm (``eps``)."""
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def _from_hf_deepseek_v3(theirs, config=None, *, dtype=None):
    """A ``mha.MultiHeadLatentAttention`` holding the weights and settings of Hugging Face's ``DeepseekV3Attention``
    (DeepSeek-V3, also the layout of DeepSeek-V2's and Kimi K2's attention); ``from_hf`` calls it.

    Read: the sizes (``hidden_size``, ``num_attention_heads``, ``q_lora_rank`` (None: a plain ``q_proj``),
    ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``), ``rope_theta``, the module's
    ``scaling`` (``(nope + rope)^-0.5`` for default RoPE) and its RMSNorms' eps; ``rope_interleave=True`` (the
    default) is our ``rope_style="interleaved"``, False our ``"half"`` (see ``mha.reference.latent``). The weights are
    copied as they are (same ``nn.Linear`` layout): q_proj or q_a_proj / q_a_layernorm / q_b_proj, kv_a_proj_with_mqa,
    kv_a_layernorm, kv_b_proj, o_proj.

    Refused (ValueError): a RoPE other than ``rope_type="default"`` (DeepSeek-V3's released YaRN included: its
    frequencies and its mscale on the scores are not implemented), ``attention_bias=True``, ``num_key_value_heads``
    other than ``num_attention_heads``, a nonzero ``attention_dropout`` (the module has no dropout), and q and kv
    norms with different eps (the module has one ``norm_eps``).
    """
    import torch

    from mha.latent import MultiHeadLatentAttention

    name = f"DeepseekV3Attention (layer {getattr(theirs, 'layer_idx', '?')})"
    config = theirs.config if config is None else config
    rope = dict(getattr(config, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default" or "rope_theta" not in rope:
        raise ValueError(f"{name}: rope_type {rope_type!r} (rope_parameters={rope}) is not supported, only 'default' "
                         f"RoPE with a rope_theta (no YaRN, no linear or dynamic scaling)")
    problems = []
    if getattr(config, "attention_bias", False):
        problems.append("attention_bias=True (MultiHeadLatentAttention has no biases)")
    if config.num_key_value_heads != config.num_attention_heads:
        problems.append(f"num_key_value_heads={config.num_key_value_heads} != num_attention_heads="
                        f"{config.num_attention_heads} (MLA has one latent shared by all heads)")
    if float(getattr(config, "attention_dropout", 0.0)) != 0.0:
        problems.append(f"attention_dropout={config.attention_dropout} (MultiHeadLatentAttention has no dropout)")
    eps = _hf_norm_eps(theirs.kv_a_layernorm)
    if theirs.q_a_layernorm is not None and _hf_norm_eps(theirs.q_a_layernorm) != eps:
        problems.append(f"q_a_layernorm eps {_hf_norm_eps(theirs.q_a_layernorm)} != kv_a_layernorm eps {eps} "
                        f"(MultiHeadLatentAttention has one norm_eps)")
    if problems:
        raise ValueError(f"{name}: not supported: " + "; ".join(problems))
    source = theirs.kv_a_proj_with_mqa.weight
    dtype = source.dtype if dtype is None else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
    ours = MultiHeadLatentAttention(
        config.hidden_size, config.num_attention_heads, config.kv_lora_rank, q_rank=config.q_lora_rank,
        qk_nope_head_dim=config.qk_nope_head_dim, qk_rope_head_dim=config.qk_rope_head_dim,
        v_head_dim=config.v_head_dim, rope_base=float(rope["rope_theta"]),
        rope_style="interleaved" if getattr(config, "rope_interleave", True) else "half",
        scale=float(theirs.scaling), norm_eps=eps).to(device=source.device, dtype=dtype)
    pairs = [(ours.kv_a_proj.weight, theirs.kv_a_proj_with_mqa.weight), (ours.kv_a_norm, theirs.kv_a_layernorm.weight),
             (ours.kv_b_proj.weight, theirs.kv_b_proj.weight), (ours.o_proj.weight, theirs.o_proj.weight)]
    if ours.q_rank is None:
        pairs.append((ours.q_proj.weight, theirs.q_proj.weight))
    else:
        pairs += [(ours.q_a_proj.weight, theirs.q_a_proj.weight), (ours.q_a_norm, theirs.q_a_layernorm.weight),
                  (ours.q_b_proj.weight, theirs.q_b_proj.weight)]
    with torch.no_grad():
        for mine, hf in pairs:
            mine.copy_(hf)
    return ours.train(theirs.training)
