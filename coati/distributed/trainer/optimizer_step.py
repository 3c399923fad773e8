"""The consumer's optimizer steps: the learning rate of each (the schedule), the guard that skips a step whose loss or
gradient norm is not finite, and the gradient clip where ``grad_clip.fold_clipping`` moved it into the update. The
consumer calls ``step`` once per minibatch and reads ``report`` once per training step; what it trains and how
(forward, backward, gradient sync) stays in ``consumer.py``.
"""

from __future__ import annotations

import numpy as np
import torch

from coati.distributed.trainer.config import ConsumerConfig
from coati.distributed.trainer.grad_clip import clip_divisor
from coati.distributed.trainer.schedule import lr_factor


class OptimizerSteps:
    """Wraps a boosted ColossalAI optimizer (plain, mixed precision or ZeRO wrapper). Those wrappers compute the
    global gradient norm, then call the inner optimizer's ``step``: the guard sits there, so every rank sees the same
    all-reduced norm and makes the same choice, and a skipped step leaves weights and Adam moments untouched. With
    ``clipping`` (the clip folded into the update), the guard hands the clip's divisor, derived from that norm, to
    HybridAdam's update as ``div_scale``."""

    def __init__(
        self, optimizer, cfg: ConsumerConfig, clipping: bool, device: torch.device, world_size: int, role="actor"
    ):
        self.optimizer, self.cfg, self.clipping, self.role = optimizer, cfg, clipping, role
        self.device, self.world_size = device, world_size
        self.lr = cfg.learning_rate
        """the learning rate of the last optimizer step"""
        self.skipped_total = 0
        self.log: list[tuple[float, bool]] = []
        """(gradient norm, skipped) of each optimizer step of the training step in progress"""
        self._loss_finite = True
        inner = optimizer.optim
        real_step = inner.step

        def guarded_step(*args, **kwargs):
            norm = float(optimizer.get_grad_norm())
            skip = not (self._loss_finite and np.isfinite(norm))
            self.log.append((norm, skip))
            if skip:
                self.skipped_total += 1
                return None
            divisor = clip_divisor(norm, optimizer.max_norm) if clipping else 1.0
            if divisor > 1.0:
                kwargs["div_scale"] = divisor
            return real_step(*args, **kwargs)

        inner.step = guarded_step

    def begin(self) -> None:
        """A training step starts: its optimizer steps are logged afresh."""
        self.log = []

    def step(self, losses: list[float], index: int, total: int, per_step: int) -> None:
        """Optimizer step ``index`` of a run of ``total`` (``per_step`` per training step), at the schedule's learning
        rate; skipped when any rank's loss of it was not finite (agreed over the whole world)."""
        c = self.cfg
        self.lr = c.learning_rate * lr_factor(index, total, c.lr_schedule, c.warmup_steps * per_step, c.min_lr_ratio)
        for group in self.optimizer.optim.param_groups:
            group["lr"] = self.lr
        bad = torch.tensor([0.0 if all(np.isfinite(losses)) else 1.0], device=self.device)
        if self.world_size > 1:
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        self._loss_finite = not bool(bad.item())
        self.optimizer.step()
        self.optimizer.zero_grad()

    def report(self) -> dict:
        """The training step's optimizer metrics; raises once more steps were skipped than ``max_skipped_steps``."""
        finite = [n for n, skipped in self.log if not skipped]
        if self.skipped_total > self.cfg.max_skipped_steps:
            raise RuntimeError(
                f"{self.skipped_total} optimizer steps skipped for a non-finite loss or gradient norm (limit "
                f"max_skipped_steps={self.cfg.max_skipped_steps}); the last step's gradient norm was "
                f"{self.log[-1][0]}. Lower the learning rate or check the rewards and data"
            )
        r = self.role
        return {
            f"{r}/lr": self.lr,
            f"{r}/grad_norm": float(np.mean(finite)) if finite else float("nan"),
            f"{r}/skipped_steps": sum(skipped for _, skipped in self.log),
            f"{r}/skipped_steps_total": self.skipped_total,
        }
