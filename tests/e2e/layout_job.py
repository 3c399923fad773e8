"""Run as a script: PPO on a simulated cluster laid out as OpenRLHF's multi-node guide lays out its roles. First the
guide's layout, a node each for the producer, the reference, the reward model, the critic and the actor; then its
colocated one, the producer on one node and every model on another (started, joined and pushed to, not trained: the
first run trains the roles' step). Prints, per run, which node each role's actors landed on and which node the plan
gave it."""

import json
import sys
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from coati.distributed.config.tree import config_from_dict
from coati.distributed.driver.loop import Run
from coati.distributed.driver.preflight import preflight

REWARD = "tests.component.reward_fns:digit_fraction"


def tree(tiny: str, rm: str, layout: dict) -> dict:
    return {
        "algo": "PPO",
        "model": {"path": tiny, "inference_options": {"dtype": "float32"}},
        "data": {"train": [{"prompt": f"q{i}"} for i in range(16)], "eval": None},
        "producer": {
            "inference_batch_size": 2,
            "inference_microbatch_size": 2,
            "num_generations": 2,
            "backend": "transformers",
        },
        "consumer": {"train_batch_size": 2, "learning_rate": 1e-3},
        "generation": {"max_new_tokens": 4},
        "reward": {"fn": REWARD, "components": {REWARD: 1.0, "rm": 0.5}, "rm": {"path": rm, "cpus": 0.5}},
        "run": {"max_steps": 1, "max_staleness": 0, "save_dir": None, "progress": False, "cpus_per_actor": 0.5},
        "layout": layout,
    }


def landed(config, name: str, train: bool) -> dict:
    plan = preflight(config)
    run = Run(config, plan, run_name=name)
    try:
        run.start_actors()
        run.connect_weight_group()
        run.push_weights()
        step = {"critic/grad_norm": 0.0}
        if train:
            step = run.loop(max_steps=1, eval_interval=0, save_interval=0, save_dir=None, on_step=None)["history"][0]
        a = run.actors
        actual = {
            "producer": [i["node_id"] for i in a.producer_info],
            "actor": [i["node_id"] for i in a.consumer_info],
            "critic": [i["node_id"] for i in a.critic_info],
            "ref": [i["node_id"] for i in a.reference_info],
            "reward": [i["node_id"] for i in a.server_info],
        }
        planned = {
            "producer": [s.node_id for s in plan.producer_slots],
            "actor": [s.node_id for s in plan.consumer_slots],
            "critic": [s.node_id for s in plan.critic_slots],
            "ref": [s.node_id for s in plan.ref_slots],
            "reward": [s.node_id for s in plan.server_slots["rm"]],
        }
        return {"actual": actual, "planned": planned, "trained": step["critic/grad_norm"] > 0 if train else None}
    finally:
        run.shutdown()


if __name__ == "__main__":
    tiny, rm = sys.argv[1:3]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(5):
        cluster.add_node(num_cpus=2)
    root = str(Path(__file__).resolve().parents[2])
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": root}
    ray.init(address=cluster.address, runtime_env={"env_vars": env})
    cluster.wait_for_nodes()
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]
    guide = {"actor_nodes": 1, "critic_nodes": 1, "ref_nodes": 1, "reward_nodes": 1, "ref_procs": 1}
    colocated = {"actor_nodes": 1, "colocate_all_models": True, "ref_procs": 1}
    out = {
        "nodes": nodes,
        "guide": landed(config_from_dict(tree(tiny, rm, guide)), "layout-guide", train=True),
        "colocated": landed(config_from_dict(tree(tiny, rm, colocated)), "layout-colocated", train=False),
    }
    print("LAYOUT " + json.dumps(out))
