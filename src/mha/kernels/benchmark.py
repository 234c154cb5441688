"""Benchmark of the Triton FlashAttention kernel against PyTorch's flash backend and the naive path.

``run_benchmark(device, config)`` times three contenders on the same inputs, forward and forward+backward:

* ``triton``: :func:`mha.kernels.flash_attention`;
* ``flash_backend``: ``F.scaled_dot_product_attention`` restricted to ``SDPBackend.FLASH_ATTENTION``;
* ``naive``: the materialised computation, ``softmax(q k^T * scale) v`` with the (N, h, L, L) matrix in memory.

Method (the book's paired-ratio method, appendix *Benchmarks*): after warm-up, each repeat times every contender
once, in a rotating order, with ``torch.cuda.synchronize`` around each timing; the reported ratio is the median of
the per-repeat ratios, with its quartiles. FLOPs use the standard counts: forward ``4 N h L_q L_kv d`` (halved when
causal with L_q = L_kv), backward 2.5 times the forward (so forward+backward is 3.5 times). The rate of one large
square matrix product in the benchmark's dtype is measured in the same run, and every TFLOP/s is also given as a
fraction of it. The result is a JSON-serialisable dict.

Target from the issue, on one H100: triton at least 0.8x the flash backend's forward and 0.7x its forward+backward
at L >= 4096; ``summary`` says which rows meet it.

On the CPU (under Triton's interpreter) it runs with tiny sizes as a smoke test only; its times mean nothing.
``python -m mha.kernels.benchmark --out results.json`` runs the default configuration on CUDA.

Book: part II, "From the recurrence to a kernel" (what was not measured there); appendix *Benchmarks*.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from mha.kernels.flash import flash_attention, is_interpreted

__all__ = ["BenchConfig", "run_benchmark", "attention_flops", "matmul_rate", "paired_times", "main"]

CONTENDERS = ("triton", "flash_backend", "naive")
TARGETS = {"forward": 0.8, "forward+backward": 0.7, "from_seq_len": 4096}


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What to time. ``batch=None`` keeps ``tokens`` = batch x L fixed (batch = max(1, tokens // L));
    ``n_heads=None`` uses ``d_model // head_dim`` heads (the FlashAttention-2 paper's setting: d_model 2048,
    16k tokens per batch). ``n_kv_heads=None`` is MHA. The naive path is skipped when its score and weight
    matrices would need more than ``naive_max_bytes``."""

    seq_lens: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
    head_dims: tuple[int, ...] = (64, 128)
    causal: tuple[bool, ...] = (False, True)
    dtypes: tuple[str, ...] = ("bfloat16",)
    passes: tuple[str, ...] = ("forward", "forward+backward")
    batch: int | None = None
    tokens: int = 16384
    n_heads: int | None = None
    d_model: int = 2048
    n_kv_heads: int | None = None
    repeats: int = 15
    warmup: int = 3
    min_time_s: float = 0.02
    matmul_size: int = 8192
    naive_max_bytes: int = 16 * 2**30


def attention_flops(n_batch, n_heads, seq_len_q, seq_len_kv, head_dim, is_causal, pass_name) -> float:
    """Standard FLOP count: forward 4 N h L_q L_kv d (two matrix products of 2 m n k each), halved when causal
    with L_q = L_kv; the backward is 2.5 forwards (five products, one of them the recomputed scores).

    Book: part II, "Counting everything"; "From the recurrence to a kernel".
    """
    forward = 4.0 * n_batch * n_heads * seq_len_q * seq_len_kv * head_dim
    if is_causal and seq_len_q == seq_len_kv:
        forward /= 2
    return forward if pass_name == "forward" else 3.5 * forward


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_calls(fn, calls: int, device: torch.device) -> float:
    """Seconds per call of ``calls`` back-to-back calls, synchronised before and after."""
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _synchronize(device)
    return (time.perf_counter() - start) / calls


def _quartiles(values) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def paired_times(fns: dict, repeats: int, warmup: int, device, min_time_s: float = 0.0) -> dict:
    """Time several contenders side by side: ``{name: {"s": median s/call, "q1_s", "q3_s", "per_repeat_s"}}``.

    After ``warmup`` untimed rounds, every repeat times each contender once (``calls`` calls, the same for all,
    enough for the slowest to last ``min_time_s``), rotating the order so no contender always goes first.
    Book: appendix *Benchmarks* (the paired-ratio method).
    """
    device = torch.device(device)
    names = list(fns)
    slowest = 0.0
    for _ in range(max(warmup, 1)):
        slowest = max(_time_calls(fns[name], 1, device) for name in names)
    calls = 1 if min_time_s <= 0 or slowest >= min_time_s else min(1000, math.ceil(min_time_s / max(slowest, 1e-9)))
    per_repeat = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]  # rotate who goes first
        for name in order:
            per_repeat[name].append(_time_calls(fns[name], calls, device))
    result = {}
    for name, times in per_repeat.items():
        q1, median, q3 = _quartiles(times)
        result[name] = {"s": median, "q1_s": q1, "q3_s": q3, "per_repeat_s": times, "calls": calls}
    return result


def _median_ratio(numerator: list[float], denominator: list[float]) -> dict:
    """Median and quartiles of the per-repeat ratios numerator / denominator."""
    q1, median, q3 = _quartiles([a / b for a, b in zip(numerator, denominator)])
    return {"median": median, "q1": q1, "q3": q3}


def matmul_rate(device, dtype: torch.dtype, size: int, repeats: int = 10) -> float:
    """FLOP/s of one ``size`` x ``size`` matrix product in ``dtype`` (2 size^3 FLOPs), median of ``repeats``."""
    device = torch.device(device)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    _time_calls(lambda: a @ b, 2, device)  # warm-up
    times = [_time_calls(lambda: a @ b, 3, device) for _ in range(repeats)]
    return 2.0 * size**3 / statistics.median(times)


def naive_attention(q, k, v, is_causal: bool, scale: float):
    """softmax(q k^T * scale) v with the (N, h, L_q, L_kv) weights in memory (softmax in float32); GQA by
    grouping the query heads of a key/value head, as ``mha.MultiHeadAttention(impl="naive")`` does."""
    n_batch, n_heads, seq_len_q, head_dim = q.shape
    n_kv_heads, seq_len_kv = k.shape[1], k.shape[2]
    group = n_heads // n_kv_heads
    q_grouped = q.reshape(n_batch, n_kv_heads, group * seq_len_q, head_dim)  # (N, g, (h/g) L_q, d)
    scores = (q_grouped @ k.transpose(-2, -1)) * scale  # (N, g, (h/g) L_q, L_kv)
    scores = scores.view(n_batch, n_heads, seq_len_q, seq_len_kv)  # (N, h, L_q, L_kv)
    if is_causal:
        allowed = torch.ones(seq_len_q, seq_len_kv, dtype=torch.bool, device=q.device).tril(seq_len_kv - seq_len_q)
        scores = scores.masked_fill(~allowed, float("-inf"))  # (N, h, L_q, L_kv)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # (N, h, L_q, L_kv)
    out = weights.view(n_batch, n_kv_heads, group * seq_len_q, seq_len_kv) @ v  # (N, g, (h/g) L_q, d)
    return out.view(n_batch, n_heads, seq_len_q, head_dim)  # (N, h, L_q, d)


def _flash_backend(q, k, v, is_causal: bool, scale: float):
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale,
                                              enable_gqa=k.shape[1] != q.shape[1])


def _contender_calls(attention, q, k, v, grad_out, is_causal, scale, pass_name):
    """A zero-argument callable running one forward (no graph) or one forward+backward (``autograd.grad``, so
    gradients are not accumulated from call to call)."""
    if pass_name == "forward":
        def forward():
            with torch.no_grad():
                attention(q, k, v, is_causal, scale)
        return forward

    def forward_backward():
        out = attention(q, k, v, is_causal, scale)
        torch.autograd.grad(out, (q, k, v), grad_out)
    return forward_backward


def _row_shape(cfg: BenchConfig, seq_len: int, head_dim: int) -> tuple[int, int, int]:
    n_batch = cfg.batch if cfg.batch is not None else max(1, cfg.tokens // seq_len)
    n_heads = cfg.n_heads if cfg.n_heads is not None else max(1, cfg.d_model // head_dim)
    n_kv_heads = cfg.n_kv_heads if cfg.n_kv_heads is not None else n_heads
    return n_batch, n_heads, n_kv_heads


def _one_row(cfg, device, dtype, seq_len, head_dim, is_causal, pass_name, peak_rate) -> dict:
    n_batch, n_heads, n_kv_heads = _row_shape(cfg, seq_len, head_dim)
    generator = torch.Generator(device=device).manual_seed(seq_len * 1000 + head_dim)
    shape_q, shape_kv = (n_batch, n_heads, seq_len, head_dim), (n_batch, n_kv_heads, seq_len, head_dim)
    needs_grad = pass_name != "forward"
    q, k, v = (torch.randn(s, device=device, dtype=dtype, generator=generator).requires_grad_(needs_grad)
               for s in (shape_q, shape_kv, shape_kv))
    grad_out = torch.randn(shape_q, device=device, dtype=dtype, generator=generator)
    scale = 1.0 / math.sqrt(head_dim)
    attentions = {"triton": lambda *a: flash_attention(*a), "flash_backend": _flash_backend,
                  "naive": naive_attention}
    notes = {}
    naive_bytes = n_batch * n_heads * seq_len * seq_len * (2 * dtype.itemsize + 4) * (2 if needs_grad else 1)
    if naive_bytes > cfg.naive_max_bytes:
        attentions.pop("naive")
        notes["naive"] = f"skipped: its score and weight matrices need about {naive_bytes / 2**30:.0f} GiB"
    fns = {}
    for name, attention in attentions.items():  # drop a contender that cannot run here (no flash backend, OOM)
        fn = _contender_calls(attention, q, k, v, grad_out, is_causal, scale, pass_name)
        try:
            fn()
            _synchronize(device)
            fns[name] = fn
        except (RuntimeError, torch.cuda.OutOfMemoryError) as err:
            notes[name] = f"could not run: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    times = paired_times(fns, cfg.repeats, cfg.warmup, device, cfg.min_time_s) if fns else {}
    flops = attention_flops(n_batch, n_heads, seq_len, seq_len, head_dim, is_causal, pass_name)
    row = {"dtype": str(dtype).removeprefix("torch."), "seq_len": seq_len, "head_dim": head_dim, "causal": is_causal,
           "pass": pass_name, "batch": n_batch, "n_heads": n_heads, "n_kv_heads": n_kv_heads, "flops": flops,
           "notes": notes}
    for name in CONTENDERS:
        seconds = times[name]["s"] if name in times else None
        row[f"{name}_s"] = seconds
        row[f"{name}_q1_s"] = times[name]["q1_s"] if name in times else None
        row[f"{name}_q3_s"] = times[name]["q3_s"] if name in times else None
        row[f"{name}_tflops"] = flops / seconds / 1e12 if seconds else None
        row[f"{name}_fraction_of_matmul"] = flops / seconds / peak_rate if seconds else None
    for other in ("flash_backend", "naive"):  # triton's speed relative to the other: > 1 means triton is faster
        if "triton" in times and other in times:
            ratio = _median_ratio(times[other]["per_repeat_s"], times["triton"]["per_repeat_s"])
            row[f"triton_speed_vs_{other}"], row[f"triton_speed_vs_{other}_iqr"] = ratio["median"], \
                [ratio["q1"], ratio["q3"]]
        else:
            row[f"triton_speed_vs_{other}"], row[f"triton_speed_vs_{other}_iqr"] = None, None
    return row


def _device_info(device: torch.device) -> dict:
    import triton

    info = {"type": device.type, "torch": torch.__version__, "triton": triton.__version__,
            "interpreted": is_interpreted()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"name": props.name, "capability": f"{props.major}.{props.minor}",
                 "memory_gib": round(props.total_memory / 2**30, 1)}
    else:
        info["name"] = "cpu"
    return info


def _summary(rows: list[dict]) -> dict:
    """Whether triton reaches the issue's targets against the flash backend at L >= 4096, pass by pass."""
    summary = {}
    for pass_name in ("forward", "forward+backward"):
        ratios = [r["triton_speed_vs_flash_backend"] for r in rows if r["pass"] == pass_name
                  and r["seq_len"] >= TARGETS["from_seq_len"] and r["triton_speed_vs_flash_backend"] is not None]
        summary[pass_name] = {"target": TARGETS[pass_name], "rows": len(ratios),
                              "worst": min(ratios) if ratios else None,
                              "met": bool(ratios) and min(ratios) >= TARGETS[pass_name]}
    return summary


def run_benchmark(device="cuda", config: BenchConfig | None = None, progress: bool = False) -> dict:
    """Time triton vs the flash backend vs naive for every (dtype, L, head_dim, causal, pass) of ``config``.

    Returns a JSON-serialisable dict: ``device`` (type, name, torch and triton versions, interpreted),
    ``config``, ``matmul_rate_flops`` (the measured rate of a ``matmul_size`` square product in the first dtype),
    ``rows`` (one per case: shapes, FLOPs, seconds and quartiles, TFLOP/s and fraction of the matmul rate for each
    contender, ``triton_speed_vs_flash_backend`` and ``triton_speed_vs_naive`` as medians of per-repeat ratios,
    ``notes`` for contenders that were skipped or could not run), ``targets`` and ``summary``.

    Book: part II, "From the recurrence to a kernel".
    """
    config = config or BenchConfig()
    device = torch.device(device)
    dtypes = [getattr(torch, name) for name in config.dtypes]
    peak_rate = matmul_rate(device, dtypes[0], config.matmul_size)
    rows = []
    for dtype in dtypes:
        for head_dim in config.head_dims:
            for seq_len in config.seq_lens:
                for is_causal in config.causal:
                    for pass_name in config.passes:
                        row = _one_row(config, device, dtype, seq_len, head_dim, is_causal, pass_name, peak_rate)
                        rows.append(row)
                        if progress:
                            print(f"{row['dtype']} L={seq_len} d={head_dim} causal={is_causal} {pass_name}: "
                                  f"triton {row['triton_tflops'] or float('nan'):.1f} TFLOP/s, "
                                  f"x{row['triton_speed_vs_flash_backend'] or float('nan'):.2f} of flash",
                                  file=sys.stderr, flush=True)
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
    return {"device": _device_info(device), "config": dataclasses.asdict(config),
            "matmul_rate_flops": peak_rate, "matmul_dtype": config.dtypes[0], "rows": rows, "targets": TARGETS,
            "summary": _summary(rows)}


def main(argv=None) -> dict:
    """``python -m mha.kernels.benchmark [--out FILE] [--quick]``: the default configuration on CUDA."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the JSON result here")
    parser.add_argument("--quick", action="store_true", help="L in (512, 4096), head_dim 64, 5 repeats")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the kernel benchmark needs a CUDA GPU (on the CPU, Triton only interprets: see "
                         "tests/test_kernels.py for the smoke run)")
    config = BenchConfig(seq_lens=(512, 4096), head_dims=(64,), repeats=5) if args.quick else BenchConfig()
    result = run_benchmark("cuda", config, progress=True)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        print(text)
    return result


if __name__ == "__main__":
    main()
