"""The producer's teacher unit (on-policy distillation): renders each drawn prompt as the teacher reads it (the
teacher's chat template, and the privileged context the student does not see), sends those prompts with the
completions the student sampled to the teacher servers, and writes the teacher's log-probs and top-1 flags into the
record (``RolloutBatch.teacher_logprobs``/``teacher_top1``). The servers are ``teacher/server.py``'s."""

from __future__ import annotations

import time

import numpy as np

from coati.distributed.record import RolloutBatch
from coati.distributed.reward.model_actors import RewardModelClient
from coati.distributed.rollout.data import PromptFormat
from coati.distributed.rollout.plan import TeacherLink


def with_context(row: dict, context: str | None) -> dict:
    """``row`` as the teacher reads it: ``context`` (its {column} fields filled from the row) appended to the last
    message's text (or to the raw prompt); unchanged without a context."""
    if not context:
        return row
    extra = context.format(**row)
    if "messages" in row and row["messages"]:
        messages = [dict(m) for m in row["messages"]]
        messages[-1]["content"] = f"{messages[-1]['content']}{extra}"
        return {**row, "messages": messages}
    return {**row, "prompt": f"{row['prompt']}{extra}"}


class Teaching:
    """Scores a producer's draws under the teacher: ``servers`` [(name, actor)], shared by all producers."""

    def __init__(self, link: TeacherLink, servers: list, prompt_format: PromptFormat):
        from transformers import AutoTokenizer

        self.link, self.prompt_format = link, prompt_format
        self.tokenizer = AutoTokenizer.from_pretrained(link.tokenizer_path)
        self.client = RewardModelClient(
            [a for _, a in servers], [n for n, _ in servers], link.timeout_s, "teacher.timeout_s", "teacher server"
        )

    def prompt(self, row: dict) -> list[int]:
        """The teacher's prompt tokens for ``row``."""
        return self.prompt_format.encode(self.tokenizer, with_context(row, self.link.privileged_context))

    def annotate(self, batch: RolloutBatch, rows: list[dict], n: int) -> float:
        """Fill ``batch``'s teacher fields (row i answers ``rows[i // n]``: prompt-major groups of ``n``); returns
        the seconds spent waiting for the servers."""
        start = time.perf_counter()
        prompts = [self.prompt(row) for row in rows]
        mask = batch.trained_mask()
        responses = [batch.response_ids[i, mask[i]].tolist() for i in range(len(batch))]
        answers = self.client.score([prompts[i // n] for i in range(len(batch))], responses)
        logprobs = np.zeros(batch.response_ids.shape, dtype=np.float32)
        top1 = np.zeros(batch.response_ids.shape, dtype=bool)
        for i, (lp, best) in enumerate(answers):
            logprobs[i, mask[i]], top1[i, mask[i]] = lp, best
        batch.teacher_logprobs, batch.teacher_top1 = logprobs, top1
        return time.perf_counter() - start
