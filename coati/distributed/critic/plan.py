"""What a critic rank is built from: ``CriticPlan``, resolved once by preflight (``driver/preflight.critic_plan``):
the critic's own training settings as the engine takes them, the algorithm (its returns, its value clip) and how the
rows were sampled."""

from __future__ import annotations

from dataclasses import dataclass

from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.trainer.config import ConsumerConfig


@dataclass(frozen=True)
class CriticPlan:
    """One critic role's inputs, the same for every rank."""

    world_size: int
    """critic processes (their own ColossalAI world)"""
    master_addr: str
    master_port: int
    model_path: str
    """the critic's starting weights, resolved"""
    trainer: ConsumerConfig
    """the critic's training settings as the engine takes them: its learning rate, schedule, clipping and layout,
    with the policy's batch arithmetic (rows per DP rank, minibatches, passes)"""
    algorithm: AlgorithmConfig
    generation: GenerationConfig
    seed: int = 0
