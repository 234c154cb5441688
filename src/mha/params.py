"""The NumPy exchange of a torch attention module's weights, shared by ``MultiHeadAttention`` and
``MultiHeadLatentAttention``: each module lists its parameters as *specs*, ``key -> (tensor, shape in the params
dict, stored transposed?)`` in the convention of the NumPy reference ``mha.reference`` (row vectors, Y = X W, so a
weight stored by ``nn.Linear`` as W^T is transposed on the way out and back in). ``export_specs`` writes the params
dict; ``load_specs`` checks a params dict against the specs, every key, shape and dtype before anything is written,
and copies it in.

Book: part I, "From one head to h heads" (the parameter names).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["export_specs", "load_specs"]

Spec = tuple[torch.Tensor, tuple[int, ...], bool]  # (the module's tensor, its shape in the params dict, transposed?)


def export_specs(specs: dict[str, Spec]) -> dict[str, np.ndarray]:
    """The params dict: float64 arrays on the CPU, transposed where the module stores W^T."""
    out = {}
    for name, (tensor, _, transposed) in specs.items():
        t = tensor.detach().to(device="cpu", dtype=torch.float64)
        out[name] = np.ascontiguousarray((t.T if transposed else t).numpy())
    return out


def load_specs(specs: dict[str, Spec], params, options: str, sizes: str) -> None:
    """Copy ``params`` (arrays or tensors) into the tensors of ``specs``, each keeping its dtype and device.

    Checked before anything is written: ``params`` is a dict (TypeError); its keys are those of ``specs``, a key
    whose value is None counting as absent (ValueError naming the missing or unexpected keys and ``options``, what
    decides the keys, e.g. "bias=True, sinks=True"); each value has its spec's shape (ValueError naming ``sizes``,
    what decides the shapes, e.g. "d_model=16, n_heads=4") and holds real numbers (TypeError).
    """
    if not hasattr(params, "keys"):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    params = {key: value for key, value in params.items() if value is not None}  # None = absent (as in reference)
    missing = sorted(set(specs) - set(params))
    if missing:
        raise ValueError(f"params is missing {missing} (module has {options}); expected keys {sorted(specs)}")
    extra = sorted(set(params) - set(specs))
    if extra:
        raise ValueError(f"params has unexpected keys {extra} (module has {options}); expected keys {sorted(specs)}")
    values = {}
    for name, (_, shape, transposed) in specs.items():
        value = params[name]
        if not isinstance(value, torch.Tensor):
            value = torch.as_tensor(np.asarray(value))
        if tuple(value.shape) != shape:
            raise ValueError(f"params[{name!r}] must have shape {shape} ({sizes}), got shape {tuple(value.shape)}")
        if not (value.dtype.is_floating_point or value.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"params[{name!r}] must hold real numbers, got dtype {value.dtype}")
        values[name] = value.T if transposed else value
    with torch.no_grad():
        for name, (tensor, _, _) in specs.items():
            tensor.copy_(values[name].to(device=tensor.device, dtype=tensor.dtype))
