"""Shared by the tests: random parameter dicts in the reference convention (W_q, W_k, W_v, W_o, b_*), random
tensors, mha.MultiHeadAttention modules with random weights, papermill notebooks, a repository whose train template
runs in a kernel's start-up time, and a sweep runner whose runs take no time (the fixture fake_runs)."""

import math

import numpy as np
import pytest
import torch

from mha import MultiHeadAttention


def make_params(rng, d_model, n_heads, n_kv_heads, head_dim, bias=True):
    q_w, kv_w = n_heads * head_dim, n_kv_heads * head_dim
    p = {
        "W_q": rng.standard_normal((d_model, q_w)) / math.sqrt(d_model),
        "W_k": rng.standard_normal((d_model, kv_w)) / math.sqrt(d_model),
        "W_v": rng.standard_normal((d_model, kv_w)) / math.sqrt(d_model),
        "W_o": rng.standard_normal((q_w, d_model)) / math.sqrt(q_w),
    }
    if bias:
        p |= {"b_q": rng.standard_normal(q_w), "b_k": rng.standard_normal(kv_w),
              "b_v": rng.standard_normal(kv_w), "b_o": rng.standard_normal(d_model)}
    return p


def t(a):
    return torch.as_tensor(np.asarray(a), dtype=torch.float64)


def torch_mha_module(p, d_model, n_heads):
    """torch.nn.MultiheadAttention holding the same weights (torch: Y = X W^T, in_proj_weight = [Wq; Wk; Wv]^T)."""
    mha = torch.nn.MultiheadAttention(d_model, n_heads, bias=True, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([t(p["W_q"]).T, t(p["W_k"]).T, t(p["W_v"]).T]))
        mha.in_proj_bias.copy_(torch.cat([t(p["b_q"]), t(p["b_k"]), t(p["b_v"])]))
        mha.out_proj.weight.copy_(t(p["W_o"]).T)
        mha.out_proj.bias.copy_(t(p["b_o"]))
    return mha


def replaced(params: dict, **entries) -> dict:
    """A copy of a parameter dict with some entries replaced (value None = removed): the bad-input tables' way of
    making a broken ``params``."""
    p = dict(params)
    for key, value in entries.items():
        if value is None:
            p.pop(key)
        else:
            p[key] = value
    return p


def make(d_model=16, n_heads=4, seed=0, dtype=torch.float64, device="cpu", **kwargs):
    """A module in eval mode with random weights and (when bias) visibly non-zero biases."""
    torch.manual_seed(seed)
    m = MultiHeadAttention(d_model, n_heads, **kwargs)
    with torch.no_grad():
        for lin in (m.q_proj, m.k_proj, m.v_proj, m.o_proj):
            if lin.bias is not None:
                lin.bias.normal_(0.0, 0.5)
    return m.to(dtype=dtype, device=device).eval()


def randn(*shape, seed=1, dtype=torch.float64, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)


def write_notebook(path, parameters: str, body: str):
    """A papermill notebook at ``path``: a cell tagged 'parameters' holding ``parameters``, then ``body``."""
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = nbformat.v4.new_code_cell(parameters)
    cell.metadata["tags"] = ["parameters"]
    notebook.cells = [cell, nbformat.v4.new_code_cell(body)]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)
    return path


def write_train_template(sweep_file, body: str = ""):
    """Make the folder of ``sweep_file`` (a train sweep) a repository of its own (a ``.git`` folder) whose train
    template (``experiments/notebooks/train.ipynb``, which the sweep then runs) stands in for the real one: the same
    parameters cell (``overrides``, ``out_dir``, ``artifacts_dir``), no torch (checking a configuration imports it: a
    few seconds per kernel), no training. It looks the run's configuration up among the sweep's runs (as
    ``load_sweep`` made them here, from the same settings), runs ``body`` (which may raise, sleep, or change
    ``config``), then reports what the real template reports: study "train" and the configuration, with val_loss =
    seed / 2, a list (not a column), OMP_NUM_THREADS, its pid and its kernel's transport. Returns ``sweep_file``.
    Where papermill, nbformat or ipykernel is missing (a stock GPU image), the calling test is skipped, saying so."""
    import json
    from pathlib import Path

    import pytest

    for module in ("nbformat", "papermill", "ipykernel"):
        pytest.importorskip(module, reason=f"{module} is not installed (the experiments extra brings it): the "
                                           f"sweep's notebook executor needs it")

    from mha.experiments.sweep_file import canonical_config, load_sweep

    root = Path(sweep_file).parent
    (root / ".git").mkdir(exist_ok=True)
    configs = {canonical_config(run.parameters): run.config for run in load_sweep(sweep_file).runs()}
    write_notebook(root / "experiments" / "notebooks" / "train.ipynb",
                   'overrides = {}\nout_dir = ""\nartifacts_dir = ""',
                   "import json, os, pathlib\n"
                   "from ipykernel.connect import get_connection_file\n"
                   f"configs = json.loads({json.dumps(configs)!r})\n"
                   "config = configs[json.dumps(overrides, sort_keys=True, separators=(',', ':'), default=str)]\n"
                   f"{body}\n"
                   "metrics = {'study': 'train', 'config': config, 'val_loss': config['seed'] / 2, 'history': [1, 2],\n"
                   "           'omp': os.environ.get('OMP_NUM_THREADS'), 'pid': os.getpid(),\n"
                   "           'transport': json.loads(pathlib.Path(get_connection_file()).read_text())"
                   "['transport']}\n"
                   "pathlib.Path(out_dir, 'metrics.json').write_text(json.dumps(metrics))")
    return sweep_file


@pytest.fixture
def fake_runs(monkeypatch):
    """Runs that take no time: each call to the sweep runner's ``execute_run`` is recorded (its run id) and returns a
    fixed loss. A test module uses it with ``from _params import fake_runs``."""
    from mha.experiments import sweep

    calls = []

    def fake_execute_run(sweep_, run, runs_dir, executor="notebook", kernel="python3"):
        calls.append(run.run_id)
        return {"status": "ok", "error": "", "val_loss": 1.25}

    monkeypatch.setattr(sweep, "execute_run", fake_execute_run)
    return calls
