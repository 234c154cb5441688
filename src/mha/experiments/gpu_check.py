"""The first command to run on a GPU machine: every CUDA path of the project, run and recorded, in minutes.

Usage (from a checkout, after ``pip install -e ".[test]"`` into an environment that already has a CUDA torch)::

    python -m mha.experiments.gpu_check [--out DIR] [--skip STEP ...]      (make gpu-check)

Steps, each timed and recorded:

1. ``environment``: the machine's record (:func:`mha.experiments.machine.machine_record`: the GPU, its memory, the
   CUDA, cuDNN, torch, Triton and Python versions, the CPU), the same record the benchmarks write.
2. ``tests``: ``pytest -m cuda tests`` — the CUDA tests (float32 and bfloat16 agreement with the float64
   reference, the KV cache with no host synchronisation, the Triton kernel in fp16/bf16 and at large shapes).
3. ``bench``: ``python -m mha.bench`` on CUDA (float32 and bfloat16 points, the SDPA backend that ran, the Triton
   kernel against the flash backend), written to ``experiments/benchmarks/<device>.json``.
4. ``smoke``: the smoke sweep on CUDA through the study functions (no Jupyter needed), into ``DIR/smoke/``.

The report goes to ``DIR/gpu-check.json`` and ``DIR/gpu-check.md`` (default ``DIR``:
``experiments/gpu-check/<device>/``), with the commands to rerun each step. Without a CUDA device it prints one line
saying so and exits with status 2; a failed step makes the exit status 1 (the other steps still run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["STEPS", "main", "run_checks"]

STEPS = ("environment", "tests", "bench", "smoke")
REPO = Path(__file__).resolve().parents[3]


def _run(command: list[str], log: Path) -> dict:
    """Run a command from the repository root, its output to ``log``; return the status, time and last line."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    return dict(command=" ".join(command), status="ok" if proc.returncode == 0 else "failed",
                returncode=proc.returncode, seconds=round(time.perf_counter() - start, 1),
                last_line=lines[-1] if lines else "", log=str(log))


def run_checks(out: Path | None = None, skip=()) -> tuple[dict, int]:
    """Run the steps not in ``skip``; return (report, exit status). Status 2 without CUDA."""
    import torch

    if not torch.cuda.is_available():
        print(f"gpu-check: no CUDA device visible to torch {torch.__version__} (CUDA build: "
              f"{torch.version.cuda or 'none, this is a CPU build'}); run it on a machine with an NVIDIA GPU and a "
              f"CUDA build of torch", file=sys.stderr)
        return {}, 2
    from mha.experiments.machine import machine_record

    environment = machine_record(torch.device("cuda", 0))
    out = Path(out) if out else REPO / "experiments" / "gpu-check" / environment["slug"].removeprefix("cuda-")
    out.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    report = dict(date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), environment=environment, steps={})
    total = time.perf_counter()
    if "tests" not in skip:
        report["steps"]["tests"] = _run([python, "-m", "pytest", "tests", "-m", "cuda", "-q", "-p",
                                         "no:cacheprovider"], out / "tests.log")
    if "bench" not in skip:
        bench_json = REPO / "experiments" / "benchmarks" / f"{environment['slug']}.json"  # as mha.bench names it
        step = _run([python, "-m", "mha.bench", "--device", "cuda", "--no-progress", "--out", str(bench_json)],
                    out / "bench.log")
        step["json"] = str(bench_json.relative_to(REPO))
        if bench_json.is_file():
            step.update(_bench_summary(json.loads(bench_json.read_text())))
        report["steps"]["bench"] = step
    if "smoke" not in skip:
        step = _run([python, "-m", "mha.sweep", "experiments/smoke.yaml", "--executor", "function", "--out",
                     str(out / "smoke")], out / "smoke.log")
        results = out / "smoke" / "results.csv"
        if results.is_file():
            import csv

            with open(results, newline="") as f:
                rows = list(csv.DictReader(f))
            step["runs"] = [{k: row.get(k) for k in ("run_id", "status", "n_kv_heads", "seed", "val_loss", "device",
                                                     "device_name", "decode_s_per_token")} for row in rows]
        report["steps"]["smoke"] = step
    report["total_seconds"] = round(time.perf_counter() - total, 1)
    (out / "gpu-check.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "gpu-check.md").write_text(_markdown(report))
    failed = [name for name, step in report["steps"].items() if step["status"] != "ok"]
    print(f"gpu-check: {environment['name']}, {len(report['steps']) - len(failed)} of {len(report['steps'])} steps "
          f"ok in {report['total_seconds']:.0f} s; report: {out / 'gpu-check.md'}")
    return report, 1 if failed else 0


def _bench_summary(results: dict) -> dict:
    """What the report quotes from the benchmark JSON: the SDPA backends seen, the ratios against torch, and the
    kernel's targets."""
    attention = results.get("sections", {}).get("attention", {}).get("points", [])
    summary = dict(bench_device=results.get("device", {}).get("name"),
                   sdpa_backends=sorted({p.get("sdpa_backend") or "none" for p in attention}),
                   dtypes=sorted({p["dtype"] for p in attention}),
                   ours_vs_torch_ratio_max=max((p["ratio"] for p in attention), default=None))
    kernels = results.get("sections", {}).get("kernels", {})
    summary["kernels"] = kernels.get("summary", kernels.get("skipped"))
    return summary


def _markdown(report: dict) -> str:
    env = report["environment"]
    cuda = env["cuda"]
    lines = [f"# GPU check: {env['name']}", "",
             f"{report['date']}; {cuda['gpu_count']} x {env['name']} ({cuda['memory_gib']} GiB, compute capability "
             f"{cuda['capability']}); torch {env['torch_version']}, CUDA {cuda['cuda_version']}, cuDNN "
             f"{cuda['cudnn_version']}, Triton {env['triton_version']}, Python {env['python_version']}; CPU "
             f"{env['cpu']}, {env['cpu_count']} logical CPUs. Total {report['total_seconds']:.0f} s.", "",
             "| step | status | seconds | last line | command |", "|---|---|---|---|---|"]
    for name, step in report["steps"].items():
        lines.append(f"| {name} | {step['status']} | {step['seconds']:.0f} | {step['last_line'][:80]} | "
                     f"`{step['command']}` |")
    bench = report["steps"].get("bench", {})
    if "sdpa_backends" in bench:
        lines += ["", f"Benchmark: SDPA backends {', '.join(bench['sdpa_backends'])}; dtypes "
                      f"{', '.join(bench['dtypes'])}; largest time ratio ours / torch.nn.MultiheadAttention "
                      f"{bench['ours_vs_torch_ratio_max']}; kernel: {bench['kernels']}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mha.experiments.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="report folder (default experiments/gpu-check/<gpu>/)")
    parser.add_argument("--skip", nargs="+", default=[], choices=STEPS[1:], help="steps to leave out")
    args = parser.parse_args(argv)
    return run_checks(args.out, args.skip)[1]


if __name__ == "__main__":
    sys.exit(main())
