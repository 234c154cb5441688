"""Rerun committed runs and say how far their numbers moved: reproducibility measured, not assumed.

Book: part III (the reproducibility section of each chapter, and the claims appendix).

Usage::

    python -m mha.experiments.reproduce [SWEEP ...] [--runs RUN_ID ...] [--per-sweep K] [--out DIR]
                                        [--executor notebook|function] [--against DIR] [--env NAME=VALUE ...]

For each sweep (default: every sweep with committed results) it reruns the runs named by ``--runs``, or the first
``--per-sweep`` finished ones, into ``DIR/<sweep>/`` with the sweep's own settings (``python -m mha.sweep ...
--only``), then compares every metric the two rows share with the committed row (or with the row of the same run in
``--against DIR/<sweep>/results.csv``). Timings and the machine's description are reported, not compared. The report
(``DIR/report.json``, and a table on stdout) gives, per run and metric, both values and the relative difference, and
per sweep whether every compared number was identical. ``--env`` sets environment variables for the reruns, e.g.
``ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41``: the same machine on the
code paths of a CPU without AVX2 (torch's, MKL's and oneDNN's kernels then add in another order).

Runs are deterministic on one CPU model with one thread count and one torch build; on another CPU (or another
library build) floating-point reductions can take another order, and a training run can move, a little or, near a
plateau, qualitatively. This command measures how much.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from mha._checks import check_choice, check_int
from mha.experiments.io import save_json
from mha.experiments.results import Results, experiments_dir, load, sweep_names

__all__ = ["NOT_COMPARED", "ENVIRONMENT", "compare_rows", "reproduce", "main"]

ENVIRONMENT = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS")
"""Environment variables that change which kernels run; the report records those that were set."""

NOT_COMPARED = {
    "run_id", "sweep", "status", "error", "git_commit", "checksum",  # bookkeeping
    "tokens_per_s", "wall_s", "train_wall_s", "total_wall_s", "analysis_s", "decode_s_per_token",
    "load_average_1min", "cpu_count",  # timings and load
    "device", "device_name", "cpu_model", "cpu_id", "cpu_capability", "num_threads", "threads", "torch_version",
    "python_version",  # the machine
    "progress",
}
"""Columns reported but never compared: they describe when, where and how fast a run ran, not what it computed."""


def _number(text: str):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def compare_rows(reference: dict, rerun: dict) -> list[dict]:
    """Per shared column (outside :data:`NOT_COMPARED`): the two values, whether they are identical, and for numbers
    the absolute and relative difference."""
    out = []
    for key in reference:
        if key in NOT_COMPARED or key not in rerun:
            continue
        a, b = reference[key], rerun[key]
        entry = dict(metric=key, reference=a, rerun=b, identical=a == b)
        x, y = _number(a), _number(b)
        if x is not None and y is not None and math.isfinite(x) and math.isfinite(y):
            entry["abs_diff"] = abs(x - y)
            entry["rel_diff"] = abs(x - y) / max(abs(x), 1e-300) if x != y else 0.0
            entry["identical"] = x == y  # "1.0" and "1" are the same number
        out.append(entry)
    return out


def _rows(path: Path) -> dict:
    """The rows of a results.csv by run_id; a row that does not parse (cut short, edited) is refused."""
    rows, bad = Results(path, path.parent / "runs" / ".lock").read_checked()
    if bad:
        raise ValueError(f"{path}, line {bad[0].line} (run {bad[0].run_id}): {bad[0].reason}")
    return {row["run_id"]: row for row in rows}


def reproduce(sweeps=None, runs=None, per_sweep: int = 1, out="_build/reproduce", executor: str = "notebook",
              against=None, progress: bool = True) -> dict:
    """Rerun and compare (see the module docstring); returns the report (also written to ``out/report.json``)."""
    from mha.experiments.sweep import run_sweep

    check_int("per_sweep", per_sweep)
    check_choice("executor", executor, ("notebook", "function"))
    out = Path(out)
    names = list(sweeps) if sweeps else [n for n, path in sweep_names().items()
                                         if (path.parent / n / "results.csv").is_file()]
    environment = {k: os.environ[k] for k in ENVIRONMENT if k in os.environ}
    report = dict(sweeps={}, executor=executor, against=str(against) if against else "committed results",
                  environment=environment)
    for name in names:
        committed = load(name)
        reference_rows = _rows(Path(against) / name / "results.csv") if against else _rows(committed.csv_path)
        ok = [rid for rid, row in reference_rows.items() if row["status"] == "ok"]
        wanted = [rid for rid in (runs or []) if rid in reference_rows] if runs else ok[:per_sweep]
        if not wanted:
            continue
        rerun_rows = {row["run_id"]: row for row in run_sweep(committed.sweep_file, out=out / name, only=wanted,
                                                               executor=executor, progress=progress)}
        entries = []
        for rid in wanted:
            rerun = rerun_rows.get(rid, {})
            comparison = compare_rows(reference_rows[rid], rerun) if rerun.get("status") == "ok" else []
            entries.append(dict(run_id=rid, status=rerun.get("status", "missing"), error=rerun.get("error", ""),
                                machine_reference=reference_rows[rid].get("device_name", ""),
                                machine_rerun=rerun.get("device_name", ""),
                                identical=bool(comparison) and all(c["identical"] for c in comparison),
                                max_rel_diff=max((c.get("rel_diff", 0.0) for c in comparison), default=None),
                                metrics=comparison))
        report["sweeps"][name] = entries
    save_json(report, out / "report.json")
    return report


def _print(report: dict) -> None:
    for name, entries in report["sweeps"].items():
        for entry in entries:
            verdict = "identical" if entry["identical"] else f"max relative difference {entry['max_rel_diff']:.3g}" \
                if entry["max_rel_diff"] is not None else entry["status"]
            print(f"{name:40s} {entry['run_id']}  {verdict}   ({entry['machine_reference'] or '?'} -> "
                  f"{entry['machine_rerun']})")
            for metric in entry["metrics"]:
                if not metric["identical"] and metric["metric"] in ("val_loss", "val_acc", "train_loss",
                                                                     "val_loss_final", "loss_repeat"):
                    print(f"    {metric['metric']}: {metric['reference']} -> {metric['rerun']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mha.experiments.reproduce", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="*", help="sweep names (default: every sweep with committed results)")
    parser.add_argument("--runs", nargs="+", metavar="RUN_ID", help="the runs to redo (default: --per-sweep of each)")
    parser.add_argument("--per-sweep", type=int, default=1, help="finished runs to redo per sweep (default 1)")
    parser.add_argument("--out", default="_build/reproduce", help="where the reruns and report.json go")
    parser.add_argument("--executor", choices=("notebook", "function"), default="notebook")
    parser.add_argument("--against", default=None, help="compare with DIR/<sweep>/results.csv instead of the "
                                                        "committed results")
    parser.add_argument("--env", nargs="+", default=[], metavar="NAME=VALUE",
                        help="environment variables for the reruns (read when each run's torch starts)")
    args = parser.parse_args(argv)
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--env takes NAME=VALUE, got {item!r}")
        os.environ[name] = value
    experiments_dir()  # fail early outside a checkout
    report = reproduce(args.sweeps, args.runs, args.per_sweep, args.out, args.executor, args.against)
    _print(report)
    return 0 if all(e["status"] == "ok" for entries in report["sweeps"].values() for e in entries) else 1


if __name__ == "__main__":
    sys.exit(main())
