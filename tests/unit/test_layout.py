"""The role layout planner (``runtime/layout.py``): OpenRLHF's node-per-role layouts and colocations as slots, on
hand-written node lists; what a cluster cannot hold is refused naming what is short."""

import pytest

from coati.distributed.config.tree import config_from_dict
from coati.distributed.runtime.layout import LayoutConfig, plan_roles
from coati.distributed.runtime.placement import plan_placement


def node(i, gpus, cpus=2):
    return {"NodeID": f"n{i}", "NodeManagerAddress": f"10.0.0.{i}", "Resources": {"GPU": gpus, "CPU": cpus}}


def test_the_guides_four_role_layout_gives_each_role_a_node_of_its_own():
    nodes = [node(i, 8) for i in range(5)]
    producers, _ = plan_placement(nodes, 8, 1, 0)  # the engines on the first node
    layout = LayoutConfig(actor_nodes=1, critic_nodes=1, ref_nodes=1, reward_nodes=1, ref_procs=8)
    slots = plan_roles(nodes, layout, {"actor": 8, "critic": 8, "ref": 8, "reward": 8}, producers, 0.5)
    assert {r: {s.node_id for s in v} for r, v in slots.items()} == {
        "ref": {"n1"},
        "reward": {"n2"},
        "critic": {"n3"},
        "actor": {"n4"},
    }
    assert all(s.num_gpus == 1 and s.share is None for v in slots.values() for s in v)


def test_colocations_share_nodes_and_gpus():
    nodes = [node(i, 4) for i in range(3)]
    producers, _ = plan_placement(nodes, 4, 1, 0)
    everything = LayoutConfig(actor_nodes=1, colocate_all_models=True, ref_procs=4)
    slots = plan_roles(nodes, everything, {"actor": 4, "critic": 4, "ref": 4, "reward": 4}, producers, 0.5)
    for role in ("actor", "critic", "ref", "reward"):  # process i of every role on GPU i of node 1
        assert [(s.node_id, s.share, s.num_gpus) for s in slots[role]] == [("n1", i, 0.25) for i in range(4)]
    pairs = LayoutConfig(
        actor_nodes=1, critic_nodes=1, colocate_actor_ref=True, colocate_critic_reward=True, ref_procs=2
    )
    slots = plan_roles(nodes, pairs, {"actor": 2, "critic": 2, "ref": 2, "reward": 2}, producers, 0.5)
    assert [s.node_id for s in slots["critic"] + slots["reward"]] == ["n1"] * 4  # critic+reward first
    assert [s.node_id for s in slots["actor"] + slots["ref"]] == ["n2"] * 4
    assert [s.share for s in slots["actor"]] == [s.share for s in slots["ref"]] == [2, 3]
    assert [s.num_gpus for s in slots["ref"]] == [0.5, 0.5]


def test_cpu_nodes_take_the_roles_by_cpus_and_a_node_without_cpus_holds_none():
    nodes = [node(9, 0, cpus=0)] + [node(i, 0, cpus=2) for i in range(3)]  # a head started with no CPUs first
    producers, _ = plan_placement(nodes, 1, 1, 0)
    layout = LayoutConfig(actor_nodes=1, critic_nodes=1)
    slots = plan_roles(nodes, layout, {"actor": 2, "critic": 1, "ref": 0, "reward": 0}, producers, 0.5)
    assert [(s.node_id, s.num_gpus, s.num_cpus) for s in slots["critic"]] == [("n1", 0, 0.5)]
    assert [s.node_id for s in slots["actor"]] == ["n2", "n2"]


@pytest.mark.parametrize(
    ("nodes", "layout", "counts", "match"),
    [
        (
            [node(i, 8) for i in range(3)],
            LayoutConfig(actor_nodes=1, critic_nodes=1, ref_nodes=1, ref_procs=8),
            {"actor": 8, "critic": 8, "ref": 8},
            r"the layout needs 3 whole nodes \(ref 1, critic 1, actor 1\) beside the producers' 1; the cluster has 2",
        ),
        (
            [node(0, 8), node(1, 4)],
            LayoutConfig(actor_nodes=1),
            {"actor": 8},
            r"actor needs 8 GPUs on each of its 1 nodes; node n1 has 4",
        ),
        (
            [node(0, 8), node(1, 8), node(2, 8)],
            LayoutConfig(actor_nodes=2),
            {"actor": 3},
            r"3 actor processes do not spread evenly over 2 nodes",
        ),
    ],
)
def test_a_layout_the_cluster_cannot_hold_is_refused(nodes, layout, counts, match):
    producers, _ = plan_placement(nodes, 1, 1, 0)
    with pytest.raises(ValueError, match=match):
        plan_roles(nodes, layout, counts, producers, 0.5)


@pytest.mark.parametrize(
    ("tree", "match"),
    [
        ({"layout": {"critic_nodes": 1, "actor_nodes": 1}}, "the layout places a critic, but --algo DAPO trains none"),
        ({"layout": {"ref_procs": 1, "ref_nodes": 1, "actor_nodes": 1}}, "uses no reference"),
        ({"layout": {"ref_nodes": 1, "actor_nodes": 1}}, "ref_procs=0 keeps the reference inside"),
        ({"algo": "PPO", "layout": {"actor_nodes": 1}}, "the critic needs nodes of its own"),
        ({"layout": {"colocate_all_models": True, "colocate_actor_ref": True, "actor_nodes": 1}}, "already puts"),
        ({"layout": {"reward_nodes": 1, "actor_nodes": 1}}, "set reward.rm.path"),
        ({"layout": {"critic_nodes": 1}, "algo": "PPO"}, "set layout actor_nodes"),
    ],
)
def test_layouts_that_cannot_work_are_refused_before_any_actor(tree, match):
    with pytest.raises(ValueError, match=match):
        config_from_dict(tree)
