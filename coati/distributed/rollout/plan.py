"""What a producer is built from: ``RolloutPlan``, resolved once by preflight (``driver/preflight.rollout_plan``) from
the config tree and the run's plan. A producer reads this and its identity, never the whole config or another role's
section: what it needs of the trainer (the precision its engine follows, the LoRA adapters it receives) is named
here, resolved."""

from __future__ import annotations

from dataclasses import dataclass

from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.reward.config import RewardConfig
from coati.distributed.rollout.data import DatasetSpec, PromptFormat


@dataclass(frozen=True)
class LoraSpec:
    """The LoRA adapters consumers push, as the engine needs them to apply one."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha, "target_modules": self.target_modules}


@dataclass(frozen=True)
class TrainerPrecision:
    """The trainer's precision settings, which the engine's weights follow by default (``generation_dtype``)."""

    compute_dtype: str
    """consumer.compute_dtype"""
    precision: str
    """the plugin's precision"""
    tp_size: int
    """the plugin's tensor-parallel size"""


@dataclass(frozen=True)
class TeacherLink:
    """What a producer needs of the teacher role: how it reads prompts, and how long its servers may stall."""

    tokenizer_path: str
    """the folder whose chat template renders the teacher's prompts (its tokenizer is the student's: checked)"""
    privileged_context: str | None
    """text after the prompt's last message, for the teacher alone, with {column} fields of the row"""
    timeout_s: float


@dataclass(frozen=True)
class RolloutPlan:
    """One producer role's inputs, the same for every producer of a run (each adds its index)."""

    num_producers: int
    """producers in the run: each reads its shard of the training rows"""
    backend: str
    """the inference backend's name in BACKEND_MAP"""
    model_path: str
    """the inference model's folder, resolved"""
    engine_options: dict
    """the engine's constructor options (the user's, checked, and the launch's choices)"""
    generation: GenerationConfig
    algorithm: AlgorithmConfig
    """the resolved preset: its shaping, filtering and skipping act in the producer"""
    reward: RewardConfig
    train_dataset: DatasetSpec
    eval_dataset: DatasetSpec | None
    prompt_format: PromptFormat
    num_generations: int
    """completions per prompt (the group size)"""
    microbatch_size: int
    """prompts per generate call"""
    seed: int
    """the run's seed (each producer derives its own from it and its index)"""
    stream_prompts: int
    """groups kept generating across draws (0: rounds)"""
    processor_path: str | None
    """the folder whose processor renders each prompt with its images (a vision-language model's); None: the
    tokenizer renders text prompts"""
    trainer_precision: TrainerPrecision
    lora: LoraSpec | None
    """the adapters consumers push; None when they push whole weights"""
    teacher: TeacherLink | None = None
    """on-policy distillation: how the teacher reads prompts (its servers come with the producer); None: no teacher"""
