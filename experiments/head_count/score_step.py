"""The premise of the Adam/scale heuristic, measured on characters: how far one optimizer step moves the scores, by
head count at fixed width.

The heuristic of the chapter "Head count" (section "Every head count at its own learning rate"): Adam moves each
weight by about the learning rate per step whatever its gradient, so a score, a sum of d_k products divided by
sqrt(d_k), moves by up to sqrt(d_k) times as much per step as one product when the updates of its coordinates are
aligned, and by an amount that does not grow with d_k when they are not. At fixed width (d_model 64) a head of one
head (d_k = 64) would then move its scores up to sqrt(64 / 4) = 4 times further per step than a head of sixteen
(d_k = 4). The chapter's Tiny Shakespeare runs could not measure this; this script does, with the models of
``head-count-shakespeare-lr.yaml`` (2 layers, d_model 64, context 32, batch 32, warmup 50, cosine to 3e-4 over 1000
steps), at its two middle rates, 3e-3 and 1e-2, for h in {1, 2, 4, 8, 16} and seeds 0-7 (80 runs), each stopped after
update 200: :class:`mha.experiments.probes.ScoreStepProbe` records the root mean square change of every layer's
scores over updates 1, 2, 10, 50, 100 and 200, on the first held-out batch.

Planned before any run (2026-11-28). Per run, the statistic is the mean over the six updates and the two layers of
log(change_rms); the comparison is one head against sixteen, paired by seed (the runs of one seed share their
batches), at each rate: the exact sign-flip test over the 8 seeds and its interval
(``mha.experiments.stats.paired_difference``), Holm over the two rates. The premise holds where one head's scores move
further, resolved; the ratio is set against the two bounds, 1 (unaligned) and 4 (aligned). The other head counts are
described, not tested.

Added after the results above had been seen (2026-11-28, on an outside read): the split of each change into the part
the layer's own query and key projections make (the new projections applied to the old input) and the part its input
makes (the old projections applied to the new input: the embeddings, the layer norm and, in layer 2, layer 1 moved);
all 80 runs were run again for it, and every earlier number must come back to the last bit. Planned before that run:
the same statistic on the own part (per run, the mean over the six updates and the two layers of log
own_change_rms), one head against sixteen, paired by seed, the exact sign-flip test, Holm over the two rates. The
premise, that a wider head's own projections move its scores further per step, holds where one head's own part is
resolved larger. Described, not tested: the input part, the share of each in the change per head count, and the two
layers apart. After a review of that run, the rest of the change (their interaction, rest_change_rms) was added to
what a run records, and the 80 runs were run a third time for it (described only). Run it alone:

    python experiments/head_count/score_step.py

writes ``experiments/head_count/score-step/results.json`` (one entry per run, with the machine), about 5 minutes on
two cores (two runs at a time, one thread each).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
from pathlib import Path

HERE = Path(__file__).resolve().parent
SWEEP = HERE / "head-count-shakespeare-lr.yaml"  # the models' configuration (its base)
HEADS = (1, 2, 4, 8, 16)
RATES = (3e-3, 1e-2)
SEEDS = tuple(range(8))
UPDATES = (1, 2, 10, 50, 100, 200)


def run_one(args: tuple) -> dict:
    """One run: the sweep's model at ``n_heads``, ``lr`` and ``seed``, trained until the last probed update."""
    n_heads, lr, seed = args
    import torch
    import yaml

    from mha.experiments.machine import cpu_id
    from mha.experiments.probes import ScoreStepProbe
    from mha.experiments.studies import make_config
    from mha.experiments.train import train

    torch.set_num_threads(1)
    config = make_config("train", {**yaml.safe_load(SWEEP.read_text())["base"], "n_heads": n_heads, "lr": lr,
                                   "seed": seed, "threads": 1, "progress": False})
    task = config.make_task()
    probe_x, _ = task.get_batch("val", 32, torch.device("cpu"))  # (32, 32): one fixed held-out batch
    probe = ScoreStepProbe(probe_x, UPDATES, stop_after=max(UPDATES))
    train(config.model_config(task), task, config.train, progress=False, hooks=[probe])
    return dict(n_heads=n_heads, head_dim=64 // n_heads, lr=lr, seed=seed, cpu_id=cpu_id(),
                torch_version=torch.__version__,
                updates={str(k): probe.records[k] for k in UPDATES})


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--out", default=str(HERE / "score-step" / "results.json"), help="the JSON file to write")
    args = parser.parse_args(argv)
    grid = list(itertools.product(HEADS, RATES, SEEDS))
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        runs = pool.map(run_one, grid)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(description=__doc__.split("\n\n")[0], heads=HEADS, rates=RATES, seeds=SEEDS,
                                   updates=UPDATES, runs=runs), indent=1) + "\n")
    print(f"wrote {out} ({len(runs)} runs)")
    return out


if __name__ == "__main__":
    main()
