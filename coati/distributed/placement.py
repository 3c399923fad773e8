"""Where actors run: producers on the lowest-index nodes, consumers on the highest, enforced with node affinity
(never left to Ray's load balancer, whose choice could put a consumer where a producer was planned and hang the job).

Node order is deterministic: alive nodes sorted by (index in ``ray.nodes()``), dead nodes excluded. With GPUs, each
producer takes ``gpus_per_producer`` GPUs and each consumer one GPU; with ``colocate``, producer i and consumer i share
the i-th GPU (half each), for machines with fewer GPUs than actors. Without GPUs, actors take ``cpus_per_actor`` CPUs.
A plan that does not fit raises before any actor starts.
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
            raise ValueError("colocate=True shares GPUs between producers and consumers, but the cluster has no GPU; "
                             "drop colocate (--colocate) to run on CPU")  # fmt: skip
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
    return {"node_id": ctx.get_node_id(), "pid": os.getpid(), "gpus": [str(g) for g in ray.get_gpu_ids()],
            "cores": len(os.sched_getaffinity(0))}  # fmt: skip


def weight_backend(producers: list[Slot], consumers: list[Slot]) -> str:
    """The weight groups' torch backend: NCCL when every actor holds whole GPUs of its own, else gloo through host
    memory (CPU actors, or actors sharing a GPU, which NCCL refuses as duplicate devices)."""
    return "nccl" if all(s.num_gpus >= 1 for s in producers + consumers) else "gloo"


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


def reserve_shared_gpus(slots: list[Slot], timeout_s: float = 120.0) -> dict[int, object]:
    """One placement group per shared GPU (a whole GPU on the slot's node), so both partners get the same device;
    Ray's fractional GPUs alone could pack two producers onto one GPU and two consumers onto another."""
    import ray
    from ray.util.placement_group import placement_group

    groups = {}
    for s in slots:
        if s.share is not None and s.share not in groups:
            # The node-id label pins the bundle to the planned node (addresses can repeat across nodes).
            bundle, on_node = {"GPU": 1, "CPU": 0.2}, {"ray.io/node-id": s.node_id}
            groups[s.share] = placement_group([bundle], bundle_label_selector=[on_node])
    ready, _ = ray.wait([g.ready() for g in groups.values()], num_returns=len(groups), timeout=timeout_s)
    if len(ready) < len(groups):
        for g in groups.values():
            ray.util.remove_placement_group(g)
        raise RuntimeError(f"could not reserve {len(groups)} shared GPUs within {timeout_s:.0f} s; are they in use?")
    return groups


def actor_options(slot: Slot, shared: dict[int, object] | None = None) -> dict:
    """``.options(...)`` pinning an actor to its slot's node (hard affinity: no silent fallback), or into its
    shared GPU's placement group."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

    if slot.share is not None:
        group = PlacementGroupSchedulingStrategy(shared[slot.share], placement_group_bundle_index=0)
        return {"num_gpus": slot.num_gpus, "num_cpus": slot.num_cpus, "scheduling_strategy": group}
    return {
        "num_gpus": slot.num_gpus,
        "num_cpus": slot.num_cpus,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=slot.node_id, soft=False),
    }
