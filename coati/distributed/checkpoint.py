"""Checkpoints that restore everything: consumer model and optimizer (through the booster, sharded as the plugin
keeps them), RNG states of every actor, each producer's dataset position, the driver's buffer of scored groups not yet
trained on, step, policy version and the run's config.

A checkpoint is written into ``<root>/.tmp-step-K`` and renamed to ``<root>/step-K`` only when complete, then
``<root>/latest`` is replaced atomically; the last ``keep_last`` are kept. A crash mid-save leaves the previous
checkpoint intact and nothing half-written under a ``step-K`` name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
from pathlib import Path

from coati.distributed.config import LaunchConfig

# Fields that may change on resume without breaking the saved state.
RESUMABLE_CHANGES = {"num_episodes"}


def config_dict(cfg: LaunchConfig) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def check_compatible(saved: dict, current: dict, where: str) -> None:
    """Raise naming every field whose value differs between the checkpoint's config and this run's."""
    a, b = _flatten(saved), _flatten(current)
    diffs = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k) and k.split(".")[0] not in RESUMABLE_CHANGES]
    if diffs:
        detail = "; ".join(f"{k}: checkpoint {a.get(k)!r}, this run {b.get(k)!r}" for k in diffs)
        raise ValueError(f"checkpoint {where} is incompatible with this run ({detail}); start a new run or match them")


class CheckpointManager:
    def __init__(self, root: str, keep_last: int = 2):
        self.root = Path(root)
        self.keep_last = max(1, keep_last)

    def staging(self, step: int) -> Path:
        tmp = self.root / f".tmp-step-{step}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, tmp: Path, step: int, meta: dict) -> Path:
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        final = self.root / f"step-{step}"
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        latest_tmp = self.root / ".latest.tmp"
        latest_tmp.write_text(final.name)
        os.replace(latest_tmp, self.root / "latest")
        for old in self.list()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def list(self) -> list[Path]:
        if not self.root.exists():
            return []
        found = [p for p in self.root.glob("step-*") if (p / "meta.json").exists()]
        return sorted(found, key=lambda p: int(p.name.split("-")[1]))

    def resolve(self, spec: str) -> Path:
        """'latest' (the newest complete checkpoint under root) or a checkpoint folder."""
        if spec == "latest":
            pointer = self.root / "latest"
            if pointer.exists() and (self.root / pointer.read_text().strip() / "meta.json").exists():
                return self.root / pointer.read_text().strip()
            found = self.list()
            if not found:
                raise FileNotFoundError(f"--resume latest: no checkpoint under {self.root}")
            return found[-1]
        path = Path(spec)
        if not (path / "meta.json").exists():
            raise FileNotFoundError(f"--resume {spec}: not a complete checkpoint (no meta.json)")
        return path


def save_driver_state(folder: Path, buffer, producer_states: list) -> None:
    with (folder / "driver.pkl").open("wb") as f:
        pickle.dump({"buffer": buffer, "producers": producer_states}, f)


def load_driver_state(folder: Path) -> dict:
    with (folder / "driver.pkl").open("rb") as f:
        return pickle.load(f)
