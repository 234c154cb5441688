"""The experiment harness of book part III, built on the core package (:mod:`mha`).

What the experiments need beyond attention itself, one module a job:

``config``    ``RunConfig`` (composed of a ``ModelConfig`` and a ``TrainConfig``) and one subclass per study: every
              setting a run takes, typed and checked once.
``model``     ``TinyTransformer``: a small decoder-only GPT built on ``mha.MultiHeadAttention``.
``tasks``     the tasks (two-offset lookup, associative recall, repeated sequences, Tiny Shakespeare).
``data``      where data sets live; Tiny Shakespeare downloaded once (pooch) and checked (hashlib).
``train``     the one trainer, with hooks (per-step measurements, step-0 probes, early stop).
``probes``    what the dynamics study measures while training.
``studies``   the experiments as functions: one training run, what heads learn, dynamics, the Shakespeare run.
``sweep_file`` a sweep file read and checked: its runs, their ids and configurations, the command that runs it.
``sweep``     the runner: a study over a grid of settings, one row per run in ``results.csv`` (``python -m mha.sweep``).
``results``   ``results.csv`` (the table, its checksums, which rows to trust) and the committed results the chapters
              read.
``reproduce`` committed runs rerun and compared: how far the numbers move on this machine.
``stats``     intervals over seeds: Wilson for proportions, t for means, exact sign-flip for paired differences; verdicts.
``report``    the words and tables the chapters glue (intervals as text, counts, lists, machine descriptions).
``analysis``  head scores, similarity, importance and pruning of trained models.
``viz``       ``attention_explorer``: an interactive attention-map viewer for the static book.
``bench``     side-by-side benchmarks (``python -m mha.bench``; the run and its CLI in ``bench_run``).
``timing``    the one timer: paired repeats after warm-up, medians and quartiles of the ratios.
``gpu_run``   one command for a short GPU slot: CUDA tests, benchmark, kernels, then the GPU program's pieces, each
              step time-boxed, at most 8 files back (``python -m mha.experiments.gpu_run --budget 480 --out DIR``).
``gpu_queue`` the GPU program as pieces sized to fit a slot (``experiments/gpu/queue.yaml``), and the record of
              what ran on which GPU (``experiments/gpu/record.csv``).
``machine``   what ran: device, CPU or GPU name, threads, seeding.   ``io``: atomic JSON writes, artifact folders.
"""

from importlib import import_module

MODULES = ("config", "model", "tasks", "data", "train", "probes", "studies", "sweep_file", "sweep", "results",
           "reproduce", "stats", "report", "analysis", "viz", "bench", "bench_run", "timing", "machine", "io",
           "gpu_run", "gpu_queue")

__all__ = list(MODULES)


def __getattr__(name):
    # Lazy: importing the harness does not import torch until a module that needs it is asked for.
    if name in MODULES:
        return import_module(f"mha.experiments.{name}")
    raise AttributeError(f"module 'mha.experiments' has no attribute {name!r}")
