"""Model-based reward components end to end: a tiny reward model fitted to prefer digits over letters drives its
own score up in a tiny policy trained on it (RLOO), a tiny judge fitted to reply 'Score: 7' adds its weighted grade,
each component is reported per step, and a killed reward-model server is named and replaced (--max-restarts)."""

import json
import random
import re

import numpy as np
import pytest

from tests.e2e.runs import REWARD, tiny_config, train


@pytest.fixture(scope="module")
def digit_rm(tmp_path_factory):
    from coati.testing import build_tiny_reward_model, train_tiny_reward_model

    rng = random.Random(0)
    path = build_tiny_reward_model(tmp_path_factory.mktemp("digit_rm"))
    prompts = [f"q{i}" for i in range(32)]
    digits = ["".join(rng.choice("0123456789") for _ in range(rng.randint(2, 12))) for _ in prompts]
    letters = ["".join(rng.choice("abcdefghij .,") for _ in range(rng.randint(2, 12))) for _ in prompts]
    return str(train_tiny_reward_model(path, prompts, digits, letters, steps=40))


def test_model_components_drive_the_reward_and_a_killed_server_is_replaced(
    ray_cluster,
    tiny,
    digit_rm,
    score7_judge,
    tmp_path,
):
    """Reward = 0 x rule + 1 x rm + 0.5 x judge over 12 RLOO steps; the reward-model server (beside the producer) is
    killed after step 6: the run's error names it (a RunError: without restarts the run stops with it), the run
    restarts from its last checkpoint with new servers and trains to the end, leaving no actor behind."""
    import ray

    from tests.component.test_judge import TEMPLATE

    steps, killed = {}, []

    def record_and_kill_once(metrics):
        steps[metrics["step"]] = metrics  # a step trained again after the restart replaces its first record
        if metrics["step"] == 6 and not killed:
            name = next(n for n in ray.util.list_named_actors() if n.endswith("-rm-0"))
            ray.kill(ray.get_actor(name))
            killed.append(name)

    reward = {
        "components": {REWARD: 0.0, "rm": 1.0, "judge": 0.5},
        "rm": {"path": digit_rm, "normalize": "none", "placement": "producer", "timeout_s": 20},
        "judge": {"path": score7_judge, "template": TEMPLATE, "max_new_tokens": 12, "placement": "node:0"},
    }
    run = {"max_steps": 12, "max_restarts": 1, "save_interval": 1}
    out = train(tiny_config(tiny, tmp_path, algo="RLOO", reward=reward, run=run), on_step=record_and_kill_once)
    history = [steps[k] for k in sorted(steps)]
    assert [m["step"] for m in history] == list(range(1, 13)) and out["history"][-1]["step"] == 12
    rm = [m["reward/component/rm"] for m in history]
    assert np.mean(rm[-3:]) > np.mean(rm[:3]) + 0.1, rm
    for m in history:
        seen = {k: v for k, v in m.items() if k.startswith(("reward/", "samples")) or k == "step"}
        assert m["reward/component/judge"] == pytest.approx(0.7, abs=1e-5) and m["reward/judge_unread"] == 0, seen
        assert m["reward/mean"] == pytest.approx(m["reward/component/rm"] + 0.35, abs=1e-5)
        assert f"reward/component/{REWARD}" in m and m["reward/rm_truncated"] == 0  # weight 0, still reported
    assert len(out["restarts"]) == 1 and re.search(rf"reward model server {killed[0]} died", out["restarts"][0])
    # The servers loaded their models while the producer and consumer started (they were started and waited for
    # first): the two groups' start-ups overlap. Which process Ray spawns first is its own choice, so a server quicker
    # than Ray's next worker spawn may be ready before one of the others has a process; the overlap holds either way.
    actors = json.loads(next(tmp_path.rglob("summary.json")).read_text())["startup"]["actors"]
    first = {a["actor"]: a for a in actors if a["run"] == actors[0]["run"]}
    assert {"producer-0", "consumer-0", "rm-0", "judge-0"} <= set(first), actors
    servers, others = [first["rm-0"], first["judge-0"]], [first["producer-0"], first["consumer-0"]]
    assert all(s["engine_s"] > 0 for s in servers), servers
    assert min(a["process_at_s"] for a in others) < max(s["ready_at_s"] for s in servers), actors
    assert max(s["process_at_s"] for s in servers) < max(a["ready_at_s"] for a in others), actors
    assert not [n for n in ray.util.list_named_actors() if n.startswith(killed[0].rsplit("-", 2)[0])]


def test_a_wrong_reward_model_is_refused_before_any_actor_starts(ray_cluster, tiny, tmp_path):
    import ray

    rm_only = {"components": {"rm": 1.0}}
    before = set(ray.util.list_named_actors())
    with pytest.raises(FileNotFoundError, match="is not a model folder"):
        train(tiny_config(tiny, reward={**rm_only, "rm": {"path": str(tmp_path)}}))
    with pytest.raises(ValueError, match=r"a reward model is a \.\.\.ForSequenceClassification with one"):
        train(tiny_config(tiny, reward={**rm_only, "rm": {"path": tiny}}))  # a causal LM
    with pytest.raises(ValueError, match="the rm component and reward.rm.path go together"):
        train(tiny_config(tiny, reward={"components": {REWARD: 1.0}, "rm": {"path": tiny}}))
    assert set(ray.util.list_named_actors()) == before
