"""The GPU program as a queue of pieces that each fit one short GPU slot, and the record of what ran on which GPU.

Book: part III (the ``*-gpu.yaml`` sweeps of its chapters, and the nanoGPT comparison), the appendix "Benchmarks".

A GPU is often lent for a short, metered slot (15 minutes, start included; at most 10 minutes a command; no
network). ``experiments/gpu/queue.yaml`` cuts the GPU program into pieces, each sized from rates measured on the GPU
(the 100-step calibration runs of 2026-11-27 on an H100, ``experiments/gpu/2026-11-27-nvidia-h100/``) to fit in
what one slot leaves after the CUDA tests (``slot_s - fixed_s``). A piece is a list of steps:

* ``sweep: FILE`` runs ``python -m mha.sweep FILE --executor function``, optionally on some grid points only
  (``select: {seed: [0]}``, passed as ``--only RUN_ID ...``: the runs keep the full sweep's ids and land in its
  results folder, so the pieces of one sweep add up to the sweep), or with settings overridden (``set: {steps:
  100}``, passed as ``--set``: runs of their own), into the sweep's own folder unless ``out:`` names another;
* ``script: FILE`` runs ``python FILE ARGS...`` (``args``), its results in ``outputs`` (files or folders).

``{gpu}`` in ``out``, ``args`` and ``outputs`` is the GPU's slug (``nvidia-h100-80gb-hbm3``). A piece's
``estimate_s`` is computed from the calibration by :func:`estimate_piece` (tests/test_gpu_run.py checks that the
committed numbers are its numbers, and that each fits a slot); ``cuda: false`` marks a piece that may run without
a GPU (only test queues have such pieces).

``experiments/gpu/record.csv`` records, one row per step or piece and GPU, what ran (``piece``: ``tests``,
``bench``, ``kernels`` or a piece's id; ``gpu``: ``torch.cuda.get_device_name()``; ``status`` ok, cut or failed).
``python -m mha.experiments.gpu_run`` runs what the record does not hold as ok for its GPU yet, and brings back
the rows it adds; ``python -m mha.experiments.gpu_run --collect DIR`` puts them, with the results, into the
checkout. ``python -m mha.experiments.gpu_queue`` lists the queue, its estimates and what ran where.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
import os
import re
import sys
from pathlib import Path

import yaml

__all__ = ["Step", "Piece", "Queue", "load_queue", "read_record", "write_record", "done_on", "RECORD_COLUMNS",
           "STATUSES", "FIXED_STEPS", "QUEUE", "RECORD", "REPO", "gpu_slug", "estimate_piece", "estimate_step",
           "main"]

REPO = Path(__file__).resolve().parents[3]
QUEUE = REPO / "experiments" / "gpu" / "queue.yaml"
RECORD = REPO / "experiments" / "gpu" / "record.csv"
RECORD_COLUMNS = ["piece", "gpu", "date", "status", "seconds", "estimate_s", "git_commit", "note"]
STATUSES = ("ok", "cut", "failed")
FIXED_STEPS = ("tests", "bench", "kernels")  # what gpu_run runs before the queue; recorded like pieces
QUEUE_KEYS = {"slot_s", "fixed_s", "calibration", "pieces"}
PIECE_KEYS = {"id", "about", "estimate_s", "cuda", "steps"}
STEP_KEYS = {"sweep": {"sweep", "select", "set", "out"}, "script": {"script", "args", "outputs"}}
CALIBRATION_KEYS = {"gpu", "folder", "csv", "margin", "sweep_overhead_s", "run_s", "reference_s", "reference_iters"}


def gpu_slug(name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"`` (as :func:`mha.experiments.machine.device_slug`)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# ------------------------------------------------------------------------------------------------------ the queue
@dataclasses.dataclass(frozen=True)
class Step:
    kind: str  # "sweep" or "script"
    path: str  # the sweep file or the script, relative to the repository root
    select: dict = dataclasses.field(default_factory=dict)  # sweep: grid key -> values to run (default: all)
    overrides: dict = dataclasses.field(default_factory=dict)  # sweep: --set settings
    out: str | None = None  # sweep: results folder (default: the sweep's own), may hold {gpu}
    args: tuple = ()  # script: its arguments, may hold {gpu}
    outputs: tuple = ()  # script: the files or folders it writes, may hold {gpu}


@dataclasses.dataclass(frozen=True)
class Piece:
    id: str  # its name in the record
    about: str  # what it runs, in words
    estimate_s: float  # seconds on the calibration GPU, margin included (estimate_piece)
    cuda: bool  # needs CUDA (every piece of the GPU program)
    steps: tuple  # Step, ...


@dataclasses.dataclass(frozen=True)
class Queue:
    path: Path
    slot_s: float  # the budget of one slot's gpu_run
    fixed_s: float  # what a slot spends before its pieces (environment, CUDA tests, packing)
    calibration: dict  # the measured rates the estimates come from (see estimate_piece)
    pieces: tuple  # Piece, ...

    def piece(self, piece_id: str) -> Piece:
        for piece in self.pieces:
            if piece.id == piece_id:
                return piece
        raise ValueError(f"{self.path}: no piece {piece_id!r}; the pieces are {[p.id for p in self.pieces]}")


def _where(path, what: str) -> str:
    return f"{path}: {what}"


def _number(path, name, value, minimum=0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(_where(path, f"{name} must be a number, got {value!r} of type {type(value).__name__}"))
    if value < minimum:
        raise ValueError(_where(path, f"{name} must be >= {minimum:g}, got {value!r}"))
    return float(value)


def _step(path: Path, where: str, spec, root: Path) -> Step:
    if not isinstance(spec, dict):
        raise TypeError(_where(path, f"{where} must be a mapping with 'sweep' or 'script', got {spec!r}"))
    kinds = [kind for kind in STEP_KEYS if kind in spec]
    if len(kinds) != 1:
        raise ValueError(_where(path, f"{where} must have exactly one of 'sweep' or 'script', got keys "
                                      f"{sorted(spec)}"))
    kind = kinds[0]
    unknown = sorted(set(spec) - STEP_KEYS[kind])
    if unknown:
        raise ValueError(_where(path, f"{where}: unknown keys {unknown}; a {kind} step has {sorted(STEP_KEYS[kind])}"))
    target = spec[kind]
    if not isinstance(target, str) or not (root / target).is_file():
        raise ValueError(_where(path, f"{where}: {kind} must name a file of the repository, got {target!r}"))
    if kind == "script":
        args, outputs = spec.get("args", []), spec.get("outputs", [])
        for name, value in (("args", args), ("outputs", outputs)):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise TypeError(_where(path, f"{where}: {name} must be a list of strings, got {value!r}"))
        return Step("script", target, args=tuple(args), outputs=tuple(outputs))
    select, overrides, out = spec.get("select") or {}, spec.get("set") or {}, spec.get("out")
    if not isinstance(select, dict) or not all(isinstance(v, list) and v for v in select.values()):
        raise TypeError(_where(path, f"{where}: select must map grid keys to non-empty lists, got {select!r}"))
    if not isinstance(overrides, dict) or any(isinstance(v, (list, dict)) for v in overrides.values()):
        raise TypeError(_where(path, f"{where}: set must map settings to scalars, got {overrides!r}"))
    if out is not None and not isinstance(out, str):
        raise TypeError(_where(path, f"{where}: out must be a folder relative to the repository, got {out!r}"))
    step = Step("sweep", target, select=dict(select), overrides=dict(overrides), out=out)
    sweep = _load_sweep(root / target, overrides)  # checks the overrides like any setting
    for key, values in select.items():
        if key not in sweep.grid:
            raise ValueError(_where(path, f"{where}: select {key!r} is not a grid key of {target} (its grid: "
                                          f"{sorted(sweep.grid)})"))
        missing = [v for v in values if v not in sweep.grid[key]]
        if missing:
            raise ValueError(_where(path, f"{where}: select {key}={missing} is not in {target}'s grid "
                                          f"{key}={sweep.grid[key]}"))
    return step


def _load_sweep(path: Path, overrides: dict | None = None):
    from mha.experiments.sweep_file import load_sweep

    return load_sweep(path, dict(overrides or {}))


def load_queue(path: str | os.PathLike = QUEUE, root: str | os.PathLike | None = None) -> Queue:
    """Read and check a queue file: its keys, each piece's id (unique: letters, digits, '-', '_'), estimate and steps;
    each sweep step's file loads with its overrides, and its ``select`` names grid values of the sweep. ``root``: the
    repository the paths are relative to (default: the one holding this package)."""
    path = Path(path)
    root = REPO if root is None else Path(root)
    if not path.is_file():
        raise FileNotFoundError(f"queue file {path} does not exist")
    from mha.experiments.sweep_file import _Loader  # the sweep files' reader: 1e-3 is a float, no key twice

    with open(path) as stream:
        try:
            spec = yaml.load(stream, Loader=_Loader)
        except yaml.YAMLError as error:
            raise ValueError(f"{path} is not a valid queue file:\n{error}") from None
    if not isinstance(spec, dict):
        raise ValueError(_where(path, f"a queue file is a mapping with keys {sorted(QUEUE_KEYS)}"))
    unknown = sorted(set(spec) - QUEUE_KEYS)
    if unknown:
        raise ValueError(_where(path, f"unknown keys {unknown}; expected {sorted(QUEUE_KEYS)}"))
    slot_s = _number(path, "slot_s", spec.get("slot_s"), minimum=1)
    fixed_s = _number(path, "fixed_s", spec.get("fixed_s", 0))
    calibration = spec.get("calibration") or {}
    if not isinstance(calibration, dict) or set(calibration) - CALIBRATION_KEYS:
        raise ValueError(_where(path, f"calibration must be a mapping with keys among {sorted(CALIBRATION_KEYS)}"))
    pieces, seen = [], set()
    if not isinstance(spec.get("pieces"), list) or not spec["pieces"]:
        raise ValueError(_where(path, "pieces must be a non-empty list"))
    for number, item in enumerate(spec["pieces"]):
        if not isinstance(item, dict) or set(item) - PIECE_KEYS or "id" not in item or "steps" not in item:
            raise ValueError(_where(path, f"pieces[{number}] must be a mapping with 'id', 'steps' (and 'about', "
                                          f"'estimate_s', 'cuda'), got {item!r}"))
        piece_id = item["id"]
        if not isinstance(piece_id, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", piece_id):
            raise ValueError(_where(path, f"pieces[{number}].id must be letters, digits, '-' and '_', got "
                                          f"{piece_id!r}"))
        if piece_id in seen or piece_id in FIXED_STEPS:
            raise ValueError(_where(path, f"piece id {piece_id!r} is used twice (or is one of {FIXED_STEPS})"))
        seen.add(piece_id)
        cuda = item.get("cuda", True)
        if not isinstance(cuda, bool):
            raise TypeError(_where(path, f"piece {piece_id}: cuda must be true or false, got {cuda!r}"))
        steps = item["steps"]
        if not isinstance(steps, list) or not steps:
            raise ValueError(_where(path, f"piece {piece_id}: steps must be a non-empty list"))
        pieces.append(Piece(piece_id, str(item.get("about", "")).strip(),
                            _number(path, f"piece {piece_id}: estimate_s", item.get("estimate_s", 0)), cuda,
                            tuple(_step(path, f"piece {piece_id}, step {i + 1}", s, root)
                                  for i, s in enumerate(steps))))
    return Queue(path, slot_s, fixed_s, calibration, tuple(pieces))


def run_ids(step: Step, root: str | os.PathLike = REPO) -> list[str] | None:
    """The run ids a sweep step runs (its ``select``), or None for all of them."""
    if step.kind != "sweep" or not step.select:
        return None
    sweep = _load_sweep(Path(root) / step.path, step.overrides)
    return [run.run_id for run in sweep.runs()
            if all(run.parameters.get(key) in values for key, values in step.select.items())]


def step_command(step: Step, python: str, gpu: str, root: str | os.PathLike = REPO) -> list[str]:
    """The command line of a step, run from the repository root (``{gpu}``: the GPU's slug)."""
    if step.kind == "script":
        return [python, step.path, *(arg.replace("{gpu}", gpu) for arg in step.args)]
    from mha.experiments.sweep_file import format_overrides

    command = [python, "-m", "mha.sweep", step.path, "--executor", "function"]
    for item in format_overrides(step.overrides):
        command += ["--set", item]
    ids = run_ids(step, root)
    if ids:
        command += ["--only", *ids]
    if step.out:
        command += ["--out", step.out.replace("{gpu}", gpu)]
    return command


def step_outputs(step: Step, gpu: str, root: str | os.PathLike = REPO) -> list[Path]:
    """The files and folders a step writes its results to (relative to the repository root)."""
    if step.kind == "script":
        return [Path(output.replace("{gpu}", gpu)) for output in step.outputs]
    if step.out:
        return [Path(step.out.replace("{gpu}", gpu))]
    from mha.experiments.sweep import output_dir

    sweep = _load_sweep(Path(root) / step.path, step.overrides)
    return [output_dir(sweep).relative_to(Path(root).resolve())]


# ------------------------------------------------------------------------------------------------------ the record
def read_record(path: str | os.PathLike = RECORD) -> list[dict]:
    """The record's rows (dicts of strings, in file order); [] when the file does not exist. A row without a known
    status or a piece raises ValueError naming its line."""
    path = Path(path)
    if not path.is_file():
        return []
    with open(path, newline="") as stream:
        reader = csv.DictReader(stream)
        if reader.fieldnames is None:
            return []
        missing = [c for c in ("piece", "gpu", "status") if c not in reader.fieldnames]
        if missing:
            raise ValueError(f"{path}: the header lacks {missing}; expected {RECORD_COLUMNS}")
        rows = []
        for row in reader:
            if not row.get("piece") or row.get("status") not in STATUSES:
                raise ValueError(f"{path}, line {reader.line_num}: a row needs a piece and a status among "
                                 f"{STATUSES}, got {dict(row)}")
            rows.append({column: row.get(column) or "" for column in RECORD_COLUMNS})
        return rows


def write_record(rows: list[dict], path: str | os.PathLike = RECORD) -> Path:
    """Write the whole record (atomically: a temporary file, then ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(partial, "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=RECORD_COLUMNS, restval="", extrasaction="raise",
                                lineterminator="\n")  # a text file people read and diff: no CRLF
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
    os.replace(partial, path)
    return path


def done_on(rows: list[dict], gpu: str) -> dict[str, dict]:
    """``{piece: its latest ok row}`` for the pieces (and fixed steps) recorded as ok on ``gpu``."""
    return {row["piece"]: row for row in rows if row["gpu"] == gpu and row["status"] == "ok"}


# ------------------------------------------------------------------------------------------------------ estimates
_TASKS = {}  # (study, task, its arguments but the seed) -> a task: its sizes are all the estimates need


def _task(config):
    kwargs = {k: v for k, v in config.task_kwargs_with_seed().items() if k != "seed"}
    key = (config.study, config.task, json.dumps(kwargs, sort_keys=True, default=str))
    if key not in _TASKS:
        _TASKS[key] = config.make_task()
    return _TASKS[key]


def _shape(config) -> dict:
    """What the estimate needs from a run's configuration: its model (for the FLOPs), steps, evaluations, batch."""
    task = _task(config)
    model = config.model_config(task)
    train = config.train
    return dict(model=model, steps=train.steps, eval_interval=train.eval_interval, eval_batches=train.eval_batches,
                tokens_per_step=train.batch_size * task.block_size, heads=model.n_layers * model.n_heads)


def flops_per_token(model) -> float:
    """Training FLOPs per token of a :class:`~mha.experiments.model.TinyTransformer` (3 x the forward: attention by
    :func:`mha.counting.flops` over the whole context, the MLP, the output head); the estimates use ratios of it."""
    from mha import counting

    length = model.block_size
    attention = counting.flops(1, length, length, model.d_model, model.n_heads, model.n_kv_heads,
                               model.head_dim)["total"] / length
    mlp = 0 if model.attention_only else 4 * model.d_model * model.mlp_ratio * model.d_model
    return 3.0 * (model.n_layers * (attention + mlp) + 2 * model.d_model * model.vocab_size)


def _evaluations(steps: int, interval: int) -> int:
    return steps // interval + (1 if steps % interval else 0)  # every interval steps, and after the last


@functools.lru_cache(maxsize=None)
def _calibration_rows(csv_path: str) -> dict:
    with open(csv_path, newline="") as stream:
        return {row["sweep"]: row for row in csv.DictReader(stream)}


def _calibrated(queue: Queue, sweep_name: str, root: Path) -> dict:
    """The calibration run of a sweep: its configuration, seconds per step, the rest of its run, its analysis."""
    from mha.experiments.studies import make_config

    cal = queue.calibration
    rows = _calibration_rows(str(root / cal["csv"]))
    key = f"{sweep_name}-cal"
    if key not in rows or sweep_name not in cal.get("run_s", {}):
        raise ValueError(f"{queue.path}: no calibration of sweep {sweep_name!r} (a row {key!r} in {cal['csv']} and "
                         f"calibration.run_s.{sweep_name}); run the calibration piece on the GPU first")
    row = rows[key]
    config = make_config(row["study"], json.loads(row["config"]))
    shape = _shape(config)
    step_s = shape["tokens_per_step"] / float(row["tokens_per_s"])
    analysis_s = float(row["analysis_s"]) if row.get("analysis_s") else 0.0
    run_s = float(cal["run_s"][sweep_name])
    return dict(shape=shape, step_s=step_s, analysis_s=analysis_s,
                rest_s=run_s - shape["steps"] * step_s - analysis_s)


def estimate_run(run_config, calibrated: dict) -> float:
    """Seconds of one run of a sweep on the calibration GPU (no margin): the calibration run's time with its steps
    and evaluations scaled to this run's, all multiplied by this run's FLOPs per token over the calibration run's
    (at least 1); the heads study's analysis scales with the number of heads instead.

    Per run: ``f * (rest + steps * step_s + (evals - evals_cal) * eval_batches * step_s / 2) + analysis``, where
    ``step_s`` is the calibration run's seconds per step (its tokens per step over its tokens/s, the first step's
    warm-up included), an evaluation batch costs half a step (a forward pass), and ``rest`` is the calibration
    run's seconds less its steps and analysis (the process, the model, its evaluations, decoding, sampling)."""
    shape, cal = _shape(run_config), calibrated["shape"]
    factor = max(1.0, flops_per_token(shape["model"]) / flops_per_token(cal["model"]))
    extra_evals = max(0, _evaluations(shape["steps"], shape["eval_interval"])
                      - _evaluations(cal["steps"], cal["eval_interval"]))
    training = (calibrated["rest_s"] + shape["steps"] * calibrated["step_s"]
                + extra_evals * shape["eval_batches"] * calibrated["step_s"] / 2)
    analysis = calibrated["analysis_s"] * shape["heads"] / cal["heads"]
    return factor * training + analysis


def _reference_estimate(queue: Queue, step: Step, root: Path) -> float:
    """nanogpt_reference.py: per seed its iterations at the nanoGPT sweep's calibrated seconds per step, its
    evaluations (2 splits x eval_iters batches every eval_interval and after the last iteration, then 2 x
    final_eval_iters) at half a step per batch; plus the command's fixed cost, measured by its 100-iteration
    calibration (``calibration.reference_s``: 2 evaluations of 2 x 20 batches and 2 x 20 final ones)."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("_nanogpt_reference_for_estimates", root / step.path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--recipe", default="cpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1337])
    parser.add_argument("--max-iters", type=int, default=None)
    known, _ = parser.parse_known_args(list(step.args))
    settings = module.RECIPES[known.recipe][1]
    iters = known.max_iters or settings.max_iters
    step_s = _calibrated(queue, "shakespeare-nanogpt-gpu", root)["step_s"]
    cal_iters = int(queue.calibration["reference_iters"])
    fixed = float(queue.calibration["reference_s"]) - cal_iters * step_s - (2 * 2 * 20 + 2 * 20) * step_s / 2
    evals = _evaluations(iters, settings.eval_interval) + 1  # and at iteration 0
    per_seed = iters * step_s + (evals * 2 * settings.eval_iters + 2 * settings.final_eval_iters) * step_s / 2
    return fixed + len(known.seeds) * per_seed


def estimate_step(queue: Queue, step: Step, root: str | os.PathLike = REPO) -> float:
    """Seconds of one step on the calibration GPU, no margin (:func:`estimate_run` for each run of a sweep step, plus
    ``calibration.sweep_overhead_s`` for the runner itself)."""
    root = Path(root)
    if step.kind == "script":
        if Path(step.path).name != "nanogpt_reference.py":
            raise ValueError(f"{queue.path}: no estimate for script {step.path} (only nanogpt_reference.py)")
        return _reference_estimate(queue, step, root)
    import yaml as _yaml

    name = _yaml.safe_load((root / step.path).read_text())["name"]
    calibrated = _calibrated(queue, name, root)
    sweep = _load_sweep(root / step.path, step.overrides)
    runs = [run for run in sweep.runs()
            if all(run.parameters.get(key) in values for key, values in step.select.items())]
    return float(queue.calibration["sweep_overhead_s"]) + sum(estimate_run(run.study_config, calibrated)
                                                              for run in runs)


def estimate_piece(queue: Queue, piece: Piece, root: str | os.PathLike = REPO) -> int:
    """Seconds of a piece on the calibration GPU: its steps' estimates times ``calibration.margin``, rounded up to
    a multiple of 5 (the number ``estimate_s`` in the queue file must be)."""
    seconds = sum(estimate_step(queue, step, root) for step in piece.steps) * float(queue.calibration["margin"])
    return int(5 * math.ceil(seconds / 5))


# ------------------------------------------------------------------------------------------------------ command line
def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mha.experiments.gpu_queue",
                                     description="The GPU program's pieces, their estimates and what ran where.")
    parser.add_argument("--queue", default=str(QUEUE), help="queue file (default experiments/gpu/queue.yaml)")
    parser.add_argument("--record", default=str(RECORD), help="record file (default experiments/gpu/record.csv)")
    parser.add_argument("--estimate", action="store_true", help="recompute each piece's estimate from the calibration")
    args = parser.parse_args(argv)
    queue = load_queue(args.queue)
    rows = read_record(args.record)
    gpus = sorted({row["gpu"] for row in rows})
    print(f"{queue.path}: {len(queue.pieces)} pieces, slot {queue.slot_s:.0f} s, {queue.fixed_s:.0f} s before the "
          f"queue; estimates on {queue.calibration.get('gpu', '?')}")
    for piece in queue.pieces:
        ran = [f"{row['gpu']} {row['date']} {row['status']}" for row in rows if row["piece"] == piece.id]
        computed = f" (computed now: {estimate_piece(queue, piece)} s)" if args.estimate else ""
        print(f"  {piece.id:32} {piece.estimate_s:5.0f} s{computed}  {'; '.join(ran) or 'not run'}")
    for step in FIXED_STEPS:
        ran = [f"{row['gpu']} {row['date']} {row['status']}" for row in rows if row["piece"] == step]
        print(f"  ({step}){'':{29 - len(step)}}          {'; '.join(ran) or 'not run'}")
    if gpus:
        print(f"GPUs in the record: {', '.join(gpus)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
