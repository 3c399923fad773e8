"""Multi-turn episodes: model turn -> environment -> next turn, many episodes per engine call.

Every live episode's whole token context goes to the engine in one ``generate`` call per turn; each reply is handed
to its environment (in a thread pool, each step under a timeout), whose observation is appended as the chat
template renders it. The trained sequence is built from tokens, never re-tokenised text:

    prompt_ids | turn 1 (sampled) | observation 1 (template) | turn 2 (sampled) | ...

``loss_mask`` is True exactly on the sampled tokens (each turn up to and including its end-of-turn token), and
``logprobs``/``versions`` hold the engine's values there (0 elsewhere). An observation's tokens are what the chat
template writes between the end of an assistant turn and the start of the next one (``TurnTemplate``), so rendering
the final conversation with the template gives the trained tokens whenever the template renders an assistant message
as the model wrote it (the ``retokenized_equal`` check; a template that rewrites earlier turns, such as one that drops
their reasoning, or a sampled token split the tokenizer would not make, differ there, and the sampled tokens are kept:
they are what the policy produced).

An environment that raises, hangs past ``step_timeout_s`` or returns a malformed step fails its episode (the reason
in ``info["error"]``; the producer leaves it out as a failed sample); an episode that reaches ``max_turns`` without
finishing ends with reward 0 (``info["turn_limit"]``); one whose context would outgrow ``max_tokens`` is cut there
and flagged ``truncated``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as StepTimeout
from dataclasses import dataclass, field

from coati.distributed.envs.base import Environment, EnvStep, check_messages, check_step
from coati.distributed.record import RolloutBatch, left_pad, responses_from_token_lists


@dataclass
class Episode:
    env: Environment
    messages: list[dict]
    """the conversation so far: the first messages, then each model turn (as text) and observation"""
    prompt_ids: list[int]
    """the first messages rendered with the generation prompt"""
    ids: list[int] = field(default_factory=list)
    """everything after the prompt: sampled turns and observations, in order"""
    loss_mask: list[bool] = field(default_factory=list)
    """True on sampled tokens"""
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[tuple[int, int]] = field(default_factory=list)
    """[start, end) in ``ids`` of each model turn"""
    done: bool = False
    reward: float = 0.0
    answer_ok: bool = False
    truncated: bool = False
    info: dict = field(default_factory=dict)

    def context(self) -> list[int]:
        return self.prompt_ids + self.ids

    def finish(self, reward: float = 0.0, answer_ok: bool = False, **info) -> None:
        self.done, self.reward, self.answer_ok = True, float(reward), answer_ok
        self.info.update(info)


class TurnTemplate:
    """Token ids of a chat template's conversation parts, for a tokenizer with a chat template."""

    PROBE = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]

    def __init__(self, tokenizer, end_of_turn: int | None = None):
        self.tokenizer = tokenizer
        self.end_of_turn = tokenizer.eos_token_id if end_of_turn is None else end_of_turn
        self.end_text = tokenizer.decode([self.end_of_turn])
        closed = self.render(self.PROBE)
        if self.end_text not in closed:
            raise ValueError(
                f"the chat template does not end an assistant turn with {self.end_text!r} (token "
                f"{self.end_of_turn}); pass the end-of-turn token it uses"
            )
        self._closed = closed
        self._after_end = closed[closed.rindex(self.end_text) + len(self.end_text) :]

    def render(self, messages: list[dict], generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt(self, messages: list[dict]) -> list[int]:
        return self.encode(self.render(messages, generation_prompt=True))

    def observation(self, messages: list[dict]) -> list[int]:
        """What follows an assistant turn's end-of-turn token up to the next assistant turn's first token: the rest
        of the closed turn (e.g. a newline), ``messages``, and the generation prompt."""
        opened = self.render(self.PROBE + messages, generation_prompt=True)
        if not opened.startswith(self._closed):
            raise ValueError(
                "the chat template renders earlier turns differently once more messages follow; "
                "multi-turn episodes need a template that only appends"
            )
        return self.encode(self._after_end + opened[len(self._closed) :])


def start_episode(env: Environment, template: TurnTemplate) -> Episode:
    """``env.reset()`` as an episode (failed, not raised, when the environment fails: its record is then an empty
    user turn and no response)."""
    try:
        messages = check_messages(env.reset(), "reset()")
        return Episode(env, list(messages), template.prompt(messages))
    except Exception as e:  # noqa: BLE001 - an environment's fault fails its episode, not the run
        empty = [{"role": "user", "content": ""}]
        episode = Episode(env, empty, template.prompt(empty))
        episode.finish(error=f"reset: {type(e).__name__}: {e}")
        return episode


def run_episodes(
    generate: Callable,
    template: TurnTemplate,
    envs: list[Environment],
    max_turns: int,
    max_tokens: int,
    step_timeout_s: float = 30.0,
    pool: ThreadPoolExecutor | None = None,
    version: int = 0,
) -> list[Episode]:
    """Play every environment's episode to its end. ``generate(contexts)`` is one engine call: token id lists in, a
    RolloutBatch out (one row each, ``response_ids``/``response_lengths``/``rollout_logprobs``/``truncated``, and
    ``token_versions`` when the engine records them; else its tokens are labelled ``version``)."""
    episodes = [start_episode(env, template) for env in envs]
    own_pool = pool is None
    pool = pool or ThreadPoolExecutor(max(1, min(16, len(envs))))
    try:
        for turn in range(max_turns):
            live = [e for e in episodes if not e.done]
            if not live:
                break
            batch = generate([e.context() for e in live])
            texts = [_append_turn(e, batch, i, template, version) for i, e in enumerate(live)]
            stepping = [(e, t) for e, t in zip(live, texts, strict=True) if not e.done]
            futures = [pool.submit(e.env.step, t) for e, t in stepping]
            deadline = time.monotonic() + step_timeout_s  # the steps run side by side: one deadline for all
            for (episode, text), future in zip(stepping, futures, strict=True):
                episode.messages.append({"role": "assistant", "content": text})
                result = _result(future, deadline, step_timeout_s)
                _apply_step(episode, result, template, max_tokens, last=turn == max_turns - 1)
    finally:
        if own_pool:
            pool.shutdown(wait=False, cancel_futures=True)
    for e in episodes:
        e.info["turns"] = len(e.turns)
    return episodes


def _append_turn(episode: Episode, batch, row: int, template: TurnTemplate, version: int) -> str:
    """Append row ``row`` of ``batch`` as the episode's next model turn; returns its text (special tokens removed).
    A turn cut by the engine's token limit ends the episode (truncated, reward 0)."""
    n = int(batch.response_lengths[row])
    ids = [int(t) for t in batch.response_ids[row, :n]]
    start = len(episode.ids)
    episode.ids += ids
    episode.loss_mask += [True] * n
    episode.logprobs += [float(x) for x in batch.rollout_logprobs[row, :n]]
    versions = batch.token_versions[row, :n] if batch.token_versions is not None else [version] * n
    episode.versions += [int(v) for v in versions]
    episode.turns.append((start, start + n))
    if bool(batch.truncated[row]) or not ids or ids[-1] != template.end_of_turn:
        episode.truncated = True
        episode.finish(truncated_turn=True)
    return template.tokenizer.decode(ids, skip_special_tokens=True)


def _result(future, deadline: float, timeout_s: float) -> EnvStep | str:
    """The step's result, or the reason it failed."""
    try:
        return check_step(future.result(timeout=max(deadline - time.monotonic(), 0.0)))
    except StepTimeout:
        return f"step: no reply within {timeout_s:g} s"
    except Exception as e:  # noqa: BLE001 - an environment's fault fails its episode, not the run
        return f"step: {type(e).__name__}: {e}"


def _apply_step(episode: Episode, result: EnvStep | str, template: TurnTemplate, max_tokens: int, last: bool) -> None:
    """Finish the episode, or append the observation (masked) when another turn may follow."""
    if isinstance(result, str):
        episode.finish(error=result)
        return
    episode.info.update(result.info)
    if result.done:
        episode.finish(result.reward, result.answer_ok)
        return
    if last:  # the environment wanted another turn: none is left
        episode.finish(turn_limit=True)
        return
    try:
        tokens = template.observation(result.observation)
    except Exception as e:  # noqa: BLE001 - a template that cannot render the observation fails the episode
        episode.finish(error=f"observation: {type(e).__name__}: {e}")
        return
    room = max_tokens - len(episode.context())
    episode.messages += result.observation
    episode.ids += tokens[: max(room, 0)]
    episode.loss_mask += [False] * min(len(tokens), max(room, 0))
    episode.logprobs += [0.0] * min(len(tokens), max(room, 0))
    episode.versions += [0] * min(len(tokens), max(room, 0))
    if len(tokens) >= room:  # no room left for another model turn
        episode.truncated = True
        episode.finish(token_limit=True)


def retokenized_equal(episode: Episode, template: TurnTemplate) -> bool:
    """Rendering the episode's conversation with the chat template gives exactly its trained tokens (prompt, turns
    and observations, up to the last turn's end-of-turn token)."""
    if not episode.messages:
        return False
    rendered = template.encode(template.render(episode.messages))
    trained = episode.context()
    return rendered[: len(trained)] == trained and template.encode(template._after_end) == rendered[len(trained) :]


def episodes_batch(episodes: list[Episode], n: int, pad_id: int) -> RolloutBatch:
    """The record of ``episodes`` (``n`` consecutive episodes per dataset row, one group each): the first messages as
    the prompt, everything after them as the response, ``loss_mask`` on the sampled tokens; rewards and verdicts in
    ``rewards`` and ``extras``."""
    import numpy as np

    assert len(episodes) % n == 0, (len(episodes), n)
    p_ids, p_mask = left_pad([e.prompt_ids for e in episodes], pad_id)
    ids, mask, lps, lengths, truncated = responses_from_token_lists(
        [e.ids for e in episodes], [e.logprobs for e in episodes], [not e.truncated for e in episodes], pad_id
    )
    loss, versions = np.zeros_like(mask), np.zeros(mask.shape, dtype=np.int64)
    turns = np.zeros(mask.shape, dtype=np.int64)
    for i, e in enumerate(episodes):
        loss[i, : len(e.ids)] = e.loss_mask
        versions[i, : len(e.ids)] = np.where(e.loss_mask, e.versions, 0)
        for k, (start, end) in enumerate(e.turns, 1):
            turns[i, start:end] = k
    info = [e.info for e in episodes]
    batch = RolloutBatch(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        response_ids=ids,
        response_mask=mask,
        rollout_logprobs=lps,
        response_lengths=lengths,
        truncated=truncated,
        group_ids=np.arange(len(episodes), dtype=np.int64) // n,
        token_versions=versions,
        rewards=np.array([e.reward for e in episodes], dtype=np.float32),
        loss_mask=loss,
        turn_index=turns,
        extras={
            "answer_ok": np.array([e.answer_ok for e in episodes]),
            "lenient_ok": np.array(
                [bool(i.get("lenient_ok", e.answer_ok)) for i, e in zip(info, episodes, strict=True)]
            ),
            "turns": np.array([i.get("turns", 0) for i in info], dtype=np.int64),
            "tool_calls": np.array([i.get("tool_calls", 0) for i in info], dtype=np.int64),
            "turn_limit": np.array([bool(i.get("turn_limit")) for i in info]),
            "env_error": np.array([bool(i.get("error")) for i in info]),
            "env_error_msg": np.array([str(i.get("error") or "")[:300] for i in info], dtype="<U300"),
        },
    )
    return batch.validate()


class EpisodeRunner:
    """A producer's episodes: the environment class and its settings, and the pool its steps run in."""

    def __init__(
        self,
        env_cls: type[Environment],
        env_kwargs: dict,
        template: TurnTemplate,
        max_turns: int | None,
        max_tokens: int,
        step_timeout_s: float,
    ):
        self.env_cls, self.env_kwargs, self.template = env_cls, dict(env_kwargs), template
        self.max_turns = max_turns or env_cls.max_turns
        self.max_tokens, self.step_timeout_s = max_tokens, step_timeout_s
        self.pool = ThreadPoolExecutor(16, thread_name_prefix="env-step")

    def rollouts(self, generate: Callable, rows: list[dict], n: int, pad_id: int, version: int) -> RolloutBatch:
        """``n`` episodes of each row (one group each), played to their ends; their record."""
        envs = [self.env_cls(row, **self.env_kwargs) for row in rows for _ in range(n)]
        episodes = run_episodes(
            generate,
            self.template,
            envs,
            self.max_turns,
            self.max_tokens,
            self.step_timeout_s,
            pool=self.pool,
            version=version,
        )
        return episodes_batch(episodes, n, pad_id)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
