"""``python -m mha.bench``: the benchmarks' command line (:func:`mha.experiments.bench.main`)."""
from mha.experiments.bench import main

if __name__ == "__main__":
    main()
