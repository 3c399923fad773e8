"""The records a training step hands its passes: the step's per-row inputs (``StepTensors``, computed once at its
start) and one pass's slice of them (``MicroBatch``), in place of positional lists; the plain and the pipelined
passes (``step.py``, ``pipeline_step.py``) both take them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from coati.distributed.trainer.step_metrics import StepMetrics


@dataclass
class StepTensors:
    """A step's per-row inputs to its losses, computed once at its start."""

    loss_mask: torch.Tensor
    """float32 [N, R] over the global batch: the sampled tokens that train (truncated rows masked when asked)"""
    advantages: torch.Tensor
    """[N, R] over the global batch"""
    old_logprobs: torch.Tensor | None
    """[S, R] over this rank's shard: the policy before the step's first update (filled by the first minibatch's
    passes where the step makes several updates), else None: each pass is its own old policy"""
    ref_logprobs: torch.Tensor | None
    """[S, R] over this rank's shard: the reference model's, when the loss has a KL term"""
    metrics: StepMetrics


@dataclass
class MicroBatch:
    """One pass's rows and their slices of the step's inputs, as its loss takes them."""

    rows: np.ndarray
    """indices of the global batch"""
    mask: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    rollout_logprobs: torch.Tensor | None
    """the engine's log-probs of the sampled tokens (None where they are not valid for the sampling settings)"""
