"""Math rewards: extract the final answer, then check it with math_verify against the ground truth.

Answer formats, tried in this order: ``<answer>...</answer>`` tags (after any ``<think>`` block), the last
``\\boxed{...}``, a GSM8K ``#### 42`` line. Scores:
- strict (``answer_ok``): an answer in one of those formats, equivalent to the ground truth;
- lenient (``info['lenient_ok']``): the last number or expression anywhere in the text is equivalent.
math_verify times out through ``signal.alarm``, which only works in a process's main thread: call these functions
in worker processes (``RewardPool`` does), never in threads.
"""

from __future__ import annotations

import logging
import re

from coati.distributed.reward.base import REWARD_FNS, RewardResult, truncate_for_log

MAX_ANSWER_CHARS = 1000
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_GSM8K = re.compile(r"####\s*([^\n]+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), with nested braces balanced; None if absent."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract_answer(text: str) -> tuple[str | None, str]:
    """(answer, format) with format one of 'answer_tag', 'boxed', 'gsm8k', or (None, 'none')."""
    body = text.split("</think>")[-1]
    tags = _ANSWER_TAG.findall(body)
    if tags:
        inner = tags[-1]
        boxed = last_boxed(inner)
        return (boxed if boxed is not None else inner).strip(), "answer_tag"
    boxed = last_boxed(body)
    if boxed is not None:
        return boxed.strip(), "boxed"
    gsm = _GSM8K.findall(body)
    if gsm:
        return gsm[-1].strip(), "gsm8k"
    return None, "none"


def last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def _quiet_math_verify() -> None:
    # On timeout math_verify logs the whole input, which can be megabytes of model output.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)


def answers_match(gold: str, answer: str, timeout_s: int = 5) -> bool:
    """math_verify equivalence of two answer strings (wrapped in $...$ so LaTeX parses); False on any failure."""
    from math_verify import parse, verify

    _quiet_math_verify()
    if len(answer) > MAX_ANSWER_CHARS:
        return False
    gold_parsed = parse(f"${gold}$", parsing_timeout=timeout_s)
    if not gold_parsed:
        gold_parsed = parse(gold, parsing_timeout=timeout_s)
    pred = parse(f"${answer}$", parsing_timeout=timeout_s) or parse(answer, parsing_timeout=timeout_s)
    if not gold_parsed or not pred:
        return answer.strip() == str(gold).strip()
    return bool(verify(gold_parsed, pred, timeout_seconds=timeout_s))


@REWARD_FNS.register("math")
def math_reward(
    completions: list[str],
    gt_answer: list[str],
    format_bonus: float = 0.0,
    format_gate: bool = True,
    timeout_s: int = 5,
    **_fields,
) -> list[RewardResult]:
    """1.0 for a correct final answer, else 0.0; plus ``format_bonus`` when the answer is in a recognised format.

    With ``format_gate`` (default) only a strictly formatted correct answer earns the 1.0; without it the lenient
    check decides. math_verify runs with its own ``timeout_s`` per parse and verify.
    """
    results = []
    for text, gold in zip(completions, gt_answer, strict=True):
        gold = str(gold)
        answer, fmt = extract_answer(text)
        format_ok = answer is not None
        strict_ok = format_ok and answers_match(gold, answer, timeout_s)
        candidate = answer if answer is not None else last_number(text)
        lenient_ok = strict_ok or (candidate is not None and answers_match(gold, candidate, timeout_s))
        correct = strict_ok if format_gate else lenient_ok
        reward = float(correct) + (format_bonus if format_ok else 0.0)
        info = {"format": fmt, "answer": truncate_for_log(answer or ""), "lenient_ok": lenient_ok}
        results.append(RewardResult(reward, format_ok, strict_ok, info))
    return results
