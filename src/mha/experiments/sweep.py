"""Run a study over a grid of parameters, one row per run in ``results.csv``.

Book: part III (experiments); every chapter's numbers come from a ``results.csv`` written here.

Usage::

    python -m mha.sweep experiments/head_count/head-count.yaml [--out DIR] [--jobs N] [--only RUN_ID ...]
                        [--set KEY=VALUE ...] [--executor notebook|function] [--launcher local|submitit]
                        [--cluster slurm|local|debug] [--dry-run]

``--set steps=100 --set seed=0`` overrides settings for every run (a shortened or partial sweep, e.g. to measure a
GPU's rate): values are YAML scalars checked like the file's own, a grid key keeps the one value given, and the runs
get their own ids and, by default, their own folder (``<the sweep file's folder>/<name>--steps-100_seed-0/``), so they
never mix with the sweep's committed runs (:func:`mha.experiments.sweep_file.parse_overrides`).

This module is the runner and its command line. The sweep file (its keys, its checks, the runs it makes and their
ids) is :mod:`mha.experiments.sweep_file`; the table of results (its columns, the checksum, which rows are trusted)
is :mod:`mha.experiments.results`.

Each run executes, by default (``--executor notebook``), the study's template ``experiments/notebooks/<study>.ipynb``
through papermill with ``overrides`` (the run's settings), ``out_dir`` (where ``metrics.json`` goes) and
``artifacts_dir``; the executed notebook goes to ``DIR/runs/<run_id>.ipynb``. ``--executor function`` calls the
study's function in a fresh process instead, on the configuration made when the file was loaded (no Jupyter needed,
e.g. on a GPU machine without it); both go through :func:`mha.experiments.studies.run_config` and compute the same
numbers. Each run uses ``threads`` CPU threads (default 1: one run per core). Metrics go to
``DIR/runs/<run_id>/metrics.json``, the files the book plots to ``DIR/artifacts/<run_id>/``.

The runner trusts a row only when :func:`mha.experiments.results.plan` does. A row that does not parse (cut short,
edited by hand: its checksum does not match) is reported and its run redone, never carried along. A finished row
whose study or configuration is not what the sweep file and the code give now (another ``study:`` writing to the same
folder, a default changed in the code) stops the sweep before any run starts, with a message that says what changed;
``--rerun-changed`` reruns those runs instead. A rerun skips the runs whose row is trusted and says "ok"; a run that
raises is recorded as "failed" with its error and the sweep goes on. Each row is written as its run finishes
(:meth:`mha.experiments.results.Results.add`: atomically, under a file lock). Killing the runner at any moment
therefore loses no recorded run and never duplicates one (the run in progress is redone), and the processes it
started end with it. One runner works on a sweep's folder at a time: a second one stops at once, naming the first
one's pid.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm  # plain tqdm: tqdm.auto warns inside Jupyter when ipywidgets is missing

from mha._checks import check_bool, check_choice, check_int
from mha.experiments.results import RECORD_COLUMNS, Results, csv_cell, plan
from mha.experiments.sweep_file import (NOTEBOOKS, Run, Sweep, canonical_config, config_difference,
                                        describe_parameters, load_sweep, parse_overrides)

__all__ = ["execute_run", "run_sweep", "output_dir", "device_problems", "main", "EXECUTORS", "ChangedRunsError",
           "SweepBusyError"]

EXECUTORS = ("notebook", "function")


class ChangedRunsError(ValueError):
    """Finished rows of results.csv were made with another study or configuration than the sweep gives now."""


class SweepBusyError(RuntimeError):
    """Another runner is working on the same sweep folder."""


# ------------------------------------------------------------------------------------------------------- one run
def _describe(error: BaseException) -> str:
    """One line for the error column: the notebook's exception (name: value) or this process's."""
    ename, evalue = getattr(error, "ename", None), getattr(error, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(error).__name__}: {error}"
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # ANSI colours of tracebacks
    return " ".join(text.split())[:1000]


@contextlib.contextmanager
def _thread_environment(threads: int):
    """OMP/MKL thread counts for the processes started inside (they inherit this environment); restored after."""
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: str(threads) for name in names})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _die_with_parent(parent_pid: int) -> None:
    """In a worker process: end (SIGKILL) when the process that started it ends, even killed with SIGKILL.

    Linux's ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing. If the parent is already gone, exit now. A kernel that a
    worker starts (papermill) notices its parent's end itself (ipykernel watches its parent's pid).
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def _worker_pool(max_workers: int) -> ProcessPoolExecutor:
    """A pool of fresh (spawned) processes that end with this one."""
    return ProcessPoolExecutor(max_workers=max_workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_die_with_parent, initargs=(os.getpid(),))


def _call_study(study_config, out_dir: str, artifacts_dir: str) -> None:
    """In a fresh process: the study's function, on the configuration the sweep made and checked (torch is imported
    here, after the thread variables are set)."""
    from mha.experiments.studies import run_config

    run_config(study_config, out_dir=out_dir, artifacts_dir=artifacts_dir)


@contextlib.contextmanager
def _private_kernel_sockets():
    """Kernel configuration that talks over Unix sockets in a fresh private folder (removed afterwards).

    With the default TCP transport each kernel manager picks free ports by asking the OS and letting them go;
    two runs started at once in separate processes can pick the same port, and one kernel then fails to start
    ("Address already in use"). Sockets in a folder of its own cannot collide with anyone's.
    """
    from traitlets.config import Config

    with tempfile.TemporaryDirectory(prefix="mha-kernel-") as folder:
        yield Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(folder, "kernel")}})


def execute_run(sweep: Sweep, run: Run, runs_dir: str, executor: str = "notebook", kernel: str = "python3") -> dict:
    """Execute one run; return ``{"status": "ok" | "failed", "error": ..., **scalar metrics}``.

    Never raises for a failure inside the run (or a missing metrics.json): that is a "failed" result. A run reports
    the study and the configuration it used (``metrics.json``'s ``study`` and ``config``); a run that used another
    one than the runner asked for (a stale template, say) is "failed" too.
    """
    runs_dir = Path(runs_dir)
    out_dir = runs_dir / run.run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    artifacts = runs_dir.parent / "artifacts" / run.run_id
    metrics_path = out_dir / "metrics.json"
    metrics_path.unlink(missing_ok=True)  # a file left by an interrupted earlier attempt must not count
    try:
        threads = sweep.threads(run)
        with _thread_environment(threads):
            if executor == "function":
                with _worker_pool(1) as pool:  # a fresh process: torch starts with these threads
                    pool.submit(_call_study, run.study_config, str(out_dir), str(artifacts)).result()
            else:
                import papermill

                if sweep.notebook is None:
                    raise FileNotFoundError(f"no notebook for study {sweep.study!r} (looked for "
                                            f"{NOTEBOOKS / f'{sweep.study}.ipynb'} under the repository root); "
                                            f"run with --executor function")
                parameters = dict(overrides=run.parameters, out_dir=str(out_dir), artifacts_dir=str(artifacts))
                with _private_kernel_sockets() as config:
                    papermill.execute_notebook(
                        str(sweep.notebook), str(runs_dir / f"{run.run_id}.ipynb"), parameters=parameters,
                        kernel_name=kernel, progress_bar=False, cwd=str(sweep.notebook.parent), config=config)
        if not metrics_path.is_file():
            raise FileNotFoundError(f"the run finished but wrote no {metrics_path}")
        metrics = json.loads(metrics_path.read_text())
        used = (metrics.get("study"), metrics.get("config"))
        if used[0] != sweep.study or used[1] is None or canonical_config(used[1]) != canonical_config(run.config):
            raise RuntimeError(f"the run reports study {used[0]!r} with another configuration than the one it "
                               f"was asked to run ({config_difference(used[1], run.config)}); is its "
                               f"template {sweep.notebook} out of date?")
    except Exception as error:  # noqa: BLE001 - any failure of the run is recorded, and the sweep goes on
        return {"status": "failed", "error": _describe(error)}
    scalars = {k: v for k, v in metrics.items()
               if k not in RECORD_COLUMNS and (v is None or isinstance(v, (bool, int, float, str)))}
    return {"status": "ok", "error": "", **scalars}


# ------------------------------------------------------------------------------------------------------ runner
def _submitit_results(runs, call, out, jobs, cluster, timeout_min):
    """Yield (run, result) as submitit jobs finish, at most ``jobs`` in flight."""
    import submitit

    executor = submitit.AutoExecutor(folder=str(out / "submitit"), cluster=cluster)
    executor.update_parameters(timeout_min=timeout_min, cpus_per_task=1, name=f"mha-sweep-{out.name}")
    pending, running = list(runs), {}
    while pending or running:
        while pending and len(running) < jobs:
            run = pending.pop(0)
            running[executor.submit(execute_run, *call(run))] = run
        done = [job for job in running if job.done()]
        for job in done:
            run = running.pop(job)
            try:
                yield run, job.result()
            except Exception as error:  # noqa: BLE001 - the job itself failed (killed, timed out, ...)
                yield run, {"status": "failed", "error": _describe(error)}
        if not done:
            time.sleep(0.5)


def output_dir(sweep: Sweep, out: str | os.PathLike | None = None) -> Path:
    """``out``, or ``<the sweep file's folder>/<name>/``: a chapter's folder holds its sweep files and, beside each,
    the folder of its results."""
    if out is not None:
        return Path(out).resolve()
    return (sweep.path.parent / sweep.name).resolve()


@contextlib.contextmanager
def _one_runner(out: Path):
    """Hold ``out/runs/.runner`` locked while this runner works (the lock ends with the process, however it ends);
    a second runner on the same folder gets SweepBusyError naming the first one's pid."""
    path = out / "runs" / ".runner"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            pid = handle.read().strip() or "unknown"
            raise SweepBusyError(f"another runner is working on this sweep (pid {pid}, results in {out}); wait for it "
                                 f"to finish, or stop it (kill {pid}) and run again") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def device_problems(sweep: Sweep, runs: list[Run]) -> list[str]:
    """Each device the runs ask for that this machine does not have, and why (their setting ``device``)."""
    from mha.experiments.machine import device_problem

    devices = sorted({run.config["device"] for run in runs if "device" in run.config})
    problems = [(device, device_problem(device)) for device in devices]
    return [f"runs ask for device {device!r}, but {problem}" for device, problem in problems if problem]


def _changed_message(sweep: Sweep, csv_path: Path, changed: list, total: int) -> str:
    keys = list(sweep.grid)
    shown = "\n".join(f"  run {run.run_id} ({describe_parameters(run.parameters, keys)}): {difference}"
                      for run, difference in changed[:10])
    more = f"\n  ... and {len(changed) - 10} more" if len(changed) > 10 else ""
    return (f"{sweep.path}: {len(changed)} of {total} finished runs in {csv_path} were made with another study or "
            f"configuration than the one the sweep file and the code give now, so their results do not describe "
            f"these runs:\n{shown}{more}\nRerun them with --rerun-changed (their rows are replaced), or restore the "
            f"sweep file or the code that made them.")


def run_sweep(config_path: str | os.PathLike, out: str | os.PathLike | None = None, jobs: int | None = None,
              launcher: str = "local", cluster: str = "slurm", dry_run: bool = False, kernel: str = "python3",
              timeout_min: int = 60, progress: bool = True, executor: str = "notebook",
              only: list[str] | None = None, rerun_changed: bool = False,
              overrides: dict | None = None) -> list[dict]:
    """Run (or, with ``dry_run``, list) the sweep's unfinished runs; return the sweep's rows of results.csv.

    ``out`` defaults to :func:`output_dir`. ``jobs`` defaults to the sweep file's ``jobs`` (else 1).
    ``launcher="local"`` runs in this process (jobs=1) or in a pool of ``jobs`` processes; ``"submitit"`` submits
    each run as a job through ``submitit.AutoExecutor(folder, cluster=cluster)`` (``cluster``: "slurm", or
    "local"/"debug" to try it on one machine), ``jobs`` at a time, each limited to ``timeout_min`` minutes.
    ``executor``: "notebook" (papermill) or "function" (the study's function in a fresh process). ``only``: run_ids
    to run (others are left as they are). Finished rows whose study or configuration differ from the sweep's now
    raise :class:`ChangedRunsError` before anything runs, unless ``rerun_changed``. Another runner on the same
    folder raises :class:`SweepBusyError`. With ``dry_run`` nothing runs: the rows returned are the planned runs,
    with status "ok" (finished and trusted), "changed" (finished with another configuration; ``reason`` says
    which) or "todo". ``overrides``: settings for every run, as ``--set`` gives them (see
    :func:`mha.experiments.sweep_file.load_sweep`): the runs then have their own ids and default folder.
    """
    sweep = load_sweep(config_path, overrides)
    jobs = sweep.jobs if jobs is None else check_int("jobs", jobs)
    check_choice("launcher", launcher, ("local", "submitit"))
    check_choice("executor", executor, EXECUTORS)
    check_bool("rerun_changed", rerun_changed)
    out = output_dir(sweep, out)
    results = Results(out / "results.csv", out / "runs" / ".lock")
    runs = sweep.runs()
    if only is not None:
        unknown = sorted(set(only) - {run.run_id for run in runs})
        if unknown:
            raise ValueError(f"only: run_ids {unknown} are not runs of {sweep.path.name} (see --dry-run)")
        runs = [run for run in runs if run.run_id in set(only)]
    order = [run.run_id for run in sweep.runs()]

    if dry_run:
        state = plan(sweep, results, runs)
        changed = dict((run.run_id, difference) for run, difference in state["changed"])
        return [{"run_id": run.run_id, "sweep": sweep.name,
                 "status": "ok" if run.run_id in state["finished"] else "changed" if run.run_id in changed else "todo",
                 "reason": changed.get(run.run_id, ""),
                 **{k: csv_cell(v) for k, v in run.parameters.items()}}
                for run in runs]

    with _one_runner(out):
        state = plan(sweep, results, runs)
        for bad in state["bad"]:
            print(f"{results.path}, line {bad.line} (run {bad.run_id or '?'}): not trusted, {bad.reason}; the row "
                  f"is dropped and its run redone", file=sys.stderr)
        if state["changed"] and not rerun_changed:
            raise ChangedRunsError(_changed_message(sweep, results.path, state["changed"],
                                                    len(state["finished"]) + len(state["changed"])))
        todo = [run for run in runs if run.run_id not in state["finished"]]
        problems = device_problems(sweep, todo)
        if problems:  # before any run starts
            raise ValueError(f"{sweep.path}: {'; '.join(problems)}; run this sweep on a machine that has it, or "
                             f"change 'device' in the sweep file")
        if state["bad"]:  # never carried along: the table is written again without them now
            results.drop_bad_rows(order)
        _execute(sweep, todo, results, order, out, jobs, launcher, cluster, kernel, timeout_min, progress, executor)
    wanted = {run.run_id for run in runs}
    return [row for row in results.read() if row["run_id"] in wanted]


def _execute(sweep, todo, results, order, out, jobs, launcher, cluster, kernel, timeout_min, progress, executor):
    """Execute ``todo`` and record each run's row as it finishes."""
    from mha.experiments.machine import git_commit  # imported here (it imports torch): --help stays fast

    commit = git_commit((sweep.notebook or Path(__file__)).parent) or ""  # the code that runs: the notebook's checkout
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)

    def call(run):
        return sweep, run, str(runs_dir), executor, kernel

    bar = tqdm(total=len(todo), desc=f"sweep {sweep.name}", unit="run", disable=not progress)
    counts = {"ok": 0, "failed": 0}

    def record(run, result):
        results.add({"run_id": run.run_id, "sweep": sweep.name, **run.config, **result, "git_commit": commit,
                     "study": sweep.study, "config": canonical_config(run.config)}, order)
        counts[result["status"]] += 1
        bar.set_postfix(counts)
        bar.update()

    try:
        if launcher == "submitit":
            for run, result in _submitit_results(todo, call, out, jobs, cluster, timeout_min):
                record(run, result)
        elif jobs == 1:
            for run in todo:
                record(run, execute_run(*call(run)))
        else:
            pool = _worker_pool(jobs)
            try:
                futures = {pool.submit(execute_run, *call(run)): run for run in todo}
                for future in as_completed(futures):
                    record(futures[future], future.result())
            finally:  # on an interruption, do not start the queued runs
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        bar.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mha.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="sweep file (YAML)")
    parser.add_argument("--out", help="output directory (default: <the sweep file's folder>/<name>/)")
    parser.add_argument("--jobs", type=int, default=None, help="runs in parallel (default: the sweep file's jobs, else 1)")
    parser.add_argument("--only", nargs="+", metavar="RUN_ID", help="run only these runs (see --dry-run)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="override a setting for every run (repeatable; VALUE is a YAML scalar, e.g. --set "
                             "steps=100 --set seed=0); the runs get their own ids and folder <name>--<overrides>")
    parser.add_argument("--executor", choices=EXECUTORS, default="notebook",
                        help="notebook: papermill (default); function: the study's function, no Jupyter needed")
    parser.add_argument("--launcher", choices=("local", "submitit"), default="local")
    parser.add_argument("--cluster", default="slurm", help="submitit cluster: slurm (default), local or debug")
    parser.add_argument("--timeout-min", type=int, default=60, help="submitit: time limit of one run (minutes)")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and whether they are done; run none")
    parser.add_argument("--rerun-changed", action="store_true",
                        help="rerun the finished runs whose recorded study or configuration differ from the sweep's "
                             "now (otherwise the sweep stops and lists them)")
    args = parser.parse_args(argv)
    try:
        overrides = parse_overrides(args.overrides)
    except ValueError as error:
        parser.error(str(error))
    if overrides:  # a bad --set is a message, not a traceback (the sweep file's own errors are reported as before)
        try:
            loaded = load_sweep(args.config, overrides)
        except (TypeError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        for change in loaded.adjusted:
            print(f"note: --set steps={overrides['steps']}: {change}", file=sys.stderr)
    try:
        rows = run_sweep(args.config, out=args.out, jobs=args.jobs, launcher=args.launcher, cluster=args.cluster,
                         dry_run=args.dry_run, timeout_min=args.timeout_min, executor=args.executor, only=args.only,
                         rerun_changed=args.rerun_changed, overrides=overrides)
    except (ChangedRunsError, SweepBusyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        for row in rows:
            params = ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("run_id", "sweep", "status", "reason"))
            reason = f"  [{row['reason']}]" if row["reason"] else ""
            print(f"{row['run_id']}  {row['status']:7}  {params}{reason}")
        planned = load_sweep(args.config, overrides)
        for problem in device_problems(planned, planned.runs()):
            print(f"note: {problem}: a run here would stop before starting")
        todo = sum(r["status"] == "todo" for r in rows)
        changed = sum(r["status"] == "changed" for r in rows)
        print(f"{todo} of {len(rows)} runs to do" + (f"; {changed} finished with another configuration "
                                                     f"(--rerun-changed reruns them)" if changed else ""))
        return 0
    failed = [row for row in rows if row["status"] != "ok"]
    for row in failed:
        print(f"failed {row['run_id']}: {row['error']}", file=sys.stderr)
    out = output_dir(load_sweep(args.config, overrides), args.out)
    print(f"{len(rows) - len(failed)} of {len(rows)} runs ok; results in {out / 'results.csv'}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
