"""Math rewards: extract the final answer, then check it with math_verify against the ground truth.

Answer formats, tried in this order: ``<answer>...</answer>`` tags (after any ``<think>`` block), the last
``\\boxed{...}``, a GSM8K ``#### 42`` line. Scores:
- strict (``answer_ok``): an answer in one of those formats, equivalent to the ground truth;
- lenient (``info['lenient_ok']``): the last number or expression anywhere in the text is equivalent.
An answer must say one thing: one that states a relation, implication or disjunction (``43 = 42``, ``43 \\to 42``,
``43 \\lor 42``; ``x = 42`` naming a variable is fine), a percentage where the gold has none, or several different
final answers, matches nothing. Thousands separators count only where well formed (``1,000``, not ``1,2``).
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
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:/\d+)?")
# Relations, implications and connectives: an answer holding one claims more than a value.
_RELATION = re.compile(
    r"\\(?:n?eq|ne|le|ge|leq|geq|lt|gt|leqslant|geqslant|to|gets|mapsto|implies|impliedby|iff|approx|sim|simeq|equiv"
    r"|cong|propto|lor|vee|land|wedge|neg|lnot|[lL]eftarrow|[rR]ightarrow|[lL]eftrightarrow|[lL]ongrightarrow"
    r"|[lL]ongleftarrow|[lL]ongleftrightarrow)(?![a-zA-Z])"
    r"|[<>≤≥≠≈→⇒⇔↔←⟹⟸⟺∨∧¬]|\b(?:or|and|implies|not)\b"
)
_DEFINITION = re.compile(r"^\s*[a-zA-Z](?:_\{?\w+\}?)?\s*=(?!=)")
_PERCENT = re.compile(r"%|\\%|\bpercent\b|\\text\{\s*percent")


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


def all_boxed(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}``/``\\fbox{...}``, in order."""
    out = []
    while (found := last_boxed(text)) is not None:
        out.append(found)
        text = text[: max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))]
    return out[::-1]


def extract_answers(text: str) -> tuple[list[str], str]:
    """(every final answer the text gives in its format, format) with format one of 'answer_tag', 'boxed', 'gsm8k',
    or ([], 'none'). The last one is *the* answer; more than one that differ make the completion ambiguous."""
    body = text.split("</think>")[-1]
    tags = _ANSWER_TAG.findall(body)
    if tags:
        return [(last_boxed(t) if last_boxed(t) is not None else t).strip() for t in tags], "answer_tag"
    boxed = all_boxed(body)
    if boxed:
        return [b.strip() for b in boxed], "boxed"
    gsm = _GSM8K.findall(body)
    if gsm:
        return [g.strip() for g in gsm], "gsm8k"
    return [], "none"


def extract_answer(text: str) -> tuple[str | None, str]:
    """(answer, format): the last of ``extract_answers``, or (None, 'none')."""
    answers, fmt = extract_answers(text)
    return (answers[-1] if answers else None), fmt


def says_one_thing(gold: str, answer: str) -> bool:
    """False when ``answer`` states a relation, implication or disjunction, or a percentage, that ``gold`` does
    not: math_verify would otherwise compare one side of it (``43 = 42`` matches 42). ``x = 42`` is allowed."""
    if _PERCENT.search(answer) and not _PERCENT.search(gold):
        return False
    if _RELATION.search(gold) or "=" in gold:
        return True
    claim = _DEFINITION.sub("", answer, count=1)
    return not (_RELATION.search(claim) or "=" in claim)


def check_gold(gold, where: str = "gt_answer") -> str:
    """The gold answer as a string; a missing or blank one is a data error, not the string 'None'."""
    if gold is None or not str(gold).strip():
        raise ValueError(f"{where} is {gold!r}: every row needs a non-empty gt_answer for the math reward")
    return str(gold)


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
    if len(answer) > MAX_ANSWER_CHARS or not says_one_thing(str(gold), answer):
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
    format_gate: bool = False,
    timeout_s: int = 5,
    **_fields,
) -> list[RewardResult]:
    """1.0 for a correct final answer, else 0.0; plus ``format_bonus`` when the answer is in a recognised format.

    With ``format_gate`` only a strictly formatted correct answer earns the 1.0; without it (the default) the lenient
    check decides. math_verify runs with its own ``timeout_s`` per parse and verify.
    """
    results = []
    for text, gold in zip(completions, gt_answer, strict=True):
        gold = check_gold(gold)
        answers, fmt = extract_answers(text)
        answer = answers[-1] if answers else None
        format_ok = answer is not None
        # Several different final answers say nothing: each of them must be right.
        strict_ok = format_ok and all(answers_match(gold, a, timeout_s) for a in dict.fromkeys(answers))
        # A formatted answer is judged the same way by both scores; without one, the last number is the answer.
        candidate = None if format_ok else last_number(text)
        lenient_ok = strict_ok or (candidate is not None and answers_match(gold, candidate, timeout_s))
        correct = strict_ok if format_gate else lenient_ok
        reward = float(correct) + (format_bonus if format_ok else 0.0)
        info = {"format": fmt, "answer": truncate_for_log(answer or ""), "lenient_ok": lenient_ok}
        results.append(RewardResult(reward, format_ok, strict_ok, info))
    return results
