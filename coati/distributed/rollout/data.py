"""Prompt datasets: rows of chat messages (or a plain prompt) plus the fields the reward function reads.

A row is a dict with ``messages`` (a list of ``{"role", "content"}``) or ``prompt`` (a string), and any other columns
(``gt_answer``, ``test_cases``, ...) that are passed to the reward function by name. Sources: a JSONL file (read here,
so a bad line is reported with its number); a parquet, JSON, arrow or CSV file, a folder of them or a folder written by
``save_to_disk``, and a hub dataset id when the hub is reachable (all through the ``datasets`` library); a list of
rows; or a reasoning-gym task (``reasoning_gym:<task>``). ``prompt_column`` and ``answer_column`` map other layouts
onto a row (verl's parquet files: ``prompt`` holds the messages, ``answer_column="reward_model.ground_truth"``).
ColossalChat's layout reads as it is: ``messages`` as one ``{"role", "content"}`` object is a one-message list, and
its ``gold_answer`` column is the reference answer (``gt_answer``) when the row has none of that name. Everything
is validated in the driver, before any actor starts.

``DataCursor`` gives each producer its shard in a seeded order, reshuffled every episode, with a position that a
checkpoint can save and restore.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path

from coati.distributed.checks import check_plain_data, strict_json
from coati.distributed.rollout.images import with_image_digests, with_image_paths
from coati.distributed.rollout.shapes import shape_rows

FILE_FORMATS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".arrow": "arrow", ".csv": "csv"}
"""file suffix -> the ``datasets`` builder that reads it (JSONL files are read here unless inside a folder)"""
GENERATED = ("reasoning_gym:", "shapes:")
"""the prefixes of tasks generated here from a seed (a reasoning-gym task, the built-in visual task)"""
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class DatasetSpec:
    """One set of prompts as a run reads it: the source and how rows are taken from it (``load_rows``'s
    arguments). The driver makes it from the data section (``DataConfig.datasets``) and hands it to the producers
    whole."""

    source: str | list
    """a file, folder, hub id or reasoning_gym:<task>, or a list of rows"""
    size: int | None = None
    """rows taken (None: every row; a reasoning-gym task draws this many)"""
    seed: int = 0
    """the seed a reasoning-gym task draws from"""
    split: str = "train"
    subset: str | None = None
    prompt_column: str | None = None
    answer_column: str | None = None
    exclude: tuple[int, ...] = ()
    """row indices left out (the overlong prompts the driver dropped)"""
    disjoint_from: DatasetSpec | None = None
    """a set of the same reasoning-gym task whose prompts this one passes over (the training set, for the
    held-out set drawn from the same generator)"""

    def __post_init__(self):
        if isinstance(self.source, str) and not self.source.strip() or not isinstance(self.source, (str, list)):
            raise ValueError(
                f"dataset source must be a dataset file, folder, hub id or reasoning_gym:<task>, or a list of rows, "
                f"got {self.source!r}"
            )
        size = self.size
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise ValueError(f"dataset size must be a positive integer (or None for every row), got {size!r}")
        object.__setattr__(self, "exclude", tuple(self.exclude))

    def load(self) -> list[dict]:
        """The rows (see ``load_rows``)."""
        return load_rows(**{f.name: getattr(self, f.name) for f in fields(self)})

    def absolute(self) -> DatasetSpec:
        """The spec with a local file or folder made absolute (actors may run in other folders)."""
        source, under = self.source, self.disjoint_from
        if isinstance(source, str) and not source.startswith(GENERATED) and os.path.exists(source):
            source = os.path.abspath(source)
        return replace(self, source=source, disjoint_from=under.absolute() if under else None)

    def description(self) -> dict:
        """What a run folder records of it: the source (a list as its length) and the options set away from their
        defaults."""
        source = self.source if isinstance(self.source, str) else f"{len(self.source)} rows given"
        shown = ("split", "subset", "prompt_column", "answer_column", "size")
        default = DatasetSpec(source)
        return {"source": source, **{k: getattr(self, k) for k in shown if getattr(self, k) != getattr(default, k)}}


DATASET_KEYS = ("path", "rows", "size", "seed", "system_prompt", "split", "subset", "prompt_column", "answer_column")
"""the keys of a ColossalChat dataset config (``train_dataset_config``)"""


def dataset_spec(config: dict) -> DatasetSpec:
    """A ColossalChat dataset config ({path or rows, size, seed, system_prompt}, plus split and the column options;
    the system prompt aside) as a ``DatasetSpec``, refusing keys it does not have."""
    unknown = sorted(set(config) - set(DATASET_KEYS))
    if unknown:
        why = " (set by filter_overlong_prompts, not by a dataset config)" if "exclude" in unknown else ""
        raise ValueError(f"unknown dataset config key(s) {unknown}{why}; known: {', '.join(DATASET_KEYS)}")
    source = config.get("path") or config.get("rows")
    if source is None:
        raise ValueError(
            "dataset config needs 'path' (a dataset file, folder, hub id or reasoning_gym:<task>) or 'rows' (a list)"
        )
    options = {k: config[k] for k in ("split", "subset", "prompt_column", "answer_column") if config.get(k) is not None}
    return DatasetSpec(source, config.get("size"), config.get("seed") or 0, **options)


def load_rows(
    source,
    size: int | None = None,
    seed: int = 0,
    split: str = "train",
    subset: str | None = None,
    prompt_column: str | None = None,
    answer_column: str | None = None,
    exclude: tuple[int, ...] = (),
    disjoint_from: DatasetSpec | None = None,
) -> list[dict]:
    """Rows from ``source`` (see the module docstring): the first ``size`` (for a reasoning-gym task, ``size`` items
    drawn from ``seed``), mapped to rows by the column options, minus the indices in ``exclude``. A reasoning-gym
    task's rows are drawn ``disjoint_from`` another set of them (the training set, for the held-out set of the same
    task): a drawn prompt that set holds is passed over, and drawing goes on until ``size`` are left."""
    columns = (prompt_column, answer_column)
    if isinstance(source, list):
        rows = [as_row(r, *columns, f"row {i}") for i, r in enumerate(source)]
    elif isinstance(source, str) and source.startswith("reasoning_gym:"):
        taken = {r["prompt"] for r in disjoint_from.load()} if disjoint_from else set()
        rows = disjoint_gym_rows(source.split(":", 1)[1], size or 100, seed, taken)
    elif isinstance(source, str) and source.startswith("shapes:"):
        rows = shape_rows(source.split(":", 1)[1], size or 100, seed)
    elif isinstance(source, str) and source.endswith(".jsonl") and os.path.isfile(source):
        rows = read_jsonl(source, columns)
    else:
        rows = [
            as_row(r, *columns, f"{source} row {i}") for i, r in enumerate(read_dataset(source, split, subset, size))
        ]
    if size is not None and not (isinstance(source, str) and source.startswith(GENERATED)):
        rows = rows[:size]
    if exclude:
        drop = set(exclude)
        rows = [r for i, r in enumerate(rows) if i not in drop]
    if not rows:
        raise ValueError(f"dataset {source!r} has no rows")
    return rows


def rows_digest(rows: list[dict]) -> str:
    """A hash of the rows' content (a checkpoint records the training rows' digest: a resume on other data is
    refused; the base model's cached evaluation is keyed by the held-out rows'), each image by its pixels' content
    wherever it lies (a file replaced under the same path is other data)."""
    return hashlib.sha256(
        json.dumps([with_image_digests(r) for r in rows], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"


def read_dataset(source: str, split: str, subset: str | None, size: int | None) -> list[dict]:
    """Records of a file, folder or hub dataset through the ``datasets`` library (a single file is one split)."""
    path = Path(source)
    if not path.exists():
        if not HUB_ID.match(source) or path.suffix.lower() in FILE_FORMATS:
            raise FileNotFoundError(f"dataset file or folder {source} does not exist; check the path")
        if hub_offline():
            raise FileNotFoundError(
                f"dataset {source!r} is not a local file or folder, and the hub is offline (HF_HUB_OFFLINE or "
                "HF_DATASETS_OFFLINE is 1): unset it to download the hub dataset, or pass a local path"
            )
    import datasets  # after the checks of the path: it takes seconds to import

    if path.is_file():
        builder = FILE_FORMATS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(f"dataset file {source} has an unknown format; known: .jsonl and {sorted(FILE_FORMATS)}")
        data = datasets.load_dataset(builder, data_files=str(path), split="train")
    elif path.is_dir():
        saved = (path / "dataset_dict.json").exists() or (path / "state.json").exists()
        data = datasets.load_from_disk(str(path)) if saved else _split_of(source, split, subset)
        if isinstance(data, datasets.DatasetDict):
            data = _pick(data, split, source)
    else:
        data = _split_of(source, split, subset)
    if size is not None and size < len(data):
        data = data.select(range(size))
    return data.to_list()


def _split_of(source: str, split: str, subset: str | None):
    """``split`` of a dataset folder or hub id (its ``subset`` configuration), naming the split when it is missing."""
    import datasets

    try:
        return datasets.load_dataset(source, subset, split=split)
    except ValueError as e:
        if "split" not in str(e).lower():
            raise
        raise ValueError(f"dataset {source!r} has no split {split!r} ({e}); set train_split/eval_split") from None


def _pick(data, split: str, source: str):
    if split not in data:
        raise ValueError(
            f"dataset {source!r} has no split {split!r}; its splits: {sorted(data)} (set train_split/eval_split)"
        )
    return data[split]


def as_row(record: dict, prompt_column: str | None, answer_column: str | None, where: str) -> dict:
    """A dataset record as a row: the prompt from ``prompt_column`` (a string -> ``prompt``, a list of messages ->
    ``messages``; None: ``messages`` or ``prompt``, whichever the record has), the reference answer from
    ``answer_column`` copied to ``gt_answer``; a dotted name reads inside a mapping column
    (``reward_model.ground_truth``). Raises naming ``where`` when the row has no usable prompt."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a mapping of columns, got {type(record).__name__}")
    check_plain_data(record, where)
    row = dict(record)
    if prompt_column is not None or isinstance(row.get("prompt"), list):
        name = prompt_column or "prompt"
        value = _lookup(record, name, where)
        if "." not in name:
            del row[name]
        row.pop("prompt", None)
        row["messages" if isinstance(value, list) else "prompt"] = value
    if isinstance(row.get("messages"), dict) and "content" in row["messages"]:  # ColossalChat's one message
        row["messages"] = [row["messages"]]
    if answer_column is None and "gold_answer" in row and "gt_answer" not in row:  # ColossalChat's column name
        answer_column = "gold_answer"
    if answer_column is not None:
        value = _lookup(record, answer_column, where)
        # A number is an answer's text; anything else (a list, a dict, a boolean) stays as it is, for the reward's
        # preflight to refuse rather than compare as its printed form.
        plain = isinstance(value, (int, float)) and not isinstance(value, bool)
        row["gt_answer"] = str(value) if plain and math.isfinite(value) else value
    check_row(row, where)
    return row


def _lookup(record: dict, name: str, where: str):
    value = record
    for i, part in enumerate(name.split(".")):
        if not isinstance(value, dict) or part not in value:
            have = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ValueError(
                f"{where}: no column {'.'.join(name.split('.')[: i + 1])!r} (has {have}); check "
                "prompt_column/answer_column"
            )
        value = value[part]
    return value


def read_jsonl(path, columns: tuple[str | None, str | None] = (None, None)) -> list[dict]:
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
                row = strict_json(line, f"{path}:{lineno}")
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg}); each line must be one JSON object") from e
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append(with_image_paths(as_row(row, *columns, f"{path}:{lineno}"), path.parent.resolve()))
    return rows


ROLES = ("system", "developer", "user", "assistant", "tool")
"""the roles a prompt's messages may have"""


def check_row(row: dict, where: str) -> None:
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "content" in m for m in msgs):
            raise ValueError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
        if not any(str(m["content"]).strip() for m in msgs):
            raise ValueError(f"{where}: every message is empty")
        unknown = sorted({str(m.get("role")) for m in msgs} - set(ROLES))
        if unknown:
            raise ValueError(f"{where}: message role(s) {unknown} are not chat roles; use {', '.join(ROLES)}")
        if msgs[-1]["role"] == "assistant":
            raise ValueError(
                f"{where}: the messages end with an assistant turn, so there is nothing for the policy to "
                "answer; end each prompt with the user's (or a tool's) turn"
            )
    elif "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise ValueError(f"{where}: 'prompt' must be a non-empty string")
    else:
        raise ValueError(
            f"{where}: needs 'messages' or 'prompt'; has {sorted(row)} (prompt_column names the column "
            "holding the prompt)"
        )


def disjoint_gym_rows(task: str, size: int, seed: int, taken: set[str]) -> list[dict]:
    """``size`` rows of a reasoning-gym task drawn from ``seed`` whose prompts are not in ``taken``."""
    drawn = size
    while True:
        rows = [r for r in reasoning_gym_rows(task, drawn, seed) if r["prompt"] not in taken]
        if len(rows) >= size or drawn >= size + len(taken):
            return rows[:size]
        drawn = min(size + len(taken), 2 * drawn)


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


@dataclass(frozen=True)
class PromptFormat:
    """How a row becomes prompt tokens: through the tokenizer's chat template (with ``system_prompt`` first when
    set), or with ``raw`` the row's prompt text as it is (base models; no template, no system prompt)."""

    system_prompt: str | None = None
    raw: bool = False

    def __post_init__(self):
        if self.raw and self.system_prompt:
            raise ValueError(
                "raw_prompt tokenizes the prompt text as it is, so system_prompt has nowhere to go; put "
                "it in the prompts or turn raw_prompt off"
            )

    def encode(self, tokenizer, row: dict) -> list[int]:
        if self.raw:
            if "prompt" not in row:
                raise ValueError(
                    "raw_prompt needs a 'prompt' string in every row; this row has chat 'messages' "
                    "(turn raw_prompt off to use the chat template)"
                )
            return list(tokenizer(row["prompt"])["input_ids"])
        return encode_prompt(tokenizer, row, self.system_prompt)


def encode_prompt(tokenizer, row: dict, system_prompt: str | None = None) -> list[int]:
    """Token ids of the row's prompt through the tokenizer's chat template; a tokenizer without one is refused
    (``check_chat_template``) rather than fed the messages' texts joined."""
    messages = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
    if system_prompt and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system_prompt}] + list(messages)
    check_chat_template(tokenizer)
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))


def check_chat_template(tokenizer, where: str = "the tokenizer") -> None:
    """Refuse a tokenizer without a chat template, naming the alternative for base models."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{where} has no chat template, so chat prompts cannot be rendered; for a base model use "
            "raw_prompt (--raw-prompt: each row's prompt text as it is), or a tokenizer with a chat "
            "template (--model-tokenizer-path)"
        )


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
        self.skipped_pairs: list[tuple[int, int]] = []
        """(episode, row) pairs passed over"""
        self.returned: list[tuple[int, int]] = []
        """(episode, row) pairs handed back, taken again before the order goes on"""

    def _order_for(self, episode: int) -> list[int]:
        order = list(self.indices)
        random.Random(self.seed * 100_003 + episode).shuffle(order)
        return order

    def take(self, k: int) -> list[tuple[int, int]]:
        """Next ``k`` (episode, row index) pairs, moving to the next episode (reshuffled) when the shard runs out."""
        out, self.returned = self.returned[:k], self.returned[k:]
        passed = set()
        while len(out) < k:
            if self.position >= len(self._order):
                self.episode += 1
                self.position = 0
                self._order = self._order_for(self.episode)
            row = self._order[self.position]
            if self._skip(row) and row not in passed:
                passed.add(row)
                self.skipped += 1
                self.skipped_pairs.append((self.episode, row))
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

    def give_back(self, pairs: list[tuple[int, int]]) -> None:
        """Hand back taken (episode, row) pairs that were never rolled out, in the order they were taken: the next
        ``take`` returns them first."""
        self.returned = [(int(e), int(r)) for e, r in pairs] + self.returned

    def handed_out(self) -> dict:
        """{"taken": every (episode, row) pair ``take`` handed out and not handed back, "skipped": the pairs passed
        over}: the groups the run's ledger must account for."""
        not_taken = set(self.returned) | set(self.skipped_pairs)
        orders = [self._order_for(e) for e in range(self.episode)] + [self._order[: self.position]]
        taken = [[e, row] for e, order in enumerate(orders) for row in order if (e, row) not in not_taken]
        return {"taken": taken, "skipped": [list(p) for p in self.skipped_pairs]}

    def state(self) -> dict:
        return {
            "episode": self.episode,
            "position": self.position,
            "skipped": self.skipped,
            "skipped_pairs": [list(p) for p in self.skipped_pairs],
            "no_signal": {str(r): c for r, c in self.no_signal.items() if c},
            "returned": [list(p) for p in self.returned],
        }

    def restore(self, state: dict) -> None:
        self.episode, self.position = int(state["episode"]), int(state["position"])
        self.skipped = int(state.get("skipped", 0))
        self.skipped_pairs = [(int(e), int(r)) for e, r in state.get("skipped_pairs", [])]
        self.no_signal = {int(r): int(c) for r, c in state.get("no_signal", {}).items()}
        self.returned = [(int(e), int(r)) for e, r in state.get("returned", [])]
        self._order = self._order_for(self.episode)
