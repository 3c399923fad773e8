"""The base model's held-out evaluation, kept across runs: every run evaluates before training, and a run that starts
from the same model, on the same held-out rows, with the same generation, prompt format, reward, backend and engine
dtype, on the same code, would regenerate the same greedy answers. The key hashes exactly those, by content: the
model's files, the reward functions' source and module files, coati's own source; the entry holds the
evaluation and its predictions. Entries live under ``$COATI_CACHE/evals`` (``~/.cache/coati/evals`` by default), one
JSON file each, written atomically; ``run.eval_cache`` (``--no-eval-cache``) turns the cache off."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

from coati.default_model import CACHE

FORMAT = 2
"""bumped whenever an entry's meaning changes; entries of another format are never read"""


def cache_dir() -> Path:
    return Path(os.environ.get("COATI_CACHE", CACHE)) / "evals"


def model_fingerprint(path: str) -> list | None:
    """Every file of a model folder by name and content hash: a file replaced with one of the same size and time
    is another model. None where ``path`` is not a local folder (nothing to fingerprint: no cache)."""
    root = Path(path)
    if not root.is_dir():
        return None
    files = sorted(p for p in root.rglob("*") if p.is_file())
    known = len(_hash_memo())
    fingerprint = [(str(p.relative_to(root)), content_hash(p)) for p in files]
    if len(_hash_memo()) > known:  # hashes learnt: written once for the folder
        _save_memo(_hash_memo())
    return fingerprint


def content_hash(path: Path) -> str:
    """The SHA-256 of a file's bytes. Remembered (``file_hashes.json`` in the cache folder, written by
    ``model_fingerprint``) under the file's identity as the kernel keeps it (device, inode, size, modification and
    change times: the change time cannot be set back by the file's owner), so an unchanged 0.5 GB weight file is
    read once, not at every run."""
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    memo = _hash_memo()
    if ident in memo:
        return memo[ident]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    if time.time_ns() - st.st_ctime_ns > RACY_NS:  # a file changed just now could change again within its tick
        memo[ident] = digest.hexdigest()  # written by model_fingerprint, once for all its files
    return digest.hexdigest()


RACY_NS = 2_000_000_000
"""a file changed less than this long before it was hashed is not remembered: a rewrite within the file system's
timestamp tick would keep its identity"""
_MEMO: dict[str, str] | None = None


def _memo_path() -> Path:
    return cache_dir().parent / "file_hashes.json"


def _hash_memo() -> dict[str, str]:
    global _MEMO
    if _MEMO is None:
        try:
            _MEMO = dict(json.loads(_memo_path().read_text()))
        except (OSError, ValueError, TypeError):
            _MEMO = {}
    return _MEMO


def _save_memo(memo: dict[str, str]) -> None:
    path = _memo_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dict(list(memo.items())[-4096:])))
        os.replace(tmp, path)
    except OSError:
        pass


def reward_digest(reward) -> list:
    """What the reward functions of ``reward`` are made of: each one's source and its module file's hash (a reward
    file edited between runs scores the same answers differently)."""
    import inspect

    from coati.distributed.reward import resolve_reward_fn

    out = []
    for name in (reward.fn, *reward.other_fns):
        fn = resolve_reward_fn(name)
        try:
            source = inspect.getsource(fn)
            module = inspect.getsourcefile(inspect.getmodule(fn))
        except (OSError, TypeError):  # a builtin or a function without a file: its name and repr only
            source, module = repr(fn), None
        file_hash = hashlib.sha256(Path(module).read_bytes()).hexdigest() if module else None
        out.append([name, hashlib.sha256(source.encode()).hexdigest(), file_hash])
    return out


def code_digest() -> str:
    """A hash of coati's own source (every module of the package): uncommitted edits to the evaluation count too."""
    import coati

    root = Path(coati.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def evaluation_key(parts: dict) -> str:
    """The key of an evaluation decided by ``parts`` (JSON-able)."""
    text = json.dumps({"format": FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def read(key: str) -> dict | None:
    """The evaluation stored under ``key`` (None: none, or unreadable)."""
    try:
        entry = json.loads((cache_dir() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    return entry.get("evaluation") if entry.get("format") == FORMAT and entry.get("key") == key else None


def write(key: str, evaluation: dict) -> Path | None:
    """Store ``evaluation`` under ``key``; None where the cache folder cannot be written (the run goes on)."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"format": FORMAT, "key": key, "evaluation": evaluation}))
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        return None
    return folder / f"{key}.json"


def base_key(cfg, plan, producer_info: list[dict]) -> str | None:
    """What decides the base model's greedy evaluation in a run of ``cfg`` planned as ``plan`` (its producers
    reporting ``producer_info``), hashed; None where a model is not a local folder."""
    from coati.provenance import commit, versions

    models = {path: model_fingerprint(path) for path in (plan.train_model_path, plan.inference_model_path)}
    if any(fingerprint is None for fingerprint in models.values()):
        return None
    return evaluation_key(
        {
            "models": models,
            "tokenizer": model_fingerprint(plan.tokenizer_path),
            "held_out": plan.eval_digest,
            "prompt_format": dataclasses.asdict(plan.prompt_format),
            "generation": dataclasses.asdict(cfg.generation),
            "reward": dataclasses.asdict(cfg.reward),
            "reward_code": reward_digest(cfg.reward),
            "producer": dataclasses.asdict(cfg.producer),
            "inference_options": plan.inference_options,
            "engine_dtypes": sorted(str(i.get("weight_dtype")) for i in producer_info),
            "code": [commit(), versions(), code_digest()],
        }
    )
