"""The driver's wait on actors while a run's watchdog lives (``actor_group.get`` with ``liveness``)."""

import time

import pytest

from coati.distributed.driver import actor_group
from coati.distributed.driver.actor_group import RunError, get
from coati.distributed.runtime.liveness import Watchdog


def test_a_watched_wait_keeps_its_time_limit(ray_cluster, monkeypatch):
    """Waiting in slices while asking the watchdog leaves the call's own limit whole: a task that does not finish
    is reported at its limit, not after the limit waited a second time."""
    ray = ray_cluster
    watchdog = ray.remote(Watchdog).options(num_cpus=0).remote()
    monkeypatch.setitem(actor_group.WATCH, "watchdog", watchdog)
    monkeypatch.setitem(actor_group.WATCH, "limit_s", 60.0)
    slow = ray.remote(num_cpus=0)(lambda: time.sleep(30)).remote()
    start = time.monotonic()
    with pytest.raises(RunError, match="slow task: no answer within 3 s"):
        get(slow, "slow task", timeout=3)
    assert time.monotonic() - start < 4.5
    assert get(ray.put(7), "a value", timeout=3) == 7
    ray.cancel(slow, force=True)
    ray.kill(watchdog)


def test_a_watched_wait_for_any_names_a_silent_actor(ray_cluster, monkeypatch):
    """An asynchronous run waits for "one more rollout or training step" (``wait_any``): an actor that has stopped
    beating ends that wait too, naming it, instead of the step limit."""
    ray = ray_cluster
    watchdog = ray.remote(Watchdog).options(num_cpus=0).remote()
    ray.get(watchdog.beat.remote("run-producer-0"))  # then silent, as a stopped process
    monkeypatch.setitem(actor_group.WATCH, "watchdog", watchdog)
    monkeypatch.setitem(actor_group.WATCH, "limit_s", 1.0)
    monkeypatch.setattr(actor_group, "STEP_TIMEOUT_S", 20.0)
    slow = ray.remote(num_cpus=0)(lambda: time.sleep(30)).remote()
    start = time.monotonic()
    with pytest.raises(RunError, match="rollout and training step 3: actor run-producer-0 has given no sign of life"):
        actor_group.wait_any([slow], [], what="rollout and training step 3")
    assert time.monotonic() - start < 8
    ray.cancel(slow, force=True)
    ray.kill(watchdog)


class Member:
    """One member of a two-process collective group, beating to its run's watchdog like a producer or consumer."""

    def __init__(self):
        from coati.distributed.runtime.liveness import start_heartbeat

        start_heartbeat(interval_s=0.5)

    def join(self, rank: int, group: str) -> bool:
        from coati.distributed.transport.group import TorchGroup

        self.group = TorchGroup(2, rank, group, timeout_s=120)
        return True

    def send(self, n: int) -> int:
        import torch

        for i in range(n):
            self.group.broadcast_tensor(torch.full((4,), float(i)), root=0)
        return n

    def receive(self, n: int, pause_s: float, stop_after: int) -> int:
        """Receive ``n`` tensors ``pause_s`` apart; after ``stop_after`` of them wait for ever (alive, beating)."""
        import torch

        for i in range(n):
            if i == stop_after:
                while True:
                    time.sleep(1)
            t = torch.zeros(4)
            self.group.broadcast_tensor(t, root=0)
            assert t[0] == i
            time.sleep(pause_s)
        return n


@pytest.mark.parametrize("stop_after", [None, 2], ids=["slow-but-moving", "stops-moving"])
def test_a_weight_push_that_stops_moving_is_named_while_a_slow_one_finishes(ray_cluster, monkeypatch, stop_after):
    """A push whose collectives stop while both ends live (a member that never joins the next broadcast) ends the
    driver's wait after ``run.hang_timeout_s`` without a finished transfer, naming who still waits, long before the
    collective's own 120 s limit; a push slower in all than that limit but moving finishes."""
    ray = ray_cluster
    run = f"live{stop_after}"
    watchdog = ray.remote(Watchdog).options(name=f"{run}-watchdog", num_cpus=0).remote()
    monkeypatch.setitem(actor_group.WATCH, "watchdog", watchdog)
    monkeypatch.setitem(actor_group.WATCH, "limit_s", 3.0)
    sender, receiver = (
        ray.remote(Member).options(name=f"{run}-{role}-0", num_cpus=0).remote() for role in ("consumer", "producer")
    )
    ray.get([sender.join.remote(0, f"{run}-weights"), receiver.join.remote(1, f"{run}-weights")])
    n = 8  # 8 transfers 1 s apart: 8 s, past the 3 s limit, with a transfer every second
    refs = [sender.send.remote(n), receiver.receive.remote(n, 1.0, n if stop_after is None else stop_after)]
    members = [(f"{run}-consumer-0", "pushing", refs[0]), (f"{run}-producer-0", "receiving", refs[1])]
    start = time.monotonic()
    try:
        if stop_after is None:
            assert get(refs, "weight push 3", timeout=60, moving=actor_group.Moving(refs[:1], members)) == [n, n]
        else:
            with pytest.raises(RunError) as caught:
                get(refs, "weight push 3", timeout=60, moving=actor_group.Moving(refs[:1], members))
            message = str(caught.value)
            assert message.startswith("weight push 3: no transfer has finished for "), message
            assert f"still waiting: {run}-consumer-0 (pushing), {run}-producer-0 (receiving)" in message
            assert time.monotonic() - start < 2 + 3 + 6  # the transfers before the stop, the limit, two slices
    finally:
        for actor in (sender, receiver, watchdog):
            ray.kill(actor)
