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
        assert sum(c for c, w in zip(counts, working, strict=True) if w) <= max(
            2, sum(working)
        )  # one thread each at the least
    assert thread_counts(nodes, {"a": 7}, [True] * 3) == [2, 2, 2]


def test_the_consumers_world_port_is_outside_the_range_outgoing_connections_take():
    """``bind(0)`` hands out a port of the kernel's ephemeral range, which any outgoing connection (Ray opens many
    while the consumers start) can take before torch.distributed binds it: CI once failed with EADDRINUSE on such a
    port. The consumers' port is drawn below that range and above Ray's worker ports, and is free when returned."""
    import socket

    from coati.distributed.runtime.placement import _ephemeral_start, free_port

    start = _ephemeral_start()
    assert start > 20001, f"this machine's ephemeral range starts at {start}: nothing to draw from"
    for _ in range(20):
        port = free_port()
        assert 20000 <= port < start, port
        with socket.socket() as s:
            s.bind(("", port))  # free on every address, as the c10d store binds it
