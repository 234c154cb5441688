"""Tests for the sweep harness (mha.experiments.sweep, sweep_file and results): grid -> runs (papermill or the study
function) -> results.csv, reruns, failures, interruption, launchers, and the checks of a sweep file before anything
runs. The tests of the runner's machinery (parallel jobs, launchers) run a stand-in train template without torch
(tests/_params.py: write_train_template)."""

import csv
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from mha.experiments import sweep
from mha.experiments.results import REQUIRED_COLUMNS, Results
from mha.experiments.sweep import run_sweep
from mha.experiments.sweep_file import command, load_sweep

from _params import fake_runs, write_train_template  # noqa: F401 - fake_runs is a fixture

REPO = Path(__file__).resolve().parents[1]
TRAIN_NOTEBOOK = REPO / "experiments" / "notebooks" / "train.ipynb"


def write_sweep(folder, study, base, grid, name="t"):
    """A sweep file of ``study`` (such as "train") in ``folder``."""
    path = Path(folder) / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "study": study, "base": base, "grid": grid}, sort_keys=False))
    return path


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def quick_sweep(folder, base, grid):
    """A train sweep in a repository of its own whose template runs without torch (a run takes about a kernel
    start): it reports the configuration it was asked to run, with seed / 2 as val_loss; a run with seed 13 raises."""
    folder.mkdir()
    return write_train_template(write_sweep(folder, "train", base, grid),
                                "if config['seed'] == 13:\n    raise RuntimeError('asked to fail')")


BASE = {"task": "two_offset", "n_heads": 2, "steps": 4, "eval_interval": 2, "eval_batches": 1, "batch_size": 4,
        "warmup_steps": 1, "lr": 1e-3}
HUGE = 2 ** 40  # a d_model no machine has the memory for: every setting checks, and the run fails at run time
GRID = {"d_model": [32, HUGE], "seed": [0]}


@pytest.fixture(scope="module")
def train_sweep(tmp_path_factory):
    """The train study through its notebook, two runs: the first trains; the second runs out of memory."""
    for module in ("papermill", "ipykernel"):
        pytest.importorskip(module, reason=f"{module} is not installed: the sweep's notebook executor needs it")
    folder = tmp_path_factory.mktemp("train_sweep")  # outside the repository: the package's checkout has the template
    config = write_sweep(folder, "train", BASE, GRID, name="train")
    rows = run_sweep(config, out=folder / "out", progress=False)
    return config, folder / "out", rows


def test_train_sweep_rows_and_columns(train_sweep):
    config, out, rows = train_sweep
    table = read_csv(out / "results.csv")
    assert table == rows and len(table) == 2
    assert list(table[0])[:len(REQUIRED_COLUMNS)] == REQUIRED_COLUMNS
    ok, failed = table
    assert (ok["task_kwargs"], ok["status"], ok["error"]) == ("{}", "ok", "")
    assert ok["study"] == "train" and json.loads(ok["config"])["mlp_ratio"] == 4  # what the run used, defaults too
    assert list(ok)[-1] == "checksum" and len(ok["checksum"]) == 16
    assert float(ok["val_loss"]) > 0 and 0 <= float(ok["val_acc"]) <= 1
    assert ok["task"] == "two_offset" and ok["steps"] == "4" and ok["d_model"] == "32" and ok["seed"] == "0"
    assert ok["n_kv_heads"] == "2" and ok["head_dim"] == "16"  # resolved by the model
    assert int(ok["params"]) > 0 and int(ok["kv_cache_bytes"]) == 2 * 32 * 1 * 2 * 16 * 4
    assert ok["device"] == "cpu" and ok["torch_version"] and float(ok["tokens_per_s"]) > 0
    assert ok["lr"] == "0.001" and ok["sweep"] == "train" and ok["threads"] == "1"
    assert ok["device_name"] and ok["num_threads"] == "1" and ok["cpu_model"]  # the machine, in every row
    assert ok["beta2"] == "0.95" and ok["bias"] == "True"  # every setting, default or not
    assert len(ok["git_commit"]) == 40
    assert failed["status"] == "failed" and failed["d_model"] == str(HUGE)
    assert "RuntimeError" in failed["error"] and "allocate" in failed["error"] and failed["val_loss"] == ""
    for row in table:
        assert (out / "runs" / f"{row['run_id']}.ipynb").is_file()
    assert json.loads((out / "runs" / ok["run_id"] / "metrics.json").read_text())["val_loss"] == pytest.approx(
        float(ok["val_loss"]))


def test_run_ids_are_stable_hashes(train_sweep, tmp_path):
    config, _, rows = train_sweep
    spec = yaml.safe_load(config.read_text())
    for row, d_model in zip(rows, GRID["d_model"]):
        parameters = {**spec["base"], "d_model": d_model, "seed": 0}
        canonical = json.dumps(parameters, sort_keys=True, separators=(",", ":"))
        assert row["run_id"] == hashlib.sha256(canonical.encode()).hexdigest()[:12]
    reordered = write_sweep(tmp_path, "train", dict(reversed(list(spec["base"].items()))),
                            {"seed": [0], "d_model": GRID["d_model"]}, name="train")
    assert sorted(r.run_id for r in load_sweep(reordered).runs()) == sorted(r["run_id"] for r in rows)
    assert len({r["run_id"] for r in rows}) == 2


def test_rerun_skips_finished_and_kill_loses_nothing(train_sweep, fake_runs):
    """Rerun: only the failed run executes. Then delete the ok row (as if killed before it was written): only it
    and the failed one run again, and no run_id ever appears twice."""
    config, out, rows = train_sweep
    ok_id, failed_id = rows[0]["run_id"], rows[1]["run_id"]
    calls = fake_runs
    before = read_csv(out / "results.csv")
    run_sweep(config, out=out, progress=False)
    assert calls == [failed_id]
    after = read_csv(out / "results.csv")
    assert after[0] == before[0] and after[1]["status"] == "ok" and after[1]["val_loss"] == "1.25"

    calls.clear()
    with open(out / "results.csv", newline="") as f:
        lines = f.readlines()
    (out / "results.csv").write_text("".join(line for line in lines if not line.startswith(ok_id)))
    run_sweep(config, out=out, progress=False)
    assert calls == [ok_id]
    table = read_csv(out / "results.csv")
    assert [r["run_id"] for r in table] == [ok_id, failed_id]  # grid order, each once


def test_results_add_is_atomic_and_deduplicates(tmp_path):
    a, b = "aaaaaaaaaaaa", "bbbbbbbbbbbb"
    results = Results(tmp_path / "results.csv", tmp_path / "runs" / ".lock")
    results.add({"run_id": a, "status": "ok", "val_loss": 1.0, "extra": [1, 2]}, order=[b, a])
    results.add({"run_id": b, "status": "failed", "error": "boom"}, order=[b, a])
    results.add({"run_id": a, "status": "ok", "val_loss": 0.5, "n_kv_heads": None}, order=[b, a])
    table = read_csv(tmp_path / "results.csv")
    assert [(r["run_id"], r["status"]) for r in table] == [(b, "failed"), (a, "ok")]
    assert table[1]["val_loss"] == "0.5" and table[1]["extra"] == "" and table[1]["n_kv_heads"] == ""
    assert list(table[0])[:len(REQUIRED_COLUMNS)] == REQUIRED_COLUMNS and "extra" in table[0]
    assert list(table[0])[-1] == "checksum"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv", "runs"]  # no temporary file left
    with open(tmp_path / "results.csv", "a", newline="") as f:  # a duplicate row appended by hand: no checksum
        f.write(a + ",,failed" + "," * (len(table[0]) - 3) + "\n")
    rows, bad = results.read_checked()
    assert [(r["run_id"], r["status"]) for r in rows] == [(b, "failed"), (a, "ok")]
    assert [(x.line, x.run_id) for x in bad] == [(4, a)] and "no checksum" in bad[0].reason


def test_parallel_jobs_and_thread_environment(tmp_path):
    config = quick_sweep(tmp_path / "repo", {"threads": 2}, {"seed": [1, 3]})
    rows = run_sweep(config, out=tmp_path / "out", jobs=2, progress=False)
    assert [(r["seed"], r["status"], r["val_loss"]) for r in rows] == [("1", "ok", "0.5"), ("3", "ok", "1.5")]
    assert all(r["omp"] == "2" and r["threads"] == "2" for r in rows)  # the run's threads (the tests run with 1)
    assert len({r["pid"] for r in rows}) == 2 and {r["study"] for r in rows} == {"train"}
    # kernels started side by side talk over sockets in private folders: TCP ports picked by two processes at
    # once can collide ("Address already in use"), which failed this test in CI once
    assert all(r["transport"] == "ipc" for r in rows)
    assert "history" not in rows[0]  # only scalar metrics become columns


def test_submitit_local_launcher(tmp_path):
    pytest.importorskip("submitit", reason="submitit is not installed (the experiments extra brings it)")
    config = quick_sweep(tmp_path / "repo", {}, {"seed": [4, 13]})
    rows = run_sweep(config, out=tmp_path / "out", launcher="submitit", cluster="local", jobs=2, progress=False)
    assert [(r["seed"], r["status"]) for r in rows] == [("4", "ok"), ("13", "failed")]
    assert rows[0]["val_loss"] == "2.0" and "asked to fail" in rows[1]["error"]
    assert (tmp_path / "out" / "submitit").is_dir()


def test_dry_run_and_cli(tmp_path, capsys):
    config = write_sweep(tmp_path, "train", BASE, {"seed": [1, 2]})
    planned = run_sweep(config, out=tmp_path / "out", dry_run=True)
    assert [(r["seed"], r["status"]) for r in planned] == [("1", "todo"), ("2", "todo")]
    assert not (tmp_path / "out").exists()
    assert sweep.main([str(config), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    assert "2 of 2 runs to do" in capsys.readouterr().out


def test_bad_sweep_files(tmp_path):
    with pytest.raises(ValueError, match=r"'typo' is not a setting of TrainRun"):
        load_sweep(write_sweep(tmp_path, "train", {"typo": 1}, {"seed": [1]}))
    with pytest.raises(ValueError, match="both 'base' and 'grid'"):
        load_sweep(write_sweep(tmp_path, "train", {"seed": 1}, {"seed": [1]}))
    with pytest.raises(ValueError, match="non-empty list"):
        load_sweep(write_sweep(tmp_path, "train", {}, {"seed": []}))
    with pytest.raises(ValueError, match="'out_dir' is set by the runner"):
        load_sweep(write_sweep(tmp_path, "train", {"out_dir": "/tmp"}, {"seed": [1]}))
    path = tmp_path / "bad.yaml"
    path.write_text("name: b\nstudy: train\ngrid: {lr: [1e-3]}\nextra: 1\n")
    with pytest.raises(ValueError, match=r"unknown keys \['extra'\]"):
        load_sweep(path)
    path.write_text("name: b\nstudy: train\ngrid: {lr: [1e-3, 2.0e-3]}\n")
    assert load_sweep(path).grid == {"lr": [0.001, 0.002]}  # 1e-3 is a float, not the string '1e-3'
    with pytest.raises(ValueError, match="launcher"):
        run_sweep(path, out=tmp_path / "o", launcher="ssh")


def test_function_executor_computes_what_the_notebook_computed(train_sweep, tmp_path_factory):
    """The same run through the study's function in a fresh process: the same numbers, to the last digit."""
    config, out, rows = train_sweep
    again = run_sweep(config, out=out.parent / "out-function", executor="function", progress=False)
    for a, b in zip(rows, again):
        assert a["run_id"] == b["run_id"] and a["status"] == b["status"]
        for key in ("val_loss", "val_acc", "train_loss", "params", "kv_cache_bytes"):
            assert a[key] == b[key], key
    assert not (out.parent / "out-function" / "runs" / f"{rows[0]['run_id']}.ipynb").exists()


def test_only_runs_the_runs_named(tmp_path, fake_runs):
    config = write_sweep(tmp_path, "train", BASE, {"seed": [1, 2, 3]})
    ids = [run.run_id for run in load_sweep(config).runs()]
    rows = run_sweep(config, out=tmp_path / "out", only=[ids[1]], progress=False)
    assert fake_runs == [ids[1]]
    assert [r["seed"] for r in rows] == ["2"] and len(read_csv(tmp_path / "out" / "results.csv")) == 1
    with pytest.raises(ValueError, match="not runs of"):
        run_sweep(config, out=tmp_path / "out", only=["000000000000"], progress=False)


def test_study_settings_are_checked_before_any_run(tmp_path):
    """An unknown name (with the nearest field suggested), a wrong type, a bad value, an unknown task argument:
    each stops the sweep at load time with the file, the run and the field in the message."""
    folder = tmp_path
    with pytest.raises(ValueError, match=r"'n_head' is not a setting of TrainRun .*did you mean 'n_heads'"):
        load_sweep(write_sweep(folder, "train", {"n_head": 2}, {"seed": [0]}))
    with pytest.raises(TypeError, match=r"run \w+ \(seed=0\): TrainRun.steps must be an integer >= 1, got '4'"):
        load_sweep(write_sweep(folder, "train", {"steps": "4"}, {"seed": [0]}))
    with pytest.raises(ValueError, match=r"n_heads=3.*d_model \(32\) must be divisible by n_heads \(3\)"):
        load_sweep(write_sweep(folder, "train", {}, {"n_heads": [2, 3]}))
    with pytest.raises(ValueError, match=r"task_kwargs has key\(s\) \['seq_len'\]"):
        load_sweep(write_sweep(folder, "train", {"task_kwargs": {"seq_len": 4}}, {"seed": [0]}))
    with pytest.raises(ValueError, match="study must be one of"):
        load_sweep(write_sweep(folder, "nope", {}, {"seed": [0]}))
    path = folder / "none.yaml"
    path.write_text("name: b\ngrid: {seed: [0]}\n")
    with pytest.raises(ValueError, match="study must be one of"):
        load_sweep(path)
    path.write_text(f"name: b\nstudy: train\nnotebook: {TRAIN_NOTEBOOK}\ngrid: {{seed: [0]}}\n")
    with pytest.raises(ValueError, match=r"sweep files name a study .*plain notebook sweeps were removed"):
        load_sweep(path)


def test_every_committed_sweep_file_is_valid():
    """Every sweep file of every chapter folder loads (its runs' settings all check), and names its own folder."""
    files = sorted(path for path in REPO.glob("experiments/*/*.yaml") if path.parent.name != "gpu")  # gpu: the queue
    files += [REPO / "experiments" / "smoke.yaml"]
    assert len(files) >= 19
    for path in files:
        sweep_ = load_sweep(path)
        assert sweep_.study in ("train", "heads", "dynamics", "shakespeare") and sweep_.notebook.is_file(), path
        assert sweep.output_dir(sweep_) == path.parent / sweep_.name
    smoke = load_sweep(REPO / "experiments" / "smoke.yaml")
    assert smoke.notebook == TRAIN_NOTEBOOK and 2 <= len(smoke.runs()) <= 4


def test_one_command_and_one_check_per_sweep(tmp_path):
    """The command that remakes a sweep is built in one place (the sweep, its results and the book agree); a sweep
    loaded again (a chapter looks its sweeps up several times) reuses the configurations checked the first time,
    and the function executor hands the run's configuration over as it is."""
    from mha.experiments.results import load

    path = REPO / "experiments" / "head_count" / "head-count.yaml"
    assert (command(path, 2) == load_sweep(path).command() == load("head-count", REPO).command
            == "python -m mha.sweep experiments/head_count/head-count.yaml --jobs 2")
    assert command(path, 1, root=path.parent) == "python -m mha.sweep head-count.yaml"
    first, again = load_sweep(path).runs(), load_sweep(path).runs()
    assert all(a.study_config is b.study_config for a, b in zip(first, again))
    assert first[0].config == first[0].study_config.to_dict() and first[0].study_config.study == "train"
    changed = write_sweep(tmp_path, "train", {**BASE, "lr": 2e-3}, {"seed": [0]})
    assert load_sweep(changed).runs()[0].study_config.lr == 2e-3  # an edited file is read again


def test_the_rerun_command_finds_every_committed_run_to_do(capsys):
    """The pages' "Regenerate" line: the plain command finds a committed sweep done and runs nothing; the rerun
    command writes into a fresh folder, where every run is still to do."""
    from mha.experiments.results import load

    results = load("head-count", REPO)
    assert results.rerun_command == results.command + " --out /tmp/head-count-rerun"
    n = len(results.run_ids)
    for out, todo in ((results.folder, 0), (Path("/tmp/head-count-rerun-never-made"), n)):
        sweep.main([str(results.sweep_file), "--out", str(out), "--dry-run"])
        assert f"{todo} of {n} runs to do" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ --set (command line)
SMOKE = REPO / "experiments" / "smoke.yaml"


def test_set_values_are_yaml_scalars_and_bad_items_name_themselves():
    from mha.experiments.sweep_file import format_overrides, parse_overrides

    parsed = parse_overrides(["steps=100", "lr=1e-3", "n_kv_heads=null", "bias=false", "task=two_offset",
                              "device='7'"])
    assert parsed == {"steps": 100, "lr": 0.001, "n_kv_heads": None, "bias": False, "task": "two_offset",
                      "device": "7"}
    assert [type(v) for v in parsed.values()] == [int, float, type(None), bool, str, str]
    assert parse_overrides(format_overrides(parsed)) == parsed and "device='7'" in format_overrides(parsed)
    for items, words in [(["steps"], "expected KEY=VALUE"), (["=3"], "expected KEY=VALUE"),
                         (["steps=1", "steps=2"], "steps is set twice"), (["steps=[1, 2]"], "one YAML scalar"),
                         (["task_kwargs={a: 1}"], "one YAML scalar"), (["out_dir=/tmp"], "set by the runner"),
                         (["steps="], "no value")]:
        with pytest.raises(ValueError, match=words):
            parse_overrides(items)
    with pytest.raises(TypeError, match="KEY=VALUE strings, got 3"):
        parse_overrides([3])
    with pytest.raises(TypeError, match="a list of 'KEY=VALUE' strings"):
        parse_overrides("steps=3")


def test_set_makes_runs_of_their_own():
    """--set keeps a grid key to its one value, changes the other settings of every run, names the sweep (and its
    folder) after the overrides, and gives ids that no run of the file has, even where the values coincide."""
    full = load_sweep(SMOKE)
    short = load_sweep(SMOKE, {"steps": 5, "seed": 0})
    assert short.name == "smoke--steps-5_seed-0" and sweep.output_dir(short) == SMOKE.parent / "smoke--steps-5_seed-0"
    assert short.grid == {**full.grid, "seed": [0]} and short.base["steps"] == 5
    assert [run.parameters["seed"] for run in short.runs()] == [0, 0]
    assert all(run.config["steps"] == 5 for run in short.runs())
    assert not {run.run_id for run in short.runs()} & {run.run_id for run in full.runs()}
    same_values = load_sweep(SMOKE, {"seed": 0})  # seed 0 is in the grid: the runs equal two of the file's ...
    assert [r.config for r in same_values.runs()] == [r.config for r in full.runs() if r.parameters["seed"] == 0]
    assert not {r.run_id for r in same_values.runs()} & {r.run_id for r in full.runs()}  # ... under ids of their own
    again = load_sweep(SMOKE, {"seed": 0, "steps": 5})  # the same overrides in another order: the same runs
    assert [r.run_id for r in again.runs()] == [r.run_id for r in short.runs()]
    # the id hashes the parameters and the overrides, as documented
    expected = hashlib.sha256(json.dumps({"parameters": short.runs()[0].parameters, "set": {"steps": 5, "seed": 0}},
                                         sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]
    assert short.runs()[0].run_id == expected
    assert short.command() == "python -m mha.sweep experiments/smoke.yaml --set steps=5 --set seed=0"


def test_set_is_checked_like_the_files_settings_and_shortens_the_warmup():
    with pytest.raises(ValueError, match=r"--set stps=5: 'stps' is not a setting of study 'train' \(did you mean "
                                         r"'steps'\?\)"):
        load_sweep(SMOKE, {"stps": 5})
    with pytest.raises(ValueError, match=r"with --set steps=-1\): run [0-9a-f]{12} .*steps must be an integer >= 1"):
        load_sweep(SMOKE, {"steps": -1})
    with pytest.raises(TypeError, match=r"with --set n_heads=four\): run .*n_heads must be an integer"):
        load_sweep(SMOKE, {"n_heads": "four"})
    with pytest.raises(TypeError, match="overrides must be a dict"):
        load_sweep(SMOKE, ["steps=5"])
    short = load_sweep(SMOKE, {"steps": 5})  # the default warmup (10) would be longer than the run
    assert all(run.config["warmup_steps"] == 5 for run in short.runs())
    assert short.adjusted == ["warmup_steps 10 -> 5 (a warmup must not be longer than the run; --set "
                              "warmup_steps=... to choose another)"]
    assert load_sweep(SMOKE, {"steps": 50}).adjusted == []
    with pytest.raises(ValueError, match="warmup_steps \\(10\\) must be <= steps \\(5\\)"):
        load_sweep(SMOKE, {"steps": 5, "warmup_steps": 10})  # named by --set too: checked, not changed


def test_set_on_the_command_line(tmp_path, capsys):
    assert sweep.main([str(SMOKE), "--set", "steps=5", "--set", "seed=1", "--out", str(tmp_path), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    ids = [run.run_id for run in load_sweep(SMOKE, {"steps": 5, "seed": 1}).runs()]
    assert [line.split()[0] for line in out.splitlines()[:-1]] == ids and "2 of 2 runs to do" in out
    assert "warmup_steps 10 -> 5" in err
    assert sweep.main([str(SMOKE), "--set", "stps=5", "--out", str(tmp_path), "--dry-run"]) == 2
    assert "error: --set stps=5: 'stps' is not a setting" in capsys.readouterr().err  # a message, no traceback
    with pytest.raises(SystemExit):
        sweep.main([str(SMOKE), "--set", "steps", "--dry-run"])
    assert "--set 'steps': expected KEY=VALUE" in capsys.readouterr().err
