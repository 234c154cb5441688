"""The first GPU slot must count (issue 29): ``python -m mha.experiments.gpu_run`` runs offline on a stock GPU image,
time-boxes its steps and brings back at most 8 files; the GPU program is a queue of pieces sized from the rates
measured on the H100 (experiments/gpu/queue.yaml), with a record of what ran where (experiments/gpu/record.csv).

The run's CPU-possible steps are run here in a subprocess in which every package a stock image lacks is hidden
(tests/_stock_image.py): the CUDA tests' collection (the root conftest.py without nbval), the benchmark's code, a
queue piece (a sweep shortened with --set), the summary, the record and the archive."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from mha.experiments import gpu_queue, gpu_run
from mha.experiments.results import Results
from mha.experiments.sweep_file import load_sweep

from _stock_image import MUST_HIDE, stock_env

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("MHA_DATA_DIR") or REPO.parent / "shared" / "data")
HAVE_SHAKESPEARE = (DATA_DIR / "tinyshakespeare" / "input.txt").is_file()
needs_shakespeare = pytest.mark.skipif(not HAVE_SHAKESPEARE, reason=f"no Tiny Shakespeare under {DATA_DIR}")
CALIBRATION = REPO / "experiments" / "gpu" / "2026-11-27-nvidia-h100"


@pytest.fixture(autouse=True)
def _data_dir_the_guard_found(monkeypatch):
    """The loaders read $MHA_DATA_DIR only: point it where needs_shakespeare looked, so a test it lets run finds the
    file there instead of trying to download it."""
    if HAVE_SHAKESPEARE:
        monkeypatch.setenv("MHA_DATA_DIR", str(DATA_DIR))


def _cpu_name() -> str:
    from mha.experiments.machine import machine_record

    return machine_record("cpu")["name"]


# ------------------------------------------------------------------------------------------ the stock image
@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    pytest.importorskip("packaging", reason="packaging reads the installed packages' requirements")
    env = stock_env(tmp_path_factory.mktemp("stock-image"))
    env["MHA_DATA_DIR"] = str(DATA_DIR)
    return env


def test_the_stock_image_hides_what_it_lacks_and_keeps_what_it_has(stock):
    code = ("import importlib, importlib.util, json\n"
            "def importable(name):\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "        return True\n"
            "    except ImportError:\n"
            "        return False\n"
            f"names = {list(MUST_HIDE) + ['torch', 'numpy', 'yaml', 'pytest', 'tqdm', 'mha.experiments.sweep']!r}\n"
            "print(json.dumps({n: [importable(n), importlib.util.find_spec(n) is not None] for n in names}))")
    done = subprocess.run([sys.executable, "-c", code], env=stock, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert {name: found[name] for name in MUST_HIDE} == {name: [False, False] for name in MUST_HIDE}
    assert all(found[name] == [True, True] for name in ("torch", "numpy", "yaml", "pytest", "tqdm",
                                                         "mha.experiments.sweep"))


@needs_shakespeare
def test_gpu_run_runs_its_cpu_steps_on_a_stock_image(stock, tmp_path):
    """Offline, without Jupyter, nbval, Sphinx, papermill, pooch, platformdirs, submitit or hypothesis: the CUDA
    tests are collected (and skip), a queue piece runs a sweep shortened with --set, the GPU-only steps say why they
    were skipped, the benchmark's code runs (quick, on the CPU), a piece too long for the budget is left for later, a
    piece the record holds is not run again; the out folder holds four files, the record gets a row, and the archive
    holds the piece's checked results."""
    cpu = _cpu_name()
    work = f"_build/gpu-run-test/{tmp_path.name}-{os.getpid()}"  # in the checkout (ignored): results are packed by
    queue = tmp_path / "queue.yaml"  # their path in the checkout
    short = {"steps": 2, "seed": 0, "n_kv_heads": 1}
    queue.write_text(yaml.safe_dump({"slot_s": 300, "fixed_s": 60, "pieces": [
        {"id": "done-before", "cuda": False, "estimate_s": 1, "steps": [{"sweep": "experiments/smoke.yaml"}]},
        {"id": "gpu-only", "estimate_s": 10, "steps": [{"sweep": "experiments/smoke.yaml"}]},
        {"id": "too-long", "cuda": False, "estimate_s": 100000, "steps": [{"sweep": "experiments/smoke.yaml"}]},
        {"id": "smoke-short", "cuda": False, "estimate_s": 30,
         "steps": [{"sweep": "experiments/smoke.yaml", "set": short, "out": work + "/{gpu}/smoke"}]}]},
        sort_keys=False))
    record = tmp_path / "record.csv"
    gpu_queue.write_record([dict(piece="done-before", gpu=cpu, date="2026-11-26", status="ok", seconds="1",
                                 estimate_s="1", git_commit="", note="")], record)
    out = tmp_path / "out"
    try:
        done = subprocess.run([sys.executable, "-m", "mha.experiments.gpu_run", "--budget", "400", "--out", str(out),
                               "--queue", str(queue), "--record", str(record)],
                              cwd=REPO, env=stock, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        assert sorted(p.name for p in out.iterdir()) == ["env.txt", "record.csv", "results.tgz", "summary.md"]
        summary = (out / "summary.md").read_text()
        tests = re.search(r"\| tests \| ok \| \d+ \| 0 passed, 0 failed, 0 errors, (\d+) skipped \(no CUDA", summary)
        assert tests and int(tests.group(1)) >= 10, summary  # every CUDA test collected, and skipped
        assert re.search(r"\| bench \| ok \| \d+ \| sections decode, train, gflops \(no CUDA here: a quick run",
                         summary)
        assert re.search(r"\| kernels \| skipped \| 0 \| needs CUDA", summary)
        assert re.search(r"\| queue: GPU pieces \| skipped \| 0 \| need CUDA: 1 pieces \(gpu-only\)", summary)
        assert re.search(r"\| queue: too-long \| cut \| 0 \| needs about 100000 s, \d+ s left", summary)
        assert re.search(r"\| queue: smoke-short \| ok \| \d+ \| estimate 30 s; 1 of 1 runs ok", summary)
        assert "done-before" not in summary.split("Notes:")[0] and "already run on" in summary
        assert "Tiny Shakespeare at" in (out / "env.txt").read_text()
        rows = list(csv.DictReader(io.StringIO((out / "record.csv").read_text())))
        assert [(r["piece"], r["gpu"], r["status"]) for r in rows] == [("smoke-short", cpu, "ok")]
        assert [r["piece"] for r in gpu_queue.read_record(record)] == ["done-before", "smoke-short"]
        with tarfile.open(out / "results.tgz") as archive:
            names = archive.getnames()
            csv_name = f"{work}/{gpu_queue.gpu_slug(cpu)}/smoke/results.csv"
            assert csv_name in names and any(n.endswith("/tests.log") for n in names), names
            (bench,) = [n for n in names if n.endswith("/bench-cpu-quick.json")]
            result = json.load(archive.extractfile(bench))
            assert list(result["sections"]) == ["decode", "train", "gflops"] and result["complete"] is True
            (tmp_path / "unpacked").mkdir()
            archive.extract(csv_name, tmp_path / "unpacked")
        table = Results(tmp_path / "unpacked" / csv_name, tmp_path / "lock")
        got, bad = table.read_checked()
        expected = load_sweep(REPO / "experiments" / "smoke.yaml", short).runs()  # the runs --set makes
        assert not bad and [r["run_id"] for r in got] == [r.run_id for r in expected]
        assert got[0]["status"] == "ok" and got[0]["steps"] == "2" and got[0]["sweep"].startswith("smoke--")
        full = {r.run_id for r in load_sweep(REPO / "experiments" / "smoke.yaml").runs()}
        assert got[0]["run_id"] not in full  # never one of the committed sweep's runs
    finally:
        shutil.rmtree(REPO / work, ignore_errors=True)
        with contextlib.suppress(OSError):
            (REPO / work).parent.rmdir()  # when no other run's folder is in it


# ------------------------------------------------------------------------------------------ time boxes, packing
def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_step_is_stopped_at_its_time_limit_with_everything_it_started(tmp_path):
    job = gpu_run.GpuRun(60, tmp_path / "out")
    log = tmp_path / "step.log"
    code = ("import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "print('grandchild', p.pid, flush=True)\n"
            "time.sleep(120)")
    status, _ = job.call([sys.executable, "-c", code], log, timeout=3)
    assert status is None  # stopped, not finished
    text = log.read_text()
    assert "stopped at its time limit of 3 s" in text
    grandchild = int(re.search(r"grandchild (\d+)", text).group(1))
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)
    status, _ = job.call([sys.executable, "-c", "raise SystemExit(3)"], log, timeout=30)
    assert status == 3


def test_the_out_folder_must_be_empty_or_a_previous_runs(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"out: .* must be empty or hold only a previous run's"):
        gpu_run.run(10, tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("argv, words", [
    (["--budget", "0", "--out", "x"], "must be a positive"),
    (["--budget", "ten", "--out", "x"], "must be a number of seconds"),
    (["--budget", "100"], "--budget needs --out"),
    (["--budget", "100", "--out", "x", "--reserve", "100"], "--reserve .* must be less than --budget"),
    (["--budget", "100", "--out", "x", "--again", "no-such-piece"], "--again no-such-piece: not a step"),
    (["--budget", "100", "--out", "x", "--skip", "everything"], "invalid choice"),
])
def test_bad_command_lines_say_what_is_wrong(argv, words, capsys):
    with pytest.raises(SystemExit) as info:
        gpu_run.main(argv)
    assert info.value.code == 2 and re.search(words, capsys.readouterr().err)


def _results_csv(path: Path, rows: list[dict]) -> bytes:
    table = Results(path, path.parent / ".lock")
    for row in rows:
        table.add(row)
    return path.read_bytes()


def _row(run_id, val_loss):
    return {"run_id": run_id, "sweep": "s", "status": "ok", "error": "", "seed": 0, "val_loss": val_loss}


def _archive(out: Path, files: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "results.tgz", "w:gz") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))


def test_collect_merges_tables_and_the_record_and_refuses_paths_outside(tmp_path):
    root = tmp_path / "checkout"
    local_csv = root / "experiments" / "c" / "s" / "results.csv"
    local_csv.parent.mkdir(parents=True)
    _results_csv(local_csv, [_row("aaaaaaaaaaaa", 1.0), _row("bbbbbbbbbbbb", 2.0)])
    incoming_csv = _results_csv(tmp_path / "in" / "results.csv", [_row("bbbbbbbbbbbb", 2.5), _row("cccccccccccc", 3)])
    old = dict(piece="tests", gpu="G", date="2026-11-27", status="ok", seconds="9", estimate_s="", git_commit="",
               note="")
    new = {**old, "piece": "gqa", "seconds": "300", "estimate_s": "310"}
    gpu_queue.write_record([old], root / "experiments" / "gpu" / "record.csv")
    incoming_record = gpu_queue.write_record([old, new], tmp_path / "in" / "record.csv").read_bytes()
    _archive(tmp_path / "out", {"experiments/c/s/results.csv": incoming_csv,
                                "experiments/gpu/record.csv": incoming_record,
                                "experiments/gpu/2026-11-28-0900-g/summary.md": b"# GPU run\n"})
    lines = gpu_run.collect(tmp_path / "out", root)
    assert lines == ["experiments/c/s/results.csv: 2 rows merged by run id", "experiments/gpu/record.csv: 1 new rows",
                     "experiments/gpu/2026-11-28-0900-g/summary.md"]
    rows, bad = Results(local_csv, tmp_path / ".lock").read_checked()
    assert not bad and [(r["run_id"], r["val_loss"]) for r in rows] == [
        ("aaaaaaaaaaaa", "1.0"), ("bbbbbbbbbbbb", "2.5"), ("cccccccccccc", "3")]  # the incoming row wins
    assert gpu_queue.read_record(root / "experiments" / "gpu" / "record.csv") == [old, new]
    assert b"\r" not in (root / "experiments" / "gpu" / "record.csv").read_bytes()  # LF, as the committed file
    assert (root / "experiments" / "gpu" / "2026-11-28-0900-g" / "summary.md").read_text() == "# GPU run\n"
    _archive(tmp_path / "evil", {"experiments/ok.txt": b"fine", "../outside.txt": b"no"})
    with pytest.raises(ValueError, match="'../outside.txt' is not a plain file or folder inside the checkout"):
        gpu_run.collect(tmp_path / "evil", root)
    assert not (root / "experiments" / "ok.txt").exists() and not (tmp_path / "outside.txt").exists()


# ------------------------------------------------------------------------------------------ the queue and the record
@pytest.fixture(scope="module")
def queue():
    return gpu_queue.load_queue()


def _gpu_sweeps():
    return sorted(REPO.glob("experiments/*/*-gpu.yaml"))


@needs_shakespeare
def test_every_piece_fits_a_slot_at_the_measured_rates(queue):
    """Each committed estimate is the one the calibration gives now (gpu_queue.estimate_piece), and fits what a slot
    leaves after the CUDA tests."""
    assert queue.calibration["gpu"] == "NVIDIA H100 80GB HBM3"
    for piece in queue.pieces:
        assert piece.cuda and piece.estimate_s <= queue.slot_s - queue.fixed_s, piece.id
        assert gpu_queue.estimate_piece(queue, piece) == piece.estimate_s, piece.id


def test_the_pieces_of_each_gpu_sweep_add_up_to_it_once(queue):
    """Every run of every *-gpu.yaml is in exactly one piece that keeps its id (select, no --set)."""
    covered = {}
    for piece in queue.pieces:
        for step in piece.steps:
            if step.kind == "sweep" and not step.overrides:
                ids = gpu_queue.run_ids(step) or [run.run_id for run in load_sweep(REPO / step.path).runs()]
                for run_id in ids:
                    assert run_id not in covered, (run_id, piece.id, covered.get(run_id))
                    covered[run_id] = piece.id
    expected = {run.run_id: path.name for path in _gpu_sweeps() for run in load_sweep(path).runs()}
    missing = sorted({expected[run_id] for run_id in set(expected) - set(covered)})
    assert not missing, (f"runs of {missing} are in no piece of experiments/gpu/queue.yaml: add pieces for them (a "
                         f"new GPU sweep needs a calibration run first: extend the calibration piece)")
    assert len(_gpu_sweeps()) >= 7 and set(covered) == set(expected)
    scripts = [step.args for piece in queue.pieces for step in piece.steps if step.kind == "script"]
    assert ("--recipe", "gpu", "--seeds", "1337") in scripts and ("--recipe", "gpu", "--seeds", "0") in scripts


def test_the_calibration_numbers_are_the_first_runs(queue):
    """calibration.run_s is what the first lease's log says each calibration run took, reference_s the reference's
    command (its summary's marks), and the calibration piece is recorded as run on the H100."""
    log = (CALIBRATION / "calibration.log").read_text()
    measured = {}
    for match in re.finditer(r"sweep (\S+)-cal: 100%\|[^|]*\| 1/1 \[[^,]*,\s*([0-9.]+)s/run, ok=1", log):
        measured[match.group(1)] = float(match.group(2))
    assert queue.calibration["run_s"] == measured
    marks = re.findall(r"^t=(\d+)s (\S+)", (CALIBRATION / "summary.txt").read_text(), re.M)
    names = [name for _, name in marks]
    at = names.index("ref")
    assert queue.calibration["reference_s"] == int(marks[at][0]) - int(marks[at - 1][0])
    with open(REPO / queue.calibration["csv"], newline="") as stream:
        swept = {row["sweep"].removesuffix("-cal") for row in csv.DictReader(stream)}
    assert swept == set(measured) and swept <= {yaml.safe_load(p.read_text())["name"] for p in _gpu_sweeps()}
    done = gpu_queue.done_on(gpu_queue.read_record(), queue.calibration["gpu"])
    assert {"calibration", "tests", "bench", "kernels"} <= set(done)
    assert set(done) <= {p.id for p in queue.pieces} | {"tests", "bench", "kernels"}  # the record names only these


def test_a_piece_step_is_the_command_it_says(queue):
    piece = queue.piece("head-count-seed0")
    (step,) = piece.steps
    command = gpu_queue.step_command(step, "python", "nvidia-h100-80gb-hbm3")
    seed0 = [run.run_id for run in load_sweep(REPO / step.path).runs() if run.parameters["seed"] == 0]
    assert command == ["python", "-m", "mha.sweep", "experiments/head_count/head-count-gpu.yaml", "--executor",
                       "function", "--only", *seed0] and len(seed0) == 3
    assert gpu_queue.step_outputs(step, "g") == [Path("experiments/head_count/head-count-gpu")]
    calibration = queue.piece("calibration").steps
    assert gpu_queue.step_command(calibration[0], "python", "gpu-x")[-6:] == [
        "--set", "n_kv_heads=8", "--set", "seed=0", "--out", "experiments/gpu/calibration/gpu-x/gqa-gpu"]
    assert gpu_queue.step_command(calibration[-1], "python", "gpu-x") == [
        "python", "experiments/shakespeare/nanogpt_reference.py", "--recipe", "gpu", "--max-iters", "100", "--out",
        "experiments/gpu/calibration/gpu-x/nanogpt-reference.json"]


@pytest.mark.parametrize("change, error, words", [
    ({"extra": 1}, ValueError, r"unknown keys \['extra'\]"),
    ({"slot_s": "eight minutes"}, TypeError, "slot_s must be a number"),
    ({"pieces": [{"id": "a", "steps": [{"sweep": "experiments/smoke.yaml", "select": {"seed": [7]}}]}]}, ValueError,
     r"select seed=\[7\] is not in experiments/smoke.yaml's grid"),
    ({"pieces": [{"id": "a", "steps": [{"sweep": "experiments/smoke.yaml", "select": {"lr": [1]}}]}]}, ValueError,
     "select 'lr' is not a grid key"),
    ({"pieces": [{"id": "a", "steps": [{"sweep": "experiments/smoke.yaml", "set": {"stps": 1}}]}]}, ValueError,
     "'stps' is not a setting"),
    ({"pieces": [{"id": "a", "steps": [{"sweep": "experiments/smoke.yaml", "script": "x.py"}]}]}, ValueError,
     "exactly one of 'sweep' or 'script'"),
    ({"pieces": [{"id": "a", "steps": [{"sweep": "experiments/nope.yaml"}]}]}, ValueError,
     "must name a file of the repository"),
    ({"pieces": [{"id": "a", "steps": [{"sweep": "experiments/smoke.yaml"}]},
                 {"id": "a", "steps": [{"sweep": "experiments/smoke.yaml"}]}]}, ValueError, "'a' is used twice"),
    ({"pieces": [{"id": "tests", "steps": [{"sweep": "experiments/smoke.yaml"}]}]}, ValueError, "is used twice"),
    ({"pieces": [{"id": "a", "cuda": "yes", "steps": [{"sweep": "experiments/smoke.yaml"}]}]}, TypeError,
     "cuda must be true or false"),
    ({"pieces": [{"id": "a", "estimate_s": -5, "steps": [{"sweep": "experiments/smoke.yaml"}]}]}, ValueError,
     "estimate_s must be >= 0"),
])
def test_a_bad_queue_file_names_its_problem(tmp_path, change, error, words):
    spec = {"slot_s": 480, "fixed_s": 120, "pieces": [{"id": "a", "steps": [{"sweep": "experiments/smoke.yaml"}]}]}
    path = tmp_path / "queue.yaml"
    path.write_text(yaml.safe_dump({**spec, **change}))
    with pytest.raises(error, match=words):
        gpu_queue.load_queue(path)


def test_a_bad_record_row_names_its_line(tmp_path):
    path = tmp_path / "record.csv"
    path.write_text("piece,gpu,date,status,seconds,estimate_s,git_commit,note\ngqa,G,2026-11-28,done,1,,,\n")
    with pytest.raises(ValueError, match=r"line 2: a row needs a piece and a status among \('ok', 'cut', 'failed'\)"):
        gpu_queue.read_record(path)


@needs_shakespeare
def test_prepare_copies_the_checked_text(tmp_path, monkeypatch):
    monkeypatch.setenv("MHA_DATA_DIR", str(DATA_DIR))
    path = gpu_run.prepare(tmp_path / "data")
    assert path == tmp_path / "data" / "tinyshakespeare" / "input.txt"
    assert path.read_bytes() == (DATA_DIR / "tinyshakespeare" / "input.txt").read_bytes()
    path.write_text("a corrupted copy")
    assert gpu_run.prepare(tmp_path / "data").read_bytes() == (DATA_DIR / "tinyshakespeare" / "input.txt").read_bytes()


def test_the_queue_listing_says_what_ran_where(capsys):
    assert gpu_queue.main([]) == 0
    out = capsys.readouterr().out
    assert re.search(r"calibration +220 s  NVIDIA H100 80GB HBM3 2026-11-27 ok", out)
    done = gpu_queue.done_on(gpu_queue.read_record(), "NVIDIA H100 80GB HBM3")
    queue = gpu_queue.load_queue()
    for piece in queue.pieces:  # each piece says where it ran, or that it has not
        seen = f"{done[piece.id]['gpu']} {done[piece.id]['date']} ok" if piece.id in done else "not run"
        assert re.search(rf"^  {re.escape(piece.id)} +{piece.estimate_s:.0f} s  {re.escape(seen)}", out, re.M), piece.id
    assert "(kernels)" in out


# ------------------------------------------------------------------------------------------ on a GPU (its steps faked)
FAKE_GPU = {"type": "cuda", "name": "Fake GPU 80GB", "slug": "cuda-fake-gpu-80gb"}


def _fake_call(outcomes: dict, root: Path):
    """A stand-in for GpuRun.call in the checkout ``root``: writes what each command would, and returns
    ``outcomes[kind]`` (its exit status, None for 'stopped at its time limit')."""
    calls = []

    def call(command, log, timeout):
        text = " ".join(command)
        kind = ("tests" if " pytest " in text else "kernels" if "mha.kernels.benchmark" in text
                else "bench" if "mha.bench" in text else "sweep" if "mha.sweep" in text else "other")
        calls.append(kind)
        log.parent.mkdir(parents=True, exist_ok=True)
        status = outcomes.get(kind, 0)
        if kind == "tests":
            junit = Path(text.split("--junit-xml=")[1].split()[0])
            junit.write_text('<testsuites><testsuite tests="16" failures="0" errors="0" skipped="1"/></testsuites>')
        elif kind == "bench":
            out = Path(command[command.index("--out") + 1])
            out.write_text(json.dumps({"sections": {"attention": {"points": [1]}}, "complete": True}))
        elif kind == "kernels":
            out = Path(command[command.index("--out") + 1])
            rows = [{"row": i} for i in range(48 if status == 0 else 2)]
            out.write_text(json.dumps({"rows": rows, "complete": status == 0, "summary": {
                "forward": {"target": 0.8, "worst": 1.01}, "forward+backward": {"target": 0.7, "worst": 0.55}}}))
        elif kind == "sweep":
            folder = Path(command[command.index("--out") + 1]) if "--out" in command else None
            log.write_text("1 of 1 runs ok; results in somewhere\n")
            if folder is not None:
                (root / folder).mkdir(parents=True, exist_ok=True)
                (root / folder / "results.csv").write_text("run_id\n")
        return status, 1.0

    return call, calls


def _fake_checkout(tmp_path) -> Path:
    root = tmp_path / "checkout"
    (root / "experiments" / "benchmarks").mkdir(parents=True)
    (root / "experiments" / "smoke.yaml").write_text((REPO / "experiments" / "smoke.yaml").read_text())
    (root / "experiments" / "benchmarks" / "cuda-fake-gpu-80gb.json").write_text(json.dumps(
        {"sections": {"attention": {"points": [0]}, "kernels": {"rows": ["earlier"]}}}))
    (root / "queue.yaml").write_text(yaml.safe_dump({"slot_s": 480, "fixed_s": 120, "pieces": [
        {"id": "piece-a", "estimate_s": 100, "steps": [{"sweep": "experiments/smoke.yaml", "set": {"steps": 2},
                                                        "out": "experiments/gpu/calibration/{gpu}/smoke"}]}]}))
    return root


def _fake_run(root, tmp_path, name, outcomes, again=()):
    job = gpu_run.GpuRun(400, tmp_path / name, again=again, queue_path=root / "queue.yaml",
                         record_path=root / "experiments" / "gpu" / "record.csv", root=root)
    job.call, calls = _fake_call(outcomes, root)
    job.begin(machine=FAKE_GPU)
    try:
        for step in ("tests", "bench", "kernels", "queue"):
            getattr(job, step)()
        job.pack()
    finally:
        job.close()
    return job, calls, {o.name: (o.status, o.detail) for o in job.outcomes}


def test_on_a_gpu_the_steps_record_merge_and_skip_what_ran(tmp_path):
    """With CUDA (faked: each command's output is written by a stand-in), the steps record their rows for the GPU,
    the benchmark file gets this run's sections and its kernel rows (a cut kernel run keeps its rows), the piece's
    results are packed, and the next run skips the benchmark and the piece the record holds (--again reruns one)."""
    root = _fake_checkout(tmp_path)
    job, calls, outcomes = _fake_run(root, tmp_path, "first", {"kernels": None})  # the kernels are cut
    assert calls == ["tests", "bench", "kernels", "sweep"]
    assert outcomes["tests"] == ("ok", "15 passed, 0 failed, 0 errors, 1 skipped")
    assert outcomes["kernels"] == ("cut", "stopped at its time limit; 2 rows kept")
    assert outcomes["queue: piece-a"][0] == "ok"
    record = gpu_queue.read_record(root / "experiments" / "gpu" / "record.csv")
    assert [(r["piece"], r["gpu"], r["status"]) for r in record] == [
        ("tests", "Fake GPU 80GB", "ok"), ("bench", "Fake GPU 80GB", "ok"), ("kernels", "Fake GPU 80GB", "cut"),
        ("piece-a", "Fake GPU 80GB", "ok")]
    benchmark = json.loads((root / "experiments" / "benchmarks" / "cuda-fake-gpu-80gb.json").read_text())
    assert benchmark["sections"]["attention"] == {"points": [1]}  # this run's
    assert len(benchmark["sections"]["kernels"]["rows"]) == 2 and benchmark["sections"]["kernels"]["complete"] is False
    with tarfile.open(tmp_path / "first" / "results.tgz") as archive:
        names = set(archive.getnames())
    assert {"experiments/benchmarks/cuda-fake-gpu-80gb.json", "experiments/gpu/record.csv",
            "experiments/gpu/calibration/fake-gpu-80gb/smoke/results.csv"} <= names
    assert any(n.endswith("/kernels.json") for n in names) and any(n.endswith("/bench.json") for n in names)

    job, calls, outcomes = _fake_run(root, tmp_path, "second", {})  # the record now holds bench and piece-a
    assert calls == ["tests", "kernels"]  # the kernels were cut: run again, now complete
    assert outcomes["bench"][0] == "skipped" and "already recorded for Fake GPU 80GB" in outcomes["bench"][1]
    assert outcomes["kernels"][0] == "ok" and outcomes["kernels"][1].startswith("48 rows; forward worst x1.01")
    assert "queue: piece-a" not in outcomes and any("already run on Fake GPU 80GB: piece-a" in n for n in job.notes)
    benchmark = json.loads((root / "experiments" / "benchmarks" / "cuda-fake-gpu-80gb.json").read_text())
    assert benchmark["sections"]["attention"] == {"points": [1]} and len(benchmark["sections"]["kernels"]["rows"]) == 48

    job, calls, outcomes = _fake_run(root, tmp_path, "third", {}, again=["bench"])
    assert calls == ["tests", "bench"] and outcomes["kernels"][0] == "skipped"
    benchmark = json.loads((root / "experiments" / "benchmarks" / "cuda-fake-gpu-80gb.json").read_text())
    assert len(benchmark["sections"]["kernels"]["rows"]) == 48  # kept from the run before, and said so
    assert any("the kernels section is the earlier run's" in note for note in job.notes)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"budget": 0}, ValueError, r"budget must be a finite real number > 0, got 0"),
    ({"budget": "480"}, TypeError, r"budget must be .* got '480' of type str"),
    ({"budget": 60, "reserve": 60}, ValueError, r"reserve must be a finite real number in \[0, 60\), got 60"),
    ({"budget": 60, "skip": ["bench", "kernel"]}, ValueError, r"skip: \['kernel'\] are not steps"),
    ({"budget": 60, "again": "bench"}, TypeError, "again must be a list of step or piece names, got 'bench'"),
])
def test_a_bad_run_is_refused_before_anything_runs(tmp_path, kwargs, error, words):
    with pytest.raises(error, match=words):
        gpu_run.GpuRun(out=tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()
