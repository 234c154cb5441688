"""Supported versions of Python, NumPy and PyTorch, checked once when ``mha`` is imported.

``pip`` enforces ``pyproject.toml``'s ranges when it installs the package, but not when ``src/`` is put on
``sys.path`` by hand, nor when torch or numpy is changed after the install. So ``mha/__init__.py`` calls
``check_versions()``: an unsupported version raises ``UnsupportedVersionError`` (an ``ImportError``) at
``import mha`` -- before any submodule can fail later with an obscure ``TypeError`` (say, ``enable_gqa`` unknown
to an old ``F.scaled_dot_product_attention``) -- naming what is installed, what is needed and the command that
fixes it.

The check stays cheap (``import mha`` imports neither torch nor numpy): it reads the version of the copy that
*would* be imported from the metadata folder next to it (``torch-2.13.0+cpu.dist-info``), falling back to
``importlib.metadata``. A package that is not installed at all is not an error here (``mha.reference`` and
``mha.counting`` need only NumPy); importing a module that needs it then fails with the usual
``ModuleNotFoundError``. Only ``major.minor`` is compared, so a development build of a supported release
(``2.5.0a0+git...``, as NVIDIA's containers ship) counts as that release.

Set ``MHA_SKIP_VERSION_CHECK=1`` to import anyway (say, to try a build that is older than the floor).

Keep the floors in step with ``pyproject.toml``'s ``requires-python`` and ``dependencies``
(``tests/test_environment.py`` checks that they agree). This module must stay importable by old Pythons (no
syntax newer than 3.7; tests/test_compat.py parses it so), so that they get the message rather than a ``SyntaxError``.
"""

from __future__ import annotations

import os
import re
import sys
import warnings

MIN_PYTHON = (3, 10)
MAX_PYTHON = (3, 13)  # newest Python tested; a newer one gets a warning, not an error
# package -> (oldest supported major.minor, what sets that floor)
MIN_VERSIONS = {
    "numpy": ((1, 24), "the oldest NumPy tested (CI: Python 3.10, torch 2.5)"),
    "torch": ((2, 5), "F.scaled_dot_product_attention(..., enable_gqa=True) arrived in PyTorch 2.5"),
}
SKIP_ENV = "MHA_SKIP_VERSION_CHECK"
_INSTALL_HINT = {
    "torch": ('pip install --upgrade "torch>={v}"  (for a CUDA build, pick the command for your machine at '
              "https://pytorch.org/get-started/locally/)"),
    "numpy": 'pip install --upgrade "numpy>={v}"',
}


class UnsupportedVersionError(ImportError):
    """Python, NumPy or PyTorch is older than ``mha`` supports."""


def _fmt(version):
    return ".".join(str(part) for part in version)


def _release(version):
    """(major, minor) of a version string: '2.13.0+cpu' -> (2, 13), '2.5.0a0+git1234' -> (2, 5); None if unparsable."""
    m = re.match(r"\s*v?(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def installed_version(name):
    """The version of the copy of ``name`` that ``import name`` would load, without importing it; None if absent."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    module = sys.modules.get(name)
    if module is not None and isinstance(getattr(module, "__version__", None), str):
        return module.__version__
    locations = list(spec.submodule_search_locations or [])
    if not locations and spec.origin:
        locations = [spec.origin]
    for location in locations:
        parent = os.path.dirname(os.path.abspath(location))
        try:
            entries = os.listdir(parent)
        except OSError:
            continue
        for entry in entries:  # torch-2.13.0+cpu.dist-info, numpy-1.24.4.dist-info, torch-2.1.0-py3.11.egg-info
            m = re.match(rf"^{re.escape(name)}-([^-]+?)(-py[\d.]+)?\.(dist|egg)-info$", entry, re.IGNORECASE)
            if m:
                return m.group(1)
    try:  # an unusual layout (a source checkout, a zip): ask importlib.metadata (slower, so only now)
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:
        return None
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def problems(python=None, versions=None):
    """Messages for everything unsupported: ``python`` is a version tuple (default: this interpreter),
    ``versions`` maps package -> version string or None (default: what ``installed_version`` finds)."""
    python = tuple(sys.version_info[:2] if python is None else python[:2])
    found = []
    if python < MIN_PYTHON:
        found.append(f"Python {_fmt(python)} is too old: mha needs Python >= {_fmt(MIN_PYTHON)} (supported: "
                     f"{_fmt(MIN_PYTHON)} to {_fmt(MAX_PYTHON)}). Create an environment with a newer Python, e.g. "
                     f"python{_fmt(MAX_PYTHON)} -m venv .venv")
    if versions is None:
        versions = {name: installed_version(name) for name in MIN_VERSIONS}
    for name, (floor, reason) in MIN_VERSIONS.items():
        have = versions.get(name)
        release = None if have is None else _release(have)
        if release is not None and release < floor:
            hint = _INSTALL_HINT[name].format(v=_fmt(floor))
            found.append(f"{name} {have} is too old: mha needs {name} >= {_fmt(floor)} ({reason}). "
                         f"Upgrade it: {hint}")
    return found


def check_versions():
    """Raise ``UnsupportedVersionError`` naming every unsupported version; warn on a Python newer than tested."""
    if os.environ.get(SKIP_ENV, "") not in ("", "0"):
        return
    found = problems()
    if found:
        raise UnsupportedVersionError(
            "mha cannot run in this environment:\n  - " + "\n  - ".join(found)
            + f"\n(supported: Python {_fmt(MIN_PYTHON)}-{_fmt(MAX_PYTHON)}, "
            + ", ".join(f"{name} >= {_fmt(floor)}" for name, (floor, _) in MIN_VERSIONS.items())
            + f"; set {SKIP_ENV}=1 to import anyway)")
    if tuple(sys.version_info[:2]) > MAX_PYTHON:
        warnings.warn(f"mha is tested on Python {_fmt(MIN_PYTHON)} to {_fmt(MAX_PYTHON)}; this is Python "
                      f"{_fmt(sys.version_info[:2])}", RuntimeWarning, stacklevel=3)
