"""The judge on tiny models (the transformers backend): one fitted to always reply 'Score: 7' scores every answer 0.7;
a random one replies gibberish, scored 0 with the reason."""

import random
import string

import pytest
import torch

from coati.distributed.reward.judge import JudgeServer
from coati.testing import build_tiny_model

TEMPLATE = "Grade {completion} for {question}"
"""short: what the tiny judges learn to reply to"""


def fit_reply(path: str, reply: str, steps: int = 100) -> str:
    """Train the tiny causal LM at ``path`` in place to answer any user turn with ``reply`` (the loss on the reply)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rng = random.Random(0)  # questions and answers of every kind: the reply must not depend on them
    chars = string.printable  # every character the tiny policy can write: its tab, newline and form feed too
    texts_of = ["".join(rng.choice(chars) for _ in range(rng.randint(0, 16))) for _ in range(96)]
    turns = [
        [{"role": "user", "content": TEMPLATE.format(question=texts_of[2 * i], completion=texts_of[2 * i + 1])}]
        for i in range(48)
    ]
    prompts = [tok.apply_chat_template(t, add_generation_prompt=True, tokenize=False) for t in turns]
    texts = [tok.apply_chat_template(t + [{"role": "assistant", "content": reply}], tokenize=False) for t in turns]
    tok.padding_side = "right"
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    for i, prompt in enumerate(prompts):
        labels[i, : len(tok(prompt, add_special_tokens=False)["input_ids"])] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(**batch, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(path)
    return path


def test_a_scripted_judge_scores_and_a_random_one_is_read_as_zero_with_the_reason(score7_judge, tmp_path):
    random_judge = str(build_tiny_model(tmp_path / "random_judge", seed=3))
    judge = JudgeServer(score7_judge, template=TEMPLATE, max_new_tokens=12)
    assert judge.score(["2+2?", "3+3?"], ["4", "5"]) == [(pytest.approx(0.7), ""), (pytest.approx(0.7), "")]
    results = JudgeServer(random_judge, template=TEMPLATE, max_new_tokens=12).score(["2+2?"], ["4"])
    assert results[0][0] == 0.0 and "no 'Score: N'" in results[0][1]


def test_a_judge_on_the_vllm_engine_reads_the_same_grade(score7_judge):
    """The judge reuses the inference backends: on vLLM's engine (CPU build) the fitted judge's greedy grade is read
    as on transformers."""
    judge = JudgeServer(score7_judge, backend="vllm", template=TEMPLATE, max_new_tokens=12, max_prompt_tokens=256)
    results = judge.score(["2+2?", "x"], ["4", "y"])
    assert results == [(pytest.approx(0.7), ""), (pytest.approx(0.7), "")]
