"""On-policy distillation's pure parts: the teacher's per-token advantage and metrics against hand-computed numbers,
how the trainer adds it to an estimator's advantages, the OPD preset, the record's teacher fields, and the teacher
section's refusals."""

import numpy as np
import pytest
import torch

from coati.distributed.algo.distill import distill_advantages, teacher_metrics
from coati.distributed.algo.presets import resolve_algorithm
from coati.distributed.config.tree import config_from_dict
from coati.distributed.record import RolloutBatch
from coati.distributed.teacher.config import TeacherConfig
from coati.distributed.trainer.step import batch_advantages

STUDENT = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, 0.0, 0.0]])
TEACHER = torch.tensor([[-0.5, -4.0, -0.5], [-1.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_the_advantage_is_the_teachers_log_ratio_on_valid_tokens():
    adv = distill_advantages(STUDENT, TEACHER, MASK, 0.5)
    assert adv.tolist() == [[0.25, -1.0, 0.0], [1.0, 0.0, 0.0]]
    assert adv.dtype == torch.float32


def test_a_token_the_teacher_rules_out_gets_a_finite_push():
    adv = distill_advantages(torch.tensor([[-0.1]]), torch.tensor([[-float("inf")]]), torch.ones(1, 1), 1.0)
    assert adv.item() == -20.0


def test_metrics_are_the_mean_kl_and_the_top1_share_over_valid_tokens():
    top1 = torch.tensor([[True, False, True], [False, True, True]])
    m = teacher_metrics(STUDENT, TEACHER, top1, MASK)
    # (-0.5 + 2.0 + 0.0 - 2.0) / 4 tokens; 2 of the 4 valid tokens are the teacher's argmax
    assert m == {"teacher/kl": pytest.approx(-0.125), "teacher/top1_match": 0.5}
    assert np.isnan(teacher_metrics(STUDENT, TEACHER, top1, torch.zeros(2, 3))["teacher/kl"])


def batch(teacher=True) -> RolloutBatch:
    b = RolloutBatch(
        prompt_ids=np.ones((2, 1), dtype=np.int64),
        prompt_mask=np.ones((2, 1), dtype=bool),
        response_ids=np.ones((2, 3), dtype=np.int64),
        response_mask=MASK.numpy().astype(bool),
        rollout_logprobs=(STUDENT * MASK).numpy(),
        response_lengths=np.array([3, 1]),
        truncated=np.zeros(2, dtype=bool),
        group_ids=np.array([0, 0]),
        rewards=np.array([1.0, 0.0], dtype=np.float32),
    )
    if teacher:
        b.teacher_logprobs, b.teacher_top1 = (TEACHER * MASK).numpy(), MASK.numpy().astype(bool)
    return b.validate()


def test_opd_trains_on_the_teacher_alone_and_a_coefficient_adds_it_to_grpo():
    mask = MASK.clone()
    opd = resolve_algorithm("OPD")
    assert opd.advantage_estimator == "none" and opd.distill_coef == 1.0 and not opd.dynamic_sampling
    assert batch_advantages(batch(), mask, opd).tolist() == [[0.5, -2.0, 0.0], [2.0, 0.0, 0.0]]
    grpo = resolve_algorithm("GRPO")
    both = resolve_algorithm("GRPO", distill_coef=0.5)
    expected = batch_advantages(batch(), mask, grpo) + distill_advantages(STUDENT, TEACHER, mask, 0.5)
    assert torch.equal(batch_advantages(batch(), mask, both), expected)


def test_the_record_carries_the_teacher_through_concat_and_select():
    short = batch().select(np.array([1]))
    short.response_ids, short.response_mask = short.response_ids[:, :1], short.response_mask[:, :1]
    short.rollout_logprobs = short.rollout_logprobs[:, :1]
    short.teacher_logprobs, short.teacher_top1 = short.teacher_logprobs[:, :1], short.teacher_top1[:, :1]
    both = RolloutBatch.concat([batch(), short.validate()]).validate()
    assert both.teacher_logprobs.shape == (3, 3) and both.teacher_logprobs[2].tolist() == [-1.0, 0.0, 0.0]
    assert RolloutBatch.concat([batch(), batch(teacher=False)]).teacher_logprobs is None
    wrong = batch()
    wrong.teacher_logprobs = np.ones((2, 3), dtype=np.float32)  # a value past the row's end
    with pytest.raises(AssertionError, match="teacher off the mask"):
        wrong.validate()


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"algo": "OPD"}, r"distill_coef=1.0 \(--algo OPD\) distils from a teacher, but none is set"),
        ({"teacher": {"model": "t"}}, r"teacher settings \['model'\] given, but --algo DAPO has distill_coef=0"),
        ({"algo": "GRPO", "algorithm": {"advantage_estimator": "none"}}, "distill_coef=0; set distill_coef > 0"),
        ({"algo": "OPD", "teacher": {"model": "self:0"}}, "a self-teacher is self:N with N >= 1"),
        ({"algo": "OPD", "teacher": {"model": ["a", "b"]}}, "takes one teacher .* per task .* are not built"),
        ({"algo": "OPD", "teacher": {"model": "t", "privileged_context": "{"}}, "is not a format string"),
        ({"algo": "OPD", "teacher": {"model": "t", "placement": "gpu"}}, "teacher.placement must be any"),
        (
            {"algo": "OPD", "teacher": {"model": "t"}, "reward": {"env": "retry"}},
            "multi-turn episodes, which the teacher does not score",
        ),
    ],
)
def test_teacher_settings_are_refused_with_the_fix(tree, message):
    with pytest.raises(ValueError, match=message):
        config_from_dict(tree)


def test_a_self_teacher_names_its_lag_and_the_context_its_columns():
    t = TeacherConfig(model="self:3", privileged_context="\n\nThe answer is {gt_answer} ({source}).")
    assert t.self_lag == 3 and t.context_fields == {"gt_answer", "source"}
    assert TeacherConfig(model="/m").self_lag is None
    config = config_from_dict({"algo": "GRPO", "algorithm": {"distill_coef": 0.5}, "teacher": {"model": "self:1"}})
    assert config.algo_config.distills and config.algo_config.advantage_estimator == "grpo"
