"""Where actors run: producers on the lowest-index nodes, consumers on the highest, enforced with node affinity
(never left to Ray's load balancer, whose choice could put a consumer where a producer was planned and hang the job).

Node order is deterministic: alive nodes sorted by (index in ``ray.nodes()``), dead nodes excluded. With GPUs, each
producer takes ``gpus_per_producer`` GPUs and each consumer one GPU; with ``colocate``, producer i and consumer i share
the i-th GPU (half each), for machines with fewer GPUs than actors. Without GPUs, actors take ``cpus_per_actor`` CPUs.
Reward-model and judge servers go where their ``placement`` says: anywhere with their resources (``any``), on the
K-th node (``node:K``), or beside the producers (``producer``), taking a share of a producer's GPU when they ask
for GPUs. A plan that does not fit raises before any actor starts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    node_id: str
    address: str
    num_gpus: float
    num_cpus: float
    share: int | None = None
    """with colocate: index of the GPU this actor shares with its partner (one placement group per GPU)"""


def alive_nodes() -> list[dict]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive", n.get("alive", False))]


def free_port() -> int:
    """A TCP port nothing on this machine holds now, for a server socket another process binds moments later (the
    consumers' torch.distributed world). It is drawn between Ray's worker ports (10002-19999 by default) and the
    kernel's ephemeral range, whose ports every outgoing connection takes: a port handed out by ``bind(0)`` comes from
    that range, and an outgoing connection of Ray's can take it again before the server binds it (EADDRINUSE)."""
    import random
    import socket

    low, high = 20000, _ephemeral_start() - 1
    for port in random.sample(range(low, high + 1), min(64, max(high - low + 1, 0))):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no such range on this machine, or all of it taken
        s.bind(("", 0))
        return s.getsockname()[1]


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


FREE_WAIT_S = 30.0
"""how long a run waits for the resources its actors need to become free (actors of a run that just ended give theirs
back within moments) before it is refused"""


def check_free(needs: dict[str, float], available, total: dict[str, float], wait_s: float = FREE_WAIT_S) -> None:
    """Refuse a run whose actors need more CPUs or GPUs than the cluster has free (``available()``: other jobs'
    actors hold the rest), naming each, after waiting up to ``wait_s`` for them, with a message; Ray would otherwise
    keep the actors pending without a word."""
    import logging
    import time

    deadline, said = time.monotonic() + wait_s, False
    while True:
        free = available()
        short = {k: (need, free.get(k, 0.0)) for k, need in needs.items() if need > free.get(k, 0.0) + 1e-9}
        if not short:
            return
        if time.monotonic() > deadline:
            key, (need, got) = next(iter(short.items()))
            raise ValueError(
                f"the run's actors need {need:g} {key}s; the cluster has {total.get(key, 0.0):g}, of "
                f"which only {got:g} are free (other jobs or actors hold the rest): wait for them to "
                "finish, or lower the number of actors or cpus_per_actor"
            )
        if not said:
            logging.getLogger(__name__).warning(
                "waiting up to %.0f s for %s to be free on the cluster",
                wait_s,
                ", ".join(f"{n:g} {k}s" for k, (n, _) in short.items()),
            )
            said = True
        time.sleep(0.5)


def plan_placement(
    nodes: list[dict],
    num_producers: int,
    gpus_per_producer: int,
    num_consumers: int,
    cpus_per_actor: float = 0.5,
    colocate: bool = False,
) -> tuple[list[Slot], list[Slot]]:
    """(producer slots, consumer slots). ``nodes`` as returned by ``ray.nodes()`` (alive ones only)."""
    total_gpus = sum(int(n["Resources"].get("GPU", 0)) for n in nodes)
    if total_gpus == 0:
        if colocate:
            raise ValueError(
                "colocate=True shares GPUs between producers and consumers, but the cluster has no GPU; "
                "drop colocate (--colocate) to run on CPU"
            )
        return _plan_cpu(nodes, num_producers, num_consumers, cpus_per_actor)
    if colocate:
        return _plan_colocated(nodes, num_producers, gpus_per_producer, num_consumers, total_gpus)
    need = num_producers * gpus_per_producer + num_consumers
    if need > total_gpus:
        raise ValueError(
            f"{num_producers} producers x {gpus_per_producer} GPUs + {num_consumers} consumers need {need} GPUs, "
            f"the cluster has {total_gpus} on {len(nodes)} alive nodes; lower num_producers or num_consumer_procs, "
            "or pass colocate=True to let each producer share a GPU with a consumer"
        )
    free = [[n["NodeID"], n["NodeManagerAddress"], int(n["Resources"].get("GPU", 0))] for n in nodes]
    producers = []
    for i in range(num_producers):
        node = next((f for f in free if f[2] >= gpus_per_producer), None)
        if node is None:
            raise ValueError(
                f"producer {i} needs {gpus_per_producer} GPUs on one node; no alive node has that many left"
            )
        node[2] -= gpus_per_producer
        producers.append(Slot(node[0], node[1], gpus_per_producer, 0.1))
    consumers = []
    for _ in range(num_consumers):
        node = next(f for f in reversed(free) if f[2] >= 1)
        node[2] -= 1
        consumers.append(Slot(node[0], node[1], 1, 0.1))
    # Consumers fill from the highest-index node down; give rank 0 the lowest of those (stable rank order).
    consumers.sort(key=lambda s: [f[0] for f in free].index(s.node_id))
    return producers, consumers


def _plan_colocated(nodes, num_producers, gpus_per_producer, num_consumers, total_gpus):
    if gpus_per_producer != 1:
        raise ValueError(
            f"colocate=True shares one GPU between a producer and a consumer, so each producer must use one GPU; "
            f"got num_proc_per_producer={gpus_per_producer}; set it to 1 or turn colocate off"
        )
    need = max(num_producers, num_consumers)
    if need > total_gpus:
        raise ValueError(
            f"colocate=True puts producer i and consumer i on GPU i: {num_producers} producers and {num_consumers} "
            f"consumers need {need} GPUs, the cluster has {total_gpus}; lower num_producers or num_consumer_procs"
        )
    gpus = [(n["NodeID"], n["NodeManagerAddress"]) for n in nodes for _ in range(int(n["Resources"].get("GPU", 0)))]
    producers = [Slot(*gpus[i], 0.5, 0.1, share=i) for i in range(num_producers)]
    consumers = [Slot(*gpus[i], 0.5, 0.1, share=i) for i in range(num_consumers)]
    return producers, consumers


def whereabouts() -> dict:
    """Where the calling actor runs: node id, pid, the GPU ids Ray gave it and the CPUs it may run on."""
    import os

    import ray

    ctx = ray.get_runtime_context()
    return {
        "node_id": ctx.get_node_id(),
        "pid": os.getpid(),
        "gpus": [str(g) for g in ray.get_gpu_ids()],
        "cores": len(os.sched_getaffinity(0)),
    }


def weight_backend(producers: list[Slot], consumers: list[Slot]) -> str:
    """The weight groups' torch backend: NCCL when every producer and consumer has a GPU no other of them shares
    (a reward server may share one: it is not in the groups), else gloo through host memory (CPU actors, or a
    producer and a consumer on one GPU, which NCCL refuses as duplicate devices)."""
    shares = [s.share for s in producers + consumers if s.share is not None]
    own = all(s.num_gpus > 0 for s in producers + consumers) and len(shares) == len(set(shares))
    return "nccl" if own else "gloo"


def _plan_cpu(nodes, num_producers, num_consumers, cpus_per_actor):
    cap = [[n["NodeID"], n["NodeManagerAddress"], float(n["Resources"].get("CPU", 0))] for n in nodes]
    total = sum(c[2] for c in cap)
    need = (num_producers + num_consumers) * cpus_per_actor
    if need > total + 1e-9:
        raise ValueError(
            f"{num_producers + num_consumers} actors x {cpus_per_actor} CPUs = {need} CPUs, the cluster has {total}; "
            "lower cpus_per_actor or the number of actors"
        )
    producers = []
    for _ in range(num_producers):
        node = next(c for c in cap if c[2] >= cpus_per_actor - 1e-9)
        node[2] -= cpus_per_actor
        producers.append(Slot(node[0], node[1], 0, cpus_per_actor))
    consumers = []
    for _ in range(num_consumers):
        node = next((c for c in reversed(cap) if c[2] >= cpus_per_actor - 1e-9), None)
        if node is None:
            raise ValueError(f"no node has {cpus_per_actor} CPUs left for a consumer")
        node[2] -= cpus_per_actor
        consumers.append(Slot(node[0], node[1], 0, cpus_per_actor))
    consumers.sort(key=lambda s: [c[0] for c in cap].index(s.node_id))
    return producers, consumers


PLACEMENTS = ("any", "producer", "node:K")
"""where reward-model and judge servers may run"""


def check_server_placement(placement: str, what: str) -> None:
    """A placement string is one of PLACEMENTS (K a node index >= 0)."""
    ok = placement in ("any", "producer") or (placement.startswith("node:") and placement[5:].isdigit())
    if not ok:
        raise ValueError(
            f"{what} must be any, producer or node:K (K the index of an alive node, from 0), got {placement!r}"
        )


def plan_servers(
    placement: str, count: int, cpus: float, gpus: float, nodes: list[dict], producers: list[Slot], what: str
) -> tuple[list[Slot | None], list[Slot]]:
    """(server slots, producer slots) for ``count`` servers of ``cpus`` CPUs and ``gpus`` GPUs each. ``any``: no slot
    (None, Ray places them by resources); ``node:K``: the K-th alive node; ``producer``: server i beside producer
    i mod len(producers), and with ``gpus`` > 0 inside that producer's GPU (the producer's share shrinks by the
    servers' and both join one placement group, as colocated actors do)."""
    check_server_placement(placement, what)
    if placement == "any":
        return [None] * count, producers
    if placement.startswith("node:"):
        k = int(placement[5:])
        if k >= len(nodes):
            raise ValueError(
                f"{what}={placement!r}, but the cluster has {len(nodes)} alive nodes (0 to "
                f"{len(nodes) - 1}); pick one of those or use 'any'"
            )
        res = nodes[k]["Resources"]
        if count * cpus > res.get("CPU", 0) + 1e-9 or count * gpus > res.get("GPU", 0) + 1e-9:
            raise ValueError(
                f"{what}={placement!r}: {count} servers x ({cpus} CPUs, {gpus} GPUs) do not fit on that "
                f"node ({res.get('CPU', 0)} CPUs, {res.get('GPU', 0)} GPUs)"
            )
        return [Slot(nodes[k]["NodeID"], nodes[k]["NodeManagerAddress"], gpus, cpus)] * count, producers
    producers = list(producers)
    owners = [i % len(producers) for i in range(count)]
    if gpus > 0:
        if any(s.num_gpus == 0 for s in producers):
            raise ValueError(
                f"{what}='producer' with {gpus} GPUs per server, but the producers run on CPU; "
                "set the server's GPUs to 0 or place it elsewhere"
            )
        if any(s.num_gpus > 1 for s in producers):
            raise ValueError(
                f"{what}='producer' with GPUs shares one producer's GPU, but each producer has "
                f"{producers[0].num_gpus:g} GPUs; set num_proc_per_producer=1 or place the server "
                "elsewhere"
            )
        shares = [s.share for s in producers if s.share is not None]
        fresh = max(shares, default=-1) + 1
        for j in sorted(set(owners)):
            left = producers[j].num_gpus - owners.count(j) * gpus
            if left <= 0:
                raise ValueError(
                    f"{what}='producer': {owners.count(j)} servers x {gpus} GPUs leave producer {j} "
                    f"nothing of its {producers[j].num_gpus:g} GPU; lower the servers' GPUs"
                )
            share = producers[j].share
            if share is None:
                share, fresh = fresh, fresh + 1
            producers[j] = Slot(producers[j].node_id, producers[j].address, left, producers[j].num_cpus, share)
    servers = [
        Slot(producers[j].node_id, producers[j].address, gpus, cpus, producers[j].share if gpus > 0 else None)
        for j in owners
    ]
    return servers, producers


def reserve_shared_gpus(slots: list[Slot], timeout_s: float = 120.0) -> dict[int, object]:
    """One placement group per shared GPU (a whole GPU on the slot's node, and the CPUs of the actors sharing it), so
    partners get the same device; Ray's fractional GPUs alone could pack two producers onto one GPU and two consumers
    onto another."""
    import ray
    from ray.util.placement_group import placement_group

    cpus: dict[int, float] = {}
    for s in slots:
        if s.share is not None:
            cpus[s.share] = cpus.get(s.share, 0.0) + s.num_cpus
    groups = {}
    for s in slots:
        if s.share is not None and s.share not in groups:
            # The node-id label pins the bundle to the planned node (addresses can repeat across nodes).
            bundle, on_node = {"GPU": 1, "CPU": cpus[s.share]}, {"ray.io/node-id": s.node_id}
            groups[s.share] = placement_group([bundle], bundle_label_selector=[on_node])
    ready, _ = ray.wait([g.ready() for g in groups.values()], num_returns=len(groups), timeout=timeout_s)
    if len(ready) < len(groups):
        for g in groups.values():
            ray.util.remove_placement_group(g)
        raise RuntimeError(f"could not reserve {len(groups)} shared GPUs within {timeout_s:.0f} s; are they in use?")
    return groups


def actor_options(
    slot: Slot | None, shared: dict[int, object] | None = None, cpus: float = 0.0, gpus: float = 0.0
) -> dict:
    """``.options(...)`` pinning an actor to its slot's node (hard affinity: no silent fallback), or into its
    shared GPU's placement group; without a slot, just ``cpus`` and ``gpus`` (Ray picks the node)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

    if slot is None:
        return {"num_cpus": cpus, "num_gpus": gpus}
    if slot.share is not None:
        group = PlacementGroupSchedulingStrategy(shared[slot.share], placement_group_bundle_index=0)
        return {"num_gpus": slot.num_gpus, "num_cpus": slot.num_cpus, "scheduling_strategy": group}
    return {
        "num_gpus": slot.num_gpus,
        "num_cpus": slot.num_cpus,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=slot.node_id, soft=False),
    }
