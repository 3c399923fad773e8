"""The critic section of the config tree: its model, training processes, optimiser and parallel layout. Used only
when the algorithm's estimator needs values (``AlgorithmConfig.uses_critic``); its batch arithmetic is the policy's
(the same rows, the same minibatches and passes per step)."""

from __future__ import annotations

from dataclasses import dataclass, field

from coati.distributed.checks import finite, positive, require
from coati.distributed.trainer.config import PluginConfig
from coati.distributed.trainer.schedule import SCHEDULES


@dataclass(frozen=True)
class CriticConfig:
    """The value model of PPO: a scalar head over a causal-LM backbone, trained on the estimator's returns."""

    model: str | None = None
    """the critic's starting weights: a Hugging Face folder of a causal LM (a fresh value head is added), a reward
    model or a critic this run exported (their head is kept); None: the policy's weights with a fresh head"""
    num_procs: int = 1
    """critic training processes (data parallel x tensor parallel, ZeRO within the data-parallel ranks)"""
    learning_rate: float = 9e-6
    """the critic's learning rate (the peak, under a schedule)"""
    lr_schedule: str = "constant"
    """the critic's learning-rate schedule after its warmup: constant, linear or cosine"""
    warmup_steps: int = 0
    """training steps over which the critic's learning rate rises linearly to learning_rate"""
    min_lr_ratio: float = 0.0
    """the fraction of learning_rate a linear or cosine schedule ends at"""
    weight_decay: float = 0.0
    """the critic optimizer's weight decay"""
    max_grad_norm: float = 1.0
    """the critic's gradient clipping norm (0 = off; the norm is still measured)"""
    gradient_checkpointing: bool = False
    """recompute each decoder layer's activations in the critic's backward pass (less memory, more compute)"""
    train_microbatch_tokens: int = 8192
    """the most padded tokens one critic forward/backward pass computes (rows go in by length)"""
    compute_dtype: str = "auto"
    """dtype of the critic's matmuls: auto, fp32 or bf16 (as consumer.compute_dtype)"""
    save_value_network: bool = False
    """also write the trained critic as a Hugging Face folder, final/critic (AutoModelForTokenClassification with
    one label loads it)"""
    plugin: PluginConfig = field(default_factory=PluginConfig)
    """the critic's parallel layout (data and tensor parallelism, ZeRO 0-2)"""

    def __post_init__(self):
        require(
            self.model is None or (isinstance(self.model, str) and self.model.strip()),
            f"critic model must be a model folder, got {self.model!r}; leave it out to start from the policy's",
        )
        positive(self, "num_procs", "train_microbatch_tokens")
        finite(self, "learning_rate", low=0, strict=True)
        finite(self, "max_grad_norm", "weight_decay", "min_lr_ratio", low=0)
        require(
            self.lr_schedule in SCHEDULES, f"critic lr_schedule must be one of {SCHEDULES}, got {self.lr_schedule!r}"
        )
        require(
            isinstance(self.warmup_steps, int) and self.warmup_steps >= 0,
            f"critic warmup_steps must be a non-negative integer, got {self.warmup_steps!r}",
        )
        require(
            self.compute_dtype in ("auto", "fp32", "bf16"),
            f"critic compute_dtype must be auto, fp32 or bf16, got {self.compute_dtype!r}",
        )
        p = self.plugin
        require(
            p.pp_size == 1,
            f"the critic trains with data and tensor parallelism and ZeRO (critic plugin pp_size=1); got pp_size="
            f"{p.pp_size}: its values come from the whole model's last hidden states; use tp_size or num_procs",
        )
        require(
            p.sp_size == 1,
            f"critic plugin sp_size={p.sp_size}: the critic trains with data and tensor parallelism and ZeRO; use "
            "critic plugin sp_size 1",
        )
        require(
            p.ep_size == 1,
            f"critic plugin ep_size={p.ep_size}: the critic trains with data and tensor parallelism and ZeRO; expert "
            "parallelism is the policy's (--ep-size); use critic plugin ep_size 1",
        )
        require(
            self.num_procs % p.tp_size == 0,
            f"critic num_procs={self.num_procs} is not divisible by critic plugin tp_size={p.tp_size}; use a multiple "
            f"of {p.tp_size}",
        )

    @property
    def dp_size(self) -> int:
        return self.num_procs // self.plugin.tp_size
