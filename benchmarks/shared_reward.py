"""The benchmark's reward, shared verbatim by both frameworks (pure Python, no imports from either): 1.0 when the
last number in the completion equals the ground truth. Completions may be strings or chat messages."""

import re

_NUMBER = re.compile(r"-?\d+")


def last_number_reward(completions, gt_answer, **_kwargs):
    out = []
    for completion, gold in zip(completions, gt_answer, strict=True):
        if isinstance(completion, list):  # TRL's conversational format
            completion = completion[-1]["content"]
        numbers = _NUMBER.findall(completion.replace(",", ""))
        out.append(1.0 if numbers and numbers[-1] == str(gold).strip() else 0.0)
    return out
