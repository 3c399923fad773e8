"""Placement on a simulated multi-node cluster (ray.cluster_utils.Cluster with fake GPUs), in its own process so the
session's Ray cluster is untouched."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coati.distributed.runtime.placement import plan_placement

ROOT = Path(__file__).resolve().parents[2]


def node(i, gpus, cpus=2):
    return {"NodeID": f"n{i}", "NodeManagerAddress": f"10.0.0.{i}", "Resources": {"GPU": gpus, "CPU": cpus}}


def test_plan_puts_producers_low_and_consumers_high():
    producers, consumers = plan_placement([node(0, 2), node(1, 2), node(2, 2)], 2, 1, 3)
    assert [s.node_id for s in producers] == ["n0", "n0"]
    assert sorted(s.node_id for s in consumers) == ["n1", "n2", "n2"]
    assert [s.node_id for s in consumers][0] == "n1"  # rank 0 on the lowest consumer node


def test_plan_errors_when_resources_are_short():
    with pytest.raises(ValueError, match="need 9 GPUs, the cluster has 4 on 2 alive nodes"):
        plan_placement([node(0, 2), node(1, 2)], 4, 2, 1)
    with pytest.raises(ValueError, match="producer 1 needs 2 GPUs on one node"):
        plan_placement([node(0, 3), node(1, 1)], 2, 2, 0)
    with pytest.raises(ValueError, match=r"3 actors x 1.0 CPUs = 3.0 CPUs, the cluster has 2"):
        plan_placement([node(0, 0, cpus=2)], 1, 1, 2, cpus_per_actor=1.0)


def test_colocated_plan_pairs_producer_and_consumer_on_each_gpu():
    producers, consumers = plan_placement([node(0, 1), node(1, 2)], 2, 1, 3, colocate=True)
    assert [(s.node_id, s.share, s.num_gpus) for s in producers] == [("n0", 0, 0.5), ("n1", 1, 0.5)]
    assert [(s.node_id, s.share) for s in consumers] == [("n0", 0), ("n1", 1), ("n1", 2)]
    with pytest.raises(ValueError, match="4 producers and 1 consumers need 4 GPUs, the cluster has 3"):
        plan_placement([node(0, 1), node(1, 2)], 4, 1, 1, colocate=True)
    with pytest.raises(ValueError, match="got num_proc_per_producer=2; set it to 1 or turn colocate off"):
        plan_placement([node(0, 2)], 1, 2, 1, colocate=True)
    with pytest.raises(ValueError, match="the cluster has no GPU; drop colocate"):
        plan_placement([node(0, 0)], 1, 1, 1, colocate=True)
    with pytest.raises(ValueError, match="or pass colocate=True"):
        plan_placement([node(0, 1)], 1, 1, 1)


@pytest.mark.background
def test_simulated_cluster_places_actors_on_planned_nodes():
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_ADDRESS="")
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests/e2e/placement_cluster.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    gpu_nodes = result["gpu_nodes"]
    assert [w[0] for w in result["producers"]] == [gpu_nodes[0]] * 2
    assert sorted(gpu_nodes.index(w[0]) for w in result["consumers"]) == [1, 2, 2]
    assert all(w[1] not in (None, "") for w in result["producers"] + result["consumers"])
    assert "need 9 GPUs" in result["short"]
    # Each colocated pair: same node as planned, same one GPU; no GPU holds two pairs.
    for (p_where, c_where), planned in zip(result["colocated"], result["planned"], strict=True):
        assert p_where == c_where and p_where[0] == planned and len(p_where[1].split(",")) == 1
    gpus = [tuple(p) for p, _ in result["colocated"]]
    assert len(set(gpus)) == 5
    # A reward server placed beside a producer shares its node and its one GPU; a node:K server lands on node K.
    beside = result["beside"]
    assert beside["rm"] == beside["producers"] and len({tuple(w) for w in beside["producers"]}) == 2
    assert all(len(w[1].split(",")) == 1 for w in beside["rm"])
    assert beside["judge"][0] == beside["last_node"]
    # Sharing a GPU with a reward server keeps NCCL for weights; a producer and a consumer on one GPU do not.
    assert (beside["backend"], beside["colocated_backend"]) == ("nccl", "gloo")


def test_reward_servers_plan_beside_producers_on_a_node_or_anywhere():
    from coati.distributed.runtime.placement import plan_servers

    nodes = [node(0, 2), node(1, 2)]
    producers, consumers = plan_placement(nodes, 2, 1, 2)
    servers, shrunk = plan_servers("producer", 3, 1.0, 0.25, nodes, producers, "rm_placement")
    # Server i beside producer i mod 2, inside its GPU: producer 0 keeps 1 - 2 x 0.25, producer 1 keeps 0.75.
    assert [(s.node_id, s.share, s.num_gpus, s.num_cpus) for s in servers] == [
        ("n0", 0, 0.25, 1.0),
        ("n0", 1, 0.25, 1.0),
        ("n0", 0, 0.25, 1.0),
    ]
    assert [(s.share, s.num_gpus) for s in shrunk] == [(0, 0.5), (1, 0.75)]
    # Colocated producers keep their shared GPU and give the server part of their half.
    pc, cc = plan_placement(nodes, 1, 1, 1, colocate=True)
    servers, shrunk = plan_servers("producer", 1, 0.5, 0.2, nodes, pc, "rm_placement")
    assert (shrunk[0].share, servers[0].share, round(shrunk[0].num_gpus, 6)) == (0, 0, 0.3)
    # On CPU (or without GPUs asked) a server is pinned to its producer's node, outside any placement group.
    cpu_nodes = [node(0, 0), node(1, 0)]
    cp, _ = plan_placement(cpu_nodes, 1, 1, 1, cpus_per_actor=0.5)
    servers, same = plan_servers("producer", 1, 1.0, 0.0, cpu_nodes, cp, "rm_placement")
    assert (servers[0].node_id, servers[0].share, same) == ("n0", None, cp)
    assert plan_servers("node:1", 2, 1.0, 0.0, cpu_nodes, cp, "judge_placement")[0][1].node_id == "n1"
    assert plan_servers("any", 2, 1.0, 0.0, cpu_nodes, cp, "rm_placement")[0] == [None, None]


@pytest.mark.parametrize(
    "args, message",
    [
        (("node:2", 1, 1.0, 0.0), "rm_placement='node:2', but the cluster has 2 alive nodes"),
        (("node:0", 3, 1.0, 0.0), r"3 servers x \(1.0 CPUs, 0.0 GPUs\) do not fit on that node \(2 CPUs"),
        (("producer", 4, 1.0, 0.5), "2 servers x 0.5 GPUs leave producer 0 nothing of its 1 GPU"),
        (("nodes:1", 1, 1.0, 0.0), "rm_placement must be any, producer or node:K"),
    ],
)
def test_reward_server_plans_that_cannot_work_are_refused(args, message):
    from coati.distributed.runtime.placement import plan_servers

    nodes = [node(0, 2), node(1, 2)]
    producers, _ = plan_placement(nodes, 2, 1, 2)
    with pytest.raises(ValueError, match=message):
        plan_servers(*args, nodes, producers, "rm_placement")
    cpu_producers, _ = plan_placement([node(0, 0)], 1, 1, 1, cpus_per_actor=0.5)
    with pytest.raises(ValueError, match="the producers run on CPU"):
        plan_servers("producer", 1, 1.0, 0.5, [node(0, 0)], cpu_producers, "rm_placement")
    wide, _ = plan_placement(nodes, 1, 2, 1)
    with pytest.raises(ValueError, match="each producer has 2 GPUs; set num_proc_per_producer=1"):
        plan_servers("producer", 1, 1.0, 0.5, nodes, wide, "rm_placement")
