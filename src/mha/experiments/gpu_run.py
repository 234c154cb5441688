"""One command for a short GPU slot: every step time-boxed, its results written as it finishes, at most 8 files.

Usage, from the checkout's root (the package need not be installed: ``src`` is put on the path of every step)::

    python -m mha.experiments.gpu_run --prepare                      # once, where there is network: data into .data/
    PYTHONPATH=src python3 -m mha.experiments.gpu_run --budget 480 --out OUT   # on the GPU machine, offline
    python -m mha.experiments.gpu_run --collect OUT                  # back in the checkout: results into place

It needs only what a stock GPU image has (Python >= 3.10, torch, Triton, NumPy, pytest, PyYAML, tqdm): no
Jupyter, nbval, Sphinx, papermill, pooch or platformdirs (the data's checksum is ``hashlib``'s). The steps, in the
order of their value, each given what is left of ``--budget`` less ``--reserve`` (for packing the results):

1. ``environment`` (always): ``env.txt``: the machine's record, ``nvidia-smi``, the installed packages, the code's
   commit, whether Tiny Shakespeare is there.
2. ``tests``: the CUDA tests (``pytest -m cuda`` on the test files that have them): float32/bfloat16 agreement with
   the float64 reference, the KV cache, the Triton kernel compiled. Without CUDA they are collected and skip.
3. ``bench``: ``python -m mha.bench`` on CUDA (float32 and bfloat16, the SDPA backend that ran); the sections are
   kept as they finish. Without CUDA: a quick run of three of its sections on the CPU (tiny sizes; not a benchmark).
4. ``kernels``: the Triton kernel against SDPA's flash backend (``python -m mha.kernels.benchmark``), its rows kept
   as they finish, so a cut run still brings rows back. Needs CUDA.
5. ``queue``: the GPU program's pieces (``experiments/gpu/queue.yaml``, :mod:`mha.experiments.gpu_queue`), in order,
   those not yet recorded as ok for this GPU in ``experiments/gpu/record.csv``, while the budget lasts: a piece
   whose estimate exceeds what is left waits for the next slot (a later, smaller one may run instead).

``bench`` and ``kernels`` too are skipped where the record already holds them for this GPU (``--again bench``
reruns one). ``--skip STEP`` leaves a step out. A step that is cut keeps what it wrote (a sweep's finished runs,
the kernel rows, the benchmark's sections); the next slot goes on from there.

``OUT`` gets four files, rewritten after every step, so a run stopped at any moment leaves the state of its last
finished step: ``summary.md`` (what ran, what was cut or skipped and why, each step's time and command),
``env.txt``, ``record.csv`` (the record's rows this run added) and ``results.tgz`` (every file the run made, by its
path in the checkout: ``experiments/gpu/<date>-<time>-<gpu>/`` with the logs and JSON of this run,
``experiments/benchmarks/cuda-<gpu>.json``, the sweeps' ``results.csv`` and artifacts, ``experiments/gpu/record.csv``).
``--collect OUT`` unpacks it into the checkout, merging the ``results.csv`` tables (by run id) and the record (by
row) with what is there.

Without CUDA it still runs what a CPU can (the tests' collection, the benchmark's code, and any piece marked
``cuda: false``, which only test queues have) and says which steps were skipped and why; exit status 0 unless a step
failed (1). Book: the appendix "Benchmarks", part II "From the recurrence to a kernel", part III.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from mha._checks import check_float
from mha.experiments import gpu_queue
from mha.experiments.gpu_queue import FIXED_STEPS, QUEUE, RECORD, RECORD_COLUMNS, REPO
from mha.experiments.gpu_transfer import DATA_DIR, collect, prepare, write_atomic

__all__ = ["STEPS", "main", "run", "prepare", "collect", "cuda_test_files"]

STEPS = ("tests", "bench", "kernels", "queue")
RESERVE_S = 20.0  # seconds kept back from every step for packing the results
MIN_STEP_S = 10.0  # a step that would get less is not started
BENCH_SECTIONS = "attention,naive,decode,train,gflops"
CPU_BENCH_SECTIONS = "decode,train,gflops"  # without CUDA: a quick check that the benchmark's code runs (seconds)
OUT_FILES = ("summary.md", "env.txt", "record.csv", "results.tgz")


class _Stopped(Exception):
    """SIGTERM or SIGINT reached the run: stop the step, pack, and end."""


@dataclass
class Outcome:
    name: str  # the step (tests, bench, kernels) or "queue: <piece>"
    status: str  # ok, failed, cut, skipped
    seconds: float = 0.0
    detail: str = ""  # one line: the result, or why it was cut or skipped
    commands: list = field(default_factory=list)  # what ran


def _seconds(value: str, minimum_kind: str = "positive") -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {value!r}") from None
    low_ok = seconds > 0 if minimum_kind == "positive" else seconds >= 0
    if not low_ok or seconds != seconds or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a {minimum_kind}, finite number of seconds, got {value!r}")
    return seconds


def _budget(value: str) -> float:
    return _seconds(value)


def _reserve(value: str) -> float:
    return _seconds(value, "non-negative")


def cuda_test_files(root: Path = REPO) -> list[str]:
    """The test files that hold CUDA tests (``pytest.mark.cuda``), relative to ``root``: the tests step collects
    only these (collecting the whole suite would import what a stock GPU image lacks, and takes longer)."""
    files = sorted((root / "tests").rglob("test_*.py"))
    return [str(path.relative_to(root)) for path in files
            if re.search(r"pytest\.mark\.cuda\b", path.read_text(encoding="utf-8"))]


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").replace("\r", "\n").splitlines()
                 if line.strip()]
    except OSError:
        return ""
    return re.sub(r"\x1b\[[0-9;]*m", "", lines[-1])[:200] if lines else ""


class GpuRun:
    """One run: the clock, the work folder, the packing; see :func:`run`."""

    def __init__(self, budget: float, out: Path, reserve: float = RESERVE_S, skip=(), again=(),
                 queue_path: Path = QUEUE, record_path: Path = RECORD, root: Path = REPO, python: str | None = None):
        budget = check_float("budget", budget, minimum=0, min_inclusive=False)
        reserve = check_float("reserve", reserve, minimum=0, maximum=budget, max_inclusive=False)
        for name, given in (("skip", skip), ("again", again)):
            if isinstance(given, str) or not all(isinstance(item, str) for item in given):
                raise TypeError(f"{name} must be a list of step or piece names, got {given!r}")
        unknown = sorted(set(skip) - set(STEPS))
        if unknown:
            raise ValueError(f"skip: {unknown} are not steps; the steps are {list(STEPS)}")
        self.start = time.monotonic()
        self.budget, self.reserve = budget, reserve
        self.out, self.root = Path(out), Path(root)
        self.skip, self.again = set(skip), set(again)
        self.queue_path, self.record_path = Path(queue_path), Path(record_path)
        self.python = python or sys.executable
        self.started_at = datetime.datetime.now(datetime.timezone.utc)
        self.outcomes: list[Outcome] = []
        self.added_rows: list[dict] = []
        self.made: set[Path] = set()  # files and folders of the checkout this run wrote (relative to root)
        self.notes: list[str] = []
        self.child: subprocess.Popen | None = None
        self.env = self._environment()
        self.cuda, self.gpu, self.gpu_slug, self.commit, self.dirty = False, "unknown", "unknown", "", []
        self.work = None

    # ---------------------------------------------------------------------------------------- clock and children
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        """Seconds a step may still use: the budget less what has passed and the reserve for packing."""
        return self.budget - self.elapsed() - self.reserve

    def _environment(self) -> dict:
        env = dict(os.environ)
        src = str(self.root / "src")
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        data_dir = self.root / DATA_DIR.name  # .data/ in the checkout, where --prepare puts the text
        if not env.get("MHA_DATA_DIR") and (data_dir / "tinyshakespeare" / "input.txt").is_file():
            env["MHA_DATA_DIR"] = str(data_dir)
        return env

    def call(self, command: list[str], log: Path, timeout: float) -> tuple[int | None, float]:
        """Run ``command`` from the root, output to ``log``, for at most ``timeout`` seconds; return (exit status,
        seconds), the status None when it was stopped at its time limit (its whole process group is ended)."""
        start = time.monotonic()
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as stream:
            stream.write(f"$ {' '.join(command)}\n")
            stream.flush()
            self.child = subprocess.Popen(command, cwd=self.root, stdout=stream, stderr=subprocess.STDOUT,
                                          env=self.env, start_new_session=True)
            try:
                status = self.child.wait(timeout=max(timeout, 0.1))
            except subprocess.TimeoutExpired:
                self._stop_child()
                stream.write(f"\n[gpu_run: stopped at its time limit of {timeout:.0f} s]\n")
                status = None
            finally:
                self._stop_child()
                self.child = None
        return status, time.monotonic() - start

    def _stop_child(self) -> None:
        """End the running step's process group (its workers too): SIGTERM, then SIGKILL after 5 s."""
        child = self.child
        if child is None:
            return
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(child.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                child.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # workers that outlived the leader (they share its group)
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    # ---------------------------------------------------------------------------------------- folders and packing
    def begin(self, machine: dict | None = None) -> None:
        """Read the machine (``machine``: its record, :func:`mha.experiments.machine.machine_record`, to stand in for
        this one's, as the tests do for a GPU), make the work folder and the out folder."""
        if machine is None:
            import torch

            from mha.experiments.machine import machine_record

            machine = machine_record("cuda" if torch.cuda.is_available() else "cpu")
        self.machine = machine
        self.cuda = machine["type"] == "cuda"
        self.gpu = self.machine["name"]  # the GPU's name, or the CPU's model
        self.gpu_slug = gpu_queue.gpu_slug(self.gpu)
        label = f"{self.started_at:%Y-%m-%d-%H%M}-{self.gpu_slug if self.cuda else 'cpu-' + self.gpu_slug}"
        self.folder = Path("experiments") / "gpu" / label  # this run's logs and JSON, by their checkout path
        self.work = Path(tempfile.mkdtemp(prefix="mha-gpu-run-"))
        (self.work / self.folder).mkdir(parents=True)
        self.out.mkdir(parents=True, exist_ok=True)
        from mha.experiments.machine import git, git_commit

        self.commit = git_commit(self.root) or ""
        status = git(self.root, "status", "--porcelain", "--untracked-files=no")
        self.dirty = [line.split(maxsplit=1)[-1] for line in status.splitlines()] if status else []

    def here(self, name: str) -> Path:
        """A file of this run's folder (in the work folder; packed as experiments/gpu/<run>/<name>)."""
        return self.work / self.folder / name

    def pack(self) -> None:
        """Write OUT's files again: summary.md, env.txt, record.csv and results.tgz (atomically, each)."""
        summary = self.summary()
        self.here("summary.md").write_text(summary)
        write_atomic(self.out / "summary.md", summary.encode())
        if self.here("env.txt").is_file():
            write_atomic(self.out / "env.txt", self.here("env.txt").read_bytes())
        added = io.StringIO()
        writer = csv.DictWriter(added, fieldnames=RECORD_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.added_rows)
        write_atomic(self.out / "record.csv", added.getvalue().encode())
        partial = self.out / ".results.tgz.partial"
        with tarfile.open(partial, "w:gz") as archive:
            archive.add(self.work / self.folder, arcname=str(self.folder))
            for path in sorted(self.made):
                for member in self._members(path):
                    archive.add(self.root / member, arcname=str(member), recursive=False)
        os.replace(partial, self.out / "results.tgz")

    def _members(self, path: Path) -> list[Path]:
        """The files under ``path`` (a file or a folder of the checkout) that this run wrote: modified since it
        started; a sweep's ``runs/`` folder (executed notebooks, metrics already in results.csv) is left out."""
        full = self.root / path
        if full.is_file():
            return [path] if full.stat().st_mtime >= self.started_at.timestamp() - 2 else []
        if not full.is_dir():
            return []
        found = []
        for file in sorted(full.rglob("*")):
            relative = file.relative_to(self.root)
            if not file.is_file() or "runs" in relative.relative_to(path).parts[:1] or file.name.startswith("."):
                continue
            if file.stat().st_mtime >= self.started_at.timestamp() - 2:
                found.append(relative)
        return found

    # ---------------------------------------------------------------------------------------- the record
    def record(self, piece: str, status: str, seconds: float, estimate: float | None, note: str) -> None:
        """Add a row to experiments/gpu/record.csv (in this checkout; packed with the results)."""
        row = dict(piece=piece, gpu=self.gpu, date=f"{self.started_at:%Y-%m-%d}", status=status,
                   seconds=f"{seconds:.0f}", estimate_s="" if estimate is None else f"{estimate:.0f}",
                   git_commit=self.commit, note=note)
        rows = gpu_queue.read_record(self.record_path) + [row]
        gpu_queue.write_record(rows, self.record_path)
        self.added_rows.append(row)
        with contextlib.suppress(ValueError):
            self.made.add(self.record_path.resolve().relative_to(self.root.resolve()))

    def recorded(self, name: str) -> dict | None:
        """The record's ok row of ``name`` for this GPU, unless ``--again`` names it."""
        if name in self.again:
            return None
        try:
            return gpu_queue.done_on(gpu_queue.read_record(self.record_path), self.gpu).get(name)
        except ValueError as error:
            self.notes.append(f"the record {self.record_path} could not be read ({error}); nothing counts as done")
            return None

    # ---------------------------------------------------------------------------------------- the steps
    def environment(self) -> None:
        start = time.monotonic()
        lines = [f"# gpu_run {self.started_at:%Y-%m-%d %H:%M:%S} UTC: {self.gpu}", "",
                 "machine: " + json.dumps(self.machine, indent=1), "",
                 f"code: {self.commit or 'unknown (no git)'}" + (f"; files changed: {', '.join(self.dirty)}"
                                                                 if self.dirty else ""),
                 f"python: {sys.version.split()[0]} ({self.python})", f"data: {self.data_status()}", ""]
        for title, command in (("nvidia-smi", ["nvidia-smi"]),
                               ("packages", [self.python, "-m", "pip", "list", "--format=freeze"])):
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=30)
                text = done.stdout + done.stderr
            except (OSError, subprocess.SubprocessError) as error:
                text = f"({title} did not run: {error})\n"
            lines += [f"## {title}", text.rstrip(), ""]
        self.here("env.txt").write_text("\n".join(lines) + "\n")
        self.outcomes.append(Outcome("environment", "ok", time.monotonic() - start, "env.txt"))

    def data_status(self) -> str:
        """Whether Tiny Shakespeare is where the steps will look (checked by its sha256), in words."""
        from mha.experiments import data

        folder = self.env.get("MHA_DATA_DIR")
        path = data.tinyshakespeare_path(folder)
        if not path.is_file():
            note = (f"Tiny Shakespeare is missing ({path}): the Shakespeare pieces will fail; run "
                    f"python -m mha.experiments.gpu_run --prepare where there is network, and bring .data/ along")
            self.notes.append(note)
            return note
        digest = data.file_sha256(path)
        if digest != data.TINYSHAKESPEARE_SHA256:
            note = f"{path} has the wrong sha256 ({digest}): the Shakespeare pieces will fail"
            self.notes.append(note)
            return note
        return f"Tiny Shakespeare at {path} (sha256 ok)"

    def _skipped(self, name: str) -> bool:
        """True (and recorded) when ``--skip`` names the step."""
        if name in self.skip:
            self.outcomes.append(Outcome(name, "skipped", detail="--skip"))
            return True
        return False

    def _already_done(self, name: str) -> bool:
        """True (and recorded as skipped) when the record holds an ok row of ``name`` for this GPU."""
        done = self.recorded(name)
        if done:
            detail = (f"already recorded for {self.gpu} on {done['date']} ({self.record_path.name}); "
                      f"--again {name} reruns it")
            self.outcomes.append(Outcome(name, "skipped", detail=detail))
        return bool(done)

    def _no_time(self, name: str) -> bool:
        """True (and recorded as cut) when too little of the budget is left to start the step."""
        if self.left() < MIN_STEP_S:
            self.outcomes.append(Outcome(name, "cut", detail=f"no time left ({max(self.left(), 0):.0f} s after the "
                                                             f"reserve)"))
            return True
        return False

    def tests(self) -> None:
        if self._skipped("tests") or self._no_time("tests"):
            return
        files = cuda_test_files(self.root)
        junit = self.here("tests.xml")
        command = [self.python, "-m", "pytest", "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider",
                   f"--junit-xml={junit}", *files]
        status, seconds = self.call(command, self.here("tests.log"), self.left())
        counts = _junit_counts(junit)
        counts = counts or _last_line(self.here("tests.log"))
        if status is None:
            outcome = Outcome("tests", "cut", seconds, f"stopped at its time limit; {counts}")
        elif status in (0, 5):
            detail = counts + ("" if self.cuda else " (no CUDA here: the CUDA tests were collected, and skip)")
            outcome = Outcome("tests", "ok", seconds, detail)
        else:
            outcome = Outcome("tests", "failed", seconds, f"exit {status}: {counts}")
        outcome.commands.append(" ".join(command[1:]).replace(str(self.work), "<run>"))
        self.outcomes.append(outcome)
        if self.cuda:
            self.record("tests", outcome.status, seconds, None, outcome.detail)

    def bench(self) -> None:
        if self._skipped("bench"):
            return
        if (self.cuda and self._already_done("bench")) or self._no_time("bench"):
            return
        if self.cuda:
            out = self.here("bench.json")
            command = [self.python, "-m", "mha.bench", "--device", "cuda", "--sections", BENCH_SECTIONS,
                       "--no-progress", "--out", str(out)]
        else:
            out = self.here("bench-cpu-quick.json")
            command = [self.python, "-m", "mha.bench", "--device", "cpu", "--quick", "--sections",
                       CPU_BENCH_SECTIONS, "--no-progress", "--out", str(out)]
        status, seconds = self.call(command, self.here("bench.log"), self.left())
        partial = out.with_name(out.stem + ".partial.json")
        if status == 0 and out.is_file():
            sections = list(json.loads(out.read_text())["sections"])
            detail = (f"sections {', '.join(sections)}" + ("" if self.cuda else
                      " (no CUDA here: a quick run of the benchmark's code on the CPU, tiny sizes, not a benchmark; "
                      "all its sections in float32 and bfloat16 need CUDA)"))
            outcome = Outcome("bench", "ok", seconds, detail)
        else:
            kept = list(json.loads(partial.read_text())["sections"]) if partial.is_file() else []
            kept_text = f"sections kept: {', '.join(kept) or 'none'}"
            outcome = (Outcome("bench", "cut", seconds, f"stopped at its time limit; {kept_text}") if status is None
                       else Outcome("bench", "failed", seconds, f"exit {status}: {_last_line(self.here('bench.log'))};"
                                                                f" {kept_text}"))
        outcome.commands.append(" ".join(command[1:]).replace(str(self.work), "<run>"))
        self.outcomes.append(outcome)
        if self.cuda:
            self.record("bench", outcome.status, seconds, None, outcome.detail)
            self._benchmark_file()

    def kernels(self) -> None:
        if self._skipped("kernels"):
            return
        if not self.cuda:
            self.outcomes.append(Outcome("kernels", "skipped", detail="needs CUDA: on a CPU Triton only interprets "
                                         "the kernel, and its times mean nothing (tests/test_kernels.py checks its "
                                         "numbers there)"))
            return
        import importlib.util

        if importlib.util.find_spec("triton") is None:
            self.outcomes.append(Outcome("kernels", "skipped", detail="Triton is not installed"))
            return
        if self._already_done("kernels") or self._no_time("kernels"):
            return
        out = self.here("kernels.json")
        command = [self.python, "-m", "mha.kernels.benchmark", "--out", str(out)]
        status, seconds = self.call(command, self.here("kernels.log"), self.left())
        result = json.loads(out.read_text()) if out.is_file() else {}
        rows = len(result.get("rows", []))
        if status == 0 and result.get("complete"):
            summary = result.get("summary", {})
            targets = "; ".join(f"{name} worst x{value['worst']:.2f} of flash (target {value['target']})"
                                for name, value in summary.items() if value.get("worst") is not None)
            outcome = Outcome("kernels", "ok", seconds, f"{rows} rows; {targets}")
        elif status is None:
            outcome = Outcome("kernels", "cut", seconds, f"stopped at its time limit; {rows} rows kept")
        else:
            outcome = Outcome("kernels", "failed", seconds, f"exit {status}: {_last_line(self.here('kernels.log'))};"
                                                            f" {rows} rows kept")
        outcome.commands.append(" ".join(command[1:]).replace(str(self.work), "<run>"))
        self.outcomes.append(outcome)
        self.record("kernels", outcome.status, seconds, None, outcome.detail)
        self._benchmark_file()

    def _benchmark_file(self) -> None:
        """experiments/benchmarks/cuda-<gpu>.json: this run's benchmark sections, and its kernel rows as the kernels
        section; what this run did not measure is kept from the file already there."""
        bench, kernels = self.here("bench.json"), self.here("kernels.json")
        target = self.root / "experiments" / "benchmarks" / f"{self.machine['slug']}.json"
        if bench.is_file():
            result = json.loads(bench.read_text())
            if not kernels.is_file() and target.is_file():
                earlier = json.loads(target.read_text()).get("sections", {}).get("kernels")
                if earlier:
                    result["sections"]["kernels"] = earlier
                    self.notes.append(f"{target.name}: the kernels section is the earlier run's")
        elif kernels.is_file() and target.is_file():
            result = json.loads(target.read_text())
            self.notes.append(f"{target.name}: the benchmark sections are the earlier run's; the kernels section "
                              f"is this run's")
        else:
            return
        if kernels.is_file():
            result["sections"]["kernels"] = json.loads(kernels.read_text())
        from mha.experiments.io import save_json

        save_json(result, target)
        self.made.add(target.relative_to(self.root))

    def queue(self) -> None:
        if "queue" in self.skip:
            self.outcomes.append(Outcome("queue", "skipped", detail="--skip"))
            return
        try:
            queue = gpu_queue.load_queue(self.queue_path, self.root)
            rows = gpu_queue.read_record(self.record_path)
        except (OSError, TypeError, ValueError) as error:
            self.outcomes.append(Outcome("queue", "failed", detail=f"{self.queue_path}: {error}"))
            return
        done = gpu_queue.done_on(rows, self.gpu)
        already = [f"{piece.id} ({done[piece.id]['date']})" for piece in queue.pieces
                   if piece.id in done and piece.id not in self.again]
        if already:
            self.notes.append(f"already run on {self.gpu}: {', '.join(already)}")
        calibrated_on = queue.calibration.get("gpu")
        if self.cuda and calibrated_on and calibrated_on != self.gpu:
            self.notes.append(f"the pieces' estimates are {calibrated_on}'s; on {self.gpu} they may be off (run the "
                              f"calibration piece first)")
        todo = [piece for piece in queue.pieces if piece.id not in done or piece.id in self.again]
        if not self.cuda and any(piece.cuda for piece in todo):
            names = [piece.id for piece in todo if piece.cuda]
            self.outcomes.append(Outcome("queue: GPU pieces", "skipped", detail=f"need CUDA: {len(names)} pieces "
                                                                                f"({', '.join(names)})"))
        for piece in todo:
            name = f"queue: {piece.id}"
            if piece.cuda and not self.cuda:
                continue
            if piece.estimate_s > self.left():
                self.outcomes.append(Outcome(name, "cut", detail=f"needs about {piece.estimate_s:.0f} s, "
                                                                 f"{max(self.left(), 0):.0f} s left: the next slot"))
                continue
            self.piece(piece)
            self.pack()

    def piece(self, piece) -> None:
        name = f"queue: {piece.id}"
        outcome, start = Outcome(name, "ok"), time.monotonic()
        details = []
        log = self.here(f"piece-{piece.id}.log")
        for number, step in enumerate(piece.steps, 1):
            if self.left() < MIN_STEP_S:
                outcome.status = "cut"
                details.append(f"step {number} not started: no time left")
                break
            try:
                command = gpu_queue.step_command(step, self.python, self.gpu_slug, self.root)
                outputs = gpu_queue.step_outputs(step, self.gpu_slug, self.root)
            except (OSError, TypeError, ValueError) as error:
                outcome.status = "failed"
                details.append(f"step {number}: {error}")
                continue
            self.made.update(outputs)
            status, _ = self.call(command, log, self.left())
            outcome.commands.append(" ".join(command[1:]))
            last = _last_line(log).replace(f"{self.root}{os.sep}", "")  # paths in the record: the checkout's
            if status is None:
                outcome.status = "cut"
                details.append(f"step {number} stopped at its time limit (its finished runs are kept)")
                break
            if status != 0:
                outcome.status = "failed"
                details.append(f"step {number} exit {status}: {last}")
            else:
                details.append(last)
        outcome.seconds = time.monotonic() - start
        outcome.detail = f"estimate {piece.estimate_s:.0f} s; " + "; ".join(details)
        self.outcomes.append(outcome)
        self.record(piece.id, outcome.status, outcome.seconds, piece.estimate_s, "; ".join(details)[:500])

    # ---------------------------------------------------------------------------------------- the summary
    def summary(self) -> str:
        used = self.elapsed()
        lines = [f"# GPU run: {self.gpu}", "",
                 f"{self.started_at:%Y-%m-%d %H:%M:%S} UTC. Budget {self.budget:.0f} s ({self.reserve:.0f} s kept for "
                 f"packing); {used:.0f} s used so far. Code {self.commit[:12] or 'unknown'}"
                 + (f", with changes to {', '.join(self.dirty[:8])}" if self.dirty else "") + "."]
        if not self.cuda:
            lines += ["", "**No CUDA device here**: only what a CPU can do ran (the CUDA tests' collection, the "
                          "benchmark's code at tiny sizes, pieces marked `cuda: false`); the table says why each "
                          "GPU step was skipped."]
        lines += ["", "| step | status | seconds | result, or why not |", "|---|---|---|---|"]
        for outcome in self.outcomes:
            detail = outcome.detail.replace("|", "/").replace("\n", " ")
            lines.append(f"| {outcome.name} | {outcome.status} | {outcome.seconds:.0f} | {detail} |")
        waiting = [o.name.removeprefix("queue: ") for o in self.outcomes
                   if o.name.startswith("queue: ") and o.status in ("cut", "failed")]
        if waiting:
            lines += ["", f"Left for the next slot (cut or failed; the record does not hold them as done): "
                          f"{', '.join(waiting)}."]
        if self.notes:
            lines += ["", "Notes:", ""] + [f"- {note}" for note in dict.fromkeys(self.notes)]
        commands = [(o.name, c) for o in self.outcomes for c in o.commands]
        if commands:
            lines += ["", "Commands (from the checkout's root, `src` on PYTHONPATH):", ""]
            lines += [f"- {name}: `python {command}`" for name, command in commands]
        lines += ["", "Files: `results.tgz` holds every file this run made, by its path in the checkout (this run's "
                      f"logs in `{self.folder}/`); `record.csv` the rows it added to `experiments/gpu/record.csv`. "
                      "In the checkout: `python -m mha.experiments.gpu_run --collect <this folder>`."]
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def _junit_counts(path: Path) -> str:
    """"N passed, N failed, N errors, N skipped" from pytest's JUnit XML ("" when there is none)."""
    if not path.is_file():
        return ""
    import xml.etree.ElementTree as ElementTree

    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError:
        return ""
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {key: sum(int(suite.get(key, 0)) for suite in suites) for key in ("tests", "failures", "errors",
                                                                                "skipped")}
    passed = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    return f"{passed} passed, {total['failures']} failed, {total['errors']} errors, {total['skipped']} skipped"


def run(budget: float, out, reserve: float = RESERVE_S, skip=(), again=(), queue_path=QUEUE, record_path=RECORD,
        root=REPO) -> int:
    """The run (see the module's docstring); returns the exit status: 1 if a step failed, else 0."""
    out = Path(out)
    stray = sorted(p.name for p in out.iterdir() if p.name not in OUT_FILES) if out.is_dir() else []
    if stray:
        raise ValueError(f"out: {out} must be empty or hold only a previous run's {', '.join(OUT_FILES)}; it holds "
                         f"{stray[:5]}")
    job = GpuRun(budget, out, reserve, skip, again, Path(queue_path), Path(record_path), Path(root))

    def stop(signum, frame):
        raise _Stopped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        job.begin()
        job.environment()
        job.pack()
        for step in STEPS[:3]:
            getattr(job, step)()
            job.pack()
        job.queue()
    except _Stopped as why:
        job._stop_child()
        job.notes.append(f"stopped by {why} after {job.elapsed():.0f} s; what finished before is here")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if job.work is not None:
            job.pack()
            job.close()
    failed = [o.name for o in job.outcomes if o.status == "failed"]
    print(f"gpu_run: {job.gpu}, {job.elapsed():.0f} s of {budget:.0f}: "
          + ", ".join(f"{o.name} {o.status}" for o in job.outcomes) + f"; see {out / 'summary.md'}")
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mha.experiments.gpu_run",
                                     description=__doc__.split("\n\n")[0],
                                     epilog="Steps: tests, bench, kernels, queue (see the module's docstring).")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--budget", type=_budget, metavar="SECONDS",
                      help="the seconds this command may take, packing included (e.g. 480 for a 15-minute slot)")
    mode.add_argument("--prepare", action="store_true",
                      help="where there is network: put Tiny Shakespeare into .data/ (checked), for the GPU machine")
    mode.add_argument("--collect", metavar="DIR", help="unpack DIR/results.tgz into the checkout (merging tables)")
    parser.add_argument("--out", metavar="DIR", help="with --budget: the folder for the (at most 8) result files")
    parser.add_argument("--skip", nargs="+", default=[], choices=STEPS, metavar="STEP",
                        help=f"steps to leave out: {', '.join(STEPS)}")
    parser.add_argument("--again", nargs="+", default=[], metavar="NAME",
                        help="run these again though the record holds them for this GPU (bench, kernels, a piece)")
    parser.add_argument("--reserve", type=_reserve, default=RESERVE_S, metavar="SECONDS",
                        help=f"seconds kept back for packing the results (default {RESERVE_S:.0f})")
    parser.add_argument("--queue", default=str(QUEUE), help="the queue file (default experiments/gpu/queue.yaml)")
    parser.add_argument("--record", default=str(RECORD), help="the record (default experiments/gpu/record.csv)")
    args = parser.parse_args(argv)
    if args.prepare:
        path = prepare()
        print(f"Tiny Shakespeare is at {path} (sha256 ok). Bring the checkout with its .data/ folder to the GPU "
              f"machine and run, from its root:\n  PYTHONPATH=src python3 -m mha.experiments.gpu_run --budget 480 "
              f"--out OUT")
        return 0
    if args.collect:
        for line in collect(args.collect):
            print(line)
        return 0
    if not args.out:
        parser.error("--budget needs --out DIR (the folder for the result files)")
    if args.reserve >= args.budget:
        parser.error(f"--reserve ({args.reserve:g} s) must be less than --budget ({args.budget:g} s)")
    unknown = sorted(set(args.again) - set(FIXED_STEPS) - _piece_ids(args.queue))
    if unknown:
        parser.error(f"--again {' '.join(unknown)}: not a step ({', '.join(FIXED_STEPS)}) or a piece of "
                     f"{args.queue}")
    try:
        return run(args.budget, args.out, args.reserve, args.skip, args.again, args.queue, args.record)
    except ValueError as error:
        parser.error(str(error))


def _piece_ids(path) -> set:
    try:
        return {piece.id for piece in gpu_queue.load_queue(path).pieces}
    except (OSError, TypeError, ValueError):
        return set()  # the queue step reports the problem


if __name__ == "__main__":
    sys.exit(main())
