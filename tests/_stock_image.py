"""A stock GPU image, simulated in this environment: every installed package that the image lacks is hidden.

The image (issue 29): Python, torch, Triton, NumPy, pytest, pandas, matplotlib, PyYAML and tqdm, with what they
need; no pooch, platformdirs, papermill, Jupyter, nbval, nbformat, Sphinx, submitit, hypothesis. :func:`stock_env`
writes a ``sitecustomize.py`` that hides every other distribution installed here (the closure of those packages'
requirements is kept): importing one of its modules raises ModuleNotFoundError, ``importlib.util.find_spec`` finds
none, and ``importlib.metadata.distributions()`` leaves it out (so pytest loads no plugin of it). Subprocesses run
with the returned environment inherit it (it is on PYTHONPATH), with ``src`` on the path as in a plain checkout.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

STOCK = ("torch", "triton", "numpy", "pytest", "pandas", "matplotlib", "PyYAML", "tqdm", "pip", "setuptools",
         "wheel")
MUST_HIDE = ("pooch", "platformdirs", "papermill", "jupyter_client", "jupytext", "nbval", "nbformat", "sphinx",
             "submitit", "hypothesis", "myst_nb")  # named by the issue (and what the test extra brings)
REPO = Path(__file__).resolve().parents[1]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def stock_closure() -> set[str]:
    """The distributions installed here that the stock image has: STOCK and what they require (no extras)."""
    from packaging.requirements import Requirement

    keep, todo = set(), [_normal(name) for name in STOCK]
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        keep.add(name)
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(_normal(requirement.name))
    return keep


def hidden() -> tuple[set[str], set[str], set[str]]:
    """(top-level module names to hide, where they are installed, distribution names to hide). A module of a hidden
    name found elsewhere (setuptools' vendored ``jaraco``, say) is not hidden: the stock image has it there too."""
    import site

    keep = stock_closure() | {"mha-derived"}
    dists = {_normal(d.metadata["Name"]) for d in metadata.distributions() if d.metadata["Name"]} - keep
    modules = set()
    for module, owners in metadata.packages_distributions().items():
        if module.isidentifier() and all(_normal(owner) in dists for owner in owners):
            modules.add(module)
    places = set()
    for folder in site.getsitepackages() + [site.getusersitepackages()]:
        for module in modules:
            candidates = [Path(folder) / module, Path(folder) / f"{module}.py", *Path(folder).glob(f"{module}.*.so")]
            for candidate in candidates:
                if candidate.exists():
                    places.add(str(candidate.resolve()))
    return modules, places, dists


SITECUSTOMIZE = '''"""Hide what a stock GPU image lacks (written by tests/_stock_image.py)."""
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import sys

HIDDEN = set({modules!r})
HIDDEN_PLACES = tuple({places!r})
HIDDEN_DISTS = set({dists!r})


def _hidden(name, path=None):
    """Whether ``name`` would be imported from a hidden package's files."""
    if name.partition(".")[0] not in HIDDEN:
        return False
    try:
        spec = importlib.machinery.PathFinder.find_spec(name, path)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    where = spec.origin if spec.origin not in (None, "namespace") else \\
        next(iter(spec.submodule_search_locations or []), "")
    where = os.path.realpath(where or "")
    return any(where == place or where.startswith(place + os.sep) for place in HIDDEN_PLACES)


class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if _hidden(name, path):
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on the stock GPU image)", name=name)
        return None


sys.meta_path.insert(0, _Hide())
_find_spec = importlib.util.find_spec


def find_spec(name, package=None):
    if "." not in name and _hidden(name):
        return None
    return _find_spec(name, package)


importlib.util.find_spec = find_spec
_distributions = importlib.metadata.distributions


def distributions(**kwargs):
    for dist in _distributions(**kwargs):
        name = dist.metadata["Name"] or ""
        if re.sub(r"[-_.]+", "-", name).lower() not in HIDDEN_DISTS:
            yield dist


importlib.metadata.distributions = distributions
'''


def stock_env(folder: Path, base: dict | None = None) -> dict:
    """An environment for subprocesses in which the packages the stock image lacks cannot be imported."""
    modules, places, dists = hidden()
    missing = [name for name in MUST_HIDE if name in sys_modules_installed() and name not in modules]
    if missing:
        raise AssertionError(f"the stock image's closure keeps {missing}, which it must hide")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE.format(modules=sorted(modules), places=sorted(places),
                                                                  dists=sorted(dists)))
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(REPO / "src")])
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def sys_modules_installed() -> set[str]:
    """Top-level module names installed here (whatever their distribution)."""
    return set(metadata.packages_distributions())
