"""The teacher's inputs, checked before any actor starts: its folder (or the policy's, for a self-teacher), a
tokenizer that is the student's token for token (distillation compares log-probs of the same ids), a chat template
to render its prompts, and every column its privileged context shows in every row."""

from __future__ import annotations

import os

from coati.distributed.rollout.data import check_chat_template
from coati.distributed.teacher.config import TeacherConfig


def teacher_model_path(t: TeacherConfig, policy_path: str) -> str | None:
    """The folder the teacher servers load: the policy's for a self-teacher, else ``t.model`` (None: no teacher)."""
    if t.model is None:
        return None
    return policy_path if t.self_lag else os.path.abspath(os.path.expanduser(t.model))


def check_teacher_files(t: TeacherConfig, path: str, row_sets: dict[str, list[dict]]) -> None:
    """The teacher's folder holds a model, and each row has the columns its privileged context shows."""
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(
            f"teacher {t.model} is not a model folder (no config.json at {path}); teacher.model takes a local "
            "causal-LM folder with the student's tokenizer, or self:N"
        )
    for name in sorted(t.context_fields):
        for what, rows in row_sets.items():
            missing = [i for i, row in enumerate(rows) if name not in row]
            if missing:
                raise ValueError(
                    f"teacher.privileged_context shows {{{name}}}, but {what} row {missing[0]} ({len(missing)} rows in "
                    f"all) has no {name!r} column; its columns: {sorted(rows[missing[0]])}"
                )


def check_teacher_tokenizer(path: str, student, student_path: str, raw: bool) -> None:
    """The teacher's tokenizer maps every token to the student's id (the same vocabulary and special tokens), and
    renders chat prompts unless prompts are raw; refused naming both folders otherwise."""
    from transformers import AutoTokenizer

    teacher = AutoTokenizer.from_pretrained(path)
    ours, theirs = student.get_vocab(), teacher.get_vocab()
    differ = sorted(set(ours.items()) ^ set(theirs.items()), key=lambda kv: kv[1])
    specials = [
        name
        for name in ("eos_token_id", "bos_token_id", "pad_token_id")
        if getattr(student, name) is not None and getattr(teacher, name) not in (None, getattr(student, name))
    ]
    if differ or specials:
        what = f"{len(differ)} of their token ids differ (e.g. {differ[0]})" if differ else f"their {specials} differ"
        raise ValueError(
            f"teacher {path}'s tokenizer is not the student's ({student_path}): {what}; on-policy distillation "
            "scores the student's token ids under the teacher, so pick a teacher of the student's family (same "
            "tokenizer)"
        )
    if not raw:
        check_chat_template(teacher, f"teacher {path}'s tokenizer")
