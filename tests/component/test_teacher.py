"""The teacher role in process (no Ray): the server's log-probs and top-1 flags are the model's own, whatever the
batching; the producer's unit renders the teacher's prompt with its chat template and privileged context and fills the
record; preflight refuses a teacher whose tokenizer is not the student's, naming both, and a context column a row
lacks."""

import numpy as np
import pytest
import torch

from coati.distributed.record import batch_from_responses
from coati.distributed.rollout.data import PromptFormat
from coati.distributed.rollout.plan import TeacherLink
from coati.distributed.rollout.teaching import Teaching, with_context
from coati.distributed.teacher.checks import check_teacher_files, check_teacher_tokenizer
from coati.distributed.teacher.config import TeacherConfig
from coati.distributed.teacher.server import TeacherServer
from coati.testing import build_tiny_model

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
RESPONSES = [[20, 21, 22], [23], [24, 25, 26, 27, 28, 29]]


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("teacher"), seed=3))


def reference(path, prompt, response, temperature):
    """The teacher's log-probs and argmax flags of one row, by a plain forward of prompt + response."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    lp = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]
    return lp.numpy(), (logits.argmax(-1) == torch.tensor(response)).numpy()


@pytest.mark.parametrize("budget", [4096, 8])  # one forward for all rows, or one per row
def test_the_server_answers_the_models_own_logprobs(teacher_path, budget):
    server = TeacherServer(teacher_path, temperature=0.7, batch_tokens=budget)
    answers = server.score(PROMPTS, RESPONSES)
    for (lp, top1), prompt, response in zip(answers, PROMPTS, RESPONSES, strict=True):
        want_lp, want_top1 = reference(teacher_path, prompt, response, 0.7)
        assert lp.shape == (len(response),) and np.allclose(lp, want_lp, atol=1e-5), (lp, want_lp)
        assert np.array_equal(top1, want_top1)


def test_a_self_teacher_takes_the_policys_weights(teacher_path, tmp_path):
    from transformers import AutoModelForCausalLM

    other = build_tiny_model(tmp_path / "other", seed=11)
    server = TeacherServer(teacher_path, temperature=1.0)
    before = server.score(PROMPTS[:1], RESPONSES[:1])[0][0]
    state = AutoModelForCausalLM.from_pretrained(other).state_dict()
    assert server.load_weights(state, 6) == 6 and server.version == 6
    after = server.score(PROMPTS[:1], RESPONSES[:1])[0][0]
    assert not np.allclose(before, after)
    assert np.allclose(after, reference(str(other), PROMPTS[0], RESPONSES[0], 1.0)[0], atol=1e-5)


class LocalServer:
    """A teacher server called in process, answering as a Ray actor's ``score.remote`` would be read."""

    def __init__(self, server):
        self.server = server
        self.score = self

    def remote(self, prompts, responses):
        import ray

        return ray.put(self.server.score(prompts, responses))


def test_the_producers_unit_renders_the_teachers_prompt_and_fills_the_record(ray_cluster, teacher_path):
    from transformers import AutoTokenizer

    rows = [{"prompt": "2+2?", "gt_answer": "4"}, {"messages": [{"role": "user", "content": "3+3?"}], "gt_answer": "6"}]
    assert with_context(rows[0], " [answer: {gt_answer}]")["prompt"] == "2+2? [answer: 4]"
    assert with_context(rows[1], " [{gt_answer}]")["messages"][-1]["content"] == "3+3? [6]"
    assert with_context(rows[0], None) is rows[0]
    link = TeacherLink(teacher_path, " [answer: {gt_answer}]", 60.0)
    server = TeacherServer(teacher_path, temperature=1.0)
    teaching = Teaching(link, [("teacher-0", LocalServer(server))], PromptFormat())
    tokenizer = AutoTokenizer.from_pretrained(teacher_path)
    prompt = teaching.prompt(rows[0])
    assert tokenizer.decode(prompt).count("[answer: 4]") == 1  # inside the template's user turn
    batch = batch_from_responses([[3, 4], [5]], 2, [[20, 21], [22], [23, 24, 25], [26]], None, [True] * 4, 0)
    teaching.annotate(batch, rows, 2)
    batch.validate()
    for i in range(4):
        row_prompt = teaching.prompt(rows[i // 2])
        response = batch.response_ids[i, : batch.response_lengths[i]].tolist()
        lp, top1 = reference(teacher_path, row_prompt, response, 1.0)
        assert np.allclose(batch.teacher_logprobs[i, : len(response)], lp, atol=1e-5)
        assert np.array_equal(batch.teacher_top1[i, : len(response)], top1)


def test_a_teacher_with_another_tokenizer_is_refused_naming_both(teacher_path, tmp_path):
    from transformers import AutoTokenizer

    student = AutoTokenizer.from_pretrained(teacher_path)
    check_teacher_tokenizer(teacher_path, student, "student", raw=False)  # the same: accepted
    other = AutoTokenizer.from_pretrained(teacher_path)
    other.add_tokens(["<extra>"])
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match=r"teacher .*other's tokenizer is not the student's \(/s/student\): 1 of"):
        check_teacher_tokenizer(str(tmp_path / "other"), student, "/s/student", raw=False)


def test_a_context_column_a_row_lacks_is_refused(teacher_path, tmp_path):
    t = TeacherConfig(model=teacher_path, privileged_context=" {solution}")
    rows = {"training set": [{"prompt": "a", "solution": "1"}, {"prompt": "b"}]}
    with pytest.raises(ValueError, match=r"shows \{solution\}, but training set row 1 \(1 rows in all\)"):
        check_teacher_files(t, teacher_path, rows)
    with pytest.raises(FileNotFoundError, match="is not a model folder"):
        check_teacher_files(TeacherConfig(model=str(tmp_path)), str(tmp_path), {})


class Dying:
    def score(self, prompts, responses):
        import os

        os._exit(1)


def test_a_teacher_server_that_dies_is_named(ray_cluster, teacher_path):
    import ray

    server = ray.remote(Dying).remote()
    link = TeacherLink(teacher_path, None, 30.0)
    teaching = Teaching(link, [("run-teacher-0", server)], PromptFormat())
    batch = batch_from_responses([[3, 4]], 1, [[20, 21]], None, [True], 0)
    with pytest.raises(RuntimeError, match="teacher server run-teacher-0 died"):
        teaching.annotate(batch, [{"prompt": "2+2?"}], 1)
