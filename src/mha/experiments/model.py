"""``TinyTransformer``: a small decoder-only GPT built on ``MultiHeadAttention``, for the experiments.

Book: part III (experiments): "Head count", "MHA, GQA and MQA in training", "What heads learn", "Induction heads",
"The scaling ablation", "A nanoGPT-comparable character model"; part II, "Autoregressive decoding and the KV cache"
(``generate`` decodes through the cache).

The architecture is nanoGPT's ``model.py`` (Karpathy): token + learned absolute position embeddings, pre-LayerNorm
blocks ``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))``, a final LayerNorm and a language-model head whose weight is
tied to the token embedding; normal(0, 0.02) initialisation with the residual projections scaled by
1 / sqrt(2 n_layers). The attention is :class:`mha.attention.MultiHeadAttention`, so the same model runs as MHA,
GQA or MQA (``n_kv_heads``), with or without the 1/sqrt(head_dim) scale (``scale_scores``), and can switch heads off
(``head_mask``) or return every layer's attention weights (``need_weights``).

Built from a :class:`ModernTransformerConfig` (a run whose model part is a
:class:`~mha.experiments.config.ModernModelConfig`), the blocks take the attention options of today's models (book
part IV): a sliding window in the local layers, with every ``global_every``-th layer global; one learned sink logit
per head; RoPE in every head in place of the learned position table. Their defaults build exactly the model above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import nn

from mha import counting
from mha._checks import check_bool, check_float, check_int, check_shape, check_type
from mha.convert import gqa_to_mha
from mha.experiments.config import ModelConfig, ModernModelConfig, layer_windows
from mha.attention import MultiHeadAttention
from mha.latent import LatentCache, MultiHeadLatentAttention
from mha.kv_cache import KVCache

__all__ = ["TransformerConfig", "ModernTransformerConfig", "TinyTransformer", "MLP", "Block", "expand_kv_heads"]


@dataclass(frozen=True)
class TransformerConfig(ModelConfig):
    """A :class:`TinyTransformer`'s configuration: the architecture (:class:`~mha.experiments.config.ModelConfig`:
    n_layers, d_model, n_heads, n_kv_heads, head_dim, mlp_ratio, attention_only, scale_scores, dropout, bias,
    attn_impl; its defaults, and its checks) and the task's sizes."""

    vocab_size: int = 65  # number of distinct token ids (65 = Tiny Shakespeare's characters)
    block_size: int = 64  # longest sequence the model reads (size of the position embedding table)

    @classmethod
    def for_task(cls, model: ModelConfig, task) -> TransformerConfig:
        """``model``'s architecture with ``task``'s vocab_size and block_size (a :class:`ModernTransformerConfig`
        when ``model`` is a :class:`~mha.experiments.config.ModernModelConfig`)."""
        check_type("model", model, ModelConfig, "a ModelConfig (mha.experiments.config)")
        part, target = ModelConfig, cls
        if isinstance(model, ModernModelConfig):
            part, target = ModernModelConfig, ModernTransformerConfig
        return target(**{f.name: getattr(model, f.name) for f in fields(part)}, vocab_size=task.vocab_size,
                      block_size=task.block_size)


@dataclass(frozen=True)
class ModernTransformerConfig(TransformerConfig, ModernModelConfig):
    """A :class:`TransformerConfig` with the attention options of
    :class:`~mha.experiments.config.ModernModelConfig` (window, global_every, sinks, rope_base, gate, kv_rank,
    qk_rope_head_dim; their defaults and checks)."""


class MLP(nn.Module):
    """Position-wise feed-forward block: Linear(d_model -> mlp_ratio d_model), GELU, Linear back, dropout."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        hidden = config.mlp_ratio * config.d_model
        self.c_fc = nn.Linear(config.d_model, hidden, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(hidden, config.d_model, bias=config.bias)  # a residual projection
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))  # (N, L, d_model)


class Block(nn.Module):
    """One pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)) (no MLP if attention_only).

    ``window``: this block's sliding window (a local layer), or None (a global one); the config's ``sinks`` and
    ``rope_base``, when it has them, go to the attention as they are."""

    def __init__(self, config: TransformerConfig, window: int | None = None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, bias=config.bias)
        scale = None if config.scale_scores else 1.0
        if getattr(config, "kv_rank", None) is not None:  # multi-head latent attention (part IV)
            head_dim = config.head_dim or config.d_model // config.n_heads
            self.attn = MultiHeadLatentAttention(
                config.d_model, config.n_heads, config.kv_rank, qk_nope_head_dim=head_dim,
                qk_rope_head_dim=config.qk_rope_head_dim or head_dim // 2, v_head_dim=head_dim,
                rope_base=config.rope_base, rope_style="half", scale=scale)
        else:
            self.attn = MultiHeadAttention(
                config.d_model, config.n_heads, n_kv_heads=config.n_kv_heads, head_dim=config.head_dim,
                bias=config.bias, dropout=config.dropout, impl=config.attn_impl, scale=scale, window=window,
                sinks=getattr(config, "sinks", False), rope_base=getattr(config, "rope_base", None),
                gate=getattr(config, "gate", None))
        self.resid_dropout = nn.Dropout(config.dropout)
        if config.attention_only:
            self.ln_2, self.mlp = None, None
        else:
            self.ln_2 = nn.LayerNorm(config.d_model, bias=config.bias)
            self.mlp = MLP(config)

    def forward(self, x, need_weights=False, head_mask=None, kv_cache=None):
        if isinstance(self.attn, MultiHeadLatentAttention):
            if head_mask is not None:
                raise ValueError("head_mask is not supported with latent attention (kv_rank)")
            attn_out, weights = self.attn(self.ln_1(x), is_causal=True, need_weights=need_weights,
                                          kv_cache=kv_cache)  # (N, L, d_model)
        else:
            attn_out, weights = self.attn(self.ln_1(x), is_causal=True, need_weights=need_weights,
                                          kv_cache=kv_cache, head_mask=head_mask)  # (N, L, d_model)
        x = x + self.resid_dropout(attn_out)
        if self.mlp is not None:
            x = x + self.mlp(self.ln_2(x))
        return x, weights  # (N, L, d_model), (N, h, L, L_kv) or None


class TinyTransformer(nn.Module):
    """A decoder-only GPT (nanoGPT's architecture) with :class:`MultiHeadAttention` in every block.

    Book: part III, "Head count" and the chapters after it; part II, "Autoregressive decoding and the KV cache".
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        # with RoPE the heads rotate q and k by position (part IV): no learned position table
        rope = getattr(config, "rope_base", None) is not None
        self.pos_emb = None if rope else nn.Embedding(config.block_size, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.windows = layer_windows(config)  # each layer's window (None: global)
        self.blocks = nn.ModuleList([Block(config, window) for window in self.windows])
        self.ln_f = nn.LayerNorm(config.d_model, bias=config.bias)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.tok_emb.weight = self.lm_head.weight  # weight tying, as nanoGPT

        attn = self.blocks[0].attn
        latent = isinstance(attn, MultiHeadLatentAttention)
        self.n_kv_heads = attn.n_heads if latent else attn.n_kv_heads  # resolved g (latent: keys rebuilt per head)
        self.head_dim = attn.v_head_dim if latent else attn.head_dim  # resolved head size

        self.apply(self._init_weights)
        residual_std = 0.02 / math.sqrt(2 * config.n_layers)  # GPT-2: scale the projections into the residual
        for name, p in self.named_parameters():
            if name.endswith("attn.o_proj.weight") or name.endswith("mlp.c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=residual_std)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # ------------------------------------------------------------------------------------------------ counting
    def num_params(self, non_embedding: bool = False) -> int:
        """Number of trainable scalars (the tied token embedding / lm head counted once).

        ``non_embedding=True`` leaves out the position embedding (nanoGPT's convention; the token embedding stays,
        being the lm head's weight too). Book: part II, "Counting everything".
        """
        n = sum(p.numel() for p in self.parameters())
        return n - self.pos_emb.weight.numel() if non_embedding and self.pos_emb is not None else n

    def kv_cache_bytes(self, batch: int, seq_len: int, dtype_bytes: int | None = None) -> int:
        """Bytes of the KV cache for ``batch`` sequences of ``seq_len`` positions over all layers.

        ``dtype_bytes`` defaults to the size of the model's parameter dtype (4 for float32). Computed by
        :func:`mha.counting.kv_cache_bytes`, once for the global layers and once for the local ones (which keep
        their window). Book: part II, "Autoregressive decoding and the KV cache"; part IV, "Sliding windows and
        attention sinks".
        """
        if dtype_bytes is None:
            dtype_bytes = self.lm_head.weight.element_size()
        attn = self.blocks[0].attn
        if isinstance(attn, MultiHeadLatentAttention):  # the latent and the shared RoPE key, every layer
            return counting.latent_kv_cache_bytes(batch, seq_len, len(self.blocks), attn.kv_rank,
                                                  attn.qk_rope_head_dim, dtype_bytes)
        n_global = sum(window is None for window in self.windows)
        total = 0
        if n_global:
            total += counting.kv_cache_bytes(batch, seq_len, n_global, self.n_kv_heads, self.head_dim, dtype_bytes)
        if n_global < len(self.windows):
            local = next(window for window in self.windows if window is not None)
            total += counting.kv_cache_bytes(batch, seq_len, len(self.windows) - n_global, self.n_kv_heads,
                                             self.head_dim, dtype_bytes, window=local)
        return total

    def make_kv_caches(self, batch_size: int, max_len: int | None = None) -> list[KVCache | LatentCache]:
        """One empty :class:`KVCache` per layer, with the model's dtype and device; ``max_len`` <= block_size. A
        local layer's cache is a ring buffer of its window (``MultiHeadAttention.new_cache``)."""
        max_len = self.config.block_size if max_len is None else max_len
        check_int("max_len", max_len, minimum=1, maximum=self.config.block_size)  # no positions beyond block_size
        return [block.attn.new_cache(batch_size, max_len) for block in self.blocks]

    # ------------------------------------------------------------------------------------------------ forward
    def forward(self, idx, targets=None, need_weights=False, head_mask=None, kv_caches=None):
        """Logits for every position, the loss if ``targets`` is given, and optionally every layer's weights.

        Args:
            idx: (N, L) int64 token ids in [0, vocab_size). With ``kv_caches`` these are the next L positions after
                the cached ones (position ids are offset by the caches' length).
            targets: (N, L) int64 ids, or -100 at positions that are not scored (cross-entropy ``ignore_index``).
            need_weights: also return the attention weights, a list (one per layer) of (N, h, L, L_kv).
            head_mask: (n_layers, n_heads) float or bool; row i multiplies the heads' outputs of layer i before its
                output projection (0 removes a head's contribution). Book: part III, "What heads learn".
            kv_caches: a list of n_layers :class:`KVCache` (from :meth:`make_kv_caches`); each layer appends this
                call's keys/values and attends over all cached positions.

        Returns:
            ``(logits, loss, weights)``: logits (N, L, vocab_size); loss the mean cross-entropy over the scored
            positions (None without targets); weights a list of (N, h, L, L_kv) or None.

        Shapes, types and the caches are checked on every call; the ids' values (in range, a scored target) only
        on the CPU: a call never waits for an accelerator to hand its tensors back.
        """
        n_seq, length, offset = self._check_forward_inputs(idx, targets, head_mask, kv_caches)
        x = self.tok_emb(idx)  # (N, L, d_model)
        if self.pos_emb is not None:  # (with RoPE the heads place the positions, offset by the caches' length)
            x = x + self.pos_emb(torch.arange(offset, offset + length, device=idx.device))  # positions (L,)
        x = self.drop(x)  # (N, L, d_model)
        all_weights = [] if need_weights else None
        try:
            for i, block in enumerate(self.blocks):
                x, weights = block(x, need_weights=need_weights,
                                   head_mask=None if head_mask is None else head_mask[i],
                                   kv_cache=None if kv_caches is None else kv_caches[i])
                if need_weights:
                    all_weights.append(weights)  # (N, h, L, L_kv)
            logits = self.lm_head(self.ln_f(x))  # (N, L, vocab_size)
        except BaseException:  # a failed call leaves every layer's cache as it was, not the first layers advanced
            for cache in kv_caches or ():
                cache.length = offset
            raise
        loss = None
        if targets is not None:
            flat_logits = logits.view(n_seq * length, -1)  # (N * L, vocab_size)
            loss = F.cross_entropy(flat_logits, targets.view(n_seq * length), ignore_index=-100)  # targets (N * L,)
        return logits, loss, all_weights

    def _check_forward_inputs(self, idx, targets, head_mask, kv_caches):
        """Validate the arguments of :meth:`forward` before any computation; returns (N, L, position offset)."""
        cfg = self.config
        if not isinstance(idx, torch.Tensor) or idx.dtype != torch.long:
            got = f"{idx.dtype} tensor" if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise TypeError(f"idx must be an int64 tensor of shape (N, L), got {got}")
        if idx.ndim != 2:
            raise ValueError(f"idx must be an int64 tensor of shape (N, L), got shape {tuple(idx.shape)}")
        n_seq, length = idx.shape
        if n_seq == 0 or length == 0:
            raise ValueError(f"idx must have at least one sequence and one position, got shape {tuple(idx.shape)}")
        offset = 0
        if kv_caches is not None:
            check_type("kv_caches", kv_caches, (list, tuple), f"a list of n_layers={cfg.n_layers} KVCache")
            if len(kv_caches) != cfg.n_layers:
                raise ValueError(f"kv_caches must be a list of n_layers={cfg.n_layers} KVCache (see "
                                 f"make_kv_caches), got {type(kv_caches).__name__} of length "
                                 f"{len(kv_caches) if hasattr(kv_caches, '__len__') else '?'}")
            for i, cache in enumerate(kv_caches):
                check_type(f"kv_caches[{i}]", cache, (KVCache, LatentCache),
                           "a mha.KVCache or a LatentCache (see make_kv_caches)")
            lengths = [cache.length for cache in kv_caches]
            if len(set(lengths)) > 1:
                raise ValueError(f"kv_caches hold different numbers of positions {lengths}: the layers' caches must "
                                 f"advance together (make them with make_kv_caches and pass them all on every call)")
            offset = lengths[0]
        if offset + length > cfg.block_size:
            raise ValueError(f"sequence too long: {offset} cached + {length} new positions > block_size "
                             f"{cfg.block_size} (idx has shape {tuple(idx.shape)}); crop it to the last "
                             f"block_size tokens")
        if targets is not None:
            if not isinstance(targets, torch.Tensor) or targets.dtype != torch.long:
                got = f"{targets.dtype} tensor" if isinstance(targets, torch.Tensor) else type(targets).__name__
                raise TypeError(f"targets must be an int64 tensor of idx's shape {tuple(idx.shape)}, got {got}")
            if targets.shape != idx.shape:
                raise ValueError(f"targets must have idx's shape {tuple(idx.shape)}, got shape {tuple(targets.shape)}")
        if idx.device.type == "cpu":  # see _check_values
            self._check_values(idx, targets)
        if head_mask is not None:
            check_type("head_mask", head_mask, torch.Tensor, "a tensor of shape (n_layers, n_heads) or None")
            check_shape("head_mask", head_mask, (cfg.n_layers, cfg.n_heads), names="(n_layers, n_heads)")
            if not (head_mask.dtype.is_floating_point or head_mask.dtype == torch.bool):
                raise TypeError(f"head_mask must be a float or bool tensor, got dtype {head_mask.dtype}")
        return n_seq, length, offset

    def _check_values(self, idx, targets) -> None:
        """Token ids in range and at least one scored target: checks that read the tensors' values.

        Only for tensors on the CPU, where reading them costs no transfer. On an accelerator, reading them would
        copy them back and wait for the device on every call (every training step, every decoding step, the timed
        ones too); there an id out of range is caught by the embedding's and the loss's own device-side checks.
        """
        vocab_size = self.config.vocab_size
        checks = [idx.min(), idx.max()]
        if targets is not None:
            scored = targets != -100
            scored_ids = torch.where(scored, targets, 0)  # (N, L)
            checks += [scored.sum(), scored_ids.min(), scored_ids.max()]
        values = torch.stack(checks).tolist()
        if values[0] < 0 or values[1] >= vocab_size:
            raise ValueError(f"idx holds token ids in [{values[0]}, {values[1]}], expected ids in [0, vocab_size="
                             f"{vocab_size})")
        if targets is not None:
            if values[2] == 0:
                raise ValueError("targets has no scored position (every entry is -100): the loss would be NaN")
            if values[3] < 0 or values[4] >= vocab_size:
                raise ValueError(f"targets hold ids in [{values[3]}, {values[4]}] besides -100 (ignored), expected "
                                 f"ids in [0, vocab_size={vocab_size})")

    # ------------------------------------------------------------------------------------------------ decoding
    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, greedy=False, generator=None):
        """Append ``max_new_tokens`` sampled tokens to ``idx`` (N, L) and return the (N, L + max_new_tokens) ids.

        Decoding goes through the KV cache: one forward pass over the prompt (prefill), then one position at a
        time, each new position's id offset by the cache length. When the context would grow past block_size the
        learned absolute positions of every token shift, so the cache is no longer valid: from then on each new
        token is computed by recomputation over the last block_size tokens (nanoGPT's behaviour). A prompt longer
        than block_size is cropped to its last block_size tokens. As in nanoGPT the model's train/eval mode is left
        as it is: call ``model.eval()`` first when the model has dropout.

        Args:
            temperature: logits are divided by it before sampling (> 0; ignored when greedy).
            top_k: sample only among the top_k most likely tokens (None = all).
            greedy: take the argmax instead of sampling.
            generator: a ``torch.Generator`` for reproducible sampling.

        Book: part II, "Autoregressive decoding and the KV cache".
        """
        cfg = self.config
        if not isinstance(idx, torch.Tensor) or idx.dtype != torch.long:
            got = f"{idx.dtype} tensor" if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise TypeError(f"idx must be a non-empty int64 tensor of shape (N, L), got {got}")
        if idx.ndim != 2 or idx.shape[1] == 0:
            raise ValueError(f"idx must be a non-empty int64 tensor of shape (N, L), got shape {tuple(idx.shape)}")
        check_int("max_new_tokens", max_new_tokens, minimum=0)
        check_bool("greedy", greedy)
        if not greedy:
            check_float("temperature", temperature, minimum=0.0, min_inclusive=False)
        if top_k is not None:
            check_int("top_k", top_k, minimum=1, maximum=cfg.vocab_size)
        if max_new_tokens == 0:
            return idx

        context = idx[:, -cfg.block_size:]  # (N, <= block_size)
        caches = self.make_kv_caches(idx.shape[0])
        logits, _, _ = self(context, kv_caches=caches)  # prefill, (N, L, vocab_size)
        for step in range(max_new_tokens):
            next_id = self._pick(logits[:, -1, :], temperature, top_k, greedy, generator)  # (N, 1)
            idx = torch.cat([idx, next_id], dim=1)  # (N, L + step + 1)
            if step == max_new_tokens - 1:
                break
            if caches[0].length < cfg.block_size:
                logits, _, _ = self(next_id, kv_caches=caches)  # one new position, (N, 1, vocab_size)
            else:
                logits, _, _ = self(idx[:, -cfg.block_size:])  # window slid: recompute, (N, block_size, vocab)
        return idx

    @staticmethod
    def _pick(logits, temperature, top_k, greedy, generator):
        """Next token ids (N, 1) from last-position logits (N, vocab_size): argmax, or a (top-k) sample."""
        if greedy:
            return logits.argmax(dim=-1, keepdim=True)  # (N, 1)
        logits = logits / temperature
        if top_k is not None:
            kth = torch.topk(logits, top_k, dim=-1).values[:, [-1]]  # (N, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = F.softmax(logits, dim=-1)  # (N, vocab_size)
        if generator is not None and generator.device != probs.device:
            # A generator draws only on its own device: sample there (a CPU generator gives the same ids for the
            # same probabilities whichever device ran the model) and bring the ids back.
            return torch.multinomial(probs.to(generator.device), num_samples=1,
                                     generator=generator).to(probs.device)  # (N, 1)
        return torch.multinomial(probs, num_samples=1, generator=generator)  # (N, 1)


def expand_kv_heads(model: TinyTransformer) -> TinyTransformer:
    """An MHA copy of a GQA/MQA ``model``: in every layer each key/value head is copied to every query head of its
    group (:func:`mha.convert.gqa_to_mha`), so both models compute the same function while the copy's KV cache is
    h / g times larger. Book: part II, "MQA and GQA"; appendix "Benchmarks" (the decoding section)."""
    check_type("model", model, TinyTransformer, "a TinyTransformer")
    weight = model.lm_head.weight
    expanded = TinyTransformer(replace(model.config, n_kv_heads=None)).to(device=weight.device, dtype=weight.dtype)
    state = {k: v for k, v in model.state_dict().items() if ".attn." not in k}
    expanded.load_state_dict(state, strict=False)  # everything but the attention layers
    for ours, theirs in zip(model.blocks, expanded.blocks):
        theirs.attn.load_params(gqa_to_mha(ours.attn.export_params(), model.config.n_heads))
    return expanded
