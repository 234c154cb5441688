"""Where a run's files go, and writing them so that a killed run never leaves half a file.

Book: part III (the committed ``results.csv`` and artifacts every chapter reads).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

__all__ = ["save_json", "artifacts_dir", "rounded"]


def save_json(content, path: str | os.PathLike, compact: bool = False) -> Path:
    """Write ``content`` as JSON to ``path`` atomically (a temporary file, then ``os.replace``); return the path.

    ``compact=True`` writes no whitespace (the artifacts the book plots); otherwise one key per line.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = json.dumps(content, separators=(",", ":")) if compact else json.dumps(content, indent=1)
    partial.write_text(text + "\n")
    os.replace(partial, path)
    return path


def artifacts_dir(out_dir: str | os.PathLike) -> Path:
    """Where a run keeps the files the book plots: ``DIR/artifacts/<run_id>/`` for a sweep's ``DIR/runs/<run_id>/``
    (``runs/`` is not committed, ``artifacts/`` is); any other ``out_dir`` keeps them itself."""
    out_dir = Path(out_dir)
    if out_dir.parent.name == "runs":
        return out_dir.parent.parent / "artifacts" / out_dir.name
    return out_dir


def rounded(value, digits: int = 4):
    """Floats to ``digits`` significant digits (small JSON files); lists and dicts recursively; inf/nan as text."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if math.isfinite(value) else str(value)
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    return value
