"""An LLM judge: a generative model reads the question, the completion and (when the data has one) the reference
answer through a prompt template, and its greedy reply is parsed into a score in [0, 1]. A reply the parser cannot
read scores 0, with the reason kept; it never stops the run.

The template is a string with ``{question}``, ``{completion}`` and optionally ``{reference}`` (the row's
``gt_answer``) and ``{rubric}`` (the row's ``rubric`` column) fields, sent as the judge model's user turn under its
chat template. The grade is read from the reply's own final line (a judge that quotes the graded answer's "Score: 10"
earlier in its reply is not taken at that word): the last ``Score: x`` there, divided by ``max_score``, or by ``N``
where the line says ``Score: x/N`` or ``Score: x out of N``.
"""

from __future__ import annotations

import re

from coati.distributed.inference import backend_class
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.runtime.liveness import note_progress, start_heartbeat
from coati.distributed.runtime.startup import mark, marks

TEMPLATE = (
    "Grade the answer to the question.\n\nQuestion: {question}\n\nReference answer: {reference}\n\n"
    "Answer to grade: {completion}\n\nReply with one line, 'Score: N', N from 0 (wrong) to 10 (right)."
)
FIELDS = ("question", "completion", "reference", "rubric")
"""the fields a judge template may use"""
SCORE = re.compile(r"score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)(?:\s*(?:/|\bout\s+of\b)\s*(\d+(?:\.\d+)?))?", re.I)


def final_line(reply: str) -> str:
    """The reply's last line that holds anything but white space and markup."""
    lines = [line for line in reply.splitlines() if line.strip(" \t*_`#>")]
    return lines[-1] if lines else ""


def parse_score(reply: str, max_score: float = 10.0) -> tuple[float, str]:
    """(score in [0, 1], "") from the last 'Score: x' (or 'Score: x/N', 'Score: x out of N') on the reply's final
    line, or (0.0, the reason) when that line has none or it is out of range."""
    found = SCORE.findall(final_line(reply))
    if not found:
        return 0.0, f"judge reply's final line has no 'Score: N': {reply[-120:]!r}"
    value, out_of = found[-1]
    top = float(out_of) if out_of else max_score
    score = float(value)
    if top <= 0 or not 0 <= score <= top:
        return 0.0, f"judge score {value} is outside [0, {top:g}]"
    return score / top, ""


def template_fields(template: str) -> set[str]:
    """The ``{field}`` names ``template`` uses."""
    import string

    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def render(template: str, question, completion: str, reference, rubric=None) -> str:
    """The judge's user turn (a question given as messages is shown as its last user message; a missing reference
    or rubric as '(none)')."""
    if not isinstance(question, str):
        question = next((m["content"] for m in reversed(list(question)) if m.get("role") == "user"), "")
    reference = "(none)" if reference is None else reference
    rubric = "(none)" if rubric is None else rubric
    return template.format(question=question, completion=completion, reference=reference, rubric=rubric)


class JudgeServer:
    """Hosts a judge model on an inference backend; run as a Ray actor (``ray.remote(JudgeServer)``)."""

    def __init__(
        self,
        path: str,
        backend: str = "transformers",
        template: str = TEMPLATE,
        max_score: float = 10.0,
        max_new_tokens: int = 32,
        max_prompt_tokens: int = 1024,
        threads: int = 1,
    ):
        import torch

        mark("imported")
        start_heartbeat()
        mark("setup")
        torch.set_num_threads(threads)
        generation = GenerationConfig(max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens)
        self.backend = backend_class(backend)(path, generation)
        mark("engine")
        mark("ready")
        self.template, self.max_score = template, max_score

    def score(
        self, prompts: list, completions: list[str], references: list | None = None, rubrics: list | None = None
    ) -> list[tuple[float, str]]:
        tok = self.backend.tokenizer
        references, rubrics = references or [None] * len(prompts), rubrics or [None] * len(prompts)
        turns = [
            render(self.template, q, c, r, g)
            for q, c, r, g in zip(prompts, completions, references, rubrics, strict=True)
        ]
        ids = [
            tok.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
            for t in turns
        ]
        batch = self.backend.generate(ids, 1, greedy=True)
        replies = [
            tok.decode(batch.response_ids[i, : batch.response_lengths[i]].tolist(), skip_special_tokens=True)
            for i in range(len(batch))
        ]
        note_progress()
        return [parse_score(reply, self.max_score) for reply in replies]

    def ping(self) -> dict:
        """Answered once the engine has started: the server's start-up marks (``startup``)."""
        return {"startup": marks()}
