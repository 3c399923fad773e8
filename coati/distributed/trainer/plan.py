"""What a consumer is built from: ``TrainerPlan``, resolved once by preflight (``driver/preflight.trainer_plan``). A
consumer reads this and its rank, never the whole config: the producers' group size and the sampling temperature it
must score at arrive here, named."""

from __future__ import annotations

from dataclasses import dataclass

from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.trainer.config import ConsumerConfig


@dataclass(frozen=True)
class TrainerPlan:
    """One consumer role's inputs, the same for every rank of a run."""

    world_size: int
    """consumer processes (ColossalAI's world)"""
    master_addr: str
    """the address of rank 0's process group store"""
    master_port: int
    model_path: str
    """the trained model's folder, resolved"""
    consumer: ConsumerConfig
    algorithm: AlgorithmConfig
    """the resolved preset: estimator, loss, aggregation, KL, masking"""
    generation: GenerationConfig
    """how the rows were sampled (the temperature log-probs are computed at, the response budget)"""
    num_generations: int
    """completions per prompt (the group size the estimators work over)"""
    seed: int = 0
    reference_inside: bool = True
    """each consumer holds the reference (for KL in the loss or the reward); False: reference servers of their own
    compute its log-probs, handed to the step with its batch"""
