"""Prompt datasets: rows of chat messages (or a plain prompt) plus the fields the reward function reads.

A row is a dict with ``messages`` (a list of ``{"role", "content"}``) or ``prompt`` (a string), and any other columns
(``gt_answer``, ``test_cases``, ...) that are passed to the reward function by name. Sources: a JSONL file, a list of
rows, or a reasoning-gym task (``reasoning_gym:<task>``). Everything is validated in the driver, before any actor
starts: a bad JSONL line is reported with its number.

``DataCursor`` gives each producer its shard in a seeded order, reshuffled every episode, with a position that a
checkpoint can save and restore.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SYSTEM_PROMPT = (
    "Solve the problem. Think briefly, then give the final answer as \\boxed{answer}."
)


def load_rows(source, size: int | None = None, seed: int = 0) -> list[dict]:
    """Rows from a JSONL path, a list of dicts, or ``reasoning_gym:<task>`` (``size`` items from ``seed``)."""
    if isinstance(source, list):
        rows = [dict(r) for r in source]
    elif isinstance(source, str) and source.startswith("reasoning_gym:"):
        rows = reasoning_gym_rows(source.split(":", 1)[1], size or 100, seed)
    else:
        rows = read_jsonl(source)
    if size is not None and not (isinstance(source, str) and source.startswith("reasoning_gym:")):
        rows = rows[:size]
    for i, row in enumerate(rows):
        check_row(row, f"row {i}")
    if not rows:
        raise ValueError(f"dataset {source!r} has no rows")
    return rows


def read_jsonl(path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    rows = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}:{lineno}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}); save the file as "
                    "UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg}); each line must be one JSON object") from e
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            check_row(row, f"{path}:{lineno}")
            rows.append(row)
    return rows


def check_row(row: dict, where: str) -> None:
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "content" in m for m in msgs):
            raise ValueError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
        if not any(str(m["content"]).strip() for m in msgs):
            raise ValueError(f"{where}: every message is empty")
    elif "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise ValueError(f"{where}: 'prompt' must be a non-empty string")
    else:
        raise ValueError(f"{where}: needs 'messages' or 'prompt'; has {sorted(row)}")


def reasoning_gym_rows(task: str, size: int, seed: int) -> list[dict]:
    """``size`` items of a reasoning-gym task as rows (question -> prompt, answer -> gt_answer). Task options follow
    a '?': ``chain_sum?min_terms=2&max_terms=3`` (integers and floats are converted)."""
    import reasoning_gym

    name, _, query = task.partition("?")
    options = {}
    for pair in filter(None, query.split("&")):
        key, _, value = pair.partition("=")
        options[key] = _number(value)
    try:
        data = reasoning_gym.create_dataset(name, size=size, seed=seed, **options)
    except (KeyError, ValueError, TypeError) as e:
        raise ValueError(f"reasoning-gym task {task!r}: {e}") from e
    return [{"prompt": item["question"], "gt_answer": str(item["answer"])} for item in data]


def _number(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def encode_prompt(tokenizer, row: dict, system_prompt: str | None = None) -> list[int]:
    """Token ids of the row's prompt, through the tokenizer's chat template when it has one."""
    messages = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
    if system_prompt and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system_prompt}] + list(messages)
    if getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
    text = "\n".join(m["content"] for m in messages)
    return list(tokenizer(text)["input_ids"])


def reward_fields(row: dict) -> dict:
    """The columns passed to the reward function (everything but the prompt itself)."""
    return {k: v for k, v in row.items() if k not in ("messages", "prompt")}


@dataclass
class DataCursor:
    """Walks one shard of ``num_rows`` rows in a seeded order, reshuffled per episode.

    With ``skip_after = N > 0`` a row whose last N groups had no signal (``record``) is passed over when its turn
    comes, except with probability ``recheck`` (seeded by the position, so a resumed run skips the same rows); passed
    over rows are counted in ``skipped``. A row is never passed over twice within one ``take``, so a call always ends.
    """

    num_rows: int
    shard: int
    num_shards: int
    seed: int = 0
    episode: int = 0
    position: int = 0
    skip_after: int = 0
    recheck: float = 0.1

    def __post_init__(self):
        self.indices = list(range(self.shard, self.num_rows, self.num_shards))
        if not self.indices:
            raise ValueError(f"shard {self.shard} of {self.num_shards} has no rows (dataset has {self.num_rows})")
        self._order = self._order_for(self.episode)
        self.no_signal: dict[int, int] = {}
        """row -> its consecutive groups without signal, up to now"""
        self.skipped = 0

    def _order_for(self, episode: int) -> list[int]:
        order = list(self.indices)
        random.Random(self.seed * 100_003 + episode).shuffle(order)
        return order

    def take(self, k: int) -> list[tuple[int, int]]:
        """Next ``k`` (episode, row index) pairs, moving to the next episode (reshuffled) when the shard runs out."""
        out, passed = [], set()
        while len(out) < k:
            if self.position >= len(self._order):
                self.episode += 1
                self.position = 0
                self._order = self._order_for(self.episode)
            row = self._order[self.position]
            if self._skip(row) and row not in passed:
                passed.add(row)
                self.skipped += 1
            else:
                out.append((self.episode, row))
            self.position += 1
        return out

    def _skip(self, row: int) -> bool:
        if not self.skip_after or self.no_signal.get(row, 0) < self.skip_after:
            return False
        draw = random.Random(((self.seed * 100_003 + self.episode) * 1_000_003 + self.position) * 7 + 1).random()
        return draw >= self.recheck

    def record(self, row: int, no_signal: bool) -> None:
        """One group of ``row`` was scored: had it no signal (every completion the same task reward)?"""
        self.no_signal[row] = self.no_signal.get(row, 0) + 1 if no_signal else 0

    def state(self) -> dict:
        return {"episode": self.episode, "position": self.position, "skipped": self.skipped,
                "no_signal": {str(r): c for r, c in self.no_signal.items() if c}}  # fmt: skip

    def restore(self, state: dict) -> None:
        self.episode, self.position = int(state["episode"]), int(state["position"])
        self.skipped = int(state.get("skipped", 0))
        self.no_signal = {int(r): int(c) for r, c in state.get("no_signal", {}).items()}
        self._order = self._order_for(self.episode)
