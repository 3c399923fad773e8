"""Preflight: every check that needs no actor, run by the driver before anything starts, so bad input fails at once
with the value and the fix. It resolves what the actors will need (absolute model and dataset paths, the placement
plan, the number of rows) into a ``Plan``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

from coati.default_model import default_model_path
from coati.distributed.config.tree import Config
from coati.distributed.critic.plan import CriticPlan
from coati.distributed.driver.ray_start import check_address
from coati.distributed.envs import resolve_environment
from coati.distributed.envs.base import check_messages
from coati.distributed.envs.episodes import TurnTemplate
from coati.distributed.inference import backend_options
from coati.distributed.model.architectures import (
    check_experts,
    check_layout,
    check_positions,
    check_routing,
    check_sequence,
    is_vision_language,
    load_config,
)
from coati.distributed.model.files import read_safetensors_header, weight_files
from coati.distributed.reward import RewardSignature, resolve_reward_fn
from coati.distributed.reward.base import TRAINER_FIELDS, max_reward_of
from coati.distributed.reward.judge import template_fields
from coati.distributed.reward.math_reward import boxed, check_gold, math_reward, think_answer_tags
from coati.distributed.reward.sandbox import Sandbox, SandboxUnavailable
from coati.distributed.rollout.data import (
    HUB_ID,
    DatasetSpec,
    PromptFormat,
    check_chat_template,
    hub_offline,
    reward_fields,
    rows_digest,
)
from coati.distributed.rollout.images import (
    check_image_model,
    check_images,
    load_processor,
    render_with_images,
    vision_language_refusal,
)
from coati.distributed.rollout.plan import LoraSpec, RolloutPlan, TeacherLink, TrainerPrecision
from coati.distributed.runtime.layout import plan_roles
from coati.distributed.runtime.placement import alive_nodes, check_free, plan_placement, plan_servers
from coati.distributed.teacher.checks import check_teacher_files, check_teacher_tokenizer, teacher_model_path
from coati.distributed.trainer.plan import TrainerPlan
from coati.registry import use_user_folders, user_folders


def resolve_model_path(path: str, what: str) -> str:
    """An absolute local folder (actors run in other working directories, possibly on other nodes), or a hub model
    id when the hub is reachable: downloaded here first into the Hugging Face cache, so a missing, gated or
    unreachable model fails before any actor starts (actors load it by id: from that cache on this node, from the
    hub on others)."""

    if not isinstance(path, str) or not path:
        raise ValueError(f"{what} path must be a non-empty string, got {path!r}")
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"{what} folder {path} has no config.json; pass a Hugging Face model folder")
        return os.path.abspath(path)
    if not HUB_ID.match(path):
        raise FileNotFoundError(f"{what} {path!r} is not a local folder (nor a hub id, owner/name); check the path")
    if hub_offline():
        raise FileNotFoundError(
            f"{what} {path!r} is not a local folder, and the hub is offline (HF_HUB_OFFLINE=1): "
            "unset HF_HUB_OFFLINE to download it, or pass a local folder"
        )
    try:
        _fetch(path)
    except Exception as e:  # network, gated, missing: all end here, before any actor starts
        raise FileNotFoundError(
            f"{what} {path!r} is not a local folder, and fetching it from the hub failed: "
            f"{type(e).__name__}: {str(e).splitlines()[0]}"
        ) from e
    return path


@functools.cache
def _fetch(repo_id: str) -> str:
    """A hub model downloaded once per driver (model, inference model and tokenizer are often the same id)."""
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id)


@dataclass
class Inputs:
    """What the checks of a run's inputs resolved, before Ray starts."""

    train_model_path: str
    inference_model_path: str
    tokenizer_path: str
    train_dataset: DatasetSpec
    """the training set (overlong rows excluded where they are dropped)"""
    eval_dataset: DatasetSpec | None
    """the held-out set (None: no evaluation)"""
    num_rows: int
    prompt_format: PromptFormat
    """chat template and system prompt, or raw text"""
    dataset_digest: str
    """a hash of the training rows: a checkpoint records it, so a resume on other data is refused"""
    eval_digest: str
    """a hash of the held-out rows ("" without them): part of the key of the base model's cached evaluation"""
    overlong: dict
    """{"train": n, "eval": n}: rows dropped for prompts over max_prompt_tokens (filter_overlong_prompts)"""
    stream_prompts: int
    """groups each producer keeps generating across draws (``producer.stream_prompts``, checked; 0: rounds)"""
    sandbox: str | None
    """the code sandbox's isolation and bounds (``Sandbox.describe``) where the run executes model-written code (the
    code reward, tool_math); None: it executes none"""
    sandbox_degraded: bool
    """whether that isolation is degraded (no bwrap; allowed by ``reward.allow_degraded_sandbox``)"""
    sandbox_per_run: bool
    """whether the sandbox bounds each run's memory and processes as a whole (a control group per run); else per
    process"""
    critic_model_path: str | None
    """the critic's starting weights, resolved (None: the run trains no critic)"""
    teacher_model_path: str | None
    """the folder the teacher servers load (the policy's for a self-teacher; None: the run does not distil)"""
    processor_path: str | None
    """the folder whose processor renders prompts with their images (a vision-language model's tokenizer folder;
    None: the tokenizer renders text prompts)"""


@dataclass
class Plan(Inputs):
    """The run's plan: its checked inputs and where its actors go."""

    producer_slots: list
    consumer_slots: list
    steps_per_episode: int
    total_steps: int
    """the run's horizon: every episode's steps, cut at ``max_steps`` where that is set (computed here once)"""
    inference_options: dict
    """the engine's constructor options (the user's, checked, and the launch's choices)"""
    server_slots: dict
    """{component: [Slot or None per server]}: where the reward's model servers (rm, judge) and the teacher's
    (teacher) run (None: anywhere with their resources)"""
    in_flight: bool
    """whether pushes load while producers generate (``run.in_flight_weight_updates``, auto resolved)"""
    critic_slots: list
    """where the critic's ranks run (none without a critic)"""
    ref_slots: list
    """where the reference servers run (``layout.ref_procs``; none: each consumer holds the reference)"""


def check_inputs(config: Config, files_checked: Callable[[], None] | None = None) -> Inputs:
    """Every check of the run's inputs (models, tokenizer, data, rewards, batch arithmetic, backend options, the
    sandbox): none needs Ray, so a command line's mistakes end before Ray starts. The cluster's address is checked
    first (a connection: milliseconds), then what reads files (``check_files``), then what needs the tokenizer
    (transformers takes seconds to import); ``files_checked`` is called between the two (the command line starts a
    local cluster there, beside the slower checks)."""
    if config.run.address:
        check_address(config.run.address)
    files = check_files(config)
    if files_checked is not None:
        files_checked()
    cfg, (rows, eval_rows) = config, files.rows
    from transformers import AutoConfig, AutoTokenizer  # after the file checks: a wrong path ends in a second

    try:
        tokenizer = AutoTokenizer.from_pretrained(files.tokenizer_path)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(
            f"tokenizer {files.tokenizer_path} cannot be loaded ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); point --model-tokenizer-path at a folder "
            "with tokenizer files"
        ) from None
    if not files.prompt_format.raw:
        check_chat_template(tokenizer, f"tokenizer {files.tokenizer_path}")
    for path in {files.train_model_path, files.inference_model_path}:
        vocab = AutoConfig.from_pretrained(path).get_text_config().vocab_size
        if vocab < len(tokenizer):
            raise ValueError(
                f"model {path} has vocab_size={vocab} but its tokenizer has {len(tokenizer)} tokens: sampled ids past "
                "the vocabulary would crash generation; resize the model's embeddings or use its own tokenizer"
            )
    if files.processor_path is not None:  # prompts are as long as the processor renders them, image tokens included
        processor = load_processor(files.processor_path)
        system = files.prompt_format.system_prompt
        encode = lambda row: render_with_images(processor, row, system)[0]  # noqa: E731
    else:
        encode = functools.partial(files.prompt_format.encode, tokenizer)
    overlong, specs = {}, {"train": files.train_dataset, "eval": files.eval_dataset}
    limit, drop = cfg.generation.max_prompt_tokens, cfg.data.filter_overlong_prompts
    for what, data in (("train", rows), ("eval", eval_rows)):
        over = overlong_rows(data, encode, limit, what, drop)
        if over:  # the producers read the same rows and leave these out
            specs[what], dropped = dataclasses.replace(specs[what], exclude=tuple(over)), set(over)
            data[:] = [row for i, row in enumerate(data) if i not in dropped]
            if not data:
                raise ValueError(f"every {what} row's prompt is over max_prompt_tokens={limit}; raise it")
        overlong[what] = len(over)
    if cfg.reward.episodes:  # the environment scores episodes: its inputs instead of the reward function's
        check_env_inputs(cfg, rows, "training set", tokenizer)
        if eval_rows:
            check_env_inputs(cfg, eval_rows, "eval set", tokenizer)
    check_counts(cfg, len(rows))  # again: the overlong rows dropped above may leave too few
    if files.teacher_model_path is not None:
        check_teacher_tokenizer(files.teacher_model_path, tokenizer, files.tokenizer_path, files.prompt_format.raw)
    sandbox, degraded, per_run = check_sandbox(cfg.reward)
    return Inputs(
        files.train_model_path,
        files.inference_model_path,
        files.tokenizer_path,
        specs["train"],
        specs["eval"],
        len(rows),
        files.prompt_format,
        rows_digest(rows),
        rows_digest(eval_rows) if eval_rows else "",
        overlong,
        resolve_stream(cfg, backend_options(cfg.producer.backend), config.run.max_staleness),
        sandbox,
        degraded,
        per_run,
        files.critic_model_path,
        files.teacher_model_path,
        files.processor_path,
    )


def embedded_model() -> str:
    """The embedded model's folder, its first conversion on this machine marked as a start-up phase of its own."""
    from coati.default_model import default_model_folder, is_current
    from coati.distributed.driver.reporting import CONVERTING, phase

    if is_current(default_model_folder()):
        return default_model_path()
    phase(CONVERTING)
    path = default_model_path()
    phase("checking the inputs: the rest")
    return path


@dataclass
class Files:
    """What ``check_files`` resolved: the model folders, the datasets and their rows."""

    train_model_path: str
    inference_model_path: str
    tokenizer_path: str
    train_dataset: DatasetSpec
    eval_dataset: DatasetSpec | None
    prompt_format: PromptFormat
    rows: tuple[list[dict], list[dict]]
    """(training rows, held-out rows)"""
    critic_model_path: str | None = None
    """the critic's starting weights (None: no critic)"""
    teacher_model_path: str | None = None
    """the teacher's folder (None: no teacher)"""
    processor_path: str | None = None
    """the folder whose processor renders prompts with their images (``Inputs.processor_path``)"""


def check_files(config: Config) -> Files:
    """The checks that read files only, without transformers: the model folders and their weights, the backend's
    options and whether it runs the model here, the datasets and the reward's columns, the reward model and judge
    folders, the batch arithmetic."""
    cfg, m = config, config.model
    use_user_folders(user_folders([cfg.data.train, cfg.data.eval]))  # where module:function names are found
    # the datasets, the reward's columns and the batch arithmetic first: a mistake there is refused before the
    # default model's first conversion (~20 s of progress bars)
    train_dataset, eval_dataset = config.data.datasets(config.run.seed)
    train_dataset, eval_dataset = train_dataset.absolute(), eval_dataset and eval_dataset.absolute()
    rows = train_dataset.load()
    eval_rows = eval_dataset.load() if eval_dataset else []
    if not cfg.reward.episodes:
        check_reward_inputs(cfg, rows, "training set")
        if eval_rows:
            check_reward_inputs(cfg, eval_rows, "eval set")
    check_counts(cfg, len(rows))
    train_model_path = resolve_model_path(m.path or embedded_model(), "train model")
    inference_model_path = resolve_model_path(m.inference_path or train_model_path, "inference model")
    tokenizer_path = resolve_model_path(m.tokenizer_path or train_model_path, "tokenizer")
    backend_options(cfg.producer.backend).check_options(m.inference_options or {})
    check_model_files(train_model_path, "train model")
    limit = cfg.data.max_image_pixels
    images = check_images(rows, "training set", limit) + check_images(eval_rows, "eval set", limit)
    if images:
        check_image_model(train_model_path, images)
    processor_path = None
    if is_vision_language(load_config(train_model_path)):
        check_vision_language_run(cfg, train_model_path, inference_model_path)
        processor_path = tokenizer_path
    if inference_model_path != train_model_path:
        check_model_files(inference_model_path, "inference model")
    critic_model_path = None
    if cfg.algo_config.uses_critic:
        critic_model_path = resolve_model_path(cfg.critic.model or train_model_path, "critic model")
        check_value_model(critic_model_path)
    if cfg.reward.rm.path is not None:
        check_reward_model(cfg.reward.rm.path)
    teacher_path = teacher_model_path(cfg.teacher, train_model_path)
    if teacher_path is not None:
        check_teacher_files(cfg.teacher, teacher_path, {"training set": rows, "eval set": eval_rows})
    if cfg.reward.judge.path is not None:
        check_judge(cfg.reward.judge.path, cfg.reward.judge.template, {"training set": rows, "eval set": eval_rows})
    if config.run.address is None:  # a local cluster: its accelerators are this machine's
        gpu = local_gpus()
        check_models(cfg, train_model_path, inference_model_path, producer_gpu=gpu, consumer_gpu=gpu)
    return Files(
        train_model_path,
        inference_model_path,
        tokenizer_path,
        train_dataset,
        eval_dataset,
        config.data.prompt_format(),
        (rows, eval_rows),
        critic_model_path,
        teacher_path,
        processor_path,
    )


def check_vision_language_run(cfg: Config, train_model_path: str, inference_model_path: str) -> None:
    """What a vision-language model's run does not do yet is refused before any actor starts, naming the setting."""
    p, c, lay = cfg.producer, cfg.consumer, cfg.layout
    plugin = c.plugin
    vision_language_refusal(
        {
            f"backend {p.backend} does not read images: use --backend transformers or vllm": not backend_options(
                p.backend
            ).IMAGES,
            f"tp_size={plugin.tp_size}, pp_size={plugin.pp_size}, sp_size={plugin.sp_size} and ep_size="
            f"{plugin.ep_size} split it in ways not built for its vision tower: use 1 for each (-tp, -pp, --sp-size, "
            "--ep-size)": max(plugin.tp_size, plugin.pp_size, plugin.sp_size, plugin.ep_size) > 1,
            f"--algo {cfg.algo} needs a critic, which is not built over it: use a group baseline (GRPO, DAPO, RLOO)": (
                cfg.algo_config.uses_critic
            ),
            "LoRA adapters over it are not built: drop --lora-rank": bool(c.lora_rank),
            f"layout ref_procs={lay.ref_procs}: reference servers do not read images; leave the reference inside the "
            "consumers (ref_procs 0)": bool(lay.ref_procs),
            "a teacher does not read images: drop --teacher-model": cfg.teacher.model is not None,
            "multi-turn environments do not carry images: drop --env": cfg.reward.episodes,
            f"stream_prompts={p.stream_prompts}: streamed groups carry no images; use rounds (stream_prompts 0)": bool(
                p.stream_prompts
            ),
            "in_flight_weight_updates=True: an engine's cached image embeddings are dropped between batches; leave "
            "it unset (auto) or false": cfg.run.in_flight_weight_updates is True,
            "raw_prompt has no place for images (the processor's chat template places them): turn raw_prompt off": (
                cfg.data.raw_prompt
            ),
            f"its inference model {inference_model_path} is text-only: serve the same model": not is_vision_language(
                load_config(inference_model_path)
            ),
        },
        train_model_path,
    )


def check_value_model(path: str) -> None:
    """The critic's folder holds an architecture transformers puts a token-classification head on (the value head)."""
    import json

    check_model_files(path, "critic model")
    with open(os.path.join(path, "config.json")) as f:
        model_type = json.load(f).get("model_type")
    from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES as HEADS

    if model_type not in HEADS:
        raise ValueError(
            f"critic model {path} is a {model_type!r}, for which transformers has no token-classification class to "
            "carry the value head; pass --critic-model a Llama-, Qwen- or Mistral-style folder"
        )


GPU_DEVICE_NODES = ("nvidia[0-9]*", "kfd", "dxg")
"""the device files a CUDA (NVIDIA, WSL) or ROCm GPU shows under /dev; without one no torch build sees a GPU"""


def local_gpus(dev: str = "/dev") -> bool:
    """Whether this machine has an accelerator a local cluster's actors would get. Where none can be there (a CPU
    build of torch, or no GPU device file) torch is not imported: that takes seconds, and the driver imports it later
    while Ray starts."""
    import importlib.metadata
    from pathlib import Path

    try:
        if importlib.metadata.version("torch").endswith("+cpu"):
            return False
    except importlib.metadata.PackageNotFoundError:
        return False
    if not any(any(Path(dev).glob(pattern)) for pattern in GPU_DEVICE_NODES):
        return False
    import torch

    return torch.cuda.is_available()


def check_counts(cfg: Config, num_rows: int) -> None:
    """Enough training rows for one step's prompts and for every producer."""
    per_step = cfg.global_train_batch_size
    if num_rows < per_step:
        raise ValueError(f"the training set has {num_rows} rows, fewer than one step's {per_step} prompts")
    if num_rows < cfg.producer.num_producers:
        raise ValueError(f"{cfg.producer.num_producers} producers but only {num_rows} rows")


def preflight(config: Config, inputs: Inputs | None = None) -> Plan:
    """Every check that needs no actor, so bad input fails before anything starts (``check_inputs``, unless its
    ``inputs`` are given), then the placement on the cluster: the plan the run follows."""
    import ray

    cfg, r, i = config, config.run, inputs or check_inputs(config)
    inference_options = config.model.inference_options
    train_model_path, inference_model_path = i.train_model_path, i.inference_model_path

    if not ray.is_initialized():
        raise RuntimeError("call ray.init() (or ray.init(address=...)) before launch_distributed")
    producers, consumers, critic_slots, server_slots, ref_slots = place_roles(cfg)
    check_free(
        resources_needed(cfg.reward, producers + consumers + critic_slots + ref_slots, cfg.teacher),
        ray.available_resources,
        ray.cluster_resources(),
    )
    backend = backend_options(cfg.producer.backend)
    check_models(
        cfg,
        train_model_path,
        inference_model_path,
        producer_gpu=producers[0].num_gpus > 0,
        consumer_gpu=consumers[0].num_gpus > 0,
    )
    in_flight = resolve_in_flight(
        r.in_flight_weight_updates, backend, r.max_staleness, cfg.consumer.lora_rank, i.processor_path is not None
    )
    inference_options = backend.engine_options(
        inference_options or {},
        processes=cfg.producer.num_proc_per_producer,
        sleep=r.sleep_while_training,
        gpu=producers[0].num_gpus > 0,
        in_flight=in_flight,
        lora_rank=cfg.consumer.lora_rank,
        routing_replay=cfg.consumer.routing_replay,
    )
    return Plan(
        **vars(i),
        producer_slots=producers,
        consumer_slots=consumers,
        steps_per_episode=(per_episode := i.num_rows // cfg.global_train_batch_size),
        total_steps=horizon(r.num_episodes * per_episode, cfg.step_limit),
        inference_options=dict(inference_options or {}),
        server_slots=server_slots,
        in_flight=in_flight,
        critic_slots=critic_slots,
        ref_slots=ref_slots,
    )


def place_roles(cfg: Config) -> tuple[list, list, list, dict, list]:
    """(producer, consumer, critic, {reward component: server slots}, reference server slots): by the run's layout
    where it has one (``runtime.layout``), else producers low, consumers and then the critic high, the reward's
    servers by their placement."""
    r, lay, nodes = cfg.run, cfg.layout, alive_nodes()
    critics = cfg.critic.num_procs if cfg.algo_config.uses_critic else 0
    p = cfg.producer
    if not lay.active:
        producers, trainers = plan_placement(
            nodes, p.num_producers, p.num_proc_per_producer, cfg.consumer.num_consumer_procs + critics,
            r.cpus_per_actor, r.colocate,
        )  # fmt: skip
        # the critic's ranks after the policy's: on the highest-index nodes
        n = cfg.consumer.num_consumer_procs
        server_slots, producers = plan_reward_servers(cfg.reward, nodes, producers, cfg.teacher)
        return producers, trainers[:n], trainers[n:], server_slots, []
    producers, _ = plan_placement(nodes, p.num_producers, p.num_proc_per_producer, 0, r.cpus_per_actor)
    rm = cfg.reward.rm
    counts = {"actor": cfg.consumer.num_consumer_procs, "critic": critics, "ref": lay.ref_procs}
    counts["reward"] = rm.servers if rm.path is not None else 0
    slots = plan_roles(nodes, lay, counts, producers, r.cpus_per_actor)
    server_slots, producers = plan_reward_servers(cfg.reward, nodes, producers, cfg.teacher)
    if "reward" in slots:
        server_slots["rm"] = slots["reward"]
    return producers, slots["actor"], slots.get("critic", []), server_slots, slots.get("ref", [])


def rollout_plan(config: Config, plan: Plan) -> RolloutPlan:
    """The producers' role plan: their sections of ``config`` and what ``plan`` resolved for them, with what they need
    of the trainer (its precision, the adapters it pushes) named, not read from its section."""
    c, p = config.consumer, config.producer
    lora = LoraSpec(c.lora_rank, c.lora_alpha, tuple(c.lora_target_modules)) if c.lora_rank else None
    return RolloutPlan(
        num_producers=p.num_producers,
        backend=p.backend,
        model_path=plan.inference_model_path,
        engine_options=dict(plan.inference_options or {}),
        generation=config.generation,
        algorithm=config.algo_config,
        reward=config.reward,
        train_dataset=plan.train_dataset,
        eval_dataset=plan.eval_dataset,
        prompt_format=plan.prompt_format,
        num_generations=p.num_generations,
        microbatch_size=p.inference_microbatch_size,
        seed=config.run.seed,
        stream_prompts=plan.stream_prompts,
        processor_path=plan.processor_path,
        trainer_precision=TrainerPrecision(c.compute_dtype, c.plugin.precision, c.plugin.tp_size),
        lora=lora,
        teacher=teacher_link(config, plan),
    )


def teacher_link(config: Config, plan: Plan) -> TeacherLink | None:
    """What producers need of the teacher: the chat template it reads prompts with (its own folder's; a
    self-teacher's is the student's), its privileged context and its servers' stall limit."""
    t = config.teacher
    if plan.teacher_model_path is None:
        return None
    path = plan.tokenizer_path if t.self_lag else plan.teacher_model_path
    return TeacherLink(path, t.privileged_context, t.timeout_s)


def trainer_plan(config: Config, plan: Plan, master_addr: str, master_port: int) -> TrainerPlan:
    """The consumers' role plan: their section, the algorithm, how rows were sampled and the group size, the resolved
    model, and where rank 0's process group listens (chosen once the actors are placed)."""
    return TrainerPlan(
        reference_inside=not plan.ref_slots,
        world_size=config.consumer.num_consumer_procs,
        master_addr=master_addr,
        master_port=master_port,
        model_path=plan.train_model_path,
        consumer=config.consumer,
        algorithm=config.algo_config,
        generation=config.generation,
        num_generations=config.producer.num_generations,
        seed=config.run.seed,
    )


def critic_plan(config: Config, plan: Plan, master_addr: str, master_port: int) -> CriticPlan:
    """The critic's role plan: its training settings with the policy's batch arithmetic, the algorithm, how rows
    were sampled, its starting weights, and where its rank 0's process group listens."""
    assert plan.critic_model_path is not None
    return CriticPlan(
        world_size=config.critic.num_procs,
        master_addr=master_addr,
        master_port=master_port,
        model_path=plan.critic_model_path,
        trainer=config.critic_trainer(),
        algorithm=config.algo_config,
        generation=config.generation,
        seed=config.run.seed,
    )


def horizon(episode_steps: int, limit: int | None) -> int:
    """The steps a run trains: all of its episodes' ``episode_steps``, or ``limit`` when that is set and fewer."""
    return min(episode_steps, limit) if limit else episode_steps


def resources_needed(r, slots: list, teacher=None) -> dict[str, float]:
    """{"CPU": n, "GPU": n} the run's actors take: producers and consumers (``slots``), the reward's model servers
    and the teacher's."""
    cpus, gpus = sum(s.num_cpus for s in slots), sum(s.num_gpus for s in slots)
    servers = [(r.rm, r.rm.path), (r.judge, r.judge.path)] + ([(teacher, teacher.model)] if teacher else [])
    for server, path in servers:
        if path is not None:
            cpus, gpus = cpus + server.servers * server.cpus, gpus + server.servers * server.gpus
    return {"CPU": cpus, "GPU": gpus}


CODE_REWARDS, CODE_ENVS = ("code",), ("tool_math",)
"""the reward functions and environments that execute model-written code in the sandbox"""


def check_sandbox(r) -> tuple[str | None, bool, bool]:
    """Where the run executes model-written code: (the sandbox's description, whether its isolation is degraded,
    whether it bounds each run as a whole), after refusing degraded isolation the run does not allow; (None, False,
    True) where it executes none."""
    if r.episodes:
        runs_code = r.env.name in CODE_ENVS
    else:
        runs_code = r.fn in CODE_REWARDS or bool(set(r.components) & set(CODE_REWARDS))
    if not runs_code:
        return None, False, True
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the launcher says it once, on the console
            sandbox = Sandbox(allow_degraded=r.allow_degraded_sandbox)
    except SandboxUnavailable as e:
        raise ValueError(str(e)) from None
    return sandbox.describe(), sandbox.mode != "bwrap", sandbox.cgroups


def check_model_files(path: str, what: str) -> None:
    """A local model folder holds weights, and every safetensors file (each shard an index names) is whole and
    readable."""
    import json
    from pathlib import Path

    folder = Path(path)
    if not folder.is_dir():
        return  # a hub id: fetched and checked by the hub client
    files = weight_files(folder)
    if not files:
        raise FileNotFoundError(
            f"{what} folder {path} has no weights (*.safetensors or *.bin); pass a folder written by save_pretrained"
        )
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        missing = [s for s in shards if not (folder / s).exists()]
        if missing:
            raise FileNotFoundError(
                f"{what} folder {path}: its index names weight files that are not there: "
                f"{missing}; copy or download them"
            )
    for f in files:
        if f.suffix == ".safetensors":
            read_safetensors_header(f)


def check_models(
    cfg: Config,
    train_path: str,
    inference_path: str,
    producer_gpu: bool,
    consumer_gpu: bool,
) -> None:
    """What the workers would refuse, decided from the models' config.json: the parallel layout (architectures),
    the rollout engine on this device (``check_model``), sequences past the position table, fp16 training on CPU.
    Run before Ray starts for a local cluster (its devices are this machine's) and again on the placed actors'."""
    backend, options = backend_options(cfg.producer.backend), cfg.model.inference_options or {}

    p = cfg.consumer.plugin
    train, inference = load_config(train_path), load_config(inference_path)
    if train:
        check_layout(train, f"model {train_path}", p.tp_size, p.pp_size)
        check_experts(train, f"model {train_path}", p.ep_size)
        check_sequence(train, f"model {train_path}", p.sp_size)
        if cfg.consumer.routing_replay:
            check_routing(train, f"model {train_path}")
            backend.check_routing(producer_gpu)
    g = cfg.generation
    for config, where in ((train, f"model {train_path}"), (inference, f"inference model {inference_path}")):
        if config:
            what = f"max_prompt_tokens + max_new_tokens = {g.max_prompt_tokens} + {g.max_new_tokens}"
            check_positions(config, where, g.max_prompt_tokens + g.max_new_tokens, what)
    if inference:
        backend.check_model(inference, f"inference model {inference_path}", options, producer_gpu)
    if p.precision == "fp16" and not consumer_gpu:
        raise ValueError(
            "plugin precision fp16 needs a GPU (its loss scaler is CUDA's); on CPU use precision bf16 or fp32"
        )


def resolve_in_flight(
    requested: bool | None, backend, max_staleness: int, lora_rank: int, images: bool = False
) -> bool:
    """``run.in_flight_weight_updates``: as given, or for None (auto) on wherever the run can load pushes mid-batch:
    an engine that can (``IN_FLIGHT_UPDATES``), producers allowed to run ahead (max_staleness >= 1), full-weight
    pushes (a LoRA adapter loads only between batches) and text prompts (``images``: an engine's cached image
    embeddings are dropped between batches). An explicit True the run cannot honour is refused earlier with the
    reason."""
    if requested is not None:
        return requested
    return backend.IN_FLIGHT_UPDATES and max_staleness >= 1 and not lora_rank and not images


def plan_reward_servers(r, nodes: list[dict], producers: list, teacher=None) -> tuple[dict, list]:
    """({component: server slots}, producer slots) for the reward's model components (rm, judge) and the teacher's
    servers (teacher), placed alike."""

    slots = {}
    servers = [("rm", r.rm, r.rm.path), ("judge", r.judge, r.judge.path)]
    if teacher is not None:
        servers.append(("teacher", teacher, teacher.model))
    for c, server, path in servers:
        if path is not None:
            slots[c], producers = plan_servers(
                server.placement,
                server.servers,
                server.cpus,
                server.gpus,
                nodes,
                producers,
                "teacher.placement" if c == "teacher" else f"reward.{c}.placement",
            )
    return slots, producers


def overlong_rows(rows: list[dict], encode, limit: int, what: str, drop: bool) -> list[int]:
    """Indices of the rows whose prompts (``encode``: a row's prompt ids) have more than ``limit`` tokens: refused,
    or returned when ``drop``."""
    over = []
    for i, row in enumerate(rows):
        n = len(encode(row))
        if n > limit and not drop:
            raise ValueError(
                f"{what} row {i}'s prompt has {n} tokens > max_prompt_tokens={limit}; raise "
                "max_prompt_tokens, or drop such rows with filter_overlong_prompts "
                "(--filter-overlong-prompts)"
            )
        if n > limit:
            over.append(i)
    return over


def check_reward_model(path: str) -> None:
    """``path`` is a sequence-classification folder with one output (the reward model loads in its own actors)."""
    from transformers import AutoConfig

    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(
            f"reward model {path} is not a model folder (no config.json); reward.rm.path takes a local "
            "AutoModelForSequenceClassification folder"
        )
    config = AutoConfig.from_pretrained(path)
    if config.num_labels != 1 or not any(a.endswith("ForSequenceClassification") for a in config.architectures or []):
        raise ValueError(
            f"reward model {path} is {config.architectures} with {config.num_labels} outputs; a reward "
            "model is a ...ForSequenceClassification with one (num_labels=1)"
        )


def check_judge(path: str, template: str, row_sets: dict[str, list[dict]]) -> None:
    """``path`` is a model folder, and a template that shows each row's rubric finds one in every row."""

    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(
            f"judge {path} is not a model folder (no config.json); reward.judge.path takes a local generative model "
            "folder"
        )
    if "rubric" in template_fields(template):
        for what, rows in row_sets.items():
            missing = [i for i, row in enumerate(rows) if row.get("rubric") in (None, "")]
            if missing:
                raise ValueError(
                    f"reward.judge.template shows {{rubric}}, but {what} row {missing[0]} ({len(missing)} rows "
                    "in all) has no 'rubric' column value; add one to every row or drop {rubric} from "
                    "the template"
                )


def check_env_inputs(cfg: Config, rows: list[dict], what: str, tokenizer) -> None:
    """The environment resolves, its chat template closes turns with the end-of-turn token, and each row makes an
    episode whose first messages fit in reward.env.max_tokens (with room for a turn)."""

    env = cfg.reward.env
    env_cls, template = resolve_environment(env.name), TurnTemplate(tokenizer)
    for i, row in enumerate(rows):
        try:
            messages = check_messages(env_cls(row, **env.kwargs).reset(), "reset()")
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(
                f"{what} row {i}: env {env.name!r} with kwargs {env.kwargs} cannot start an episode: "
                f"{type(e).__name__}: {e}"
            ) from e
        n = len(template.prompt(messages))
        if n >= env.max_tokens:
            raise ValueError(
                f"{what} row {i}: the episode's first messages take {n} tokens, reward.env.max_tokens is "
                f"{env.max_tokens}; raise it (--env-max-tokens, and max_prompt_tokens)"
            )


def check_reward_inputs(cfg: Config, rows: list[dict], what: str) -> None:
    """The reward function's options against its signature, and every row against the columns it requires
    (present and not null or blank in every row)."""

    columns = set.intersection(*(set(reward_fields(r)) for r in rows))
    for fn in (cfg.reward.fn, *cfg.reward.other_fns):  # reward_kwargs are the run's own function's options
        kwargs = cfg.reward.kwargs if fn == cfg.reward.fn else {}
        function = resolve_reward_fn(fn)
        signature = RewardSignature.of(function, fn)
        try:
            signature.check(columns, kwargs)
            max_reward_of(function, fn)  # a number reward's maximum, refused here rather than in every worker
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
        for column in signature.required:
            if column in TRAINER_FIELDS or column in kwargs:
                continue
            for i, row in enumerate(rows):
                value = row[column]
                if value is None or (isinstance(value, str) and not value.strip()):
                    raise ValueError(
                        f"{what} row {i}: column {column!r} is {value!r}, but reward function {fn} needs a value in "
                        "every row; fix or drop the row"
                    )
    check_gold_answers(cfg.reward.fn, rows, what)


def check_gold_answers(fn: str, rows: list[dict], what: str) -> None:
    """For the math rewards (``math``, ``think_answer_tags``, ``boxed``), every row's gt_answer is a non-empty
    string or a finite number (a list, dict, boolean or NaN would be compared as its text and score every answer 0)."""

    if resolve_reward_fn(fn) not in (math_reward, think_answer_tags, boxed):
        return
    for i, row in enumerate(rows):
        try:
            check_gold(row.get("gt_answer"))
        except ValueError as e:
            raise ValueError(f"{what} row {i} ({_row_excerpt(row)}): {e}; fix or drop the row") from None


def _row_excerpt(row: dict, limit: int = 120) -> str:
    import json

    text = json.dumps(row, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "...}"


def resolve_stream(cfg: Config, backend, max_staleness: int) -> int:
    """``producer.stream_prompts``, refused with the reason where the run cannot keep groups in the engine across
    draws."""
    requested, lora, env = cfg.producer.stream_prompts, cfg.consumer.lora_rank, cfg.reward.env.name
    why = None
    if not backend.STREAMS:
        why = f"the {backend.engine_name()} engine generates rounds only; use the vllm backend"
    elif max_staleness < 1:
        why = (
            "max_staleness=0 trains only rows of the weights being trained, and groups left in the engine "
            "would be sampled by older ones; set max_staleness >= 1"
        )
    elif lora:
        why = f"lora_rank={lora}: an adapter loads between rounds; use lora_rank 0"
    elif env is not None:
        why = f"the environment {env} runs episodes turn by turn, in rounds"
    if requested and why:
        raise ValueError(f"stream_prompts={requested}, but {why}; or use stream_prompts=0 (rounds)")
    return requested
