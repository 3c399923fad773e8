"""A trainer's states out of accelerator memory between its steps (``run.offload_trainers``, OpenRLHF's DeepSpeed
sleep): after a weight push the consumer moves its weights, gradients, optimizer states and reference to host memory,
so colocated engines have the accelerator to themselves while they generate; its next call that needs them moves
them back first.

Tensors move in place (``tensor.data`` is re-pointed), so every holder (the optimizer, ZeRO's stores, hooks) keeps
the same objects; views of one storage move as one (a flat weight buffer stays one buffer, its parameters its views).
On a trainer that runs on the CPU nothing moves: its states already lie in host memory.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator

import torch

HOST = torch.device("cpu")

_SCANNED_PACKAGES = ("colossalai", "torch.optim", "coati")
"""whose objects' attributes are searched for tensors under an optimizer (ZeRO's parameter, gradient and bucket
stores live there); other objects are left alone"""


def state_tensors(modules: Iterable[torch.nn.Module | None], optimizer: object | None) -> list[torch.Tensor]:
    """Every tensor a trainer's step needs kept: the modules' parameters, their gradients and buffers, and whatever
    tensors its optimizer (a booster's wrapper, ZeRO's stores, the inner optimizer's state) holds; each once."""
    found: dict[int, torch.Tensor] = {}

    def add(t: torch.Tensor) -> None:
        found.setdefault(id(t), t)
        if t.grad is not None:
            found.setdefault(id(t.grad), t.grad)

    for module in modules:
        if module is not None:
            for t in module.parameters():
                add(t)
            for t in module.buffers():
                add(t)
    if optimizer is not None:
        for t in _tensors_under(optimizer):
            add(t)
    return list(found.values())


def _tensors_under(root: object, depth: int = 6) -> Iterator[torch.Tensor]:
    seen: set[int] = set()
    stack = [(root, 0)]
    while stack:
        obj, level = stack.pop()
        if id(obj) in seen or level > depth:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            yield obj
        elif isinstance(obj, dict):
            stack.extend((v, level + 1) for v in obj.values())
            stack.extend((k, level + 1) for k in obj if isinstance(k, torch.Tensor))
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend((v, level + 1) for v in obj)
        elif type(obj).__module__.startswith(_SCANNED_PACKAGES) and hasattr(obj, "__dict__"):
            if isinstance(obj, torch.nn.Module):
                continue  # modules are given whole (``modules``); a wrapper's model is not the optimizer's
            stack.extend((v, level + 1) for v in vars(obj).values())


@torch.no_grad()
def move_storages(tensors: Iterable[torch.Tensor], device: torch.device, copy: bool = False) -> list[torch.Tensor]:
    """Move each tensor's storage to ``device`` in place, the views of one storage as one; returns the tensors moved.
    A storage already on ``device`` stays (``copy``: it is copied there anyway, which checks the re-pointing on a
    machine with one device)."""
    groups: dict[tuple[torch.device, int], list[torch.Tensor]] = {}
    for t in tensors:
        if t.device.type == "meta" or (t.device == device and not copy):
            continue
        groups.setdefault((t.device, t.untyped_storage().data_ptr()), []).append(t)
    pinned = device.type == "cpu" and torch.cuda.is_available()
    for views in groups.values():
        whole = torch.empty(0, dtype=torch.uint8, device=views[0].device).set_(views[0].untyped_storage())
        target = torch.empty(whole.shape, dtype=torch.uint8, device=device, pin_memory=pinned)
        target.copy_(whole, non_blocking=pinned)
        home = target.untyped_storage()
        for t in views:
            t.data = torch.empty(0, dtype=t.dtype, device=device).set_(home, t.storage_offset(), t.size(), t.stride())
    if pinned:
        torch.cuda.synchronize()
    return [t for views in groups.values() for t in views]


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of the distinct storages under ``tensors``."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def accelerator_bytes(device: torch.device) -> int:
    """Accelerator memory this process holds in tensors (0 on a CPU)."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


class Residency:
    """Where a trainer's states are: on its device (resident) or parked in host memory. ``park`` after a push;
    ``ensure`` before anything reads or trains them moves back what ``park`` moved (states that live in host memory
    anyway, as ZeRO's offloaded optimizer states, stay there)."""

    def __init__(self, device: torch.device, modules, optimizer):
        self.device = device
        self._modules, self._optimizer = modules, optimizer
        """callables giving the modules and the optimizer as they are at the time of the move"""
        self._parked: list[torch.Tensor] | None = None
        self._copy = False
        """the parked states were copied even where they already lay, and go back the same way"""
        self.reload_s: float | None = None
        """seconds spent moving parked states back since the last training step reported them (None: none moved;
        ``reloaded``)"""

    @property
    def parked(self) -> bool:
        return self._parked is not None

    def park(self, copy: bool = False) -> dict:
        """Move the states on the device to host memory; returns the bytes moved, the seconds and the accelerator
        memory held before and after (0 bytes moved on a CPU trainer). ``copy``: move even what already lies in host
        memory (a copy on a CPU trainer: the re-pointing runs where nothing else would move)."""
        start, before = time.perf_counter(), accelerator_bytes(self.device)
        if self._parked is None:
            self._copy = copy
            self._parked = move_storages(state_tensors(self._modules(), self._optimizer()), HOST, copy)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return {
            "bytes": storage_bytes(self._parked),
            "seconds": time.perf_counter() - start,
            "resident_bytes": before,
            "parked_bytes": accelerator_bytes(self.device),
        }

    def ensure(self) -> float | None:
        """Move what ``park`` moved back to the device (the seconds add up in ``reload_s``); returns the seconds it
        took (None when resident)."""
        if self._parked is None:
            return None
        start = time.perf_counter()
        move_storages(self._parked, self.device, self._copy)
        self._parked = None
        seconds = time.perf_counter() - start
        self.reload_s = (self.reload_s or 0.0) + seconds
        return seconds

    def reloaded(self, metrics: dict, key: str = "time/trainer_reload") -> dict:
        """A training step's ``metrics`` with the seconds spent moving parked states back since the last step (as
        ``key``, only when they were parked)."""
        if self.reload_s is None:
            return metrics
        seconds, self.reload_s = self.reload_s, None
        return {**metrics, key: seconds}


def resident(method):
    """A consumer method that reads or trains the states: parked ones (its ``residency``'s) move back first."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        self.residency.ensure()
        return method(self, *args, **kwargs)

    return wrapper
