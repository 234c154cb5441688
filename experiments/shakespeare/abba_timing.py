"""The training-step time of this book's code against nanoGPT's reference, the two programs alternated (ABBA).

The chapter "A nanoGPT-comparable character model" could not decide which program trains faster on the CPU: the
two had run in separate blocks while the machine's speed drifted, and the reference did not time its training steps
alone. This script runs both on the README's CPU recipe (4 layers, 4 heads, width 128, context 64, batch 12, two
threads each), shortened to ``--iters`` iterations, one process at a time, in ABBA order: pair 0 runs this book's
code then the reference, pair 1 the reference then this book's code, and so on, each pair with its own seed for both
programs. Each program times the same span of a training step (the batch, the forward and backward passes, the
clipping and the optimizer's step; evaluations and construction left out): ``tokens_per_s`` in both.

Planned before any run (2026-11-28): the comparison is the log of this book's step time over the reference's, paired
by pair, the exact sign-flip test and its interval (``mha.experiments.stats.paired_difference``), over 8 pairs of
500 iterations (the smallest p it can give is 2/256); a ratio is "resolved" only when that test rejects at 5%. Run
it alone on a quiet machine:

    python experiments/shakespeare/abba_timing.py --pairs 8 --iters 500

writes ``experiments/shakespeare/abba/results.json`` (one row per run, in the order run, with the CPU model and the
load average), rewritten after every run. Added after the first run: each row also records ``cpu_id`` (the family
and model numbers); the first run's file has only the brand name.

Second run, planned before it (2026-11-28, after the first run's result had been seen, unresolved): 20 pairs of 500
iterations, with nothing else running on the machine, and ``--warm-start``: before its training, this book's program
runs the forward passes that the reference's evaluation at step 0 runs (20 batches of each split, without gradients,
on a model of the same shape, untimed), so that in neither program is the first timed step the first computation of
the process. The same statistic; with 20 pairs ``paired_difference`` gives the paired t test and its interval. A ratio
is resolved when that test rejects at 5%. Run it alone:

    python experiments/shakespeare/abba_timing.py --pairs 20 --iters 500 --warm-start \
        --out experiments/shakespeare/abba/second-run.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SWEEP = HERE / "shakespeare-nanogpt-cpu.yaml"  # this book's side of the recipe
REFERENCE = HERE / "nanogpt_reference.py"
OURS = """
import json, sys
from mha.experiments.studies import run_study
parameters = json.loads(sys.argv[1])
if parameters.pop("warm_start", False):  # the reference's evaluation at step 0: forward passes, no gradients, untimed
    import torch
    from mha.experiments.config import ShakespeareRun
    from mha.experiments.model import TinyTransformer
    config = ShakespeareRun.from_dict(parameters)
    task = config.make_task()
    model = TinyTransformer(config.model_config(task)).eval()
    with torch.no_grad():
        for split in ("train", "val"):
            for _ in range(20):
                model(*task.get_batch(split, config.train.batch_size, torch.device("cpu")))
metrics = run_study("shakespeare", parameters)
print(json.dumps({key: metrics[key] for key in ("tokens_per_s", "train_wall_s", "val_loss", "steps_done")}))
"""


def ours_parameters(seed: int, iters: int) -> dict:
    """The sweep file's parameters for one seed, shortened to ``iters`` steps (the schedule's decay ends there, as the
    reference's --max-iters does), with a small final evaluation and a one-character sample (neither is timed)."""
    import yaml

    base = yaml.safe_load(SWEEP.read_text())["base"]
    return {**base, "seed": seed, "steps": iters, "warmup_steps": min(base["warmup_steps"], iters),
            "final_eval_batches": 20, "sample_chars": 1}


def _run(command: list, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return done


def run_ours(seed: int, iters: int, env: dict, warm_start: bool = False) -> dict:
    parameters = {**ours_parameters(seed, iters), **({"warm_start": True} if warm_start else {})}
    done = _run([sys.executable, "-c", OURS, json.dumps(parameters)], env)
    metrics = json.loads(done.stdout.strip().splitlines()[-1])
    return dict(program="this book", seed=seed, tokens_per_s=metrics["tokens_per_s"], val_loss=metrics["val_loss"],
                steps=metrics["steps_done"])


def run_reference(seed: int, iters: int, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "reference.json"
        _run([sys.executable, str(REFERENCE), "--seeds", str(seed), "--max-iters", str(iters), "--out", str(out)], env)
        run = json.loads(out.read_text())["runs"][0]
    return dict(program="reference", seed=seed, tokens_per_s=run["tokens_per_s"], val_loss=run["val_loss"],
                steps=run["history"][-1]["step"])


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=8, help="pairs of runs (default 8)")
    parser.add_argument("--iters", type=int, default=500, help="training iterations per run (default 500)")
    parser.add_argument("--out", default=str(HERE / "abba" / "results.json"), help="the JSON file to write")
    parser.add_argument("--warm-start", action="store_true",
                        help="this book's program first runs the forward passes of the reference's evaluation at "
                             "step 0 (untimed), so that neither program's first timed step is cold")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.iters < 1:
        parser.error(f"--pairs and --iters must be at least 1, got {args.pairs} and {args.iters}")
    sys.path.insert(0, str(REPO / "src"))
    from mha.experiments.machine import cpu_id, cpu_model

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = []
    for pair in range(args.pairs):
        ours = functools.partial(run_ours, warm_start=args.warm_start)
        order = (ours, run_reference) if pair % 2 == 0 else (run_reference, ours)  # A B, then B A
        for runner in order:
            row = runner(pair, args.iters, env)
            row.update(pair=pair, cpu_model=cpu_model(), cpu_id=cpu_id(), load_average_1min=os.getloadavg()[0], threads=2)
            runs.append(row)
            print(f"pair {pair}: {row['program']}: {row['tokens_per_s']:,.0f} tokens/s", flush=True)
            out.write_text(json.dumps(dict(description=__doc__.split("\n\n")[0], iters=args.iters,
                                           pairs=args.pairs, warm_start=args.warm_start, runs=runs), indent=1) + "\n")
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
