"""How the driver shares a node's CPU cores among the actors working on it."""

from coati.distributed.driver.actor_group import thread_counts


def test_working_actors_share_their_nodes_cores_and_idle_ones_keep_one():
    nodes = ["a", "a", "b", "b", "b"]
    cores = {"a": 2, "b": 16}
    assert thread_counts(nodes, cores, [True, False, True, True, True]) == [2, 1, 5, 5, 5]
    assert thread_counts(nodes, cores, [True, True, False, False, True]) == [1, 1, 1, 1, 16]
    assert thread_counts(nodes, cores, [False] * 5) == [1] * 5


def test_shares_never_oversubscribe_a_node():
    nodes = ["a"] * 3
    for working in ([True] * 3, [True, True, False]):
        counts = thread_counts(nodes, {"a": 2}, working)
        assert sum(c for c, w in zip(counts, working) if w) <= max(2, sum(working))  # one thread each at the least
    assert thread_counts(nodes, {"a": 7}, [True] * 3) == [2, 2, 2]
