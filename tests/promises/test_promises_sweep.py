"""What the sweep runner promises (issue 22, items 1, 2 and 6): it trusts only results it can vouch for."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mha.experiments import config as config_module
from mha.experiments import studies, sweep
from mha.experiments.results import Results, SweepResults, plan, sweep_names
from mha.experiments.sweep import ChangedRunsError, SweepBusyError, run_sweep
from mha.experiments.sweep_file import load_sweep

from _params import fake_runs, write_train_template  # noqa: F401 - fake_runs is a fixture

REPO = Path(__file__).resolve().parents[2]
BASE = {"task": "two_offset", "task_kwargs": {}, "n_heads": 2, "steps": 4, "eval_interval": 2, "eval_batches": 1,
        "batch_size": 4, "warmup_steps": 1}


def write(folder, study="train", base=BASE, grid=None, name="s", text=None):
    path = Path(folder) / f"{name}.yaml"
    if text is not None:
        path.write_text(text)
    else:
        spec = {"name": name, "study": study, "base": base, "grid": grid or {"seed": [0, 1]}}
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# ------------------------------------------------------------------ 1. a row is trusted only for the run it records
def test_another_study_in_the_same_folder_is_not_taken_for_this_one(tmp_path, fake_runs):
    """A sweep whose study changed (same grid, same folder) stops instead of handing back the other study's rows."""
    path = write(tmp_path, "train")
    run_sweep(path, out=tmp_path / "out", progress=False)
    write(tmp_path, "dynamics")
    with pytest.raises(ChangedRunsError, match=r"(?s)2 of 2 finished runs .*made by study 'train', the sweep now runs "
                                               r"'dynamics'.*--rerun-changed"):
        run_sweep(path, out=tmp_path / "out", progress=False)
    planned = run_sweep(path, out=tmp_path / "out", dry_run=True)
    assert [row["status"] for row in planned] == ["changed", "changed"]
    fake_runs.clear()
    rows = run_sweep(path, out=tmp_path / "out", progress=False, rerun_changed=True)
    assert len(fake_runs) == 2 and {row["study"] for row in rows} == {"dynamics"}


def test_a_default_changed_in_the_code_is_noticed(tmp_path, fake_runs, monkeypatch):
    """Rows made before a default changed (mlp_ratio 4 -> 2) describe a model the code no longer builds: the runner
    says which setting changed and does not count them as finished."""
    path = write(tmp_path)
    run_sweep(path, out=tmp_path / "out", progress=False)

    @dataclasses.dataclass(frozen=True)
    class TrainRunNow(config_module.TrainRun):
        model: config_module.ModelConfig = config_module.part(config_module.ModelConfig, mlp_ratio=2)

    monkeypatch.setitem(studies.STUDIES, "train", studies.Study(TrainRunNow, studies.run_train))
    with pytest.raises(ChangedRunsError, match=r"mlp_ratio: 4 then, 2 now"):
        run_sweep(path, out=tmp_path / "out", progress=False)
    assert sweep.main([str(path), "--out", str(tmp_path / "out")]) == 2  # the command line: a message, no traceback


def test_the_book_refuses_rows_it_cannot_vouch_for(tmp_path, fake_runs):
    """results.load(...).table() raises on a changed row, so no chapter plots results of another configuration."""
    path = write(tmp_path, "train", name="s")
    run_sweep(path, progress=False)  # into tmp_path/s/
    write(tmp_path, "dynamics", name="s")
    with pytest.raises(ValueError, match=r"(?s)cannot be trusted.*made by study 'train'"):
        SweepResults("s", path, tmp_path / "s", tmp_path).table()


def test_a_run_that_used_another_configuration_fails(tmp_path):
    """A run whose template ran another configuration than the runner asked for (a stale template) is 'failed'."""
    path = write_train_template(write(tmp_path, grid={"seed": [0]}), "config['mlp_ratio'] = 2")  # a stale template
    rows = run_sweep(path, out=tmp_path / "out", progress=False)
    assert rows[0]["status"] == "failed" and "mlp_ratio: 2 then, 4 now" in rows[0]["error"]


def test_every_committed_row_is_trusted():
    """Every committed results.csv row parses and records the study and configuration its sweep file and the code
    give now (a default changed in the code makes this fail until the runs are redone)."""
    names = sweep_names(REPO)
    checked = 0
    for csv_path in sorted(REPO.glob("experiments/**/results.csv")):
        results = Results(csv_path, csv_path.parent / "runs" / ".lock")
        rows, bad = results.read_checked()
        assert not bad, (csv_path, bad[:3])
        loaded = load_sweep(names[rows[0]["sweep"]])
        state = plan(loaded, results, loaded.runs())
        assert not state["changed"], (csv_path, state["changed"][:3])
        assert len(state["finished"]) == sum(row["status"] == "ok" for row in rows), csv_path
        checked += len(rows)
    assert checked >= 600


# ------------------------------------------------------------------------- 2. rows that do not parse are redone
def test_a_row_cut_short_is_reported_and_redone(tmp_path, fake_runs, capsys):
    """A results.csv whose last row was cut short: the row is reported (line, run) and its run redone; its empty
    metrics are never written back."""
    path = write(tmp_path)
    run_sweep(path, out=tmp_path / "out", progress=False)
    csv_path = tmp_path / "out" / "results.csv"
    text = csv_path.read_text()
    csv_path.write_text(text[:-40])  # the copy stopped 40 characters early
    last = text.splitlines()[-1].split(",")[0]
    fake_runs.clear()
    rows = run_sweep(path, out=tmp_path / "out", progress=False)
    assert fake_runs == [last]
    assert f"line 3 (run {last}): not trusted" in capsys.readouterr().err
    assert [row["val_loss"] for row in rows] == ["1.25", "1.25"] and not Results(csv_path, tmp_path).read_checked()[1]


def test_a_row_edited_by_hand_is_not_trusted(tmp_path, fake_runs):
    """A value changed by hand (its checksum no longer matches) makes the run count as not done."""
    path = write(tmp_path)
    run_sweep(path, out=tmp_path / "out", progress=False)
    csv_path = tmp_path / "out" / "results.csv"
    csv_path.write_text(csv_path.read_text().replace(",1.25,", ",0.25,", 1))
    assert [row["status"] for row in run_sweep(path, out=tmp_path / "out", dry_run=True)] == ["todo", "ok"]


def _descendants(pid):
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_one_runner_per_sweep_and_its_workers_end_with_it(tmp_path):
    """A second runner on a busy sweep stops at once naming the first one's pid; when the first is killed with
    SIGKILL, the processes it started (pool workers, their kernels) end too, and the sweep can be run again."""
    psutil = pytest.importorskip("psutil", reason="psutil is not installed (Jupyter's kernels bring it)")
    pytest.importorskip("papermill", reason="papermill is not installed (the experiments extra brings it)")
    path = write_train_template(write(tmp_path, name="slow"), "import time\ntime.sleep(600)")  # a slow template
    runner = subprocess.Popen([sys.executable, "-m", "mha.sweep", str(path), "--jobs", "2"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len([p for p in _descendants(runner.pid) if "ipykernel" in " ".join(p.cmdline())]) < 2:
            assert time.monotonic() < deadline and runner.poll() is None, "the runner did not start two kernels"
            time.sleep(0.2)
        with pytest.raises(SweepBusyError, match=rf"another runner is working on this sweep \(pid {runner.pid},"):
            run_sweep(path, progress=False)
        started = _descendants(runner.pid)
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait()
        gone, alive = psutil.wait_procs(started, timeout=30)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if runner.poll() is None:
            runner.kill()
    assert run_sweep(path, dry_run=True)[0]["status"] == "todo"  # the lock went with the runner


# --------------------------------------------------------------------------------- 6. sweep files checked whole
@pytest.mark.parametrize("text, message", [
    ("name: s\nstudy: train\nbase: {steps: 4}\ngrid: {seed: [0]}\ngrid: {seed: [1]}\n",
     r"(?s)found key 'grid' a second time \(first on line 4\).*line 5, column 1"),
    ("name: s\nstudy: train\nbase:\n  steps: 4\n  steps: 8\ngrid: {seed: [0]}\n",
     r"(?s)found key 'steps' a second time.*line 5, column 3"),
    ("name: s\nstudy: train\ngrid: {seed: [0, 1}\n", r"s\.yaml\", line 3, column \d+"),
], ids=["second-grid", "second-steps", "syntax"])
def test_yaml_mistakes_name_the_file_line_and_column(tmp_path, text, message):
    """A key given twice (at any depth) is refused instead of silently overriding the first; YAML errors name the
    file, the line and the column."""
    with pytest.raises(ValueError, match=message):
        load_sweep(write(tmp_path, text=text))


@pytest.mark.parametrize("name", [".", "..", ".hidden", "a/b", ""])
def test_a_name_cannot_leave_the_chapter_folder(tmp_path, name):
    """The name is the results folder's: '.', '..', hidden names and paths are refused."""
    with pytest.raises(ValueError, match="'name' names the results folder"):
        load_sweep(write(tmp_path, text=f"name: '{name}'\nstudy: train\ngrid: {{seed: [0]}}\n"))


@pytest.mark.parametrize("grid, shown", [({"seed": [0, 1, 0]}, r"\(seed=0\) and \(seed=0\)"),
                                         ({"lr": [0.001, 1.0e-3]}, r"\(lr=0\.001\) and \(lr=0\.001\)")])
def test_a_grid_that_repeats_a_run_is_refused(tmp_path, grid, shown):
    """Two grid points that make the same run (a value listed twice) would run it twice: refused."""
    with pytest.raises(ValueError, match=shown + " make the same run"):
        load_sweep(write(tmp_path, grid=grid))


@pytest.mark.parametrize("base, message", [
    ({**BASE, "device": "gpu"}, r"run \w+ \(seed=0\): TrainRun\.device: device must be 'auto' or a torch device"),
    ({**BASE, "task_kwargs": {"vocab_size": -3}}, r"TrainRun\.task_kwargs: task 'two_offset': vocab_size must be "
                                                  r"an integer >= 2, got -3"),
    ({**BASE, "task_kwargs": {"offsets": [2, 2]}}, r"offsets must be two distinct integers"),
    ({**BASE, "task": "shakespeare", "task_kwargs": {"block_size": "64"}}, r"block_size must be an integer"),
], ids=["device-typo", "vocab_size", "offsets", "shakespeare-block_size"])
def test_bad_values_stop_the_sweep_at_load_and_in_a_dry_run(tmp_path, base, message):
    """A bad device or task argument stops the sweep when it is loaded (so --dry-run catches it too), not at run
    time."""
    path = write(tmp_path, base=base, grid={"seed": [0]})
    with pytest.raises((TypeError, ValueError), match=message):
        run_sweep(path, out=tmp_path / "out", dry_run=True)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_machine_lacks_stops_the_sweep_before_any_run(tmp_path, fake_runs, capsys):
    """device: cuda on a machine without CUDA stops the sweep before its first run; a dry run lists the runs and
    says so."""
    path = write(tmp_path, base={**BASE, "device": "cuda"})
    with pytest.raises(ValueError, match=r"runs ask for device 'cuda', but CUDA is not available here"):
        run_sweep(path, out=tmp_path / "out", progress=False)
    assert fake_runs == [] and not (tmp_path / "out" / "results.csv").exists()
    assert sweep.main([str(path), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    assert "note: runs ask for device 'cuda', but CUDA is not available here" in capsys.readouterr().out
