"""Reward-model servers as real Ray actors: a batch spread over two servers scores as one model does, and a dead or
hung server is named within the timeout."""

import time

import pytest
import ray

from coati.distributed.reward.model_actors import RewardModelClient, RewardModelServer
from coati.distributed.reward.reward_model import RewardModel
from coati.distributed.runtime.liveness import HEARTBEAT_S, Watchdog
from coati.testing import build_tiny_reward_model


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory):
    return str(build_tiny_reward_model(tmp_path_factory.mktemp("rm_actors")))


def kill_and_wait(actor, timeout_s: float = 30.0) -> None:
    """``ray.kill`` returns before the actor is gone, and a call sent meanwhile may still be answered: wait until a
    call fails."""
    from ray.exceptions import RayActorError

    ray.kill(actor)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except RayActorError:
            return
        time.sleep(0.1)
    raise AssertionError(f"actor still answering {timeout_s:g} s after ray.kill")


class Stuck(RewardModelServer):
    def score(self, prompts, completions):
        time.sleep(30)
        return super().score(prompts, completions)


def test_servers_score_like_one_model_and_failures_are_named(ray_cluster, rm_path):
    server = ray.remote(num_cpus=0.5)(RewardModelServer)
    servers = [server.remote(rm_path, batch_size=2) for _ in range(2)]
    client = RewardModelClient(servers, ["rm-0", "rm-1"], timeout_s=30)
    prompts, completions = [f"{i}+1=" for i in range(5)], [str(i + 1) for i in range(5)]
    scored = client.score(prompts, completions)
    assert [s for s, _ in scored] == pytest.approx(RewardModel(rm_path).score(prompts, completions), abs=1e-5)
    assert [note for _, note in scored] == [""] * 5  # nothing cut
    kill_and_wait(servers[1])
    with pytest.raises(RuntimeError, match="reward model server rm-1 died"):
        client.score(prompts, completions)
    stuck = ray.remote(num_cpus=0.5)(Stuck).remote(rm_path)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"reward model server rm-stuck finished no batch for 2 s while alive"):
        RewardModelClient([stuck], ["rm-stuck"], timeout_s=2).score(prompts, completions)
    assert time.monotonic() - start < 10
    for actor in (servers[0], stuck):
        ray.kill(actor)


class SlowBatches(RewardModelServer):
    """Scores a batch a second, as a large reward model would."""

    def score(self, prompts, completions):
        from coati.distributed.runtime.liveness import note_progress

        def slowly():
            time.sleep(1.0)
            note_progress()

        scores = self.model.score(prompts, completions, on_batch=slowly)
        return [(s, "") for s in scores]


def test_in_a_run_a_server_is_waited_for_while_it_scores_and_named_once_it_stops(ray_cluster, rm_path):
    """With the run's watchdog there, the limit runs from the server's last finished batch: a server slower in all
    than ``timeout_s`` but finishing batches is waited for; one that finishes none is named after ``timeout_s``."""
    watchdog = ray.remote(Watchdog).options(name="rmrun-watchdog", num_cpus=0).remote()
    slow = ray.remote(SlowBatches).options(name="rmrun-rm-0", num_cpus=0.5).remote(rm_path, batch_size=1)
    stuck = ray.remote(Stuck).options(name="rmrun-rm-1", num_cpus=0.5).remote(rm_path)
    prompts, completions = [f"{i}+1=" for i in range(8)], [str(i + 1) for i in range(8)]
    try:
        ray.get([slow.__ray_ready__.remote(), stuck.__ray_ready__.remote()])  # started, as a run's servers are
        start = time.monotonic()
        scored = RewardModelClient([slow], ["rmrun-rm-0"], timeout_s=5).score(prompts, completions)
        assert len(scored) == 8 and time.monotonic() - start > 8  # longer than the limit, batch after batch
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"reward model server rmrun-rm-1 finished no batch for [56] s while"):
            RewardModelClient([stuck], ["rmrun-rm-1"], timeout_s=5).score(prompts, completions)
        assert time.monotonic() - start < 5 + 2 * HEARTBEAT_S + 2
    finally:
        for actor in (watchdog, slow, stuck):
            ray.kill(actor)
