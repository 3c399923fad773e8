"""The reward contract: ``fn(completions: list[str], **sample_fields) -> list[RewardResult]``, batched.

Dataset columns arrive by name (``gt_answer=[...]``, ``test_cases=[...]``), one list entry per completion. A function
also gets what a trainer supplies when it names it (``TRAINER_FIELDS``): ``prompts`` (each row's prompt: its text, or
its messages), ``completion_ids`` (each completion's token ids) and ``trainer_state`` (``global_step``: the policy
version that sampled the batch). Plain floats are accepted in place of RewardResult, and None means "no score for
this completion" (it is masked from training and counted, not an error). Functions named by ``module:function``
follow TRL's conventions: ``completions`` passed by keyword when the function names it, and, for a conversational
row (``messages``), each completion as a message list ``[{"role": "assistant", "content": text}]``; so reward
functions written for TRL, TRL's own included, work unchanged. The registered ones (``REWARD_FNS``) take text.
Reward functions are registered by name in ``REWARD_FNS``; a dotted path ``package.module:function`` resolves too.
Producers never call them directly: they go through ``RewardPool``, which runs them in worker processes.

``RewardSignature`` reads a function's parameters once, so the driver can refuse, before any actor starts, a
dataset that lacks a column the function requires and options (``reward_kwargs``) it does not take or of the wrong
type.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coati.distributed.checks import console_safe
from coati.registry import Registry, resolve_callable

REWARD_FNS: Registry = Registry("reward function")

TRAINER_FIELDS = ("prompts", "completion_ids", "trainer_state")
"""what a trainer supplies to a reward function that names it, beside the dataset's columns"""


@dataclass
class RewardResult:
    reward: float
    """the scalar the advantage estimator sees"""
    format_ok: bool = False
    """the completion put its answer where the task asked"""
    answer_ok: bool = False
    """strict correctness: right answer in the required format"""
    info: dict[str, Any] = field(default_factory=dict)
    """extra diagnostics (extracted answer, lenient score, error reason, ...)"""


def resolve_reward_fn(name: str) -> Callable[..., list[RewardResult]]:
    """A registered reward function by name, or ``module:function``."""
    return resolve_callable(name, REWARD_FNS)


@dataclass(frozen=True)
class RewardSignature:
    """What a reward function's parameters ask of the data and of ``reward_kwargs``."""

    name: str
    required: tuple[str, ...]
    """parameters without a default (besides completions): dataset columns, or prompts"""
    options: dict
    """parameters with a default: name -> default"""
    completions_by_name: bool
    """the function names a ``completions`` parameter (TRL style), so it is passed by keyword"""
    per_sample: tuple[str, ...] = ()
    """for a verl reward function (``compute_score(data_source, solution_str, ground_truth, extra_info)``), the verl
    parameters it takes: it is called once per completion (``call_reward``); empty otherwise"""

    @classmethod
    def of(cls, fn: Callable, name: str) -> RewardSignature:
        every = list(inspect.signature(fn).parameters.values())
        params = [p for p in every if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if any(p.name == "solution_str" for p in params):  # verl's per-sample contract
            verl = tuple(p.name for p in params if p.name in VERL_FIELDS)
            options = {p.name: p.default for p in params if p.name not in VERL_FIELDS and p.default is not p.empty}
            return cls(name, (), options, False, verl)
        # TRL passes completions by keyword: a function that takes **kwargs and starts with a trainer field
        # (TRL's overlong punishment: completion_ids) gets them there.
        by_name = any(p.name == "completions" for p in params) or (
            any(p.kind == p.VAR_KEYWORD for p in every) and bool(params) and params[0].name in TRAINER_FIELDS
        )
        if not by_name:  # the first positional parameter takes the completions
            if not params or params[0].kind == params[0].KEYWORD_ONLY:
                raise ValueError(f"reward function {name} takes no completions parameter; see the reward contract")
            params = params[1:]
        params = [p for p in params if p.name != "completions"]
        required = tuple(p.name for p in params if p.default is p.empty)
        options = {p.name: p.default for p in params if p.default is not p.empty}
        return cls(name, required, options, by_name)

    def wants(self, name: str) -> bool:
        """The function names the parameter ``name`` (one of ``TRAINER_FIELDS``)."""
        return name in self.required or name in self.options

    def check(self, columns: set[str], kwargs: dict) -> None:
        """Raise naming what is wrong: an unknown or mistyped option, or a required column the data lacks."""
        if not isinstance(kwargs, dict):
            raise ValueError(f"reward_kwargs must be a JSON object (dict), got {type(kwargs).__name__} {kwargs!r}")
        if "ground_truth" in self.per_sample and not columns & {"ground_truth", "gt_answer", "reward_model"}:
            raise ValueError(
                f"reward function {self.name} (verl's compute_score) needs a ground truth: a ground_truth or "
                f"gt_answer column, or verl's reward_model.ground_truth (its columns: {sorted(columns)})"
            )
        known = sorted(k for k in self.options if k not in TRAINER_FIELDS)
        for key, value in kwargs.items():
            if key not in self.options:
                raise ValueError(f"reward function {self.name} takes no option {key!r}; known options: {known}")
            default = self.options[key]
            if default is not None and not _same_kind(value, default):
                raise ValueError(
                    f"reward option {key}={value!r} is a {type(value).__name__}, but {self.name} expects a "
                    f"{type(default).__name__} (default {default!r}); write it as JSON {_json(default)}, not a string"
                )
        missing = [c for c in self.required if c not in columns and c not in kwargs and c not in TRAINER_FIELDS]
        if missing:
            raise ValueError(
                f"reward function {self.name} needs column(s) {missing}, which the dataset lacks "
                f"(its columns: {sorted(columns)}); add them to every row or choose another reward"
            )


def _same_kind(value, default) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float)) and (isinstance(default, float) or isinstance(value, int))
    return isinstance(value, type(default))


def _json(value) -> str:
    import json

    return json.dumps(value)


@dataclass(frozen=True)
class TrainerState:
    """The step information a trainer hands a reward function (``trainer_state``, as TRL passes its own)."""

    global_step: int
    """the policy version that sampled the completions"""


def follows_trl(name: str) -> bool:
    """A reward function named by ``module:function`` gets completions in the dataset's form (TRL's convention)."""
    return ":" in name


VERL_FIELDS = ("data_source", "solution_str", "ground_truth", "extra_info")
"""the parameters of verl's reward-function contract, each from the completion or the row"""


def call_reward(fn: Callable, signature: RewardSignature, completions: list, fields: dict, kwargs: dict):
    """Call ``fn`` under the contract: completions first (by keyword for TRL-style functions), columns by name; a
    verl function once per completion, with its four fields."""
    if signature.per_sample:
        return [
            fn(**{k: v for k, v in _verl_fields(c, fields, i).items() if k in signature.per_sample}, **kwargs)
            for i, c in enumerate(completions)
        ]
    if signature.completions_by_name:
        return fn(completions=completions, **fields, **kwargs)
    return fn(completions, **fields, **kwargs)


DEFAULT_MAX_REWARD = 1.0
"""a plain (number) reward's maximum unless its function says otherwise (``fn.max_reward``): TRL's accuracy rewards
give 1.0 for a right answer"""


def max_reward_of(fn: Callable, name: str) -> float:
    """The reward a plain (number-returning) function ``name`` gives a fully right completion: ``fn.max_reward``,
    else 1.0."""
    value = getattr(fn, "max_reward", DEFAULT_MAX_REWARD)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"reward function {name}: max_reward must be a finite number, got {value!r}")
    return float(value)


def _number(value) -> float | None:
    """``value`` as a float when it is one number: a Python, numpy or torch scalar (or a one-element array), as TRL
    turns a reward function's outputs into a tensor; None otherwise."""
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "ndim", None) in (0, 1) and callable(getattr(value, "item", None)):
        count = value.numel() if callable(getattr(value, "numel", None)) else getattr(value, "size", 0)
        item = value.item() if count == 1 else None
        if isinstance(item, numbers.Real):
            return float(item)
    return None


def as_result(value, fn_name: str, max_reward: float = DEFAULT_MAX_REWARD) -> RewardResult:
    """One reward function output as a RewardResult.

    - ``None``: no score (TRL's convention; masked from training, counted). A NaN or infinite number is kept as it
      is, so the step fails naming the function and the row (a bug, not a choice not to score).
    - a number (bool, int, float, numpy or torch scalar): a plain reward. It defines no strict or lenient check, so
      ``info['plain']`` marks it, and it counts as right (``answer_ok``) when it reaches ``max_reward``.
    - a dict with ``score`` (verl's convention): the score as a plain reward, its ``acc`` (when given) as the
      correctness, the other keys kept in ``info``.
    """
    if isinstance(value, RewardResult):
        return value
    if value is None:
        return RewardResult(float("nan"), info={"no_score": True})
    if isinstance(value, dict) and "score" in value:
        score = _number(value["score"])
        if score is None:
            raise TypeError(f"reward function {fn_name} returned a dict whose score is {value['score']!r}")
        extra = {k: v for k, v in value.items() if k != "score" and _plain_json(v)}
        if "acc" in value:
            ok = bool(value["acc"])
            return RewardResult(score, ok, ok, extra)
        return _plain(score, max_reward, extra)
    number = _number(value)
    if number is None:
        raise TypeError(
            f"reward function {fn_name} returned {type(value).__name__}; expected a number, None, a dict with "
            "'score', or RewardResult"
        )
    return _plain(number, max_reward, {})  # NaN or inf stays as it is: the step fails naming the function and row


def _plain(reward: float, max_reward: float, info: dict) -> RewardResult:
    right = reward >= max_reward
    return RewardResult(reward, right, right, {**info, "plain": True})


def _plain_json(value) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None


def _verl_fields(completion, fields: dict, i: int) -> dict:
    """verl's four reward inputs for completion ``i`` of a call: its text, and the row's ``data_source``,
    ground truth (a ``ground_truth`` column, else verl's ``reward_model.ground_truth``, else ``gt_answer``) and
    ``extra_info``."""
    if isinstance(completion, list):  # a conversational row's completion, as TRL's functions get it
        completion = completion[-1]["content"] if completion else ""

    def column(name: str, default=None):
        values = fields.get(name)
        return values[i] if values else default

    model, truth = column("reward_model"), column("ground_truth")
    if truth is None and isinstance(model, dict):
        truth = model.get("ground_truth")
    if truth is None:
        truth = column("gt_answer")
    return {
        "data_source": column("data_source", ""),
        "solution_str": completion,
        "ground_truth": truth,
        "extra_info": column("extra_info"),
    }


def truncate_for_log(text: str, limit: int = 200) -> str:
    """Model output can be megabytes long; logs and error messages keep the head and the tail, with terminal
    control characters escaped."""
    text = console_safe(text)
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}...[{len(text) - limit} chars]...{text[-half:]}"
