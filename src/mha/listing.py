"""Helpers of the book's hidden cells that check a listing shown on a page against the package: the listing's source as
the reader sees it, one forward and backward pass that collects every gradient, and the largest difference found.

Book: part I, 'The whole layer in one screen of code' (the multi-head listing); part II, 'MQA and GQA' (the general
listing).
"""

from __future__ import annotations

import inspect
import pathlib

import torch

from mha._checks import check_type

__all__ = ["read_listing", "forward_backward", "MaxDifference", "padding_mask"]

# What a line must contain to count as one that reshapes, and so needs a shape comment.
_RESHAPES = (".view(", ".reshape(", "repeat_interleave", ".transpose(1, 2)")


def read_listing(page, marker: str, cls, history=None) -> list[str]:
    """The non-blank lines of the code cell of ``page`` (a MyST Markdown file) that contains ``marker``.

    ``history``: the kernel's input history (IPython's ``In``) when it keeps one; the newest cell holding ``marker`` is
    then the listing (nbval keeps none, and a page's source is read instead). Checks that the listing shown is the code
    that ran (``cls.forward``'s source appears in it) and that every line that reshapes carries a shape comment
    (``# (`` or ``: (``); raises AssertionError naming the line otherwise.
    """
    marker = check_type("marker", marker, str, "a string")
    cells = [cell for cell in (history or []) if marker in cell]
    if cells:
        listing = cells[-1]
    else:
        text = pathlib.Path(page).read_text(encoding="utf-8")
        found = [c for c in text.split("```{code-cell} ipython3")[1:] if marker in c]
        if not found:
            raise ValueError(f"page: no code cell of {str(page)!r} contains marker {marker!r}")
        listing = found[0].split("```")[0]
    forward = inspect.getsource(cls.forward).strip()
    assert forward in listing, f"{cls.__name__}.forward is not the listing on {page}"
    lines = [line for line in listing.splitlines() if line.strip()]
    for line in lines:
        if any(op in line for op in _RESHAPES):
            assert "# (" in line or ": (" in line, f"a line that reshapes has no shape comment: {line.strip()}"
    return lines


def forward_backward(module: torch.nn.Module, grad_out: torch.Tensor, *inputs: torch.Tensor, **kwargs) -> dict:
    """One forward and backward pass of ``module(*inputs, **kwargs) -> (out, weights)`` with ``grad_out`` as the
    gradient of the output: returns ``out``, ``weights``, the gradients of the inputs (``x_q``, then ``x_kv``) and of
    every parameter, by name. A module that returns no weights (a fused path) is called a second time, without
    gradients, with ``need_weights=True``."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    module.zero_grad()
    out, weights = module(*leaves, **kwargs)
    (out * grad_out).sum().backward()
    if weights is None:
        with torch.no_grad():
            weights = module(*inputs, **{**kwargs, "need_weights": True})[1]
    return {"out": out.detach(), "weights": weights.detach(), **dict(zip(("x_q", "x_kv"), (x.grad for x in leaves))),
            **{name: p.grad for name, p in module.named_parameters()}}


class MaxDifference:
    """Compares pairs of tensors or arrays in float64 (``torch.testing.assert_close``, tight tolerances) and keeps the
    largest absolute difference seen, ``.max``."""

    def __init__(self, rtol: float = 1e-10, atol: float = 1e-12):
        self.rtol, self.atol, self.max = rtol, atol, 0.0

    def close(self, actual, expected, what: str) -> None:
        """Raises AssertionError, prefixed with ``what``, when ``actual`` and ``expected`` differ."""
        a, b = (torch.as_tensor(t, dtype=torch.float64).detach() for t in (actual, expected))
        torch.testing.assert_close(a, b, rtol=self.rtol, atol=self.atol, msg=lambda m: f"{what}: {m}")
        self.max = max(self.max, float((a - b).abs().max()) if a.numel() else 0.0)


def padding_mask(lengths, l_kv: int) -> torch.Tensor:
    """Boolean ``(N, 1, 1, l_kv)``, True = may attend: sequence b keeps its first ``lengths[b]`` keys."""
    lengths = torch.as_tensor(lengths)
    return (torch.arange(l_kv)[None, :] < lengths[:, None])[:, None, None, :]
