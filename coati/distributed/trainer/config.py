"""The consumer section of the config tree: training actors, optimiser and parallel layout."""

from __future__ import annotations

from dataclasses import dataclass, field

from coati.distributed.checks import as_strings, divides, finite, positive, require
from coati.distributed.trainer.schedule import SCHEDULES

SP_MODES = ("all_to_all", "split_gather", "ring")
"""ColossalAI's sequence_parallelism_mode values"""


@dataclass(frozen=True)
class PluginConfig:
    """ColossalAI HybridParallelPlugin layout of the consumers."""

    tp_size: int = 1
    """tensor-parallel size"""
    pp_size: int = 1
    """pipeline-parallel size"""
    zero_stage: int = 0
    """ZeRO stage 0, 1 or 2"""
    precision: str = "fp32"
    """training precision: fp32, bf16 or fp16 (fp16 needs CUDA)"""
    pp_num_microbatches: int = 1
    """micro-batches per pipeline pass when pp_size > 1"""
    ep_size: int = 1
    """expert-parallel size (mixture-of-experts models): each MoE layer's experts split over this many data-parallel
    ranks, tokens exchanged with them by all-to-all; divides the DP size and the experts (zero_stage 0)"""
    sp_size: int = 1
    """sequence-parallel size: this many ranks share each data-parallel shard, each forward's columns split over them
    (ColossalAI's sp_size; with sp_mode all_to_all)"""
    sp_mode: str = "all_to_all"
    """sequence parallelism's mode (ColossalAI's sequence_parallelism_mode): all_to_all (DeepSpeed-Ulysses: attention
    exchanges heads for columns); split_gather and ring are refused"""
    cpu_offload: bool = False
    """keep ZeRO's optimizer states and fp32 master weights in host memory and step them there (zero_stage 1 or 2;
    on a CPU they are there already: the same update)"""

    def __post_init__(self):
        positive(self, "tp_size", "pp_size", "pp_num_microbatches", "ep_size")
        require(
            self.ep_size == 1 or (self.tp_size == 1 and self.pp_size == 1),
            f"ep_size={self.ep_size} splits experts over data-parallel ranks; it is not combined with tensor or "
            f"pipeline parallelism (tp_size={self.tp_size}, pp_size={self.pp_size}): use tp_size=1, pp_size=1",
        )
        positive(self, "sp_size")
        require(self.sp_mode in SP_MODES, f"sp_mode must be one of {SP_MODES}, got {self.sp_mode!r}")
        require(
            self.sp_size == 1 or self.sp_mode == "all_to_all",
            f"sp_mode={self.sp_mode} is refused: ColossalAI runs split_gather and ring inside its own Llama and Qwen2 "
            "forwards, which do not run on transformers 5 (coati's policy replaces them); use sp_mode all_to_all",
        )
        require(
            self.sp_size == 1 or (self.tp_size == 1 and self.pp_size == 1 and self.ep_size == 1),
            f"sp_size={self.sp_size} is not combined with tensor, pipeline or expert parallelism (tp_size="
            f"{self.tp_size}, pp_size={self.pp_size}, ep_size={self.ep_size}); use those at 1",
        )
        require(
            self.ep_size == 1 or self.zero_stage == 0,
            f"ep_size={self.ep_size} with zero_stage={self.zero_stage} is refused: ColossalAI 0.5's MoE ZeRO "
            "optimizer measures the experts' gradient norm within each moe_dp group only, so the EP ranks would "
            "clip by different norms and drift apart (and it runs ZeRO-2 as ZeRO-1); use zero_stage 0",
        )
        require(
            self.zero_stage != 3,
            "zero_stage=3 is refused: ColossalAI 0.5's ZeRO-3 paths need an accelerator (Gemini moves its chunks to "
            "CUDA; its torch FSDP plugin pins FSDP to the CUDA device, and FSDP refuses a CPU-only host) and are not "
            "wired here; use zero_stage 2, with cpu_offload to keep the optimizer's states in host memory",
        )
        require(self.zero_stage in (0, 1, 2), f"zero_stage must be 0, 1 or 2, got {self.zero_stage}")
        require(
            not self.cpu_offload or self.zero_stage in (1, 2),
            f"cpu_offload moves ZeRO's optimizer states to host memory: it needs zero_stage 1 or 2, got "
            f"{self.zero_stage}",
        )
        require(
            self.precision in ("fp32", "bf16", "fp16"),
            f"precision must be fp32, bf16 or fp16, got {self.precision!r}",
        )
        require(
            self.zero_stage == 0 or self.precision != "fp32",
            f"zero_stage={self.zero_stage} needs precision bf16 or fp16 (ColossalAI keeps fp32 master weights "
            "itself); use precision='bf16' or zero_stage=0",
        )
        require(
            not (self.pp_size > 1 and self.zero_stage > 1),
            f"zero_stage={self.zero_stage} cannot be combined with pp_size={self.pp_size}; use zero_stage<=1",
        )


@dataclass(frozen=True)
class ConsumerConfig:
    """Training actors: batch arithmetic (per DP rank, in prompts), optimiser, parallel layout."""

    num_consumer_procs: int = 1
    """training processes (DP x TP x PP)"""
    train_batch_size: int = 4
    """prompts per DP rank consumed per training step (one weight version)"""
    train_minibatch_size: int | None = None
    """prompts per DP rank per optimizer step; train_batch_size / train_minibatch_size optimizer steps per step
    (None: train_batch_size, one optimizer step)"""
    num_iterations: int = 1
    """passes over each step's batch (GRPO's mu, PPO's epochs): each pass makes the step's train_batch_size /
    train_minibatch_size optimizer steps again on the same rollouts, every ratio taken against the trainer's
    log-probs from before the step's first update; more passes put a trainer that waits on generation to work, at
    the cost of updates further from the policy that sampled (the clip range bounds them)"""
    train_microbatch_size: int | None = None
    """completions per forward/backward pass; divides train_minibatch_size * num_generations (None: passes of whole
    groups filled up to train_microbatch_tokens; with pipeline parallelism, num_generations)"""
    train_microbatch_tokens: int = 8192
    """with train_microbatch_size None: the most padded tokens one forward/backward pass computes (its rows times
    its longest prompt and response, each group's prompt once when shared); rows go in by length, at least one group
    per pass"""
    learning_rate: float = 2e-5
    """optimizer learning rate (the peak, under a schedule)"""
    lr_schedule: str = "constant"
    """learning-rate schedule after the warmup: constant, linear or cosine (decaying to min_lr_ratio x learning_rate
    by the run's last step)"""
    warmup_steps: int = 0
    """training steps over which the learning rate rises linearly to learning_rate (per optimizer step; 0: none)"""
    min_lr_ratio: float = 0.0
    """the fraction of learning_rate a linear or cosine schedule ends at"""
    gradient_checkpointing: bool = False
    """recompute each decoder layer's activations in the backward pass instead of keeping them (less memory, about
    a third more compute); each row's prompt is then computed in full (the recompute keeps no KV cache)"""
    freeze_vision_tower: bool = True
    """a vision-language model's image encoder keeps its weights (its projector and language model train); off:
    it trains too"""
    weight_decay: float = 0.0
    """optimizer weight decay"""
    max_grad_norm: float = 1.0
    """gradient clipping norm (0 = off; the norm is still measured)"""
    max_skipped_steps: int = 3
    """optimizer steps skipped for a non-finite loss or gradient norm before the run stops"""
    max_engine_trainer_gap: float | None = None
    """stop the run when a step's mean |engine - trainer| log-prob over its fresh tokens (sampled whole by the
    weights the step starts from) exceeds this: the engines would be generating from another model than the one
    trained (None: by precisions, 5e-3 when engines and trainer both compute in fp32, else 0.1; 0: no check)"""
    compute_dtype: str = "auto"
    """dtype of the trainer's matmuls: bf16 runs forward and backward under autocast over fp32 weights (the
    optimizer updates fp32 masters; both sides of the ratio are computed under the same autocast); fp32: none (to
    force full precision); auto: bf16 where the hardware computes it natively (a CUDA GPU with bf16, a CPU with
    AVX512-BF16 or AMX), else fp32, and fp32 when the plugin's precision already makes the weights bf16/fp16 or with
    tensor parallelism (whose layers' backward ignores autocast)"""
    share_prompt_forward: bool = True
    """compute each group's prompt once per micro-batch instead of once per response: through a KV cache shared by
    the group's responses, or with the group packed in one row under a tree-shaped attention mask (no padding; SDPA
    attention), whichever has the fewer estimated FLOPs for the pass (gradient checkpointing: packing only); used
    when micro-batches hold whole groups (train_microbatch_size a multiple of num_generations) and pp_size is 1,
    otherwise the full forward of every row (said at start-up)"""
    routing_replay: bool = False
    """mixture-of-experts models: route each sampled row's tokens in training through the experts the engine routed
    them to (R3; the trainer's own router probabilities for those experts), so a token near a routing tie does not
    pass through other experts than it was sampled with; needs an engine that reports its routing (transformers)"""
    router_aux_loss_coef: float = 0.0
    """mixture-of-experts models: weight of the routers' load-balancing loss (``E * sum_e f_e * P_e`` as transformers
    computes it: k when routing is even), averaged over the MoE layers (0: off)"""
    router_z_loss_coef: float = 0.0
    """mixture-of-experts models: weight of the routers' z-loss (mean squared logsumexp of the router logits),
    averaged over the MoE layers (0: off)"""
    lora_rank: int = 0
    """train a LoRA adapter of this rank instead of the whole model (0: full fine-tuning): the base weights stay
    frozen, only the adapter is optimised and pushed, and producers merge it into a kept copy of the base"""
    lora_alpha: float = 16.0
    """LoRA scale numerator: the adapter adds (lora_alpha / lora_rank) * B A to each target weight"""
    lora_dropout: float = 0.0
    """dropout on the adapter's input while training"""
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """the linear layers that get an adapter (module names as peft matches them)"""
    lora_export_merged: bool = False
    """with LoRA, final/ holds the adapter as a PEFT folder; this also writes the merged model to final/merged"""
    plugin: PluginConfig = field(default_factory=PluginConfig)
    """parallel layout"""

    def __post_init__(self):
        if self.train_minibatch_size is None:
            object.__setattr__(self, "train_minibatch_size", self.train_batch_size)
        positive(self, "num_consumer_procs", "train_batch_size", "train_minibatch_size", "num_iterations")
        if self.train_microbatch_size is not None:
            positive(self, "train_microbatch_size")
        positive(self, "train_microbatch_tokens")
        finite(self, "learning_rate", low=0, strict=True)
        finite(self, "max_grad_norm", "weight_decay", "min_lr_ratio", low=0)
        finite(self, "lora_alpha", "lora_dropout")
        finite(self, "router_aux_loss_coef", low=0)
        finite(self, "router_z_loss_coef", low=0)
        if self.max_engine_trainer_gap is not None:
            finite(self, "max_engine_trainer_gap", low=0)
        require(self.lr_schedule in SCHEDULES, f"lr_schedule must be one of {SCHEDULES}, got {self.lr_schedule!r}")
        require(
            isinstance(self.warmup_steps, int) and self.warmup_steps >= 0,
            f"warmup_steps must be a non-negative integer, got {self.warmup_steps!r}",
        )
        require(0.0 <= self.min_lr_ratio <= 1.0, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        require(
            self.compute_dtype in ("auto", "fp32", "bf16"),
            f"compute_dtype must be auto, fp32 or bf16, got {self.compute_dtype!r}",
        )
        require(
            self.compute_dtype != "bf16" or self.plugin.precision == "fp32",
            f"compute_dtype={self.compute_dtype} autocasts over fp32 weights, but plugin precision="
            f"{self.plugin.precision} makes the weights themselves {self.plugin.precision}; use one of the two",
        )
        require(
            self.compute_dtype != "bf16" or self.plugin.tp_size == 1,
            "compute_dtype=bf16 autocasts, but ColossalAI's "
            f"tensor-parallel layers (tp_size={self.plugin.tp_size}) run "
            "their backward outside autocast; use compute_dtype='fp32' (or 'auto') or plugin precision='bf16'",
        )
        require(
            isinstance(self.max_skipped_steps, int) and self.max_skipped_steps >= 0,
            f"max_skipped_steps must be an integer >= 0, got {self.max_skipped_steps!r}",
        )
        object.__setattr__(self, "lora_target_modules", as_strings(self.lora_target_modules, "lora_target_modules"))
        require(
            isinstance(self.lora_rank, int) and self.lora_rank >= 0,
            f"lora_rank must be a non-negative integer (0: full fine-tuning), got {self.lora_rank!r}",
        )
        if self.lora_rank:
            p = self.plugin
            require(
                p.tp_size == 1 and p.pp_size == 1,
                f"LoRA trains with data parallelism, ZeRO included (tp_size=1, pp_size=1); got "
                f"tp_size={p.tp_size}, pp_size={p.pp_size}: use more consumers for data parallelism, or "
                "lora_rank 0",
            )
            require(
                self.lora_alpha > 0 and 0 <= self.lora_dropout < 1 and self.lora_target_modules,
                f"lora_alpha must be > 0, lora_dropout in [0, 1) and lora_target_modules non-empty; got "
                f"{self.lora_alpha}, {self.lora_dropout}, {self.lora_target_modules}",
            )
        p = self.plugin
        per_shard = "tp_size * pp_size" + (" * sp_size" if p.sp_size > 1 else "")  # SP named only where it is set
        divides(per_shard, p.tp_size * p.pp_size * p.sp_size, "num_consumer_procs", self.num_consumer_procs)
        require(
            p.sp_size == 1 or not self.lora_rank,
            f"sp_size={p.sp_size} with LoRA is not built; use sp_size=1 or lora_rank 0",
        )
        divides("ep_size", p.ep_size, "dp_size", self.dp_size)
        require(
            p.ep_size == 1 or not self.lora_rank,
            f"ep_size={p.ep_size} shards the experts that full fine-tuning trains; LoRA trains with "
            "data parallelism: use ep_size=1 or lora_rank 0",
        )
        divides("train_minibatch_size", self.train_minibatch_size, "train_batch_size", self.train_batch_size)

    @property
    def dp_size(self) -> int:
        """data-parallel shards: the processes over TP x PP x SP (SP ranks share a shard)"""
        p = self.plugin
        return self.num_consumer_procs // (p.tp_size * p.pp_size * p.sp_size)

    @property
    def num_minibatches(self) -> int:
        """optimizer steps per pass over a step's batch: train_batch_size / train_minibatch_size"""
        assert self.train_minibatch_size is not None  # resolved in __post_init__
        return self.train_batch_size // self.train_minibatch_size

    @property
    def lora_scale(self) -> float | None:
        """alpha / r, what a producer multiplies the adapter's B A by (None without LoRA)"""
        return self.lora_alpha / self.lora_rank if self.lora_rank else None
