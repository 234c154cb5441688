"""What ran, and how: device choice, the CPU or GPU name, thread counts and seeding.

Book: part III (every chapter records the machine beside its results). Runs are bit-for-bit reproducible on one
CPU model with one thread count (and one torch build); :func:`machine_info` records both with every run, so a
result can be traced to the machine that made it. :func:`machine_record` is the same record with what a benchmark
adds (logical CPUs, Triton, the GPU and CUDA settings): the one record of the machine that ``python -m mha.bench``,
``python -m mha.kernels.benchmark`` and ``python -m mha.experiments.gpu_run`` write. :func:`machine_load` is how
busy the machine was (logical CPUs, load average), and :func:`git_commit` the code that ran.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from mha._checks import check_int

__all__ = ["seed_everything", "resolve_device", "cpu_model", "cpu_id", "cpu_capability", "device_name", "set_threads",
           "synchronize", "machine_info", "machine_record", "device_slug", "load_average", "machine_load", "git",
           "git_commit"]

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""The environment variables that size the CPU thread pools (read when torch starts)."""


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy and torch (all devices)."""
    seed = check_int("seed", seed, minimum=0)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """"auto" -> CUDA when available, else CPU; any other string is passed to ``torch.device``."""
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'auto', 'cpu' or 'cuda:0', got {type(device).__name__}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device must be 'auto' or a torch device string ('cpu', 'cuda', 'cuda:1'), got "
                         f"{device!r}") from error


def device_problem(device: str | torch.device) -> str | None:
    """None when this machine can run on ``device`` ("auto" always can); otherwise why not, in words."""
    device = resolve_device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available here (torch.cuda.is_available() is False)"
        if device.index is not None and device.index >= torch.cuda.device_count():
            return f"this machine has {torch.cuda.device_count()} CUDA device(s), numbered from 0"
    elif device.type == "mps" and not torch.backends.mps.is_available():
        return "MPS is not available here (torch.backends.mps.is_available() is False)"
    elif device.type not in ("cpu", "cuda", "mps"):
        return f"the package runs on 'cpu', 'cuda' or 'mps' devices, not {device.type!r}"
    return None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what ``platform`` knows, else "unknown"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_id() -> str:
    """The CPU's model name with its family, model and stepping numbers (virtual machines often report only a brand
    such as "AMD EPYC"; the numbers tell two such CPUs apart), e.g. "AMD EPYC (family 25, model 1, stepping 1)"."""
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("cpu family", "model", "stepping") and key not in fields:
                fields[key] = value.strip()
            if not line.strip() and fields:
                break  # the first processor's block is enough
    except OSError:
        pass
    numbers = ", ".join(f"{'family' if k == 'cpu family' else k} {v}" for k, v in fields.items())
    return f"{cpu_model()} ({numbers})" if numbers else cpu_model()


def cpu_capability() -> str:
    """The vector instruction set torch's CPU kernels use ("AVX2", "AVX512", "DEFAULT", ...): it decides which
    kernels run, hence the order of floating-point operations."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # older torch
        return "unknown"


def device_name(device: torch.device) -> str:
    """What ran: the GPU's name on CUDA (e.g. "NVIDIA H100 80GB HBM3"), else the CPU's model (:func:`cpu_model`)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def set_threads(threads: int) -> int:
    """Use ``threads`` CPU threads in torch (and tell OpenMP/MKL, for libraries started after this call)."""
    threads = check_int("threads", threads)
    for variable in THREAD_VARIABLES:
        os.environ[variable] = str(threads)
    torch.set_num_threads(threads)
    return threads


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing on CPU. Timings are taken between two of these."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine_info(device: torch.device) -> dict:
    """The fields every results row records about the machine: device, its name, the CPU model, torch's thread
    count, torch and Python versions."""
    return dict(device=device.type, device_name=device_name(device), cpu_model=cpu_model(), cpu_id=cpu_id(),
                cpu_capability=cpu_capability(), num_threads=torch.get_num_threads(), torch_version=torch.__version__,
                python_version=platform.python_version())


def load_average() -> tuple[float, float, float] | None:
    """The system's load average over 1, 5 and 15 minutes (``os.getloadavg``); None where the system has none."""
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def machine_load() -> dict:
    """How busy the machine is: ``cpu_count`` (logical CPUs) and ``load_average_1min`` (None where unknown), the
    fields a timed run records beside its wall times."""
    load = load_average()
    return dict(cpu_count=os.cpu_count(), load_average_1min=None if load is None else load[0])


def git(folder: str | os.PathLike, *args: str) -> str | None:
    """The output of ``git args...`` run in ``folder`` (stripped); None when git fails, is missing, or ``folder``
    is in no git repository."""
    try:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def git_commit(folder: str | os.PathLike) -> str | None:
    """HEAD of the git repository holding ``folder`` (40 hex digits); None outside one."""
    return git(folder, "rev-parse", "HEAD")


def device_slug(device: torch.device) -> str:
    """A file-name-safe label of the machine: ``<type>-<name>``, e.g. "cpu-amd-epyc", "cuda-nvidia-h100-80gb-hbm3"."""
    return f"{device.type}-{re.sub(r'[^a-z0-9]+', '-', device_name(device).lower()).strip('-')}"


def _package_version(name: str) -> str | None:
    """The version of ``name``: the imported module's, else the installed distribution's (without importing it);
    None when it is not installed."""
    version = getattr(sys.modules.get(name), "__version__", None)
    if version is not None:
        return str(version)
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_record(device: str | torch.device) -> dict:
    """Everything a benchmark records about the machine, as one JSON-ready dict.

    ``type``, ``name`` (GPU name, or the CPU model), ``slug`` (:func:`device_slug`), ``cpu`` (model), ``cpu_id``,
    ``cpu_capability``, ``cpu_count`` (logical CPUs), ``num_threads`` (torch's), ``torch_version``,
    ``python_version``, ``triton_version`` (None when Triton is not installed), and ``cuda``: None on a CPU, else
    the GPU's ``capability``, ``memory_gib``, the ``gpu_count``, ``cuda_version``, ``cudnn_version``,
    ``allow_tf32_matmul`` and ``float32_matmul_precision``. The facts are :func:`machine_info`'s, under these names.
    """
    device = resolve_device(device)
    info = machine_info(device)
    record = dict(type=info["device"], name=info["device_name"], slug=device_slug(device), cpu=info["cpu_model"],
                  cpu_id=info["cpu_id"], cpu_capability=info["cpu_capability"], cpu_count=os.cpu_count(),
                  num_threads=info["num_threads"], torch_version=info["torch_version"],
                  python_version=info["python_version"], triton_version=_package_version("triton"), cuda=None)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        record["cuda"] = dict(capability=f"{props.major}.{props.minor}",
                              memory_gib=round(props.total_memory / 2**30, 1), gpu_count=torch.cuda.device_count(),
                              cuda_version=torch.version.cuda, cudnn_version=torch.backends.cudnn.version(),
                              allow_tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                              float32_matmul_precision=torch.get_float32_matmul_precision())
    return record
