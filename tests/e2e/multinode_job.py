"""Run as a script: a whole job (rl_example's path) on a simulated 3-node cluster: the driver on the head node, which
gets no actor, the producer on one node and the consumer on another. Prints where each landed and which files the
run folder holds."""

import json
import sys
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

import rl_example
from coati.distributed.runtime.placement import alive_nodes, plan_placement

if __name__ == "__main__":
    tiny, data, save_dir = sys.argv[1:4]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=2)
    root = str(Path(__file__).resolve().parents[2])
    ray.init(
        address=cluster.address,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": root}},
    )
    cluster.wait_for_nodes()
    producers, consumers = plan_placement(alive_nodes(), 1, 1, 1, 0.5)
    summary = rl_example.main(
        [
            "-m",
            tiny,
            "-b",
            "transformers",
            "-d",
            data,
            "-ed",
            data,
            "--eval-size",
            "4",
            "-mnt",
            "8",
            "--max-steps",
            "2",
            "-si",
            "1",
            "-sd",
            save_dir,
            "-p",
            "job",
            "--no-progress",
            "-tbs",
            "2",
            "-ibs",
            "2",
            "-imbs",
            "2",
            "-lr",
            "1e-3",
            "--report-to",
            "jsonl",
            "tensorboard",
        ]
    )
    run = Path(save_dir) / "job" / "latest"
    files = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())
    print(
        "RESULT "
        + json.dumps(
            {
                "driver": ray.get_runtime_context().get_node_id(),
                "producer": producers[0].node_id,
                "consumer": consumers[0].node_id,
                "files": files,
                "steps": summary["steps"],
                "final_model": summary["final_model"],
            }
        )
    )
    ray.shutdown()
    cluster.shutdown()
