"""Running the benchmark's sections and recording the run: :func:`run` and the command line ``python -m mha.bench``.

What is measured (configuration, probes, contenders, sections) is :mod:`mha.experiments.bench`; the timer is
:mod:`mha.experiments.timing`; the machine's record is :func:`mha.experiments.machine.machine_record`. The JSON
(``schema_version`` 1) holds the machine under ``device`` and, for the readers of the first files, ``torch_version``,
``python_version`` and ``num_threads`` at the top level too; then the date, the git commit and the ``mha`` files that
differed from it, the load average before and after, the configuration, the method and one entry per section.

Book: appendix "Benchmarks" (reads the files in ``experiments/benchmarks/``).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from mha.experiments import bench
from mha.experiments.bench import QUICK, SECTION_FUNCTIONS, SECTIONS, BenchConfig
from mha.experiments.io import save_json
from mha.experiments.machine import git, git_commit, load_average, machine_record, resolve_device

__all__ = ["device_info", "run", "main"]

SCHEMA_VERSION = 1
REPO_ROOT = Path(__file__).resolve().parents[3]
METHOD = ("per point: outputs compared (allclose), warmup untimed calls of each contender, then `repeats` timed pairs "
          "alternating the order (a, b), (b, a), ...; ratio = median over pairs of time(a) / time(b), with its "
          "quartiles; times are seconds per call (medians)")


def device_info(device: torch.device) -> dict:
    """The machine's record (:func:`mha.experiments.machine.machine_record`): type, name (GPU name, or the CPU
    model), slug (for the file name), cpu, cpu_count, versions and, on CUDA, the GPU and CUDA settings."""
    return machine_record(device)


def _dirty_modules() -> list[str] | None:
    """The loaded ``mha`` source files that differ from the commit (the benchmarked code is then not the commit's)."""
    paths = sorted({str(Path(module.__file__).resolve().relative_to(REPO_ROOT)) for name, module in sys.modules.items()
                    if name.split(".")[0] == "mha" and getattr(module, "__file__", None)
                    and Path(module.__file__).resolve().is_relative_to(REPO_ROOT)})
    status = git(REPO_ROOT, "status", "--porcelain", "--", *paths)
    return None if status is None else [line.split(maxsplit=1)[-1] for line in status.splitlines()]


def run(cfg: BenchConfig, sections=SECTIONS, device="auto", progress: bool = True, note: str | None = None,
        quick: bool = False, on_section=None) -> dict:
    """Run the chosen sections and return the JSON-ready results dict (see :mod:`mha.experiments.bench`).

    ``on_section``: called after every section with the results so far (``complete`` False until the last section
    is done), e.g. to write them to disk, so that a run cut short keeps the sections it finished."""
    if on_section is not None and not callable(on_section):
        raise TypeError(f"on_section must be a function of the results so far, or None; got {on_section!r} of type "
                        f"{type(on_section).__name__}")
    unknown = [s for s in sections if s not in SECTION_FUNCTIONS]
    if unknown:
        raise ValueError(f"unknown sections {unknown}; expected some of {list(SECTIONS)}")
    device = resolve_device(device)
    start = time.perf_counter()
    load_start = load_average()
    machine = machine_record(device)
    results = dict(
        schema_version=SCHEMA_VERSION, device=machine, torch_version=machine["torch_version"],
        python_version=machine["python_version"], num_threads=machine["num_threads"],
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        git_commit=git_commit(REPO_ROOT), git_dirty_files=_dirty_modules(),
        quick=quick, note=note, load_average_start=load_start, config=asdict(cfg), method=METHOD, sections={},
        complete=False)
    if device.type != "cuda":
        results["cuda_note"] = ("CPU run: no bfloat16 points and no CUDA SDPA backends; on a CUDA machine the same "
                                "command adds bfloat16 and reports flash / efficient / cudnn / math.")
    for name in sections:
        section_start = time.perf_counter()
        results["sections"][name] = SECTION_FUNCTIONS[name](cfg, device, progress=progress)
        results["sections"][name]["elapsed_s"] = time.perf_counter() - section_start
        if on_section is not None and len(results["sections"]) < len(sections):
            on_section(results)
    results["complete"] = True
    results["load_average_end"] = load_average()
    results["total_s"] = time.perf_counter() - start
    return results


def _parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m mha.bench", description=bench.__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke run: tiny sizes, 2 repeats")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)")
    parser.add_argument("--out", default=None, help="JSON path (default: experiments/benchmarks/<device>.json; "
                                                    "with --quick, _build/bench/<device>-quick.json)")
    parser.add_argument("--repeats", type=int, default=None, help="timed pairs per point")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls per contender before timing")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:1, ...")
    parser.add_argument("--note", default=None, help="a remark stored in the JSON (e.g. 'machine was loaded')")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    return parser.parse_args(argv)


def main(argv=None) -> Path:
    args = _parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    cfg = QUICK if args.quick else BenchConfig()
    overrides = {name: getattr(args, name) for name in ("repeats", "warmup") if getattr(args, name) is not None}
    for name, value in overrides.items():
        if value < 1:
            raise SystemExit(f"--{name} must be >= 1, got {value}")
    cfg = replace(cfg, **overrides)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    slug = machine_record(resolve_device(args.device))["slug"]
    if args.out is not None:
        out = Path(args.out)
    elif args.quick:
        out = REPO_ROOT / "_build" / "bench" / f"{slug}-quick.json"
    else:
        out = REPO_ROOT / "experiments" / "benchmarks" / f"{slug}.json"
    partial = out.with_name(out.stem + ".partial.json")  # the sections so far; never over a complete file

    def save_partial(results):
        save_json(results, partial)

    results = run(cfg, sections=sections, device=args.device, progress=not args.no_progress, note=args.note,
                  quick=args.quick, on_section=save_partial)
    save_json(results, out)
    partial.unlink(missing_ok=True)
    print(f"wrote {out} ({results['total_s']:.1f} s, {results['num_threads']} threads, {results['device']['name']})")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
