"""Math rewards: extract the final answer, then check it with math_verify against the ground truth.

Answer formats: ``<answer>...</answer>`` tags (after any ``<think>`` block; every ``\\boxed{}`` inside a tag is an
answer, else the tag's text), ``\\boxed{...}`` and GSM8K ``#### 42`` lines. Every final answer the text gives, in any
of these formats, counts: several that differ (a tag hiding a contradicting box included) make the completion
ambiguous and it matches nothing. Scores:
- strict (``answer_ok``): an answer in one of those formats, equivalent to the ground truth;
- lenient (``info['lenient_ok']``): without a formatted answer, the text's final number, read only where it stands
  alone as a value (``lenient_answer``): not an exponent, index, ordinal, percentage, hex digit or one of several
  alternatives.
What may stand in an answer is a whitelist (``says_one_thing``): numbers, letters, arithmetic, brackets and the
LaTeX of values (fractions, roots, constants, functions, sets). A relation, implication, disjunction, ``\\pm``, an
unknown command or symbol, or a connective word (``or``, ``and``, ``not``) matches nothing unless the gold answer
uses it too; ``x = 42`` naming a variable is fine. Digits are read in any script (full-width, Arabic-Indic), a
unicode minus is a minus, digit groups join where well formed (``1,000``, ``1\\,000``, a thin space; not ``1,2``),
and ``4.2e1`` is 42. math_verify times out through ``signal.alarm``, which only works in a process's main thread:
call these functions in worker processes (``RewardPool`` does), never in threads.
"""

from __future__ import annotations

import logging
import math
import re
import unicodedata
from decimal import Decimal, InvalidOperation

from coati.distributed.reward.base import REWARD_FNS, RewardResult, truncate_for_log

MAX_ANSWER_CHARS = 1000
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_GSM8K = re.compile(r"####\s*([^\n]+)")
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:/\d+)?")

_MINUS = dict.fromkeys(map(ord, "\u2212\u2012\u2013\u2014\ufe63\uff0d"), "-")
_GROUP_SEP = r"(?:,|\{,\}|\\,|\\ |\\;|\\:|\\!|~|[\u2009\u202f\u00a0\u2007\u2008\u205f])"
_DIGIT_GROUPS = re.compile(rf"(?<![\d.])(\d{{1,3}})((?:{_GROUP_SEP}\d{{3}})+)(?![\d])")
_SEPARATOR = re.compile(_GROUP_SEP)
_SCIENTIFIC = re.compile(r"(?<![\w.\\])(-?\d+(?:\.\d+)?)[eE]([+-]?\d{1,3})(?![\w.])")
_DEFINITION = re.compile(r"^\s*[a-zA-Z](?:_\{?\w+\}?)?\s*(?:=(?!=)|\\in(?![a-zA-Z]))")

# What may stand in an answer without the gold answer using it too.
_PLAIN_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \t\n+-*/^_()[]{},.'!$\\|") | set(
    "π√×·°∞÷"
)
_VALUE_COMMANDS = set(
    "frac dfrac tfrac cfrac sqrt pi cdot times div left right text textbf textit textrm mathrm mathbf mathit mathsf "
    "operatorname boxed fbox infty circ degree quad qquad displaystyle sin cos tan cot sec csc arcsin arccos arctan "
    "sinh cosh tanh log ln exp lg binom dbinom tbinom overline bar hat vec dot ldots cdots dots prime alpha beta "
    "gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi rho sigma tau upsilon phi "
    "varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Phi Psi Omega mathbb emptyset varnothing cup cap "
    "setminus big Big bigg Bigg bigl bigr Bigl Bigr".split()
)
_COMMAND = re.compile(r"\\([a-zA-Z]+|.)")
_CONNECTIVE = re.compile(
    r"\b(?:or|and|not|nor|either|neither|vs|versus|otherwise|else|if|unless|except|implies|iff|maybe|possibly)\b", re.I
)
_JUXTAPOSED = re.compile(r"\d\s+-?\d")
_PERCENT = re.compile(r"%|\\%|\bpercent\b|\\text\{\s*percent")


def normalize(text: str) -> str:
    """Digits of any script as ASCII digits, unicode minus signs as ``-``, well-formed digit groups joined
    (``1\\,000`` -> ``1000``), and ``4.2e1`` as a plain decimal."""
    text = text.translate(_MINUS)
    text = "".join(
        str(unicodedata.decimal(c)) if not c.isascii() and unicodedata.decimal(c, None) is not None else c for c in text
    )
    text = _DIGIT_GROUPS.sub(lambda m: m.group(1) + _SEPARATOR.sub("", m.group(2)), text)
    return _SCIENTIFIC.sub(_plain_decimal, text)


def _plain_decimal(m: re.Match) -> str:
    try:
        return format(Decimal(f"{m.group(1)}e{m.group(2)}").normalize(), "f")
    except InvalidOperation:
        return m.group(0)


_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])\s*")


def boxes(text: str) -> list[str]:
    """Every ``\\boxed``/``\\fbox`` answer of ``text``, in order of where each starts, whatever its spacing
    (``\\boxed {43}``): a braced group balanced, or up to the end of the text where it is never closed (a box left
    open still states its answer), or the one token after a brace-less ``\\boxed 4``. Boxes inside a box are answers
    too, and the outer one's text holds their contents without the box commands."""
    out = []
    for m in _BOX.finditer(text):
        i = m.end()
        if i < len(text) and text[i] == "{":
            inner = text[i + 1 : _group_end(text, i) - 1]
        else:
            token = re.match(r"[^\s$\\{}]+", text[i:])
            if token is None:
                continue
            inner = token.group(0)
        out.append(_unbox(inner).strip())
    return out


def _group_end(text: str, i: int) -> int:
    """The index after the brace that closes the group opening at ``text[i]``; one past the text's end (as if closed
    there) when it is never closed."""
    depth, j = 1, i + 1
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return j if depth == 0 else len(text) + 1


def _unbox(text: str) -> str:
    """``text`` with each box command inside it replaced by its content."""
    while (m := _BOX.search(text)) is not None:
        i = m.end()
        if i < len(text) and text[i] == "{":
            end = _group_end(text, i)
            text = text[: m.start()] + text[i + 1 : end - 1] + text[end:]
        else:
            text = text[: m.start()] + text[i:]
    return text


def last_boxed(text: str) -> str | None:
    """The last answer of ``boxes``; None without one."""
    found = boxes(text)
    return found[-1] if found else None


def all_boxed(text: str) -> list[str]:
    """Contents of every box (``boxes``), in order."""
    return boxes(text)


def extract_answers(text: str) -> tuple[list[str], str]:
    """(every final answer the text gives, format) with format the first of 'answer_tag', 'boxed', 'gsm8k' that the
    text uses, or ([], 'none'). Answers in that format come last, and the last of all is *the* answer; more than one
    that differ make the completion ambiguous."""
    body = text.split("</think>")[-1]
    tags = _ANSWER_TAG.findall(body)
    outside = _ANSWER_TAG.sub(" ", body)
    tagged = [b for t in tags for b in (all_boxed(t) or [t])]
    boxed, gsm = all_boxed(outside), _GSM8K.findall(outside)
    if tags:
        found, fmt = boxed + gsm + tagged, "answer_tag"
    elif boxed:
        found, fmt = gsm + boxed, "boxed"
    elif gsm:
        found, fmt = gsm, "gsm8k"
    else:
        return [], "none"
    return [a.strip() for a in found], fmt


def extract_answer(text: str) -> tuple[str | None, str]:
    """(answer, format): the last of ``extract_answers``, or (None, 'none')."""
    answers, fmt = extract_answers(text)
    return (answers[-1] if answers else None), fmt


def says_one_thing(gold: str, answer: str) -> bool:
    """True when everything in ``answer`` is on the whitelist of what states one value (module docstring), or is
    used by ``gold`` too: math_verify would otherwise compare one side of a relation (``43 = 42``, ``43 \\mid 42``
    match 42), one of two alternatives, or a percentage as its number. ``x = 42`` is allowed."""
    if _PERCENT.search(answer) and not _PERCENT.search(gold):
        return False
    if _JUXTAPOSED.search(answer) and not _JUXTAPOSED.search(gold):  # "43 42": two values side by side
        return False
    if re.search(r"\{\s*\}", answer) and not re.search(r"\{\s*\}", gold):  # an empty argument: \frac{1}{}
        return False
    claim = _DEFINITION.sub("", answer, count=1)
    if "=" in claim and "=" not in gold:
        return False
    if any(c not in _PLAIN_CHARS and c not in gold for c in claim):
        return False
    gold_commands = set(_COMMAND.findall(gold))
    for command in _COMMAND.findall(claim):
        if command not in _VALUE_COMMANDS and command not in gold_commands and command not in ",;:! {}%$":
            return False
    words = {w.lower() for w in _CONNECTIVE.findall(claim)}
    if words - {w.lower() for w in _CONNECTIVE.findall(gold)}:
        return False
    return claim.count("|") % 2 == 0 or "|" in gold


def check_gold(gold, where: str = "gt_answer") -> str:
    """The gold answer as a string. It must be a non-empty string or a finite number: a missing one, a boolean, a
    list, a dict or NaN is a data error (a list would make every answer wrong), not a string to compare with."""
    if gold is None:
        raise ValueError(f"{where} is None: every row needs a non-empty gt_answer for the math reward")
    if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
        raise ValueError(
            f"{where} is {gold!r} ({type(gold).__name__}): the math reward needs a string or a number "
            "as every row's gt_answer"
        )
    if isinstance(gold, float) and not math.isfinite(gold):
        raise ValueError(f"{where} is {gold!r}: the math reward needs a finite number or a string as gt_answer")
    if not str(gold).strip():
        raise ValueError(f"{where} is {gold!r}: every row needs a non-empty gt_answer for the math reward")
    return str(gold)


def last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


_REJECTED = re.compile(
    r"\d\s*(,?\s*(?:and\s+)?(?:not|rather than|instead of)\s+-?\d+(?:\.\d+)?(?:/\d+)?)\s*[.!]?\s*$", re.I
)
"""a text ending with a value and then one it rejects: ``42, not 43.``, ``42 rather than 43``"""
_CLAUSE_END = re.compile(r"[.!?;:](?:\s|$)|\n")
_NOT_BEFORE = re.compile(r"(?:[\w.\\]|[-+*/×·÷^_]\s*\{?\s*|\\(?:times|cdot|div)\s*)$")
_NOT_AFTER = re.compile(r"\s*(?:[\^!×·÷]|[*/]\s*[\w(\\]|\\times|\\cdot|\\div|\\circ|\\degree|°|\.\d)|[\w.]\w", re.I)
_PERCENT_AFTER = re.compile(r"\s*(?:%|\\%|percent\b)", re.I)
_ARGUMENT_BEFORE = re.compile(
    r"(?:\}|\\(?:[dtc]?frac|[dt]?binom|sqrt(?:\[[^\]]*\])?|log|ln|exp|sin|cos|tan|overline|bar|vec|hat))\s*\{\s*$"
)
"""a number that opens a command's argument (``\\frac{1+\\sqrt{5}}{2}``, ``\\sqrt{5}``): a part of a value"""


def in_group(before: str) -> bool:
    """Whether the bracket left open in ``before`` also holds another value or a separator: the number is a bound of
    an interval (``[0, 1)``) or a member of a tuple, not a value of its own."""
    depth, opened = 0, None
    for i in range(len(before) - 1, -1, -1):
        c = before[i]
        if c in ")]":
            depth += 1
        elif c in "([":
            if depth == 0:
                opened = i
                break
            depth -= 1
    return opened is not None and bool(re.search(r"[\d,;]", before[opened + 1 :]))


def lenient_answer(text: str) -> str | None:
    """The text's final number where it stands alone as a value, else None: the last number (with its sign), not
    part of a word, an exponent, index, hex or binary literal, ordinal or operand, and not one of alternatives
    (``41 or 42``), negated (``not 42``) or the far side of a relation (``x < 42``) within its sentence; a text that
    ends rejecting a value after stating one (``42, not 43``) states the first. A percent
    sign after it stays with it (``42%``), for ``says_one_thing`` to weigh against the gold answer."""
    body = re.sub(r"\*\*|__", " ", normalize(text.split("</think>")[-1]))  # markdown emphasis, not arithmetic
    rejected = _REJECTED.search(body)
    if rejected:  # "42, not 43": the value stated is the one before the rejected one
        body = body[: rejected.start(1)]
    matches = list(re.finditer(r"(?<![\d.])-?(?:\d+(?:\.\d+)?(?:/\d+)?)", body))
    if not matches:
        return None
    m = matches[-1]
    before, after = body[: m.start()], body[m.end() :]
    if _NOT_BEFORE.search(before) or _NOT_AFTER.match(after) or _ARGUMENT_BEFORE.search(before):
        return None
    clause_start = max((e.end() for e in _CLAUSE_END.finditer(before)), default=0)
    earlier = [n.end() for n in matches[:-1] if n.start() >= clause_start]
    between = before[max([clause_start, *earlier]) :]
    if in_group(before[clause_start:]):
        return None
    if _CONNECTIVE.search(between) or not _states_values(between.replace("=", "")):
        return None
    return m.group(0) + ("%" if _PERCENT_AFTER.match(after) else "")


def _states_values(text: str) -> bool:
    """Whether ``text`` holds only what may stand beside a value (no relation symbol or command)."""
    return all(c in _PLAIN_CHARS or c in '*:"' for c in text) and all(
        c in _VALUE_COMMANDS or c in ",;:! {}%$()[]" for c in _COMMAND.findall(text)
    )


def _quiet_math_verify() -> None:
    # On timeout math_verify logs the whole input, which can be megabytes of model output.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)


MAX_EXPONENT = 10**5
"""the largest integer exponent (and factorial argument) an answer is evaluated with: math_verify's parser computes
integer powers exactly while parsing, in the calling thread and holding the GIL (``9^{9^{9}}`` never returned), where
no timeout can stop it"""
_POWER = re.compile(r"\^|\*\*")
_FACTORIAL = re.compile(r"(\d+)\s*!")


def _exponents(text: str):
    """The text of each exponent in ``text``: a braced group, a parenthesised one, or the token after ^ or **; and
    whether another power follows it directly (``9^9^9`` nests to the right)."""
    for m in _POWER.finditer(text):
        i = m.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] in "{(":
            close, depth, j = "}" if text[i] == "{" else ")", 0, i
            while j < len(text):
                depth += text[j] in "{("
                depth -= text[j] in "})"
                j += 1
                if depth == 0:
                    break
            exponent = text[i + 1 : j - 1] if j <= len(text) and text[j - 1] == close else text[i + 1 :]
        else:
            j = i
            while j < len(text) and (text[j].isalnum() or text[j] in "._\\"):
                j += 1
            exponent = text[i:j]
        yield exponent, bool(_POWER.match(text[j:].lstrip()))


def too_costly(answer: str) -> bool:
    """Whether evaluating ``answer`` could run without bound: a power in an exponent (written nested or chained), an
    exponent or a factorial over ``MAX_EXPONENT``. Such an answer is compared as text, never evaluated."""
    for exponent, chained in _exponents(answer):
        if chained or _POWER.search(exponent) or any(int(n) > MAX_EXPONENT for n in re.findall(r"\d+", exponent)):
            return True
    return any(int(n) > MAX_EXPONENT for n in _FACTORIAL.findall(answer))


_COLOR = re.compile(r"\\color\s*\{[^{}]*\}|\\(?:textcolor|colorbox)\s*\{[^{}]*\}")
_STYLE = re.compile(
    r"\\(?:boldsymbol|bm|pmb|mathbf|mathrm|mathit|mathsf|textbf|textit|textrm|displaystyle|textstyle)(?![a-zA-Z])"
)
_SIZED = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg)(?![a-zA-Z])\s*(\.?)")


def strip_formatting(text: str) -> str:
    """``text`` without what only changes how a value looks: colours (``\\color{red}``, ``\\textcolor{c}{..}``),
    weights and styles (``\\boldsymbol``, ``\\mathbf``, ``\\displaystyle``), and delimiter sizing (``\\left``,
    ``\\right``, ``\\big``; the invisible ``\\left.``/``\\right.`` removed whole)."""
    text = _COLOR.sub("", text)
    text = _STYLE.sub("", text)
    return _SIZED.sub("", text)


def gold_parts(gold: str) -> list[str]:
    """A multi-part gold answer's parts: its top-level comma-separated items, outer brackets dropped (``(3, 5)``,
    ``3, 5``); one part for a single value."""
    text = gold.strip()
    if len(text) > 1 and text[0] + text[-1] in ("()", "[]", "{}"):
        text = text[1:-1]
    parts, depth, current = [], 0, ""
    for c in text:
        depth += c in "([{"
        depth -= c in ")]}"
        if c == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += c
    return [p for p in [*parts, current.strip()] if p]


def answers_correct(gold: str, answers: list[str], timeout_s: int = 5) -> bool:
    """Whether the final answers a text gives say the gold answer: each of them matches it (several that differ say
    nothing), or, for a multi-part gold answer, they are its parts, one answer (box) per part, in order."""
    if not answers:
        return False
    if all(answers_match(gold, a, timeout_s) for a in dict.fromkeys(answers)):
        return True
    parts = gold_parts(gold)
    return 1 < len(parts) == len(answers) and all(
        answers_match(p, a, timeout_s) for p, a in zip(parts, answers, strict=True)
    )


def answers_match(gold: str, answer: str, timeout_s: int = 5) -> bool:
    """math_verify equivalence of two answer strings (wrapped in $...$ so LaTeX parses); False on any failure."""
    from math_verify import parse, verify

    _quiet_math_verify()
    gold, answer = normalize(strip_formatting(str(gold))), normalize(strip_formatting(answer))
    if len(answer) > MAX_ANSWER_CHARS or not says_one_thing(gold, answer):
        return False
    if too_costly(answer) or too_costly(gold):
        return answer.strip() == gold.strip()
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
        strict_ok = format_ok and answers_correct(gold, answers, timeout_s)
        # A formatted answer is judged the same way by both scores; without one, the last number is the answer.
        candidate = None if format_ok else lenient_answer(text)
        lenient_ok = strict_ok or (candidate is not None and answers_match(gold, candidate, timeout_s))
        correct = strict_ok if format_gate else lenient_ok
        reward = float(correct) + (format_bonus if format_ok else 0.0)
        info = {"format": fmt, "answer": truncate_for_log(answer or ""), "lenient_ok": lenient_ok}
        results.append(RewardResult(reward, format_ok, strict_ok, info))
    return results


DEFAULT_TAGS = {
    "think_start": {"text": "<think>", "num_occur": 1},
    "think_end": {"text": "</think>", "num_occur": 1},
    "answer_start": {"text": "<answer>", "num_occur": 1},
    "answer_end": {"text": "</answer>", "num_occur": 1},
}
"""ColossalChat's response format for ``think_answer_tags``: each tag this many times, in this order"""


def tags_in_order(text: str, tags: dict) -> bool:
    """Each tag of ``tags`` ({name: {"text", "num_occur"}}, ColossalChat's ``response_format_tags``) occurs exactly
    its number of times, and the tags first occur in the order given (a think block before the answer)."""
    positions = []
    for spec in tags.values():
        if text.count(spec["text"]) != spec.get("num_occur", 1):
            return False
        positions.append(text.find(spec["text"]))
    return positions == sorted(positions)


def _strict(texts, golds, timeout_s: int, formatted) -> list[RewardResult]:
    """1.0 where ``formatted(text)`` and every final answer the text gives matches the gold one, else 0.0."""
    results = []
    for text, gold in zip(texts, golds, strict=True):
        gold = check_gold(gold)
        answers, fmt = extract_answers(text)
        format_ok = bool(answers) and formatted(text, fmt)
        correct = format_ok and answers_correct(gold, answers, timeout_s)
        info = {"format": fmt, "answer": truncate_for_log(answers[-1] if answers else ""), "lenient_ok": correct}
        results.append(RewardResult(float(correct), format_ok, correct, info))
    return results


@REWARD_FNS.register("think_answer_tags")
def think_answer_tags(
    completions: list[str], gt_answer: list[str], tags: dict | None = None, timeout_s: int = 5, **_fields
) -> list[RewardResult]:
    """ColossalChat's ``think_answer_tags`` reward, strict: a completion scores 1.0 only when it has each tag of
    ``tags`` (its ``response_format_tags``; default one <think>, </think>, <answer>, </answer>, in that order) the
    given number of times and its answer (the tag's boxes, else its text) matches the gold one; else 0.0 (ColossalChat
    scores 10 for the same verdict; group-normalised advantages do not see the scale)."""
    tags = tags or DEFAULT_TAGS
    return _strict(
        completions, gt_answer, timeout_s, lambda text, fmt: fmt == "answer_tag" and tags_in_order(text, tags)
    )


@REWARD_FNS.register("boxed")
def boxed(completions: list[str], gt_answer: list[str], timeout_s: int = 5, **_fields) -> list[RewardResult]:
    """ColossalChat's ``boxed`` reward, strict: 1.0 when the completion puts its answer in \\boxed{} (inside an answer
    tag or not; every final answer the text gives agreeing) and it matches the gold one, else 0.0."""
    return _strict(completions, gt_answer, timeout_s, lambda text, fmt: bool(all_boxed(text)))
