"""mha._compat: an unsupported Python, NumPy or PyTorch gives a clear ImportError at ``import mha``, and the check
itself imports neither torch nor numpy."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from packaging.version import Version

from mha import _compat

SRC = Path(__file__).resolve().parents[1] / "src"


def _import_mha(tmp_path, fakes=(), code="import mha", **env):
    """Run ``code`` in a fresh interpreter whose sys.path starts with fake packages {name: version} and src/.

    A fake package raises if it is imported, so the check must read its version without importing it."""
    for name, version in fakes:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise RuntimeError('the check imported the fake {name}')\n")
        info = tmp_path / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    full_env = {k: v for k, v in os.environ.items() if k != _compat.SKIP_ENV}
    full_env.update(PYTHONPATH=os.pathsep.join([str(tmp_path), str(SRC)]), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120)


def test_import_mha_imports_neither_torch_nor_numpy(tmp_path):
    run = _import_mha(tmp_path, code="import sys, mha; print(sorted({'torch', 'numpy'} & set(sys.modules)))")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_old_torch_is_a_clear_import_error(tmp_path):
    run = _import_mha(tmp_path, fakes=[("torch", "2.4.1+cu121")])
    assert run.returncode != 0
    err = run.stderr
    assert "mha._compat.UnsupportedVersionError" in err and "imported the fake" not in err, err
    assert "torch 2.4.1+cu121 is too old: mha needs torch >= 2.5" in err, err
    assert "enable_gqa" in err, err  # why 2.5
    assert 'pip install --upgrade "torch>=2.5"' in err, err  # how to fix it
    assert "MHA_SKIP_VERSION_CHECK=1" in err


def test_old_numpy_and_torch_are_both_named(tmp_path):
    run = _import_mha(tmp_path, fakes=[("torch", "2.1.0"), ("numpy", "1.23.5")])
    assert run.returncode != 0
    assert "numpy 1.23.5 is too old: mha needs numpy >= 1.24" in run.stderr, run.stderr
    assert 'pip install --upgrade "numpy>=1.24"' in run.stderr
    assert "torch 2.1.0 is too old" in run.stderr


def test_supported_versions_import(tmp_path):
    # The floor itself, a development build of it (NVIDIA's containers), and the fake is still never imported.
    run = _import_mha(tmp_path, fakes=[("torch", "2.5.0a0+gitabc123"), ("numpy", "1.24.0")],
                      code="import sys, mha; print('torch' in sys.modules)")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"


def test_skip_env_imports_anyway(tmp_path):
    run = _import_mha(tmp_path, fakes=[("torch", "2.0.1")], code="import mha; print(mha.__version__)",
                      **{_compat.SKIP_ENV: "1"})
    assert run.returncode == 0, run.stderr


def test_error_is_an_import_error():
    assert issubclass(_compat.UnsupportedVersionError, ImportError)


@pytest.mark.parametrize("python,versions,expected", [
    ((3, 9), {}, ["Python 3.9 is too old: mha needs Python >= 3.10"]),
    ((3, 11), {"torch": "2.4.1", "numpy": "2.0.0"}, ["torch 2.4.1 is too old"]),
    ((3, 11), {"torch": "1.13.1", "numpy": "1.21.6"}, ["numpy 1.21.6 is too old", "torch 1.13.1 is too old"]),
    ((3, 10), {"torch": "2.5.1", "numpy": "1.24.4"}, []),
    ((3, 13), {"torch": "2.15.0", "numpy": "2.4.6"}, []),
    ((3, 12), {"torch": "2.11.0+cu130", "numpy": None}, []),  # not installed: not this check's business
    ((3, 12), {"torch": "2.10.0a0+git1234", "numpy": "2.1.0rc1"}, []),
    ((3, 12), {"torch": "unknown", "numpy": "2.1"}, []),  # unparsable: let it through
])
def test_problems(python, versions, expected):
    found = _compat.problems(python=python, versions=versions)
    assert len(found) == len(expected), found
    for message, start in zip(found, expected):
        assert message.startswith(start), (message, start)


def test_python_newer_than_tested_warns(monkeypatch):
    monkeypatch.setattr(_compat, "MAX_PYTHON", (3, 9))
    monkeypatch.setattr(_compat, "MIN_PYTHON", (3, 8))
    with pytest.warns(RuntimeWarning, match="tested on Python 3.8 to 3.9"):
        _compat.check_versions()


def test_this_environment_passes():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compat.check_versions()


def test_installed_version_finds_the_imported_copy(monkeypatch):
    assert _compat.installed_version("torch") == torch.__version__
    monkeypatch.delitem(sys.modules, "torch")  # now from the metadata folder beside the package, as at import mha
    # PyPI's CUDA wheel says 2.11.0 in its metadata and 2.11.0+cu130 in torch.__version__
    assert Version(_compat.installed_version("torch")).public == Version(torch.__version__).public
    monkeypatch.delitem(sys.modules, "numpy")
    assert _compat.installed_version("numpy") == np.__version__
    assert _compat.installed_version("no_such_package_mha") is None


@pytest.mark.parametrize("module", ["__init__.py", "_compat.py"])
def test_an_old_python_gets_the_message_not_a_syntax_error(module):
    # `import mha` runs these two files before anything else: they must parse on old Pythons (3.7 grammar).
    import ast

    ast.parse((SRC / "mha" / module).read_text(), feature_version=(3, 7))
