"""Reward-model servers as real Ray actors: a batch spread over two servers scores as one model does, and a dead or
hung server is named within the timeout."""

import time

import pytest
import ray

from coati.distributed.reward.model_actors import RewardModelClient, RewardModelServer
from coati.distributed.reward.reward_model import RewardModel
from coati.models import build_tiny_reward_model


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
    with pytest.raises(RuntimeError, match=r"reward model server rm-stuck did not answer within 2 s"):
        RewardModelClient([stuck], ["rm-stuck"], timeout_s=2).score(prompts, completions)
    assert time.monotonic() - start < 10
    for actor in (servers[0], stuck):
        ray.kill(actor)
