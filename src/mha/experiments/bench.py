"""Side-by-side benchmarks: ``python -m mha.bench`` (``make bench``) writes ``experiments/benchmarks/<device>.json``.

Book: appendix "Benchmarks" (loads the JSON, shows the tables and plots); part II, "Counting everything" (the FLOP
counts behind the GFLOP/s section), "Autoregressive decoding and the KV cache" and "MQA and GQA" (the decoding
section); part I, "From one head to h heads" (the module under test).

This module holds what is measured: the configuration (:class:`BenchConfig`), the probes (peak memory, which SDPA
backend ran), the contenders and the sections. The timer is :mod:`mha.experiments.timing` (:func:`compare` and
:class:`ScriptedClock` are re-exported here); running the sections, recording the run and the command line are
:mod:`mha.experiments.bench_run` (:func:`run`, :func:`main` and :func:`device_info` are re-exported here).

Method (one function, :func:`compare`, times every pair). Both contenders are first checked to compute the same
outputs (``torch.allclose``, recorded as ``max_abs_diff`` and ``outputs_match``), then each runs ``warmup`` untimed
calls, then the two are *alternated* for ``repeats`` pairs (a then b, b then a, ...), each timing measured with
``time.perf_counter`` around ``calls`` calls (``torch.cuda.synchronize`` before and after on CUDA; short calls are
repeated until a timing lasts ``min_time_s``). A pair's ratio is time(a) / time(b) for that pair; the reported
ratio is the **median of the per-pair ratios** with its interquartile range (IQR). Alternating and taking per-pair
ratios cancels most of the drift a shared, loaded machine adds: both members of a pair see the same load.

Sections (``--sections``, all by default):

* ``attention``: ``mha.MultiHeadAttention`` (sdpa path) against ``torch.nn.MultiheadAttention`` with the same
  weights; forward (under ``torch.no_grad``, where torch's module may take its fused "fast path") and
  forward+backward; with and without a causal mask. Target: ratio ours / torch <= 1.0.
* ``naive``: the naive path against the sdpa path of the same module: time ratio naive / sdpa and the peak memory
  of each, beside the analytic size of one attention matrix (``mha.counting.attention_matrix_bytes``).
* ``decode``: per generated token, a step through the KV cache against recomputing the whole prefix; and GQA (g=2)
  and MQA (g=1) against MHA, per-token time and cache bytes. The MHA contender is the GQA/MQA model with its
  key/value heads *copied* to every query head of their group, so both compute the same function.
* ``equal_cache``: seconds per generated token of part IV's character model with full multi-head attention, GQA,
  MQA and multi-head latent attention (absorbed), every variant in every round (:mod:`mha.experiments.bench_cache`).
* ``train``: training-step throughput (tokens/s) of ``mha.experiments.model.TinyTransformer`` against the same model built from
  ``torch.nn.TransformerEncoderLayer`` (same weights, causal mask). Target: throughput ratio ours / torch >= 1.0.
* ``kernels`` (CUDA only): the package's Triton FlashAttention kernel against SDPA's flash backend and the naive
  path, bfloat16, forward and forward+backward, TFLOP/s and the fraction of a bf16 matmul's rate
  (:mod:`mha.kernels.benchmark`). Target on one H100: at least 0.8x the flash backend's forward and 0.7x its
  forward+backward at L >= 4096.
* ``gflops``: achieved GFLOP/s of the attention forward (FLOPs from ``mha.counting.flops``) as a fraction of an
  n x n matrix multiply's GFLOP/s, the two timed alternately in the same run.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` minus the memory allocated before the call. On CPU there is
no allocator statistic, so one call runs under ``torch.profiler.profile(profile_memory=True)`` and the peak is the
maximum of the running sum of the allocation/free events (bytes above what was allocated before the call; weights
and inputs excluded). On CUDA the attention sections also run in bfloat16, and every point records which SDPA
backend ran (by the aten op the profiler saw: flash, efficient, cudnn or math) and which backends can run the point
alone (``torch.nn.attention.sdpa_kernel([backend])``). The CPU flash kernel is reported as "flash (cpu)".
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn
from tqdm import tqdm  # plain tqdm: tqdm.auto warns inside Jupyter when ipywidgets is missing

from mha import counting
from mha.convert import copy_to_torch_mha
from mha.attention import MultiHeadAttention
from mha.experiments.model import TinyTransformer, TransformerConfig, expand_kv_heads
from mha.experiments.timing import ScriptedClock, TimingConfig, compare, ratio_summary, summary

__all__ = ["BenchConfig", "QUICK", "ScriptedClock", "compare", "peak_memory_bytes", "sdpa_backend_used", "sdpa_backends_runnable",
           "TorchTransformer", "device_info", "run", "main", "SECTIONS"]

SECTIONS = ("attention", "naive", "decode", "equal_cache", "train", "gflops", "kernels")


@dataclass(frozen=True)
class BenchConfig(TimingConfig):
    # repeats (11), warmup (2), min_time_s (0.02): the timer's settings, mha.experiments.timing.TimingConfig
    seed: int = 0  # seeds the weights and inputs
    # attention (ours vs torch.nn.MultiheadAttention), naive (naive vs sdpa) and gflops sections
    batch: int = 8  # N
    n_heads: int = 8  # h
    seq_lens: tuple[int, ...] = (128, 512, 1024)  # L (self-attention, L_q = L_kv)
    d_models: tuple[int, ...] = (256, 512)  # d_model
    naive_seq_lens: tuple[int, ...] = (128, 512, 1024)  # L for the naive-vs-sdpa section
    naive_d_model: int = 256  # d_model for the naive-vs-sdpa section
    matmul_size: int = 2048  # n of the n x n float matmul the gflops section compares against
    # decode section (a TinyTransformer decoding through its KV cache)
    decode_batch: int = 4  # sequences decoded together
    decode_contexts: tuple[int, ...] = (128, 256, 512, 1024, 2048)  # positions already in the context
    decode_d_model: int = 256  # d_model of the decoding model
    decode_n_layers: int = 2  # layers of the decoding model
    decode_kv_heads: tuple[int, ...] = (2, 1)  # g for the GQA/MQA contenders (MHA has g = n_heads)
    # equal_cache section (mha.experiments.bench_cache: MHA, GQA, MQA, MLA in the character model of part IV)
    # (sequences decoded together, positions already cached) per point; 64 is the trained context, and the last
    # point's caches (32 sequences of 2048) are large enough for reading them to matter on a CPU
    equal_cache_points: tuple[tuple[int, int], ...] = ((1, 64), (1, 512), (1, 2048), (32, 2048))
    # train section (TinyTransformer vs a model built from nn.TransformerEncoderLayer)
    train_batch: int = 8  # sequences per step
    train_block_size: int = 256  # sequence length
    train_n_layers: int = 4  # transformer blocks
    train_d_model: int = 256  # d_model
    train_vocab_size: int = 65  # tokens (Tiny Shakespeare's 65 characters)
    train_lr: float = 1e-3  # AdamW learning rate (the value does not change the step's cost)


QUICK = BenchConfig(repeats=2, warmup=1, min_time_s=0.0, batch=2, n_heads=4, seq_lens=(16, 32), d_models=(32,),
                    naive_seq_lens=(16, 32), naive_d_model=32, matmul_size=64, decode_batch=1,
                    decode_contexts=(8, 16), equal_cache_points=((1, 8), (2, 16)), decode_d_model=32, decode_n_layers=1,
                    train_batch=2, train_block_size=16, train_n_layers=1, train_d_model=32, train_vocab_size=16)

# (rtol, atol) for "the two contenders computed the same outputs"
TOLERANCES = {torch.float32: (1e-3, 1e-4), torch.bfloat16: (3e-2, 3e-2), torch.float16: (1e-2, 1e-2)}

# aten op recorded by the profiler -> SDPA backend
_BACKEND_OPS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
}


def _timing(cfg: BenchConfig, fn_a, fn_b, device) -> dict:
    return compare(fn_a, fn_b, device=device, **cfg.timing_kwargs())


# ------------------------------------------------------------------------------------------------ memory, backends
def peak_memory_bytes(fn, device) -> int | None:
    """Peak bytes allocated by one call of ``fn`` above what was allocated before it (None if unmeasurable).

    CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus ``memory_allocated`` before.
    CPU: the maximum of the running sum of the profiler's allocation/free events during the call
    (``torch.profiler.profile(profile_memory=True)``; read from the profiler's kineto events). The profiler records
    no free of a block allocated before it started, so memory released by the call (e.g. old gradients) is not
    credited: the result is the peak of the memory the call itself allocated.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:
        events = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                  if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    except AttributeError:  # the profiler's internals moved: report "not measured" rather than a wrong number
        return None
    running = peak = 0
    for _, nbytes in sorted(events):
        running += nbytes
        peak = max(peak, running)
    return int(peak)


def sdpa_backend_used(fn) -> str | None:
    """Which SDPA backend one call of ``fn`` ran, from the aten op the profiler recorded (None: no SDPA op)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names = {event.name for event in prof.events()}
    found = [backend for op, backend in _BACKEND_OPS.items() if op in names]
    return ", ".join(found) if found else None


def sdpa_backends_runnable(fn) -> list[str]:
    """The SDPA backends that can run ``fn`` when each is the only one allowed (``sdpa_kernel([backend])``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    runnable = []
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # each refusal warns why; the list is the answer
                with sdpa_kernel([backend]):
                    fn()
        except RuntimeError:
            continue
        runnable.append(name.removesuffix("_ATTENTION").lower())
    return runnable


def _match(a: torch.Tensor, b: torch.Tensor) -> tuple[float, bool]:
    """(max |a - b|, allclose at the dtype's tolerance); atol scales with max |b| when that exceeds 1 (gradients
    summed over many positions are large, and a low-precision dtype's error grows with them)."""
    rtol, atol = TOLERANCES.get(a.dtype, TOLERANCES[torch.float32])
    a, b = a.detach().float(), b.detach().float()
    atol = atol * max(1.0, float(b.abs().max()))
    return float((a - b).abs().max()), bool(torch.allclose(a, b, rtol=rtol, atol=atol))


def _match_all(pairs) -> dict:
    """max_abs_diff and outputs_match over several (ours, theirs) tensor pairs."""
    results = [_match(a, b) for a, b in pairs]
    return dict(max_abs_diff=max(r[0] for r in results), outputs_match=all(r[1] for r in results))


# ------------------------------------------------------------------------------------------------ contenders
class TorchTransformer(nn.Module):
    """``TinyTransformer``'s architecture built from ``nn.TransformerEncoderLayer`` (the train section's baseline).

    Pre-LayerNorm (``norm_first=True``), GELU, dim_feedforward = mlp_ratio * d_model, batch_first, causal mask,
    token + position embeddings, final LayerNorm and a head tied to the token embedding. ``from_tiny`` copies a
    TinyTransformer's weights so the two compute the same logits.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if config.n_kv_heads not in (None, config.n_heads) or config.head_dim not in (None, config.d_model
                                                                                       // config.n_heads):
            raise ValueError("TorchTransformer supports MHA with head_dim = d_model // n_heads only, got "
                             f"n_kv_heads={config.n_kv_heads}, head_dim={config.head_dim}")
        if config.attention_only or not config.bias or not config.scale_scores:
            raise ValueError("TorchTransformer needs attention_only=False, bias=True and scale_scores=True")
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.block_size, config.d_model)
        self.blocks = nn.ModuleList([
            nn.TransformerEncoderLayer(config.d_model, config.n_heads,
                                       dim_feedforward=config.mlp_ratio * config.d_model, dropout=config.dropout,
                                       activation="gelu", batch_first=True, norm_first=True)
            for _ in range(config.n_layers)])
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.tok_emb.weight = self.lm_head.weight  # tied, as TinyTransformer

    @classmethod
    def from_tiny(cls, tiny: TinyTransformer) -> "TorchTransformer":
        model = cls(tiny.config).to(device=tiny.lm_head.weight.device, dtype=tiny.lm_head.weight.dtype)
        with torch.no_grad():
            model.lm_head.weight.copy_(tiny.lm_head.weight)
            model.pos_emb.weight.copy_(tiny.pos_emb.weight)
            model.ln_f.load_state_dict(tiny.ln_f.state_dict())
            for theirs, ours in zip(model.blocks, tiny.blocks):
                copy_to_torch_mha(ours.attn, theirs.self_attn)
                theirs.norm1.load_state_dict(ours.ln_1.state_dict())
                theirs.norm2.load_state_dict(ours.ln_2.state_dict())
                theirs.linear1.load_state_dict(ours.mlp.c_fc.state_dict())
                theirs.linear2.load_state_dict(ours.mlp.c_proj.state_dict())
        return model

    def forward(self, idx, targets=None):
        """(logits (N, L, vocab_size), mean cross-entropy loss or None), as ``TinyTransformer`` without extras."""
        length = idx.shape[1]
        positions = torch.arange(length, device=idx.device)  # (L,)
        x = self.tok_emb(idx) + self.pos_emb(positions)  # (N, L, d_model)
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=idx.device, dtype=x.dtype)  # (L, L)
        for block in self.blocks:
            x = block(x, src_mask=causal, is_causal=True)  # (N, L, d_model)
        logits = self.lm_head(self.ln_f(x))  # (N, L, vocab_size)
        loss = None
        if targets is not None:
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def _rewind(caches, length: int) -> None:
    """Forget every cached position after the first ``length`` (the buffers keep them; only the prefix is read)."""
    for cache in caches:
        cache.length = length


# ------------------------------------------------------------------------------------------------ sections
def _dtypes(device: torch.device) -> list[torch.dtype]:
    return [torch.float32, torch.bfloat16] if device.type == "cuda" else [torch.float32]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _attention_inputs(cfg, device, dtype, d_model, seq_len, generator):
    x = torch.randn(cfg.batch, seq_len, d_model, generator=generator).to(device=device, dtype=dtype)
    grad_out = torch.randn(cfg.batch, seq_len, d_model, generator=generator).to(device=device, dtype=dtype)
    return x, grad_out


def _forward_backward(module, x, grad_out, call):
    """One forward + backward of ``call(module, x)``; gradients reset first (no accumulation cost)."""
    module.zero_grad(set_to_none=True)
    x.grad = None
    out = call(module, x)
    out.backward(grad_out)
    return out


def _contenders(mode: str, a, b, x, grad_out):
    """Two zero-argument callables from (module, call) pairs: a forward under ``torch.no_grad`` ("forward") or a
    forward and backward with fresh gradients ("forward_backward", x then requires grad)."""
    def make(module, call):
        if mode == "forward":
            def fn():
                with torch.no_grad():
                    return call(module, x)
        else:
            def fn():
                return _forward_backward(module, x, grad_out, call)
        return fn

    if mode != "forward":
        x.requires_grad_(True)
    return make(*a), make(*b)


def section_attention(cfg: BenchConfig, device: torch.device, progress: bool = True) -> dict:
    """``mha.MultiHeadAttention`` (sdpa) vs ``torch.nn.MultiheadAttention``; ratio = ours / torch (target <= 1)."""
    points_spec = [(dtype, d_model, seq_len, causal, mode) for dtype in _dtypes(device) for d_model in cfg.d_models
                   for seq_len in cfg.seq_lens for causal in (False, True) for mode in ("forward", "forward_backward")]
    points, backend_cache, runnable_cache = [], {}, {}
    for dtype, d_model, seq_len, causal, mode in tqdm(points_spec, desc="attention", disable=not progress):
        generator = torch.Generator().manual_seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        ours = MultiHeadAttention(d_model, cfg.n_heads).to(device=device, dtype=dtype).eval()
        theirs = nn.MultiheadAttention(d_model, cfg.n_heads, batch_first=True).to(device=device, dtype=dtype).eval()
        copy_to_torch_mha(ours, theirs)
        x, grad_out = _attention_inputs(cfg, device, dtype, d_model, seq_len, generator)
        causal_mask = nn.Transformer.generate_square_subsequent_mask(seq_len, device=device, dtype=dtype)

        def call_ours(module, inp):
            return module(inp, is_causal=causal, need_weights=False)[0]

        def call_theirs(module, inp):
            if causal:  # torch's module needs the mask itself and takes is_causal as a hint that it is causal
                return module(inp, inp, inp, attn_mask=causal_mask, is_causal=True, need_weights=False)[0]
            return module(inp, inp, inp, need_weights=False)[0]

        fn_ours, fn_theirs = _contenders(mode, (ours, call_ours), (theirs, call_theirs), x, grad_out)
        if mode == "forward":
            check = _match_all([(fn_ours(), fn_theirs())])
        else:
            out_ours = fn_ours().detach()
            grads_ours = (x.grad.clone(), ours.q_proj.weight.grad.clone(), ours.o_proj.weight.grad.clone())
            out_theirs = fn_theirs().detach()
            grads_theirs = (x.grad.clone(), theirs.in_proj_weight.grad[:d_model].clone(),
                            theirs.out_proj.weight.grad.clone())
            check = _match_all([(out_ours, out_theirs), *zip(grads_ours, grads_theirs)])

        with torch.no_grad():  # backends depend on dtype, shapes and mask, not on the mode: probe each once
            if (dtype, d_model, seq_len, causal) not in backend_cache:
                backend_cache[(dtype, d_model, seq_len, causal)] = sdpa_backend_used(lambda: call_ours(ours, x))
            if (dtype, d_model, causal) not in runnable_cache:
                runnable_cache[(dtype, d_model, causal)] = sdpa_backends_runnable(lambda: call_ours(ours, x))
        backend = backend_cache[(dtype, d_model, seq_len, causal)]
        timing = _timing(cfg, fn_ours, fn_theirs, device)
        points.append(dict(dtype=_dtype_name(dtype), batch=cfg.batch, seq_len=seq_len, d_model=d_model,
                           n_heads=cfg.n_heads, causal=causal, mode=mode, **check, sdpa_backend=backend,
                           sdpa_backends_runnable=runnable_cache[(dtype, d_model, causal)], **timing,
                           target_met=bool(timing["ratio"] <= 1.0)))
    return dict(description="mha.MultiHeadAttention (sdpa path) vs torch.nn.MultiheadAttention, same weights; "
                            "ratio = time(ours) / time(torch); forward runs under torch.no_grad",
                a="mha.MultiHeadAttention (sdpa)", b="torch.nn.MultiheadAttention", target="ratio <= 1.0",
                points=points)


def section_naive(cfg: BenchConfig, device: torch.device, progress: bool = True) -> dict:
    """The naive path vs the sdpa path of ``MultiHeadAttention`` (same weights): time ratio naive / sdpa, memory."""
    points_spec = [(dtype, seq_len, causal, mode) for dtype in _dtypes(device) for seq_len in cfg.naive_seq_lens
                   for causal in (False, True) for mode in ("forward", "forward_backward")]
    d_model, points = cfg.naive_d_model, []
    for dtype, seq_len, causal, mode in tqdm(points_spec, desc="naive", disable=not progress):
        generator = torch.Generator().manual_seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        sdpa = MultiHeadAttention(d_model, cfg.n_heads, impl="sdpa").to(device=device, dtype=dtype).eval()
        naive = MultiHeadAttention(d_model, cfg.n_heads, impl="naive").to(device=device, dtype=dtype).eval()
        naive.load_state_dict(sdpa.state_dict())
        x, grad_out = _attention_inputs(cfg, device, dtype, d_model, seq_len, generator)

        def call(module, inp):
            return module(inp, is_causal=causal, need_weights=False)[0]

        fn_naive, fn_sdpa = _contenders(mode, (naive, call), (sdpa, call), x, grad_out)
        if mode == "forward":
            check = _match_all([(fn_naive(), fn_sdpa())])
        else:
            out_naive = fn_naive().detach()
            grads_naive = [x.grad.clone()] + [p.grad.clone() for p in naive.parameters()]
            out_sdpa = fn_sdpa().detach()
            grads_sdpa = [x.grad.clone()] + [p.grad.clone() for p in sdpa.parameters()]
            check = _match_all([(out_naive, out_sdpa), *zip(grads_naive, grads_sdpa)])

        memory_naive, memory_sdpa = peak_memory_bytes(fn_naive, device), peak_memory_bytes(fn_sdpa, device)
        timing = _timing(cfg, fn_naive, fn_sdpa, device)
        points.append(dict(dtype=_dtype_name(dtype), batch=cfg.batch, seq_len=seq_len, d_model=d_model,
                           n_heads=cfg.n_heads, causal=causal, mode=mode, **check, **timing,
                           peak_bytes_naive=memory_naive, peak_bytes_sdpa=memory_sdpa,
                           attention_matrix_bytes=counting.attention_matrix_bytes(
                               cfg.batch, seq_len, seq_len, cfg.n_heads, torch.finfo(dtype).bits // 8)))
    return dict(description="MultiHeadAttention impl='naive' vs impl='sdpa', same weights; ratio = time(naive) / "
                            "time(sdpa); peak_bytes_* = peak memory of one call above what was allocated before it",
                a="naive", b="sdpa", target=None,
                memory_method="torch.cuda.max_memory_allocated" if device.type == "cuda" else
                "max running sum of torch.profiler allocation events (profile_memory=True)",
                points=points)


def _decode_model(cfg: BenchConfig, device, n_kv_heads=None) -> TinyTransformer:
    torch.manual_seed(cfg.seed)
    config = TransformerConfig(vocab_size=65, block_size=max(cfg.decode_contexts), n_layers=cfg.decode_n_layers,
                               d_model=cfg.decode_d_model, n_heads=cfg.n_heads, n_kv_heads=n_kv_heads)
    return TinyTransformer(config).to(device).eval()


def _cached_step(model, ids, context):
    """A callable: the step that decodes position ``context - 1`` through a cache holding the first context - 1."""
    caches = model.make_kv_caches(ids.shape[0], context)
    with torch.no_grad():
        model(ids[:, :context - 1], kv_caches=caches)  # prefill, not timed

    def step():
        _rewind(caches, context - 1)
        with torch.no_grad():
            return model(ids[:, context - 1:context], kv_caches=caches)[0][:, -1]  # (N, vocab_size)

    return step, caches


def section_decode(cfg: BenchConfig, device: torch.device, progress: bool = True) -> dict:
    """Per-token decoding: KV cache vs recomputing the prefix; GQA/MQA vs MHA (per-token time, cache bytes)."""
    generator = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(65, (cfg.decode_batch, max(cfg.decode_contexts)), generator=generator).to(device)
    mha_model = _decode_model(cfg, device)
    total = len(cfg.decode_contexts) * (1 + len(cfg.decode_kv_heads))
    bar = tqdm(total=total, desc="decode", disable=not progress)
    cache_points = []
    for context in cfg.decode_contexts:
        step, _ = _cached_step(mha_model, ids, context)

        def recompute(context=context):
            with torch.no_grad():
                return mha_model(ids[:, :context])[0][:, -1]  # (N, vocab_size)

        check = _match_all([(step(), recompute())])
        cache_points.append(dict(context=context, **check, **_timing(cfg, step, recompute, device)))
        bar.update()
    gqa_points = []
    for g in cfg.decode_kv_heads:
        grouped = _decode_model(cfg, device, n_kv_heads=g)
        expanded = expand_kv_heads(grouped)
        for context in cfg.decode_contexts:
            step_grouped, caches_grouped = _cached_step(grouped, ids, context)
            step_mha, caches_mha = _cached_step(expanded, ids, context)
            check = _match_all([(step_grouped(), step_mha())])
            bytes_grouped = sum(cache.nbytes for cache in caches_grouped)
            bytes_mha = sum(cache.nbytes for cache in caches_mha)
            element = mha_model.lm_head.weight.element_size()
            counted = grouped.kv_cache_bytes(cfg.decode_batch, context, element)  # mha.counting.kv_cache_bytes
            if bytes_grouped != counted:
                raise RuntimeError(f"KV cache holds {bytes_grouped} bytes but mha.counting says {counted}")
            gqa_points.append(dict(n_kv_heads=g, variant="MQA" if g == 1 else f"GQA (g={g})", context=context,
                                   **check, cache_bytes=bytes_grouped, cache_bytes_mha=bytes_mha,
                                   **_timing(cfg, step_grouped, step_mha, device)))
            bar.update()
    bar.close()
    return dict(description="per generated token (batch of decode_batch sequences, all layers): a step through the "
                            "KV cache vs recomputing the whole prefix (ratio = cached / recompute); GQA/MQA vs MHA "
                            "with copied key/value heads (ratio = grouped / MHA)",
                model=asdict(mha_model.config), batch=cfg.decode_batch,
                cache_vs_recompute=dict(a="KV cache step", b="recompute the prefix", points=cache_points),
                grouped_vs_mha=dict(a="GQA/MQA step", b="MHA step (key/value heads copied)", points=gqa_points))


def section_train(cfg: BenchConfig, device: torch.device, progress: bool = True) -> dict:
    """Training-step throughput: TinyTransformer vs the same model from nn.TransformerEncoderLayer (target >= 1)."""
    torch.manual_seed(cfg.seed)
    config = TransformerConfig(vocab_size=cfg.train_vocab_size, block_size=cfg.train_block_size,
                               n_layers=cfg.train_n_layers, d_model=cfg.train_d_model, n_heads=cfg.n_heads)
    ours = TinyTransformer(config).to(device).train()
    theirs = TorchTransformer.from_tiny(ours).train()
    generator = torch.Generator().manual_seed(cfg.seed)
    shape = (cfg.train_batch, cfg.train_block_size)
    x = torch.randint(cfg.train_vocab_size, shape, generator=generator).to(device)
    y = torch.randint(cfg.train_vocab_size, shape, generator=generator).to(device)
    with torch.no_grad():
        logits_ours, loss_ours, _ = ours(x, y)
        logits_theirs, loss_theirs = theirs(x, y)
    check = _match_all([(logits_ours, logits_theirs), (loss_ours, loss_theirs)])
    optimizers = [torch.optim.AdamW(model.parameters(), lr=cfg.train_lr) for model in (ours, theirs)]

    def training_step(model, optimizer):
        optimizer.zero_grad(set_to_none=True)
        loss = model(x, y)[1]
        loss.backward()
        optimizer.step()
        return loss

    bar = tqdm(total=1, desc="train", disable=not progress)
    timing = _timing(cfg, lambda: training_step(ours, optimizers[0]), lambda: training_step(theirs, optimizers[1]),
                     device)
    bar.update()
    bar.close()
    tokens = cfg.train_batch * cfg.train_block_size
    throughput = ratio_summary(timing["pairs_b_s"], timing["pairs_a_s"])  # per pair: time(torch) / time(ours)
    point = dict(**check, tokens_per_step=tokens, tokens_per_s_ours=tokens / timing["a_s"],
                 tokens_per_s_torch=tokens / timing["b_s"], throughput_ratio=throughput["median"],
                 throughput_ratio_q1=throughput["q1"], throughput_ratio_q3=throughput["q3"], **timing,
                 target_met=bool(throughput["median"] >= 1.0))
    return dict(description="one AdamW training step (forward, loss, backward, step); throughput_ratio = "
                            "tokens/s(ours) / tokens/s(torch) = median per-pair time(torch) / time(ours)",
                a="TinyTransformer", b="nn.TransformerEncoderLayer model", target="throughput_ratio >= 1.0",
                model=asdict(config), batch=cfg.train_batch, points=[point])


def section_gflops(cfg: BenchConfig, device: torch.device, progress: bool = True) -> dict:
    """Achieved GFLOP/s of the attention forward as a fraction of an n x n matmul's, timed alternately."""
    points_spec = [(dtype, d_model, seq_len) for dtype in _dtypes(device) for d_model in cfg.d_models
                   for seq_len in cfg.seq_lens]
    n = cfg.matmul_size
    points = []
    for dtype, d_model, seq_len in tqdm(points_spec, desc="gflops", disable=not progress):
        generator = torch.Generator().manual_seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        module = MultiHeadAttention(d_model, cfg.n_heads).to(device=device, dtype=dtype).eval()
        x, _ = _attention_inputs(cfg, device, dtype, d_model, seq_len, generator)
        a = torch.randn(n, n, generator=generator).to(device=device, dtype=dtype)
        b = torch.randn(n, n, generator=generator).to(device=device, dtype=dtype)

        def attention():
            with torch.no_grad():
                return module(x, need_weights=False)[0]

        def matmul():
            return a @ b

        flops_attention = counting.flops(cfg.batch, seq_len, seq_len, d_model, cfg.n_heads)["total"]
        flops_matmul = 2 * n ** 3
        timing = _timing(cfg, attention, matmul, device)
        fraction = summary([(flops_attention / ta) / (flops_matmul / tb)
                             for ta, tb in zip(timing["pairs_a_s"], timing["pairs_b_s"])])
        points.append(dict(dtype=_dtype_name(dtype), batch=cfg.batch, seq_len=seq_len, d_model=d_model,
                           n_heads=cfg.n_heads, flops_attention=flops_attention, flops_matmul=flops_matmul,
                           gflops_attention=flops_attention / timing["a_s"] / 1e9,
                           gflops_matmul=flops_matmul / timing["b_s"] / 1e9, fraction=fraction["median"],
                           fraction_q1=fraction["q1"], fraction_q3=fraction["q3"], **timing))
    return dict(description="attention forward (no mask, torch.no_grad) GFLOP/s, FLOPs = mha.counting.flops(...)"
                            "['total'], as a fraction of an n x n matmul's GFLOP/s in the same dtype",
                a="attention forward", b=f"{n} x {n} matmul", matmul_size=n, target=None, points=points)


def section_kernels(cfg: BenchConfig, device: torch.device, progress: bool = True) -> dict:
    """The package's Triton FlashAttention kernel against SDPA's flash backend and the naive path (bfloat16,
    forward and forward+backward, L from 512 to 16k, head_dim 64 and 128, causal and not; TFLOP/s and the fraction
    of a bf16 matmul measured in the same run): :func:`mha.kernels.benchmark.run_benchmark`, with this
    configuration's timer settings (and its ``QUICK`` sizes when ``cfg`` is :data:`QUICK`). CUDA only; on a CPU,
    or without Triton, the section says why it did not run. Book: part II, "From the recurrence to a kernel"."""
    if device.type != "cuda":
        return dict(skipped="needs a CUDA GPU: on a CPU Triton only interprets the kernel, and its times mean "
                            "nothing (the kernel's correctness is tested there, tests/test_kernels.py)")
    try:
        from mha.kernels import benchmark as kernel_benchmark
    except ImportError as error:
        return dict(skipped=f"Triton is not installed ({error}); pip install \"mha-derived[kernels]\"")
    quick = replace(QUICK, **cfg.timing_kwargs()) == cfg  # QUICK, whatever --repeats / --warmup said
    sizes = kernel_benchmark.QUICK if quick else kernel_benchmark.KernelBenchConfig()
    return kernel_benchmark.run_benchmark(device, replace(sizes, **cfg.timing_kwargs()), progress=progress)


def section_equal_cache(cfg: BenchConfig, device: torch.device, progress: bool = True) -> dict:
    """Per-token decoding time of MHA, GQA, MQA and MLA in part IV's character model:
    :func:`mha.experiments.bench_cache.section_equal_cache`."""
    from mha.experiments.bench_cache import section_equal_cache as section  # it imports this module's helpers

    return section(cfg, device, progress=progress)


SECTION_FUNCTIONS = dict(attention=section_attention, naive=section_naive, decode=section_decode,
                         equal_cache=section_equal_cache, train=section_train, gflops=section_gflops,
                         kernels=section_kernels)


def __getattr__(name):
    # Running the sections, recording the run and the command line live in mha.experiments.bench_run, which imports
    # this module: they are looked up there when first asked for (``from mha.experiments.bench import run``).
    if name in ("run", "main", "device_info"):
        from mha.experiments import bench_run
        return getattr(bench_run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":  # python -m mha.bench
    from mha.experiments.bench_run import main

    main(sys.argv[1:])
