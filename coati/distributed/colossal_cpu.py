"""Make ColossalAI 0.5.0 train on machines without CUDA. Applied only when CUDA is absent; each shim names what it
works around. With CUDA, nothing here runs and ColossalAI is used as shipped.

1. HybridAdam/CPUAdam: the x86 CPU-Adam kernel includes CUDA headers, so on a CPU-only machine no kernel loads ("No
   usable kernel found for CPUAdamLoader"). The portable kernel (shipped for aarch64, plain C++ with a scalar
   fallback) builds on x86 too: we register it as available. One JIT build (~30 s), cached under ~/.cache/colossalai.
2. ZeRO-1/2, TP and PP call CUDA-only APIs: ``torch.cuda.Stream``/``Event``/``current_stream``/``stream`` (made
   no-ops), ``get_accelerator().get_rng_state(device)`` (CPU takes no device argument),
   ``manual_seed`` (refused by the CPU accelerator), ``torch.distributed.is_hccl_available`` (absent from CPU builds), and an accelerator-name assertion in the ZeRO
   optimizer ("device is required") that rejects "cpu".
"""

from __future__ import annotations

import contextlib

import torch

_applied = False


def apply_cpu_shims() -> bool:
    """Install the shims once per process when CUDA is unavailable; returns whether they are active."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    _portable_cpu_adam()
    _cuda_stream_noops()
    _accelerator_rng_state()
    if not hasattr(torch.distributed, "is_hccl_available"):
        torch.distributed.is_hccl_available = lambda: False
    _zero_device_check()
    _applied = True
    return True


def _portable_cpu_adam() -> None:
    from colossalai.kernel.extensions.pybind.cpu_adam.cpu_adam_arm import CpuAdamArmExtension
    from colossalai.kernel.kernel_loader import CPUAdamLoader

    class PortableCpuAdamExtension(CpuAdamArmExtension):
        def is_available(self) -> bool:
            return True

        def assert_compatible(self) -> None:
            pass

    if PortableCpuAdamExtension not in CPUAdamLoader.REGISTRY:
        CPUAdamLoader.REGISTRY = [PortableCpuAdamExtension]


class _NoopStream:
    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, *args, **kwargs):
        pass

    def wait_event(self, *args, **kwargs):
        pass

    def record_event(self, *args, **kwargs):
        return _NoopEvent()

    def synchronize(self):
        pass


class _NoopEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args, **kwargs):
        pass

    def wait(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True


def _cuda_stream_noops() -> None:
    torch.cuda.Stream = _NoopStream
    torch.cuda.Event = _NoopEvent
    torch.cuda.current_stream = lambda *a, **k: _NoopStream()
    torch.cuda.default_stream = lambda *a, **k: _NoopStream()
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    torch.Tensor.record_stream = lambda self, *a, **k: None
    from colossalai.accelerator import get_accelerator

    acc = get_accelerator()
    for name in ("Stream", "Event"):
        setattr(acc, name, _NoopStream if name == "Stream" else _NoopEvent)
    acc.current_stream = lambda *a, **k: _NoopStream()
    acc.stream = lambda *a, **k: contextlib.nullcontext()
    acc.synchronize = lambda *a, **k: None


def _accelerator_rng_state() -> None:
    from colossalai.accelerator import get_accelerator

    acc = get_accelerator()
    # CpuAccelerator.get_rng_state(device) forwards the device to torch.get_rng_state(), which takes none.
    acc.get_rng_state = lambda device=None: torch.get_rng_state()
    acc.set_rng_state = lambda new_state, device=None: torch.set_rng_state(new_state)
    # The CPU accelerator refuses to seed (TP's vocab-parallel embedding forks a seeded RNG): the CPU generator is it.
    acc.manual_seed = lambda seed: torch.manual_seed(seed)
    acc.manual_seed_all = lambda seed: torch.manual_seed(seed)


def _zero_device_check() -> None:
    # The ZeRO optimizer asserts get_accelerator().name in ["cuda", "npu"] to mean "a device exists"; the CPU
    # accelerator is a device for our purposes.
    import colossalai.zero.low_level.low_level_optim as low_level

    src = getattr(low_level, "get_accelerator")

    class _NamedAsDevice:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, item):
            if item == "name":
                return "cuda"
            return getattr(self._inner, item)

    low_level.get_accelerator = lambda: _NamedAsDevice(src())
