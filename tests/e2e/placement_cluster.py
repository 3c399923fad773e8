"""Run as a script: a simulated 3-node cluster with fake GPUs; prints where producers and consumers landed."""

import json

import ray
from ray.cluster_utils import Cluster

from coati.distributed.runtime.placement import (
    actor_options,
    alive_nodes,
    plan_placement,
    plan_servers,
    reserve_shared_gpus,
    weight_backend,
)


@ray.remote
class Probe:
    def where(self):
        import os

        return ray.get_runtime_context().get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES")


if __name__ == "__main__":
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    nodes = [cluster.add_node(num_cpus=2, num_gpus=2) for _ in range(3)]
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    order = [n["NodeID"] for n in alive_nodes() if n["Resources"].get("GPU", 0) > 0]
    producers, consumers = plan_placement(alive_nodes(), num_producers=2, gpus_per_producer=1, num_consumers=3)
    p_actors = [Probe.options(**actor_options(s)).remote() for s in producers]
    c_actors = [Probe.options(**actor_options(s)).remote() for s in consumers]
    where = ray.get([a.where.remote() for a in p_actors + c_actors])
    for a in p_actors + c_actors:
        ray.kill(a)
    # Colocated: 5 pairs on the 6 GPUs, each pair sharing one GPU through its placement group.
    producers, consumers = plan_placement(alive_nodes(), 5, 1, 5, colocate=True)
    shared = reserve_shared_gpus(producers + consumers)
    pairs = [
        [Probe.options(**actor_options(s, shared)).remote() for s in pc]
        for pc in zip(producers, consumers, strict=True)
    ]
    colocated = [ray.get([a.where.remote() for a in pair]) for pair in pairs]
    planned = [s.node_id for s in producers]
    colocated_backend = weight_backend(producers, consumers)
    for a in [a for pair in pairs for a in pair]:
        ray.kill(a)
    for g in shared.values():
        ray.util.remove_placement_group(g)
    # Reward servers: two beside the producers, each inside its producer's GPU; a judge on the last node, CPU only.
    producers, consumers = plan_placement(alive_nodes(), 2, 1, 2)
    rm, producers = plan_servers("producer", 2, 0.5, 0.25, alive_nodes(), producers, "rm_placement")
    judge, _ = plan_servers(f"node:{len(alive_nodes()) - 1}", 1, 0.5, 0.0, alive_nodes(), producers, "judge")
    shared = reserve_shared_gpus(producers + consumers + rm)
    actors = [Probe.options(**actor_options(s, shared)).remote() for s in producers + rm + judge]
    beside = {
        "producers": ray.get([a.where.remote() for a in actors[:2]]),
        "rm": ray.get([a.where.remote() for a in actors[2:4]]),
        "judge": ray.get(actors[4].where.remote()),
        "last_node": alive_nodes()[-1]["NodeID"],
        "backend": weight_backend(producers, consumers),
        "colocated_backend": colocated_backend,
    }
    try:
        plan_placement(alive_nodes(), num_producers=4, gpus_per_producer=2, num_consumers=1)
        short = "no error"
    except ValueError as e:
        short = str(e)
    print(
        json.dumps(
            {
                "gpu_nodes": order,
                "producers": where[:2],
                "consumers": where[2:],
                "short": short,
                "colocated": colocated,
                "planned": planned,
                "beside": beside,
            }
        )
    )
    ray.shutdown()
    cluster.shutdown()
