"""The driver's wait on actors while a run's watchdog lives (``actor_group.get`` with ``liveness``)."""

import time

import pytest

from coati.distributed.driver import actor_group
from coati.distributed.driver.actor_group import RunError, get
from coati.distributed.liveness import Watchdog


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
