"""Cores lent to a call in progress, for producers (a rollout round) and consumers (a training step) alike.

The driver shares a node's cores among the actors working on it: a call starts with its share, and when the other
side stops working the driver lends its cores to the call still running (``lend``, arriving on another thread). The
working thread takes them up at the next point where it applies the lease (``apply``): a decode step for the engine,
a pass, or a decoder layer of the trained model in its forward and its backward (``follow_layers``). OpenMP's thread
count belongs to the calling thread, so only the working thread may change it; the lent cores go back when the call
ends. A lend names its call, so one that arrives late never reaches a later call. ``cores`` gives a piece of work
outside a call (a push's reload, say) the cores the driver names for it.
"""

from __future__ import annotations

import contextlib
import os

import torch

SET_NUM_THREADS = torch.set_num_threads
"""torch's own setter, kept before any engine loads (this module is imported before one is): vLLM's CPU worker replaces
``torch.set_num_threads`` with a no-op (it assumes threads bound to cores; coati leaves them unbound), which would keep
generation on one thread however many cores it is given"""


@contextlib.contextmanager
def cores(n: int | None):
    """The calling thread runs with ``n`` threads inside (None: as it is), then with those it had."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    SET_NUM_THREADS(n)
    try:
        yield
    finally:
        SET_NUM_THREADS(before)


class ThreadLease:
    def __init__(self, base: int | None = None):
        self.base = int(os.environ.get("COATI_THREADS", "1")) if base is None else base
        """this actor's own threads between calls (None: ``COATI_THREADS``, default 1), set with torch's own setter
        (``SET_NUM_THREADS``)"""
        self.call, self.lent, self.started, self.used = None, (-1, self.base), 0, 0
        """the call in progress (its number, None between calls), the (call, threads) lent for it, and the threads
        the call started with and the most it has run with (read back from torch, so what the work got, not what was
        asked)"""
        SET_NUM_THREADS(self.base)

    @contextlib.contextmanager
    def running(self, call: int | None, threads: int | None):
        """Run call ``call`` with ``threads`` (None: ``base``), raised by a lend for it, then give the cores back."""
        self.call = call
        SET_NUM_THREADS(threads or self.base)
        self.started, self.used = torch.get_num_threads(), 0
        self.apply()  # a lend that arrived before its call started still holds
        try:
            yield
        finally:
            SET_NUM_THREADS(self.base)
            self.call = None

    def counts(self) -> dict[str, int]:
        """The threads the call in progress started with, the most it ran with, and those it has now (cores lent,
        taken back)."""
        return {"threads_start": self.started, "threads": self.used, "threads_end": torch.get_num_threads()}

    def lend(self, n: int, call: int) -> None:
        """Call ``call`` uses ``n`` threads from the working thread's next ``apply`` on (more than it has: cores lent;
        fewer: cores lent earlier taken back)."""
        self.lent = (call, n)

    def apply(self) -> None:
        """In the working thread, between two pieces of work: take up a lend for the call in progress."""
        if self.call is not None and self.lent[0] == self.call and torch.get_num_threads() != self.lent[1]:
            SET_NUM_THREADS(self.lent[1])
        self.used = max(self.used, torch.get_num_threads())

    def follow_layers(self, model: torch.nn.Module) -> int:
        """Apply the lease before each decoder layer's forward and after its backward, so that a step of a single
        pass takes up cores lent mid-pass. The layers are the modules of the classes a transformers model names in
        ``_no_split_modules``; returns how many were hooked (0: the lease is applied between passes only)."""
        names = {n for m in model.modules() for n in (getattr(m, "_no_split_modules", None) or ())}
        layers = [m for m in model.modules() if type(m).__name__ in names]

        def before(module, args, kwargs):
            self.apply()
            hidden = args[0] if args else kwargs.get("hidden_states")
            if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
                hidden.register_hook(self._after_backward)  # its gradient is complete once the layer's backward is

        for layer in layers:
            layer.register_forward_pre_hook(before, with_kwargs=True)
        return len(layers)

    def _after_backward(self, grad: torch.Tensor) -> None:
        self.apply()
