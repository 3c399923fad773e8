"""The reward's config: how completions are scored (a function, a reward model, a judge, an environment) and how
many scoring failures a run tolerates. Typed and frozen like every component's config (``config``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from coati.distributed.checks import finite, positive, require
from coati.distributed.reward.base import REWARD_FNS, follows_trl
from coati.distributed.reward.compose import NORMALIZATIONS
from coati.distributed.reward.judge import FIELDS, template_fields
from coati.distributed.reward.judge import TEMPLATE as JUDGE_TEMPLATE
from coati.distributed.runtime.placement import check_server_placement


@dataclass(frozen=True)
class EnvConfig:
    """A multi-turn environment: each rollout is an episode of model turns and environment replies, scored by the
    environment (the reward function is then unused)."""

    name: str | None = None
    """the environment (tool_math, retry or package.module:Class); None: one completion per prompt"""
    kwargs: dict = field(default_factory=dict)
    """options passed to the environment by name"""
    max_turns: int | None = None
    """model turns per episode (None: the environment's own limit)"""
    max_tokens: int = 256
    """tokens per episode, its first prompt included; a longer conversation is cut there and flagged (at most
    generation.max_prompt_tokens: the conversation so far is the prompt of each turn)"""
    step_timeout_s: float = 30.0
    """wall-clock limit for one environment step; an episode whose step is later fails (a TIMEOUT: left out of its
    group's statistics and the loss, and counted against ``max_error_fraction``)"""

    def __post_init__(self):
        require(
            self.name is None or (isinstance(self.name, str) and self.name),
            f"reward.env.name must be an environment name or package.module:Class, got {self.name!r}",
        )
        require(isinstance(self.kwargs, dict), f"reward.env.kwargs must be a JSON object (dict), got {self.kwargs!r}")
        require(
            self.max_turns is None or self.max_turns >= 1,
            f"reward.env.max_turns must be >= 1 (or None), got {self.max_turns}",
        )
        require(
            self.max_tokens >= 1 and self.step_timeout_s > 0,
            f"reward.env.max_tokens must be >= 1 and reward.env.step_timeout_s > 0, got {self.max_tokens}, "
            f"{self.step_timeout_s}",
        )


@dataclass(frozen=True)
class RewardModelConfig:
    """A reward model (the ``rm`` component) and the Ray actors that host it."""

    path: str | None = None
    """an AutoModelForSequenceClassification folder with one output, scoring prompt + completion under its chat
    template"""
    servers: int = 1
    """Ray actors hosting the reward model, shared by all producers"""
    cpus: float = 1.0
    """CPUs reserved for each reward-model actor"""
    gpus: float = 0.0
    """GPUs (or a share of one) for each reward-model actor"""
    placement: str = "any"
    """where the reward-model actors run: any (Ray places them by cpus/gpus), node:K (the K-th alive node, in the
    order producers fill from), or producer (server i beside producer i mod num_producers; with gpus > 0 it takes
    that share of the producer's GPU, which then needs one GPU per producer)"""
    batch_size: int = 8
    """pairs per reward-model forward"""
    normalize: str = "none"
    """the reward model's scores as they are (none), standardised within each prompt's group (group), or by the
    mean and std of every score so far (running)"""
    timeout_s: float = 45.0
    """seconds a reward-model server may go without finishing a batch (of batch_size pairs) while a producer waits on
    it; then the run stops naming the server (a server that keeps scoring is waited for however long a draw takes)"""

    def __post_init__(self):
        require(
            self.normalize in NORMALIZATIONS,
            f"reward.rm.normalize must be one of {NORMALIZATIONS}, got {self.normalize!r}",
        )
        check_server_placement(self.placement, "reward.rm.placement")
        finite(self, "cpus", "gpus", low=0, where="reward.rm")
        positive(self, "servers", "batch_size", where="reward.rm")
        require(self.timeout_s > 0, f"reward.rm.timeout_s must be > 0, got {self.timeout_s}")


@dataclass(frozen=True)
class JudgeConfig:
    """An LLM judge (the ``judge`` component) and the Ray actors that host it."""

    path: str | None = None
    """a generative model folder that grades each completion through the template (in [0, 1]; a reply without a
    readable score counts 0, with the reason)"""
    backend: str = "transformers"
    """the judge's inference backend (transformers, vllm)"""
    template: str = JUDGE_TEMPLATE
    """the judge's user turn, with {question}, {completion}, and optionally {reference} (the row's gt_answer, or
    '(none)') and {rubric} (the row's rubric column, which every row must then have)"""
    max_score: float = 10.0
    """the top of the judge's 'Score: N' scale (a reply 'Score: x/M' uses its own M)"""
    max_new_tokens: int = 32
    """tokens the judge may write per grade"""
    max_prompt_tokens: int = 1024
    """the longest judge prompt (template, question, completion, reference); with max_new_tokens at most the judge
    model's context"""
    servers: int = 1
    """Ray actors hosting the judge, shared by all producers"""
    cpus: float = 1.0
    """CPUs reserved for each judge actor"""
    gpus: float = 0.0
    """GPUs (or a share of one) for each judge actor"""
    placement: str = "any"
    """where the judge actors run: any, node:K or producer, as reward.rm.placement"""
    timeout_s: float = 300.0
    """seconds a judge server may go without finishing a call (one generation over its share of a draw) while a
    producer waits on it; then the run stops naming the server"""

    def __post_init__(self):
        try:
            fields = template_fields(self.template)
        except ValueError as e:
            raise ValueError(f"reward.judge.template is not a format string ({e}): {self.template!r}") from None
        require(
            {"question", "completion"} <= fields <= set(FIELDS),
            f"reward.judge.template must contain {{question}} and {{completion}} and no field but {list(FIELDS)}, "
            f"got fields {sorted(fields)} in {self.template!r}",
        )
        positive(self, "servers", "max_new_tokens", "max_prompt_tokens", where="reward.judge")
        require(
            self.timeout_s > 0 and self.max_score > 0,
            f"reward.judge.timeout_s and max_score must be > 0, got {self.timeout_s}, {self.max_score}",
        )
        check_server_placement(self.placement, "reward.judge.placement")
        finite(self, "cpus", "gpus", low=0, where="reward.judge")


MAX_WORKERS_PER_CORE = 8
"""reward worker processes per core beyond which a count is a mistake (each worker is a process with its imports)"""
CORES = os.cpu_count() or 1


@dataclass(frozen=True)
class RewardConfig:
    """How completions are scored, and how many scoring failures a run tolerates."""

    fn: str = "math"
    """reward function: a name in REWARD_FNS (math, code) or package.module:function"""
    kwargs: dict = field(default_factory=dict)
    """options passed to the reward function by name; each must be one of its parameters, of its default's type"""
    workers: int = 1
    """reward worker processes per producer"""
    batch_size: int | None = None
    """completions per call of a reward function (those scored together; a call that fails is retried one completion
    per call); None: the group (num_generations) for package.module:function functions, which take lists as TRL
    calls them, and 1 for the registered ones, whose work is per completion"""
    item_timeout_s: float = 30.0
    """wall-clock limit for one call of the reward function (see batch_size); the worker is killed, and the
    completion counted as a timeout (a call of several is retried one completion per call first)"""
    max_error_fraction: float = 0.1
    """the run stops when more than this fraction of a step's completions fail to score (error or timeout)"""
    stop_on_first_step_error: bool = True
    """the run stops when any completion of its first step fails to score (a broken reward shows at once)"""
    allow_degraded_sandbox: bool = False
    """where the code sandbox cannot run bwrap (no unprivileged user namespaces), run model-written code (the code
    reward, tool_math) anyway under degraded isolation: rlimits and, as root, a private network, but no filesystem
    isolation; the console and the run summary say so. Default: such a run is refused at launch"""
    components: dict = field(default_factory=dict)
    """weights of the reward's named components, summed: the reward function by its name (``fn``), further reward
    functions (registered names or package.module:function, as TRL's list of reward functions with its weights; a
    function's None counts 0 beside the others'), ``rm`` (the reward model, rm.path) and ``judge`` (judge.path),
    e.g. {"math": 1.0, "rm": 0.5}; empty: the reward function alone"""
    env: EnvConfig = field(default_factory=EnvConfig)
    """a multi-turn environment in place of the reward function"""
    rm: RewardModelConfig = field(default_factory=RewardModelConfig)
    """a reward model"""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """an LLM judge"""

    def __post_init__(self):
        require(isinstance(self.fn, str) and self.fn, f"reward fn must be a name or module:function, got {self.fn!r}")
        self._check_components()
        require(
            isinstance(self.kwargs, dict),
            f"reward kwargs must be a JSON object (dict), got {type(self.kwargs).__name__} {self.kwargs!r}",
        )
        positive(self, "workers")
        require(
            self.workers <= MAX_WORKERS_PER_CORE * CORES,
            f"reward workers={self.workers} is over {MAX_WORKERS_PER_CORE} per core of this machine's {CORES} "
            f"cores; use at most {MAX_WORKERS_PER_CORE * CORES} (--reward-workers)",
        )
        require(
            self.batch_size is None or (isinstance(self.batch_size, int) and self.batch_size >= 1),
            f"reward batch_size must be an integer >= 1 or None, got {self.batch_size!r}",
        )
        require(self.item_timeout_s > 0, f"reward item_timeout_s must be > 0, got {self.item_timeout_s}")
        require(
            0 <= self.max_error_fraction <= 1,
            f"reward max_error_fraction must be in [0, 1], got {self.max_error_fraction}",
        )

    def _check_components(self) -> None:
        known = {self.fn, "rm", "judge"}
        require(
            isinstance(self.components, dict)
            and all(k in known or k in REWARD_FNS or ":" in str(k) for k in self.components)
            and all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in self.components.values()),
            f"reward components must map names in {sorted(known)} or further reward functions (registered "
            f"names, package.module:function) to numbers, got {self.components!r}",
        )
        require(
            not self.other_fns or self.fn in self.components,
            f"reward components {sorted(self.components)} name further reward functions but not the run's own, "
            f"{self.fn!r}; give it a weight too (0 to use it for accuracy only)",
        )
        bad = {k: w for k, w in self.components.items() if not math.isfinite(w)}
        require(
            not bad,
            f"reward components need finite weights, got {bad} (NaN or infinite weights make every "
            "reward NaN); give each component a finite number",
        )
        require(
            ("rm" in self.components) == (self.rm.path is not None),
            f"the rm component and reward.rm.path go together: components {sorted(self.components)}, rm.path "
            f"{self.rm.path!r}; e.g. components {{'{self.fn}': 1.0, 'rm': 0.5}} with rm.path set",
        )
        require(
            ("judge" in self.components) == (self.judge.path is not None),
            f"the judge component and reward.judge.path go together: components {sorted(self.components)}, "
            f"judge.path {self.judge.path!r}",
        )

    @property
    def episodes(self) -> bool:
        """Rollouts are episodes of a multi-turn environment (``env.name`` set)."""
        return self.env.name is not None

    def calls_of(self, name: str, group_size: int) -> int:
        """Completions per call of reward function ``name`` (``batch_size`` resolved)."""
        if self.batch_size is not None:
            return self.batch_size
        return group_size if follows_trl(name) else 1

    @property
    def scored_by(self) -> str:
        """What scores a training completion, as errors name it: the environment when episodes run, else the reward
        function."""
        return f"environment {self.env.name}" if self.env.name else f"reward function {self.fn}"

    @property
    def other_fns(self) -> tuple[str, ...]:
        """The reward functions among the components besides ``fn``."""
        return tuple(k for k in self.components if k not in (self.fn, "rm", "judge"))

    @property
    def weights(self) -> dict[str, float]:
        """The components' weights (the reward function alone, weight 1, when none are set)."""
        return dict(self.components) or {self.fn: 1.0}
