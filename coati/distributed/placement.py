"""Where actors run: producers on the lowest-index nodes, consumers on the highest, enforced with node affinity
(never left to Ray's load balancer, whose choice could put a consumer where a producer was planned and hang the job).

Node order is deterministic: alive nodes sorted by (index in ``ray.nodes()``), dead nodes excluded. With GPUs, each
producer takes ``gpus_per_producer`` GPUs and each consumer one GPU; without GPUs, actors take ``cpus_per_actor`` CPUs.
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


def alive_nodes() -> list[dict]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive", n.get("alive", False))]


def plan_placement(
    nodes: list[dict], num_producers: int, gpus_per_producer: int, num_consumers: int, cpus_per_actor: float = 0.5
) -> tuple[list[Slot], list[Slot]]:
    """(producer slots, consumer slots). ``nodes`` as returned by ``ray.nodes()`` (alive ones only)."""
    total_gpus = sum(int(n["Resources"].get("GPU", 0)) for n in nodes)
    if total_gpus == 0:
        return _plan_cpu(nodes, num_producers, num_consumers, cpus_per_actor)
    need = num_producers * gpus_per_producer + num_consumers
    if need > total_gpus:
        raise ValueError(
            f"{num_producers} producers x {gpus_per_producer} GPUs + {num_consumers} consumers need {need} GPUs, "
            f"the cluster has {total_gpus} on {len(nodes)} alive nodes; lower num_producers or num_consumer_procs"
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


def actor_options(slot: Slot) -> dict:
    """``.options(...)`` pinning an actor to its slot's node (hard affinity: no silent fallback)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {
        "num_gpus": slot.num_gpus,
        "num_cpus": slot.num_cpus,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=slot.node_id, soft=False),
    }
