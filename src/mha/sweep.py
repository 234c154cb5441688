"""``python -m mha.sweep``: the sweep runner's command line (:func:`mha.experiments.sweep.main`)."""
from mha.experiments.sweep import main

if __name__ == "__main__":
    raise SystemExit(main())
