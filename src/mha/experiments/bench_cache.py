"""The ``equal_cache`` section of ``python -m mha.bench``: the time to decode one token with full multi-head attention,
GQA, MQA and multi-head latent attention, in the character model that experiments/latent_gated/ trains.

Each variant is the model of those sweeps (:class:`mha.experiments.model.ModernTransformerConfig` with RoPE, the
sizes of :class:`EqualCacheShapes`), built with random weights: the time of a step does not depend on the weights'
values. Per context length (positions already cached), each variant's step through its cache is checked against
recomputing the whole prefix (the last position's logits, ``torch.allclose``), its cache is checked to hold the
bytes ``mha.counting`` says, and then every variant is timed side by side by
:func:`mha.experiments.timing.paired_times` (all variants in each round, the order rotated from round to round).
The section keeps every round's time per variant, so that a reader can form paired ratios (variant / MHA, round by
round) and put an interval on their median (the book does, with ``scipy.stats.quantile_test``).

Multi-head latent attention decodes by the absorbed path (``MultiHeadLatentAttention``'s default for one new token
with a cache): each head scores against the cached latents directly, as DeepSeek's inference code does. That path is
written as separate matrix products and a softmax, where the other variants call PyTorch's fused
``scaled_dot_product_attention``; the variant "MHA (unfused)" (``attn_impl="naive"``) computes full attention the
same unfused way, so that the two kinds of code can be told apart.

Book: part IV, "Latent and gated attention, measured".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from mha._checks import check_int
from mha.experiments.bench import _cached_step, _match_all
from mha.experiments.model import ModernTransformerConfig, TinyTransformer
from mha.experiments.timing import paired_times

__all__ = ["EqualCacheShapes", "VARIANTS", "variant_config", "section_equal_cache"]

# name -> the attention options that differ from full multi-head attention: n_kv_heads (GQA/MQA), kv_rank (MLA), or
# attn_impl "naive" (the control: MHA computed as MLA's step is, matrix products and a softmax one after another, where
# the others call PyTorch's fused scaled_dot_product_attention)
VARIANTS = {
    "MHA": {},
    "MHA (unfused)": {"attn_impl": "naive"},
    "GQA (2 key/value heads)": {"n_kv_heads": 2},
    "MQA": {"n_kv_heads": 1},
    "MLA (kv_rank 56)": {"kv_rank": 56},
    "MLA (kv_rank 24)": {"kv_rank": 24},
}


@dataclass(frozen=True)
class EqualCacheShapes:
    """The shared sizes of the variants: those of experiments/latent_gated/*.yaml (the book checks they agree)."""

    n_layers: int = 4  # transformer blocks
    d_model: int = 64  # model width
    n_heads: int = 4  # query heads (head_dim = d_model / n_heads = 16)
    rope_base: float = 10000.0  # RoPE in every head; MLA's shared rotary key below
    qk_rope_head_dim: int = 8  # MLA: the size of the one rotary key all heads share
    vocab_size: int = 65  # Tiny Shakespeare's characters


def variant_config(name: str, shapes: EqualCacheShapes, block_size: int) -> ModernTransformerConfig:
    """The configuration of variant ``name`` (a key of :data:`VARIANTS`) at ``shapes``, reading up to
    ``block_size`` positions."""
    if name not in VARIANTS:
        raise ValueError(f"name must be one of {list(VARIANTS)}, got {name!r}")
    options = dict(VARIANTS[name])
    if "kv_rank" in options:
        options["qk_rope_head_dim"] = shapes.qk_rope_head_dim
    return ModernTransformerConfig(vocab_size=shapes.vocab_size, block_size=check_int("block_size", block_size),
                                   n_layers=shapes.n_layers, d_model=shapes.d_model, n_heads=shapes.n_heads,
                                   rope_base=shapes.rope_base, bias=False, **options)


def section_equal_cache(cfg, device: torch.device, progress: bool = True) -> dict:
    """Per-token decoding time of the :data:`VARIANTS` at each (batch, context) of ``cfg.equal_cache_points``, all
    timed side by side; see the module docstring."""
    shapes = EqualCacheShapes()
    sizes = [(check_int("batch", b), check_int("context", c, minimum=2)) for b, c in cfg.equal_cache_points]
    max_batch, max_context = max(b for b, _ in sizes), max(c for _, c in sizes)
    generator = torch.Generator().manual_seed(cfg.seed)
    all_ids = torch.randint(shapes.vocab_size, (max_batch, max_context), generator=generator).to(device)  # (N, L)
    models = {}
    for name in VARIANTS:
        torch.manual_seed(cfg.seed)
        models[name] = TinyTransformer(variant_config(name, shapes, max_context)).to(device).eval()
    points = []
    bar = tqdm(total=len(sizes), desc="equal_cache", disable=not progress)
    for batch, context in sizes:
        ids = all_ids[:batch]  # (batch, max_context)
        steps, checks, cache_bytes = {}, {}, {}
        for name, model in models.items():
            step, caches = _cached_step(model, ids, context)
            with torch.no_grad():
                recomputed = model(ids[:, :context])[0][:, -1]  # (batch, vocab_size): the last position, no cache
            checks[name] = _match_all([(step(), recomputed)])
            cache_bytes[name] = sum(cache.nbytes for cache in caches)
            element = model.lm_head.weight.element_size()
            counted = model.kv_cache_bytes(batch, context, element)  # mha.counting's formula
            if cache_bytes[name] != counted:
                raise RuntimeError(f"{name}: the cache holds {cache_bytes[name]} bytes but mha.counting says {counted}")
            steps[name] = step
        timed = paired_times(steps, device=device, **cfg.timing_kwargs())
        points.append(dict(batch=batch, context=context, calls=timed["calls"],
                           variants={name: dict(times_s=timed["times"][name], params=sum(
                               p.numel() for p in models[name].parameters()), cache_bytes=cache_bytes[name],
                               cache_numbers_per_position_layer=cache_bytes[name] // (
                                   models[name].lm_head.weight.element_size() * batch * context * shapes.n_layers),
                               **checks[name]) for name in VARIANTS}))
        bar.update()
    bar.close()
    return dict(description="seconds per decoding step (one new token for each of `batch` sequences, through the "
                            "cache, all layers) of the character model of experiments/latent_gated/ with each "
                            "attention variant; every variant timed in every round, the order rotated",
                shapes=asdict(shapes), variants={name: dict(options) for name, options in VARIANTS.items()},
                points=points)
