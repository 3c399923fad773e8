"""Make ColossalAI 0.5.0 train on machines without CUDA. Applied only when CUDA is absent; each shim names what it
works around. With CUDA, nothing here runs and ColossalAI is used as shipped.

1. HybridAdam/CPUAdam: the x86 CPU-Adam kernel includes CUDA headers, so on a CPU-only machine no kernel loads ("No
   usable kernel found for CPUAdamLoader"). The portable kernel (shipped for aarch64) would build on x86, but off
   aarch64 it runs its scalar loop, which reads and writes every element through a dtype switch: 0.29 s per step of
   135M fp32 parameters on one thread, against 0.063 s for torch's fused CPU Adam kernel. So the loader hands
   HybridAdam an update of the same interface and formula on torch's fused kernel (no build needed);
   HybridAdam keeps its parameter groups, state and checkpoint format.
2. ZeRO-1/2, TP and PP call CUDA-only APIs: ``torch.cuda.Stream``/``Event``/``current_stream``/``stream`` (made
   no-ops), ``get_accelerator().get_rng_state(device)`` (CPU takes no device argument), ``manual_seed`` (refused by the
   CPU accelerator), ``torch.distributed.is_hccl_available`` (absent from CPU builds), and an accelerator-name assertion
   in the ZeRO optimizer ("device is required") that rejects "cpu".
3. The MoE plugin's checkpoint writer (``MoECheckpointIO``, expert parallelism) moves each expert tensor and
   optimizer state to CUDA with ``.cuda()`` before gathering it: there, ``.cuda()`` leaves a tensor where it is.
"""

from __future__ import annotations

import contextlib
import types

import torch
from torch.optim.adam import adam as torch_adam

_applied = False


def apply_cpu_shims() -> bool:
    """Install the shims once per process when CUDA is unavailable; returns whether they are active."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    _fused_cpu_adam()
    _cuda_stream_noops()
    _accelerator_rng_state()
    if not hasattr(torch.distributed, "is_hccl_available"):
        torch.distributed.is_hccl_available = lambda: False
    _zero_device_check()
    _moe_checkpoint_in_place()
    _applied = True
    return True


class TorchFusedCpuAdam:
    """ColossalAI's ``CPUAdamOptimizer`` interface, one tensor per ``step`` call, on torch's fused CPU Adam kernel.

    The update of ColossalAI's CPU kernels: m <- b1 m + (1 - b1) g, v <- b2 v + (1 - b2) g^2,
    p <- p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps), with AdamW's decoupled decay p <- (1 - lr wd) p first
    when ``adamw_mode``, else wd p added to g (L2). ``div_scale > 0`` divides the gradient first; without
    ``bias_correction`` the (1 - b^t) factors are 1 (torch's fused kernel always corrects, so that case runs unfused).
    """

    def __init__(self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, adamw_mode: bool):
        self.adamw_mode = adamw_mode  # the other arguments arrive again with every step, as the kernels take them

    def step(
        self,
        step: int,
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
        weight_decay: float,
        bias_correction: bool,
        params: torch.Tensor,
        grads: torch.Tensor,
        exp_avg: torch.Tensor,
        exp_avg_sq: torch.Tensor,
        div_scale: float = -1,
    ) -> None:
        if bias_correction:
            # torch's kernel adds one to the step itself, as its optimizer does before calling it; it divides each
            # gradient by grad_scale as it reads it (leaving the divided gradient behind, as the unfused path would)
            scale = torch.tensor(float(div_scale)) if div_scale > 0 else None
            torch_adam(
                [params],
                [grads],
                [exp_avg],
                [exp_avg_sq],
                [],
                [torch.tensor(float(step - 1))],
                fused=True,
                grad_scale=scale,
                decoupled_weight_decay=self.adamw_mode,
                amsgrad=False,
                beta1=beta1,
                beta2=beta2,
                lr=lr,
                weight_decay=weight_decay,
                eps=eps,
                maximize=False,
            )
            return
        if div_scale > 0:
            grads = grads / div_scale
        if weight_decay and self.adamw_mode:
            params.mul_(1 - lr * weight_decay)
        elif weight_decay:
            grads = grads.add(params, alpha=weight_decay)
        exp_avg.mul_(beta1).add_(grads, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grads, grads, value=1 - beta2)
        params.addcdiv_(exp_avg, exp_avg_sq.sqrt().add_(eps), value=-lr)


class _TorchFusedCpuAdamKernel:
    """Stands where a ColossalAI CPU-Adam extension stands in ``CPUAdamLoader.REGISTRY``."""

    name, priority = "torch_fused_cpu_adam", 1

    def is_available(self) -> bool:
        return True

    def assert_compatible(self) -> None:
        pass

    def load(self):
        return types.SimpleNamespace(CPUAdamOptimizer=TorchFusedCpuAdam)


def _fused_cpu_adam() -> None:
    from colossalai.kernel.kernel_loader import CPUAdamLoader

    CPUAdamLoader.REGISTRY = [_TorchFusedCpuAdamKernel]


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

    src = low_level.get_accelerator

    class _NamedAsDevice:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, item):
            if item == "name":
                return "cuda"
            return getattr(self._inner, item)

    low_level.get_accelerator = lambda: _NamedAsDevice(src())


@contextlib.contextmanager
def _cuda_in_place():
    """Within the block, ``Tensor.cuda()`` returns the tensor itself."""
    real = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.cuda = real


def _moe_checkpoint_in_place() -> None:
    from colossalai.checkpoint_io.moe_checkpoint import MoECheckpointIO

    gather = MoECheckpointIO.gather_from_sharded_optimizer_state
    pre_save = MoECheckpointIO.pre_save_model

    def gather_here(*args, **kwargs):
        with _cuda_in_place():
            return gather(*args, **kwargs)

    def pre_save_here(self, *args, **kwargs):
        with _cuda_in_place():
            return pre_save(self, *args, **kwargs)

    MoECheckpointIO.gather_from_sharded_optimizer_state = staticmethod(gather_here)
    MoECheckpointIO.pre_save_model = pre_save_here
