"""The base model's held-out evaluation, kept across runs: every run evaluates before training, and a run that starts
from the same model, on the same held-out rows, with the same generation, prompt format, reward, backend and engine
dtype, on the same code, would regenerate the same greedy answers. The key hashes exactly those; the entry holds the
evaluation and its predictions. Entries live under ``$COATI_CACHE/evals`` (``~/.cache/coati/evals`` by default), one
JSON file each, written atomically; ``run.eval_cache`` (``--no-eval-cache``) turns the cache off."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from coati.default_model import CACHE

FORMAT = 1
"""bumped whenever an entry's meaning changes; entries of another format are never read"""


def cache_dir() -> Path:
    return Path(os.environ.get("COATI_CACHE", CACHE)) / "evals"


def model_fingerprint(path: str) -> list | None:
    """Every file of a model folder (name, size, modification time): a folder written again is another model. None
    where ``path`` is not a local folder (nothing to fingerprint: no cache)."""
    root = Path(path)
    if not root.is_dir():
        return None
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return [(str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


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
            "producer": dataclasses.asdict(cfg.producer),
            "inference_options": plan.inference_options,
            "engine_dtypes": sorted(str(i.get("weight_dtype")) for i in producer_info),
            "code": [commit(), versions()],
        }
    )
