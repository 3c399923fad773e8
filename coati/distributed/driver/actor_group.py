"""The run's actors as two groups, and every call the driver fans out to them: start-up on the planned nodes, the
weight groups, weight pushes, rollouts, evaluation, sleeping and waking, reading weights back, shutdown. Each fan-out
is one bounded wait whose failure names the actor that died (``RunError``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from coati import registry
from coati.distributed.driver.preflight import critic_plan, rollout_plan, trainer_plan
from coati.distributed.guards import RunError
from coati.distributed.inference import backend_options
from coati.distributed.reward.judge import JudgeServer
from coati.distributed.reward.model_actors import RewardModelServer
from coati.distributed.rollout.producer import Producer
from coati.distributed.runtime.liveness import Stall, Watchdog
from coati.distributed.runtime.placement import actor_options, free_port, reserve_shared_gpus, weight_backend
from coati.distributed.transport.attest import compare

STEP_TIMEOUT_S = 3600.0
"""the longest the driver waits for one fan-out (a rollout round, a training step, ...)"""

KEEP_FREED_MEMORY = "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776"
"""glibc's malloc settings for actors on a CPU (``GLIBC_TUNABLES``): one heap whose freed memory stays mapped.
By default glibc maps every allocation over 32 MB afresh and unmaps it when freed, so each training step faulted in
the pages of its largest tensors again (the tied embedding's weight cast and gradients: ~90,000 page faults a step on
SmolLM2-135M), and each push's reload in a vLLM producer the pages of the layers it rebuilds; kept, they reuse them.
A ``GLIBC_TUNABLES`` in the driver's environment is passed on instead."""

ACTOR_NAMES: dict[str, str] = {}
"""actor id (hex) -> the name the driver gave it, for error messages"""


WATCH: dict = {}
"""the running run's watchdog ("watchdog": its actor handle, "limit_s": run.hang_timeout_s), set while its actors
live (``liveness``)"""


WATCH_SLICE_S = 2.0
"""seconds between two questions to the watchdog while waiting: a stopped actor is named within
``run.hang_timeout_s`` plus a heartbeat (``liveness.HEARTBEAT_S``) plus this"""


def get(refs, what: str, timeout: float | None = STEP_TIMEOUT_S, moving: Moving | None = None):
    """ray.get bounded in time, with failures re-raised as RunError naming what was being waited for; while the run's
    actors live, an actor silent longer than ``run.hang_timeout_s`` ends the wait naming it (``liveness``), and so
    does, with ``moving``, a transfer that stops moving for as long while every actor beats."""
    import ray

    try:
        left = _wait_watching(refs, what, timeout, moving=moving) if WATCH else timeout
        return ray.get(refs, timeout=left)
    except ray.exceptions.RayActorError as e:
        name = ACTOR_NAMES.get(getattr(e, "actor_id", None) or "", getattr(e, "actor_id", "unknown"))
        raise RunError(f"{what}: actor {name} died ({_first_line(e)})") from e
    except ray.exceptions.RayTaskError as e:
        raise RunError(f"{what} failed: {_first_line(e)}") from e
    except ray.exceptions.GetTimeoutError as e:
        raise RunError(f"{what}: no answer within {timeout:.0f} s") from e


@dataclass
class Moving:
    """A transfer between actors that must keep moving while any of ``senders`` (refs) is unfinished: ``members`` are
    (actor name, what it was asked, its ref) for every actor taking part, whose heartbeats carry their finished
    transfers (``liveness``)."""

    senders: list
    members: list[tuple[str, str, object]]
    stall: Stall = field(default_factory=Stall)

    def check(self, watchdog, limit_s: float, what: str) -> None:
        """Raise RunError when no member has finished a transfer for ``limit_s`` while a sender is unfinished."""
        import ray

        if ready(self.senders):
            return
        names = [name for name, _, _ in self.members]
        stalled = self.stall.seconds(sum(ray.get(watchdog.progress.remote(names), timeout=30).values()))
        if stalled > limit_s:
            waiting = [f"{name} ({call})" for name, call, ref in self.members if not ready([ref])]
            raise RunError(
                f"{what}: no transfer has finished for {stalled:.0f} s while every actor lives (a "
                "collective hangs: a member that never joined it, or a network that stopped carrying it); still "
                f"waiting: {', '.join(waiting)} (run.hang_timeout_s={limit_s:g}, --hang-timeout-s)"
            )


def _wait_watching(
    refs, what: str, timeout: float | None, num_returns: int | None = None, moving: Moving | None = None
) -> float | None:
    """Wait for ``refs`` (``num_returns`` of them; None: all) up to ``timeout`` in slices, asking the watchdog after
    each which actors are silent (and, with ``moving``, whether its transfer still moves); returns what is left of
    ``timeout`` (None: no limit) for the caller's ``ray.get``."""
    import ray

    pending = list(refs) if isinstance(refs, (list, tuple)) else [refs]
    wanted = len(pending) if num_returns is None else num_returns
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if wanted <= 0 or left == 0:
            return left  # done, or the caller's ray.get reports the timeout at once
        slice_s = min(left or WATCH_SLICE_S, WATCH_SLICE_S)
        done, pending = ray.wait(pending, num_returns=min(wanted, len(pending)), timeout=slice_s, fetch_local=False)
        wanted -= len(done)
        if wanted <= 0:
            continue
        silent = ray.get(WATCH["watchdog"].silent.remote(WATCH["limit_s"]), timeout=30)
        if silent:
            name, seconds = max(silent.items(), key=lambda kv: kv[1])
            raise RunError(
                f"{what}: actor {name} has given no sign of life for {seconds:.0f} s (its process is stopped, stuck "
                f"in native code or gone; run.hang_timeout_s={WATCH['limit_s']:g}, --hang-timeout-s)"
            )
        if moving is not None:
            moving.check(WATCH["watchdog"], WATCH["limit_s"], what)


def ready(refs) -> bool:
    """Every one of ``refs`` has finished (without waiting)."""
    import ray

    return len(ray.wait(list(refs), num_returns=len(refs), timeout=0, fetch_local=False)[0]) == len(refs)


def wait_any(*ref_lists, what: str) -> None:
    """Block until one more of these refs finishes (or none is left unfinished); while the run's actors live, an
    actor silent longer than ``run.hang_timeout_s`` ends the wait naming it, as in ``get``."""
    import ray

    pending = [r for refs in ref_lists for r in refs if not ready([r])]
    if pending and WATCH:
        _wait_watching(pending, what, STEP_TIMEOUT_S, num_returns=1)
    elif pending:
        ray.wait(pending, num_returns=1, timeout=STEP_TIMEOUT_S, fetch_local=False)


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    tail = [line for line in text if "Error" in line]
    return (tail[-1] if tail else text[0] if text else type(e).__name__)[:500]


def cpu_actor_env(env: dict, gpus: float) -> dict:
    """``env`` (the actors' ``runtime_env`` options) for a producer or consumer holding ``gpus`` GPUs: on a CPU, with
    the malloc settings that keep freed memory (``KEEP_FREED_MEMORY``, or the driver's own ``GLIBC_TUNABLES``)."""
    if gpus > 0:
        return env
    tunables = os.environ.get("GLIBC_TUNABLES", KEEP_FREED_MEMORY)
    return {
        "runtime_env": {
            **env["runtime_env"],
            "env_vars": {**env["runtime_env"]["env_vars"], "GLIBC_TUNABLES": tunables},
        }
    }


def thread_counts(nodes: list[str], cores: dict[str, int], working: list[bool]) -> list[int]:
    """CPU threads per actor: a working actor gets an equal share of its node's cores among the actors working on
    that node (at least 1), an idle one 1. Shares never add up to more than a node's cores, so nothing oversubscribes
    (two single-threaded actors on one core already made generation 40-60x slower)."""
    busy: dict[str, int] = {}
    for node, w in zip(nodes, working, strict=True):
        busy[node] = busy.get(node, 0) + w
    return [max(1, cores[node] // busy[node]) if w else 1 for node, w in zip(nodes, working, strict=True)]


def actor_env() -> dict:
    """Every actor's runtime environment: one thread until it is lent more, the driver's hub setting, and the
    driver's folder on the path and its user folders named (``coati.registry.USER_FOLDERS``: the current folder, the
    data's; put first on the path at the first lookup), so user reward modules (module:function) import there as in
    the driver."""
    folders = registry.USER_FOLDERS or [os.getcwd()]
    path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    env_vars = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0")}
    env_vars[registry.USER_FOLDERS_ENV] = os.pathsep.join(folders)
    return {"runtime_env": {"env_vars": {**env_vars, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path}}}


def start_reward_servers(r, plan, run_name: str, shared_gpus: dict, env: dict) -> tuple[dict[str, list], list]:
    """The reward-model and judge actors of the reward's model components ({component: [(name, actor)]}), each
    with its own resources, and their pings (each answered once its model has loaded, with its start-up marks): the
    servers load while the producers and consumers start."""
    wanted = {}
    if r.rm.path is not None:
        wanted["rm"] = (RewardModelServer, r.rm, dict(path=r.rm.path, batch_size=r.rm.batch_size))
    if r.judge.path is not None:
        j = r.judge
        options = ("path", "backend", "template", "max_score", "max_new_tokens", "max_prompt_tokens")
        wanted["judge"] = (JudgeServer, j, {k: getattr(j, k) for k in options})
    servers = {
        component: start_servers(
            cls, kwargs, section, f"{run_name}-{component}", plan.server_slots[component], shared_gpus, env
        )
        for component, (cls, section, kwargs) in wanted.items()
    }
    return servers, [a.ping.remote() for group in servers.values() for _, a in group]


def start_servers(cls, kwargs: dict, section, prefix: str, slots: list, shared_gpus: dict, env: dict) -> list:
    """[(name, actor)]: one ``cls(**kwargs)`` server per slot, named ``<prefix>-<i>``, with the CPUs and GPUs of its
    config ``section`` reserved and as many threads as its CPUs (a reward model's, a judge's, a teacher's)."""
    import ray

    assert len(slots) == section.servers, (prefix, len(slots), section.servers)
    cpus, gpus = section.cpus, section.gpus
    remote, kwargs = ray.remote(cls), {**kwargs, "threads": max(1, int(cpus))}  # its reserved CPUs
    servers = []
    for i, slot in enumerate(slots):
        name = f"{prefix}-{i}"
        actor = remote.options(name=name, **actor_options(slot, shared_gpus, cpus, gpus), **env).remote(**kwargs)
        ACTOR_NAMES[actor._actor_id.hex()] = name
        servers.append((name, actor))
    return servers


def start_teacher_servers(config, plan, run_name: str, shared_gpus: dict, env: dict) -> tuple[list, list]:
    """The teacher's servers [(name, actor)] on their planned slots, and their pings (each answered once its model
    has loaded); none when the run does not distil."""
    from coati.distributed.teacher.server import TeacherServer  # deferred: imports torch and transformers

    t = config.teacher
    if plan.teacher_model_path is None:
        return [], []
    kwargs = dict(path=plan.teacher_model_path, temperature=config.generation.temperature, batch_tokens=t.batch_tokens)
    servers = start_servers(
        TeacherServer, kwargs, t, f"{run_name}-teacher", plan.server_slots["teacher"], shared_gpus, env
    )
    return servers, [a.ping.remote() for _, a in servers]


class ActorGroups:
    """Producers (on the low-index nodes) and consumers (on the high-index ones), as the plan placed them."""

    def __init__(self, config, plan, run_name: str):
        self.cfg, self.plan, self.run_name = config, plan, run_name
        r = config.run
        self.seed, self.master_addr, self.master_port = r.seed, r.master_addr, r.master_port
        self.in_flight, self.follow_work = plan.in_flight, r.threads_follow_work
        self.train_calls = self.generate_calls = 0
        """training steps and rollout rounds started, numbering each so that a lend of cores reaches the call it was
        meant for"""
        self.producers, self.consumers, self.senders = [], [], []
        self.critics: list = []
        """the critic's ranks (PPO), none without a critic"""
        self.references: list = []
        """the reference servers (``layout.ref_procs``), none where each consumer holds the reference"""
        self.reference_info: list[dict] = []
        self.critic_info: list[dict] = []
        self.weight_groups: list[str] = []
        self.shared_gpus: dict[int, object] = {}
        self.producer_info: list[dict] = []
        self.consumer_info: list[dict] = []
        self.server_info: list[dict] = []
        self.teachers: list = []
        """the teacher's servers [(name, actor)] (on-policy distillation), none without a teacher"""
        self.teacher_version = 0
        """the policy version a self-teacher holds (0: the model folder's weights)"""
        self.teacher_weights = None
        """the object-store ref of the weights a self-teacher was last given (None: the folder's), for checkpoints"""

    def start(self, consumers: bool = True) -> None:
        """Start the plan's actors (the reward's model servers, the producers and, unless ``consumers`` is False,
        the consumers) and set them up."""
        p, env = self.plan, actor_env()
        self._start_watchdog()
        servers = [s for slots in p.server_slots.values() for s in slots if s is not None]
        self.shared_gpus = reserve_shared_gpus(
            p.producer_slots + p.consumer_slots + p.critic_slots + p.ref_slots + servers
        )
        self.reward_servers, pings = start_reward_servers(self.cfg.reward, p, self.run_name, self.shared_gpus, env)
        self.teachers, teacher_pings = start_teacher_servers(self.cfg, p, self.run_name, self.shared_gpus, env)
        pings = pings + teacher_pings
        if self.shared_gpus:  # a server on a GPU an engine shares loads first: the engine sizes itself by what is free
            self.server_info = get(pings, "model server setup")
        self._start_producers(env)
        if consumers:
            self._start_consumers(env)
            self._start_critics(env)
            self._start_references(env)
        groups = ("producer", self.producers), ("consumer", self.consumers), ("critic", self.critics)
        for kind, group in (*groups, ("reference", self.references)):
            for i, a in enumerate(group):
                ACTOR_NAMES[a._actor_id.hex()] = f"{self.run_name}-{kind}-{i}"
        producers = [a.setup.remote() for a in self.producers]
        if self.shared_gpus:  # engines size their memory by what is free on the GPU: no consumer loading beside them
            self.producer_info = get(producers, "producer setup")
        consumers = [a.setup.remote() for a in self.consumers]
        critics = [a.setup.remote() for a in self.critics]
        self.server_info = get(pings, "model server setup")  # first: a model that fails to load is what stops the run
        self.producer_info = get(producers, "producer setup")
        self.consumer_info = get(consumers, "consumer setup")
        self.critic_info = get(critics, "critic setup")
        self.reference_info = get([a.ping.remote() for a in self.references], "reference server setup")
        self.cores = {}
        # the CPUs each node lets its actors run on
        for info in self.producer_info + self.consumer_info + self.critic_info:
            self.cores[info["node_id"]] = min(self.cores.get(info["node_id"], info["cores"]), info["cores"])

    def startup(self) -> list[tuple[str, dict]]:
        """(name, setup's or ping's reply) of each producer, consumer and reward server, for the start-up account."""
        servers = [
            name.removeprefix(f"{self.run_name}-")
            for group in [*self.reward_servers.values(), self.teachers]
            for name, _ in group
        ]
        return (
            [(f"producer-{i}", info) for i, info in enumerate(self.producer_info)]
            + [(f"consumer-{i}", info) for i, info in enumerate(self.consumer_info)]
            + [(f"critic-{i}", info) for i, info in enumerate(self.critic_info)]
            + [(f"reference-{i}", info) for i, info in enumerate(self.reference_info)]
            + list(zip(servers, self.server_info, strict=True))
        )

    def _start_watchdog(self) -> None:
        """The run's watchdog (``liveness``), on the driver's node with no CPU reserved, before the actors that beat
        to it."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        where = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node, soft=True)
        self.watchdog = (
            ray.remote(Watchdog)
            .options(name=f"{self.run_name}-watchdog", num_cpus=0, scheduling_strategy=where)
            .remote()
        )
        WATCH.update(watchdog=self.watchdog, limit_s=self.cfg.run.hang_timeout_s)

    def _start_producers(self, env: dict) -> None:
        import ray

        # With in-flight updates a push is received on a second thread while the first one generates; with threads
        # following the work, an actor is lent cores on another thread while the first one trains or generates.
        concurrency = 1 + self.in_flight + self.follow_work
        threads = {"max_concurrency": concurrency} if concurrency > 1 else {}
        role = rollout_plan(self.cfg, self.plan)
        for i, slot in enumerate(self.plan.producer_slots):
            options = actor_options(slot, self.shared_gpus)
            actor = ray.remote(Producer).options(
                **options, **cpu_actor_env(env, slot.num_gpus), **threads, name=f"{self.run_name}-producer-{i}"
            )
            self.producers.append(actor.remote(i, role, self.reward_servers, self.teachers))

    def _start_consumers(self, env: dict) -> None:
        import ray

        from coati.distributed.trainer.consumer import GRPOConsumer  # deferred: imports Ray's collective module

        c, slots = self.cfg, self.plan.consumer_slots
        lend = {"max_concurrency": 2} if self.follow_work else {}  # a second thread takes lent cores
        addr, port = self.master_addr or slots[0].address, self.master_port or _port_on(slots[0].node_id)
        role = trainer_plan(c, self.plan, addr, port)
        for rank, slot in enumerate(slots):
            options = actor_options(slot, self.shared_gpus)
            actor = ray.remote(GRPOConsumer).options(
                **options, **cpu_actor_env(env, slot.num_gpus), **lend, name=f"{self.run_name}-consumer-{rank}"
            )
            self.consumers.append(actor.remote(rank, role))

    def _start_critics(self, env: dict) -> None:
        """The critic's ranks (PPO), in a process group of their own, on the slots preflight planned."""
        import ray

        from coati.distributed.critic.consumer import CriticConsumer  # deferred: imports ColossalAI

        slots = self.plan.critic_slots
        if not slots:
            return
        lend = {"max_concurrency": 2} if self.follow_work else {}
        role = critic_plan(self.cfg, self.plan, slots[0].address, _port_on(slots[0].node_id))
        for rank, slot in enumerate(slots):
            actor = ray.remote(CriticConsumer).options(
                **actor_options(slot, self.shared_gpus),
                **cpu_actor_env(env, slot.num_gpus),
                **lend,
                name=f"{self.run_name}-critic-{rank}",
            )
            self.critics.append(actor.remote(rank, role))

    def _start_references(self, env: dict) -> None:
        """The reference servers of the layout, each a whole replica on its planned slot."""
        import ray

        from coati.distributed.trainer.reference import ReferenceServer  # deferred: imports torch and transformers

        for i, slot in enumerate(self.plan.ref_slots):
            actor = ray.remote(ReferenceServer).options(
                **actor_options(slot, self.shared_gpus),
                **cpu_actor_env(env, slot.num_gpus),
                name=f"{self.run_name}-reference-{i}",
            )
            self.references.append(actor.remote(self.plan.train_model_path, self.cfg.generation.temperature))

    def threads(self, producers: bool, consumers: bool) -> tuple[list, list]:
        """Threads for each producer and each consumer while the producers (``producers``) and/or the consumers
        (``consumers``, the critic's ranks with them) work; None each when threads do not follow the work (every
        actor keeps its own). The critic's share is ``critic_threads``."""
        counts = self._thread_counts(producers, consumers)
        np_, nc = len(self.producers), len(self.consumers)
        return counts[:np_], counts[np_ : np_ + nc]

    def critic_threads(self, producers: bool) -> list:
        """Threads for each critic rank while it works beside the consumers (and the producers, ``producers``)."""
        return self._thread_counts(producers, True)[len(self.producers) + len(self.consumers) :]

    def _thread_counts(self, producers: bool, consumers: bool) -> list:
        np_, nc, nk = len(self.producers), len(self.consumers), len(self.critics)
        if not self.follow_work:
            return [None] * (np_ + nc + nk)
        nodes = [info["node_id"] for info in self.producer_info + self.consumer_info + self.critic_info]
        return thread_counts(nodes, self.cores, [producers] * np_ + [consumers] * (nc + nk))

    def lend_to_consumers(self) -> None:
        """The producers have stopped for this step: the training step last started takes their cores from its next
        micro-batch on (the consumers, and the critic's ranks, give them back when the step ends)."""
        if self.follow_work:
            for c, n in zip(self.consumers, self.threads(False, True)[1], strict=True):
                c.set_threads.remote(n, self.train_calls)
            for c, n in zip(self.critics, self.critic_threads(False), strict=True):
                c.set_threads.remote(n, self.train_calls)

    def lend_to_producers(self) -> None:
        """The training step has ended while a rollout round still runs: the round takes the consumers' cores from its
        next decode step on (each producer gives them back when its call ends, or ``take_back_from_producers``)."""
        self._producer_threads(training=False)

    def take_back_from_producers(self) -> None:
        """A training step is about to start while the rollout round lent the consumers' cores still runs: the round
        goes back to its share from its next decode step on."""
        self._producer_threads(training=True)

    def _producer_threads(self, training: bool) -> None:
        if self.follow_work:
            for p, n in zip(self.producers, self.threads(True, training)[0], strict=True):
                p.set_threads.remote(n, self.generate_calls)

    def connect_weight_group(self, timeout_s: float) -> None:
        """One weight group per consumer pipeline stage: its sender (DP rank 0, TP rank 0) plus every producer."""
        from coati.distributed.transport import forget_group_address  # deferred: imports Ray's collective module

        backend = weight_backend(self.plan.producer_slots, self.plan.consumer_slots)
        stages = sorted({info["pp_rank"] for info in self.consumer_info})
        self.senders = [
            next(
                i
                for i, info in enumerate(self.consumer_info)
                if info["pp_rank"] == s and info["dp_rank"] == 0 and info["tp_rank"] == 0
            )
            for s in stages
        ]
        self.weight_groups = groups = [f"{self.run_name}-weights-stage{s}" for s in stages]
        for g in groups:  # members look rank 0 up by name: none may find one an earlier run of this name left
            forget_group_address(g)
        # Engines with worker processes (vLLM) put each of them in the group; the others one process per producer.
        per = backend_options(self.cfg.producer.backend).weight_ranks(self.plan.inference_options)
        world = 1 + len(self.producers) * per
        # Full pushes travel in the engines' weight dtype where they all hold one (they cast to it on arrival).
        dtypes = {info["weight_dtype"] for info in self.producer_info}
        wire = dtypes.pop() if len(dtypes) == 1 else None
        refs = [
            self.consumers[i].join_weight_group.remote(world, g, backend, timeout_s, wire)
            for i, g in zip(self.senders, groups, strict=True)
        ]
        refs += [
            p.join_weight_groups.remote(world, 1 + i * per, groups, backend, timeout_s)
            for i, p in enumerate(self.producers)
        ]
        get(refs, "joining the weight groups")

    def push_weights(self, version: int) -> dict:
        """Every consumer pushes (senders send, the others take part in gathers), every producer receives; returns
        how the push travelled, as producer 0 saw it (all producers receive the same transfers)."""
        refs = [c.push_weights.remote(version) for c in self.consumers]
        # An engine loads a push once it is whole, when the consumers have sent theirs: it may take their cores.
        refs += [p.receive_weights.remote(t) for p, t in zip(self.producers, self.threads(True, False)[0], strict=True)]
        calls = ["pushing"] * len(self.consumers) + ["receiving"] * len(self.producers)
        names = [ACTOR_NAMES.get(a._actor_id.hex(), "?") for a in self.consumers + self.producers]
        moving = Moving([refs[i] for i in self.senders], list(zip(names, calls, refs, strict=True)))
        results = get(refs, f"weight push {version}", moving=moving)
        sent_by, received = results[: len(self.consumers)], results[len(self.consumers) :]
        stats = {k: v for k, v in received[0].items() if k.startswith("weights/")}
        return {**stats, **self.attest(version, sent_by, received)}

    def attest(self, version: int, sent_by: list[dict], received: list[dict]) -> dict:
        """Compare what each producer's engine holds after push ``version`` with what the consumers sent (``attest``);
        a difference stops the run naming the tensors and the producer. Returns the tensors compared per engine."""

        sent = {}
        for result in sent_by:
            sent.update(result.get("fingerprints") or {})
        compared = []
        for i, result in enumerate(received):
            held = result.get("fingerprints")
            if not sent or held is None:
                continue  # an engine that cannot read its weights back
            wrong, n = compare(sent, held)
            if wrong:
                raise RunError(
                    f"weight push {version}: producer {i}'s engine holds {len(wrong)} of the {n} tensors "
                    f"compared unlike the consumers sent them ({', '.join(wrong[:5])}"
                    f"{', ...' if len(wrong) > 5 else ''}); it did not load the push whole, so it would "
                    "generate from other weights than those trained"
                )
            compared.append(n)
        return {"weights/attested": min(compared)} if compared else {}

    def generate(self, sizes: list[int], training: bool) -> list:
        """Start a rollout round: producer i draws ``sizes[i]`` prompts (none when 0), alongside a training step
        (``training``) or alone; returns the refs."""
        threads = self.threads(True, training)[0]
        self.generate_calls += 1
        return [
            p.generate.remote(k, t, self.generate_calls)
            for p, k, t in zip(self.producers, sizes, threads, strict=True)
            if k > 0
        ]

    def train(self, batch_ref, generating: bool, total_steps: int | None = None, policy: bool = True) -> list:
        """Start a training step of a run of ``total_steps``, alongside rollouts (``generating``) or alone: the
        policy's (counted only, ``policy`` False: the critic's warm-up) and the critic's at once; returns the refs,
        the consumers' first."""
        threads = self.threads(generating, True)[1]
        self.train_calls += 1
        refs = [
            c.train_step.remote(batch_ref, t, self.train_calls, total_steps, policy)
            for c, t in zip(self.consumers, threads, strict=True)
        ]
        return refs + [
            c.train_step.remote(batch_ref, t, self.train_calls, total_steps)
            for c, t in zip(self.critics, self.critic_threads(generating), strict=True)
        ]

    def experience(
        self, batch_ref, rows: int, width: int, values: bool, logprobs: bool, generating: bool, ref: bool = False
    ) -> dict:
        """What a step's batch needs before it trains, at once: the critic's values (``values``), the policy's
        log-probs and, without servers of its own, the reference's (``logprobs``), the reference servers' (``ref``),
        each [rows, width] float32 put together from the ranks' shards."""
        import numpy as np

        self.train_calls += 1
        asks = {}
        if ref and self.references:  # the rows split evenly over the servers, each on a thread
            k = len(self.references)
            bounds = [rows * i // k for i in range(k + 1)]
            asks["references"] = [
                a.logprobs.remote(batch_ref, np.arange(bounds[i], bounds[i + 1]), 1, self.train_calls)
                for i, a in enumerate(self.references)
            ]
        if values:
            asks["values"] = [
                c.values.remote(batch_ref, t, self.train_calls)
                for c, t in zip(self.critics, self.critic_threads(generating), strict=True)
            ]
        if logprobs:
            asks["logprobs"] = [
                c.experience.remote(batch_ref, t, self.train_calls)
                for c, t in zip(self.consumers, self.threads(generating, True)[1], strict=True)
            ]
        answers = {k: get(v, f"the step's {k} before training") for k, v in asks.items()}
        out = {}
        for key, names in (("values", ("values",)), ("logprobs", ("old", "ref")), ("references", ("ref",))):
            for name in names if key in answers else ():
                full = np.zeros((rows, width), dtype=np.float32)
                parts = [part for part in answers[key] if part and name in part]
                for part in parts:
                    full[part["rows"]] = part[name]
                if parts:
                    out[name] = full
        return out

    def refresh_teachers(self, version: int, weights=None) -> None:
        """A self-teacher takes the policy's weights of ``version``: gathered from the consumers, or ``weights`` (a
        checkpoint's); every teacher server holds them once this returns."""
        import ray

        self.teacher_weights = ray.put(self.full_weights() if weights is None else weights)
        get([a.load_weights.remote(self.teacher_weights, version) for _, a in self.teachers], "refreshing the teacher")
        self.teacher_version = version

    def evaluate(self) -> list[dict]:
        threads = self.threads(True, False)[0]
        return get([p.evaluate.remote(threads=t) for p, t in zip(self.producers, threads, strict=True)], "evaluation")

    def sleep(self) -> dict:
        """Producers free accelerator memory before consumers start training (they may share the GPUs)."""
        start = time.perf_counter()
        mem = get([p.sleep.remote() for p in self.producers], "producers going to sleep")
        return {
            "time/sleep": time.perf_counter() - start,
            "inference/mem_awake_mb": max(m[0] for m in mem) / 2**20,
            "inference/mem_asleep_mb": max(m[1] for m in mem) / 2**20,
        }

    def wake(self) -> float:
        start = time.perf_counter()
        get([p.wake.remote() for p in self.producers], "producers waking")
        return time.perf_counter() - start

    def offload_trainers(self, copy: bool = False) -> dict:
        """Consumers and critic ranks park their states in host memory until their next call that needs them
        (``run.offload_trainers``; ``copy``: copied even on CPU trainers); returns the seconds, the megabytes moved and
        the accelerator memory the busiest rank held before and after."""
        start = time.perf_counter()
        parked = get([a.offload.remote(copy) for a in self.consumers + self.critics], "trainers offloading")
        return {
            "time/trainer_offload": time.perf_counter() - start,
            "trainer/mem_resident_mb": max(m["resident_bytes"] for m in parked) / 2**20,
            "trainer/mem_offloaded_mb": max(m["parked_bytes"] for m in parked) / 2**20,
            "trainer/offloaded_mb": sum(m["bytes"] for m in parked) / 2**20,
        }

    def full_weights(self) -> dict:
        """The whole model's weights, merged from each pipeline stage's sender (all ranks join the TP gathers)."""
        states = get([c.weights.remote() for c in self.consumers], "gathering weights")
        merged = {}
        for i in self.senders:
            merged.update(states[i])
        return merged

    def shutdown(self) -> None:
        import ray

        from coati.distributed.transport import forget_group_address  # deferred: imports Ray's collective module

        for a in self.producers:
            try:
                ray.get(a.close.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        servers = [
            a
            for group in [*getattr(self, "reward_servers", {}).values(), getattr(self, "teachers", [])]
            for _, a in group
        ]
        WATCH.clear()
        watchdog = [self.watchdog] if hasattr(self, "watchdog") else []
        for a in self.producers + self.consumers + self.critics + self.references + servers + watchdog:
            ray.kill(a)
        for g in self.shared_gpus.values():
            ray.util.remove_placement_group(g)
        for name in self.weight_groups:  # killed rank 0s leave their addresses behind
            forget_group_address(name)


def _port_on(node_id: str) -> int:
    """A free port on the node whose consumer (rank 0) serves the consumers' world: asked there when it is not the
    driver's node (a port free here says nothing about another machine)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if node_id == ray.get_runtime_context().get_node_id():
        return free_port()
    there = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return ray.get(ray.remote(num_cpus=0)(free_port).options(scheduling_strategy=there).remote(), timeout=60)
