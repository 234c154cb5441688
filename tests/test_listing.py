"""mha.listing, the helpers of the book's hidden cells that check a listing on a page: each against an independent
computation (autograd called directly, the exercises' NumPy padding mask, a page written here)."""

import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from mha.exercises.runner import padding_mask as numpy_padding_mask
from mha.listing import MaxDifference, forward_backward, padding_mask, read_listing


class _Tiny(nn.Module):
    def __init__(self, weights=True):
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.weights = weights

    def forward(self, x_q, x_kv=None, need_weights=False):
        x_kv = x_q if x_kv is None else x_kv
        out = self.proj(x_q) * x_kv.sum()
        return out, (out.detach() if (self.weights or need_weights) else None)


def test_forward_backward_gives_autograds_gradients():
    torch.manual_seed(0)
    module = _Tiny().double()
    x_q, x_kv, grad_out = (torch.randn(2, 3, dtype=torch.float64) for _ in range(3))
    got = forward_backward(module, grad_out, x_q, x_kv)
    leaves = [x_q.clone().requires_grad_(), x_kv.clone().requires_grad_()]
    out = module.proj(leaves[0]) * leaves[1].sum()
    expected = torch.autograd.grad((out * grad_out).sum(), [*leaves, module.proj.weight, module.proj.bias])
    for key, value in zip(("x_q", "x_kv", "proj.weight", "proj.bias"), expected):
        torch.testing.assert_close(got[key], value)
    torch.testing.assert_close(got["out"], out.detach())
    assert not x_q.requires_grad and x_q.grad is None  # the caller's tensors are left alone


def test_forward_backward_asks_a_fused_path_for_its_weights():
    module = _Tiny(weights=False).double()
    x = torch.randn(2, 3, dtype=torch.float64)
    got = forward_backward(module, torch.ones(2, 3, dtype=torch.float64), x)
    torch.testing.assert_close(got["weights"], module(x, need_weights=True)[0].detach())


def test_max_difference_keeps_the_largest_and_names_a_mismatch():
    diff = MaxDifference()
    diff.close(np.array([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-13], dtype=torch.float64), "first")
    diff.close(np.zeros(0), np.zeros(0), "empty")
    assert 0 < diff.max <= 1e-12
    with pytest.raises(AssertionError, match="^second: "):
        diff.close(torch.tensor([1.0]), torch.tensor([1.1]), "second")


def test_padding_mask_matches_the_exercises_numpy_mask():
    for lengths, l_kv in (([6, 2], 6), ([0, 3, 5], 5), ([1], 4)):
        np.testing.assert_array_equal(padding_mask(lengths, l_kv).numpy(), numpy_padding_mask(lengths, l_kv))


class Shown(nn.Module):
    def forward(self, x):
        return x.view(2, 3)  # (6,) -> (2, 3)


def _page(tmp_path, body):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n```{code-cell} ipython3\n" + body + "```\n\nText.\n", encoding="utf-8")
    return page


SHOWN = textwrap.dedent('''\
    class Shown(nn.Module):

        def forward(self, x):
            return x.view(2, 3)  # (6,) -> (2, 3)
    ''')


def test_read_listing_returns_the_cells_nonblank_lines(tmp_path):
    page = _page(tmp_path, SHOWN)
    assert read_listing(page, "class Shown", Shown) == [line for line in SHOWN.splitlines() if line.strip()]
    # the kernel's history wins over the page when it holds the marker
    assert read_listing(tmp_path / "missing.md", "class Shown", Shown, ["x = 1", SHOWN]) == read_listing(
        page, "class Shown", Shown)


def test_read_listing_refuses_a_listing_that_is_not_the_code_that_ran(tmp_path):
    page = _page(tmp_path, SHOWN.replace("x.view(2, 3)", "x.view(3, 2)"))
    with pytest.raises(AssertionError, match="Shown.forward is not the listing"):
        read_listing(page, "class Shown", Shown)


class Bare(nn.Module):
    def forward(self, x):
        return x.reshape(2, 3)


def test_read_listing_wants_a_shape_comment_on_every_reshape(tmp_path):
    body = "class Bare(nn.Module):\n    def forward(self, x):\n        return x.reshape(2, 3)\n"
    with pytest.raises(AssertionError, match="no shape comment: return x.reshape"):
        read_listing(_page(tmp_path, body), "class Bare", Bare)


def test_read_listing_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="no code cell of .* contains marker 'class Nowhere'"):
        read_listing(_page(tmp_path, SHOWN), "class Nowhere", Shown)
    with pytest.raises(TypeError, match="marker must be a string, got int"):
        read_listing(_page(tmp_path, SHOWN), 3, Shown)
