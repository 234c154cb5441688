"""Benchmark of the Triton FlashAttention kernel against PyTorch's flash backend and the naive path.

``run_benchmark(device, config)`` times three contenders, forward and forward+backward:

* ``triton``: :func:`mha.kernels.flash_attention` on (N, h, L, d) heads q, k, v;
* ``flash_backend``: ``F.scaled_dot_product_attention`` on the same q, k, v, restricted to
  ``SDPBackend.FLASH_ATTENTION``;
* ``naive``: the package's naive path, ``mha.MultiHeadAttention(impl="naive")``, which materialises the
  (N, h, L, L) scores and weights. It is called as a layer whose residual stream has width ``NAIVE_WIDTH`` (1), so
  that what it adds to the attention core (its four projections, the head split and merge) is a few passes over
  N L h d numbers, small beside the N h L^2 of the matrices it materialises (on a CPU, float32, L = 512, d = 64:
  within the timing noise of the bare core). In float16/bfloat16 it computes the scores and the softmax in float32,
  as the module does.

Method: the project's one timer, :func:`mha.experiments.timing.paired_times` (after warm-up, every repeat times each
contender once in a rotating order, ``torch.cuda.synchronize`` around each timing; ratios are medians of the
per-repeat ratios, with their quartiles). FLOPs: :func:`mha.counting.attention_core_flops` (forward 4 N h L_q L_kv d,
halved when causal with L_q = L_kv; forward+backward 3.5 times the forward). The rate of one large square matrix
product in the benchmark's dtype is measured with the same timer at the start of the run, and every TFLOP/s is also
given as a fraction of it. The machine: :func:`mha.experiments.machine.machine_record`. The result is a
JSON-serialisable dict.

Target from the issue, on one H100: triton at least 0.8x the flash backend's forward and 0.7x its forward+backward
at L >= 4096; ``summary`` says which rows meet it.

On the CPU (under Triton's interpreter) it runs with tiny sizes as a smoke test only; its times mean nothing.
``python -m mha.kernels.benchmark --out results.json`` runs the default configuration on CUDA, writing the file again
after every row (``"complete": false`` until the last), so that a run cut short keeps the rows it finished;
``python -m mha.bench --sections kernels`` runs it as a section of the package's benchmarks.

Book: part II, "From the recurrence to a kernel" (what was not measured there); appendix *Benchmarks*.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from mha import counting
from mha.attention import MultiHeadAttention
from mha.experiments.io import save_json
from mha.experiments.machine import machine_record, synchronize
from mha.experiments.timing import TimingConfig, paired_times, ratio_summary, summary
from mha.kernels.flash import flash_attention, is_interpreted

__all__ = ["KernelBenchConfig", "BenchConfig", "QUICK", "run_benchmark", "matmul_rate", "main"]

CONTENDERS = ("triton", "flash_backend", "naive")
TARGETS = {"forward": 0.8, "forward+backward": 0.7, "from_seq_len": 4096}
NAIVE_WIDTH = 1  # d_model of the naive contender's layer: its projections cost O(N L h d), not O(N L d_model h d)


@dataclasses.dataclass(frozen=True)
class KernelBenchConfig(TimingConfig):
    """What to time (the timer's ``repeats``, ``warmup`` and ``min_time_s`` are :class:`TimingConfig`'s).

    ``batch=None`` keeps ``tokens`` = batch x L fixed (batch = max(1, tokens // L)); ``n_heads=None`` uses
    ``d_model // head_dim`` heads (the FlashAttention-2 paper's setting: d_model 2048, 16k tokens per batch).
    ``n_kv_heads=None`` is MHA. The naive path is skipped when its score and weight matrices would need more than
    ``naive_max_bytes``."""

    repeats: int = 15
    warmup: int = 3
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
    matmul_size: int = 8192
    naive_max_bytes: int = 16 * 2**30


BenchConfig = KernelBenchConfig  # the earlier name (book: part II, "From the recurrence to a kernel")

QUICK = KernelBenchConfig(seq_lens=(512, 4096), head_dims=(64,), repeats=5, warmup=1)  # --quick; mha.bench --quick


def matmul_rate(device, dtype: torch.dtype, size: int, timing: TimingConfig = TimingConfig()) -> float:
    """FLOP/s of one ``size`` x ``size`` matrix product in ``dtype`` (2 size^3 FLOPs), by the one timer: the median
    over ``timing.repeats`` timings."""
    device = torch.device(device)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    times = paired_times({"matmul": lambda: a @ b}, device=device, **timing.timing_kwargs())["times"]["matmul"]
    return 2.0 * size**3 / summary(times)["median"]


# ------------------------------------------------------------------------------------------------ contenders
def _flash_backend(q, k, v, is_causal: bool, scale: float):
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale,
                                              enable_gqa=k.shape[1] != q.shape[1])


def _core_call(attention, q, k, v, grad_out, is_causal, scale, pass_name):
    """A zero-argument callable running ``attention(q, k, v, is_causal, scale)`` forward (no graph) or forward and
    backward (``autograd.grad``, so gradients are not accumulated from call to call)."""
    if pass_name == "forward":
        def forward():
            with torch.no_grad():
                attention(q, k, v, is_causal, scale)
        return forward

    def forward_backward():
        out = attention(q, k, v, is_causal, scale)
        torch.autograd.grad(out, (q, k, v), grad_out)
    return forward_backward


def _naive_call(n_batch, n_heads, n_kv_heads, seq_len, head_dim, is_causal, pass_name, device, dtype, generator):
    """The naive contender: ``MultiHeadAttention(impl="naive")`` of width ``NAIVE_WIDTH`` (see the module docstring),
    forward (no graph) or forward and backward (the gradient of its input: q, k and v's gradients on the way)."""
    layer = MultiHeadAttention(NAIVE_WIDTH, n_heads, n_kv_heads, head_dim, bias=False, impl="naive")
    layer = layer.to(device=device, dtype=dtype).requires_grad_(False)  # weights are not what is differentiated
    shape = (n_batch, seq_len, NAIVE_WIDTH)
    x = torch.randn(shape, device=device, dtype=dtype, generator=generator).requires_grad_(pass_name != "forward")
    grad_out = torch.randn(shape, device=device, dtype=dtype, generator=generator)
    if pass_name == "forward":
        def forward():
            with torch.no_grad():
                layer(x, is_causal=is_causal, need_weights=False)
        return forward

    def forward_backward():
        out = layer(x, is_causal=is_causal, need_weights=False)[0]  # (N, L, NAIVE_WIDTH)
        torch.autograd.grad(out, (x,), grad_out)
    return forward_backward


def _naive_bytes(n_batch, n_heads, seq_len, dtype, is_causal, pass_name) -> int:
    """About the peak bytes of the naive path's (N, h, L, L) tensors: float32 scores (and their masked copy when
    causal), the float32 softmax and the weights in ``dtype``; twice that with the backward."""
    per_score = 4 + (4 if is_causal else 0) + 4 + dtype.itemsize
    matrices = counting.attention_matrix_bytes(n_batch, seq_len, seq_len, n_heads, per_score)
    return matrices * (1 if pass_name == "forward" else 2)


def _row_shape(cfg: KernelBenchConfig, seq_len: int, head_dim: int) -> tuple[int, int, int]:
    n_batch = cfg.batch if cfg.batch is not None else max(1, cfg.tokens // seq_len)
    n_heads = cfg.n_heads if cfg.n_heads is not None else max(1, cfg.d_model // head_dim)
    n_kv_heads = cfg.n_kv_heads if cfg.n_kv_heads is not None else n_heads
    return n_batch, n_heads, n_kv_heads


# ------------------------------------------------------------------------------------------------ one row
def _one_row(cfg, device, dtype, seq_len, head_dim, is_causal, pass_name, peak_rate) -> dict:
    n_batch, n_heads, n_kv_heads = _row_shape(cfg, seq_len, head_dim)
    generator = torch.Generator(device=device).manual_seed(seq_len * 1000 + head_dim)
    shape_q, shape_kv = (n_batch, n_heads, seq_len, head_dim), (n_batch, n_kv_heads, seq_len, head_dim)
    needs_grad = pass_name != "forward"
    q, k, v = (torch.randn(s, device=device, dtype=dtype, generator=generator).requires_grad_(needs_grad)
               for s in (shape_q, shape_kv, shape_kv))
    grad_out = torch.randn(shape_q, device=device, dtype=dtype, generator=generator)
    scale = 1.0 / math.sqrt(head_dim)
    calls = {name: _core_call(attention, q, k, v, grad_out, is_causal, scale, pass_name)
             for name, attention in (("triton", flash_attention), ("flash_backend", _flash_backend))}
    notes = {}
    naive_bytes = _naive_bytes(n_batch, n_heads, seq_len, dtype, is_causal, pass_name)
    if naive_bytes > cfg.naive_max_bytes:
        notes["naive"] = f"skipped: its score and weight matrices need about {naive_bytes / 2**30:.0f} GiB"
    else:
        calls["naive"] = _naive_call(n_batch, n_heads, n_kv_heads, seq_len, head_dim, is_causal, pass_name, device,
                                     dtype, generator)
    fns = {}
    for name, fn in calls.items():  # drop a contender that cannot run here (no flash backend, out of memory)
        try:
            fn()
            synchronize(device)
            fns[name] = fn
        except (RuntimeError, torch.cuda.OutOfMemoryError) as err:
            notes[name] = f"could not run: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    times = paired_times(fns, device=device, **cfg.timing_kwargs())["times"] if fns else {}
    flops = counting.attention_core_flops(n_batch, seq_len, seq_len, n_heads, head_dim, is_causal=is_causal,
                                          backward=pass_name != "forward")
    row = {"dtype": str(dtype).removeprefix("torch."), "seq_len": seq_len, "head_dim": head_dim, "causal": is_causal,
           "pass": pass_name, "batch": n_batch, "n_heads": n_heads, "n_kv_heads": n_kv_heads, "flops": flops,
           "notes": notes}
    for name in CONTENDERS:
        stats = summary(times[name]) if name in times else None
        seconds = stats["median"] if stats else None
        row[f"{name}_s"] = seconds
        row[f"{name}_q1_s"] = stats["q1"] if stats else None
        row[f"{name}_q3_s"] = stats["q3"] if stats else None
        row[f"{name}_tflops"] = flops / seconds / 1e12 if seconds else None
        row[f"{name}_fraction_of_matmul"] = flops / seconds / peak_rate if seconds else None
    for other in ("flash_backend", "naive"):  # triton's speed relative to the other: > 1 means triton is faster
        if "triton" in times and other in times:
            ratio = ratio_summary(times[other], times["triton"])
            row[f"triton_speed_vs_{other}"], row[f"triton_speed_vs_{other}_iqr"] = ratio["median"], \
                [ratio["q1"], ratio["q3"]]
        else:
            row[f"triton_speed_vs_{other}"], row[f"triton_speed_vs_{other}_iqr"] = None, None
    return row


def _summary(rows: list[dict]) -> dict:
    """Whether triton reaches the issue's targets against the flash backend at L >= 4096, pass by pass."""
    result = {}
    for pass_name in ("forward", "forward+backward"):
        ratios = [r["triton_speed_vs_flash_backend"] for r in rows if r["pass"] == pass_name
                  and r["seq_len"] >= TARGETS["from_seq_len"] and r["triton_speed_vs_flash_backend"] is not None]
        result[pass_name] = {"target": TARGETS[pass_name], "rows": len(ratios),
                             "worst": min(ratios) if ratios else None,
                             "met": bool(ratios) and min(ratios) >= TARGETS[pass_name]}
    return result


def run_benchmark(device="cuda", config: KernelBenchConfig | None = None, progress: bool = False,
                  on_row=None) -> dict:
    """Time triton vs the flash backend vs naive for every (dtype, L, head_dim, causal, pass) of ``config``.

    Returns a JSON-serialisable dict: ``device`` (:func:`mha.experiments.machine.machine_record`, with
    ``interpreted``: whether Triton ran its interpreter), ``config``, ``matmul_rate_flops`` (the measured rate of a
    ``matmul_size`` square product in the first dtype), ``rows`` (one per case: shapes, FLOPs, seconds and
    quartiles, TFLOP/s and fraction of the matmul rate for each contender, ``triton_speed_vs_flash_backend`` and
    ``triton_speed_vs_naive`` as medians of per-repeat ratios, ``notes`` for contenders that were skipped or could
    not run), ``targets``, ``summary`` and ``complete`` (True). ``on_row``: called after every row with the
    result so far (the same dict, ``complete`` False until the last row), e.g. to write it to disk.

    Book: part II, "From the recurrence to a kernel".
    """
    config = config or KernelBenchConfig()
    if on_row is not None and not callable(on_row):
        raise TypeError(f"on_row must be a function of the result so far, or None; got {on_row!r} of type "
                        f"{type(on_row).__name__}")
    device = torch.device(device)
    dtypes = [getattr(torch, name) for name in config.dtypes]
    peak_rate = matmul_rate(device, dtypes[0], config.matmul_size, config)
    machine = machine_record(device) | {"interpreted": is_interpreted()}
    total = len(dtypes) * len(config.head_dims) * len(config.seq_lens) * len(config.causal) * len(config.passes)
    rows = []

    def result() -> dict:
        return {"device": machine, "config": dataclasses.asdict(config), "matmul_rate_flops": peak_rate,
                "matmul_dtype": config.dtypes[0], "rows": list(rows), "targets": TARGETS, "summary": _summary(rows),
                "complete": len(rows) == total}

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
                        if on_row is not None:
                            on_row(result())
    return result()


def main(argv=None) -> dict:
    """``python -m mha.kernels.benchmark [--out FILE] [--quick]``: the default configuration on CUDA; with ``--out``
    the file is written again after every row (``"complete": false`` until the last)."""
    parser = argparse.ArgumentParser(prog="python -m mha.kernels.benchmark", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the JSON result here (default: print it)")
    parser.add_argument("--quick", action="store_true", help="QUICK: L in (512, 4096), head_dim 64, 5 repeats")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the kernel benchmark needs a CUDA GPU (on the CPU, Triton only interprets: see "
                         "tests/test_kernels.py for the smoke run)")
    save = (lambda partial: save_json(partial, args.out)) if args.out else None
    result = run_benchmark("cuda", QUICK if args.quick else KernelBenchConfig(), progress=True, on_row=save)
    if args.out:
        save_json(result, args.out)
    else:
        print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
