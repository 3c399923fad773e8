"""Checkpoints that restore everything: consumer model and optimizer (through the booster, sharded as the plugin
keeps them), RNG states of every actor, each producer's dataset position, the driver's buffer of scored groups not yet
trained on, step, policy version, the run's config and its identity (which model, which data, which seed).

Nothing a checkpoint loads can run code: the driver's state is JSON plus a numpy archive read with
``allow_pickle=False``, RNG states load with ``torch.load(weights_only=True)``.

A checkpoint is written into ``<root>/.tmp-step-K`` and renamed to ``<root>/step-K`` only when complete, then
``<root>/latest`` is replaced atomically; the last ``keep_last`` are kept. A crash mid-save leaves the previous
checkpoint intact and nothing half-written under a ``step-K`` name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np

from coati.distributed.config.tree import Config
from coati.distributed.driver.actor_group import RunError, get
from coati.distributed.guards import all_finite
from coati.distributed.model.architectures import auto_model_class
from coati.distributed.model.lora import peft_config, write_adapter
from coati.distributed.record import RolloutBatch

# Fields that may change on resume without breaking the saved state; others only when named in ``allow``.
RESUMABLE_CHANGES = {"num_episodes"}


def config_dict(config: Config) -> dict:
    """The tree's training sections as JSON (``Config.training_record``): what a checkpoint records."""
    return json.loads(json.dumps(config.training_record(), default=str))


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


FLAT_REWARD = re.compile(r"(^|\.)reward\.(env|rm|judge)(?:_(\w+))?$")
"""a key of a record whose reward section was flat (``reward.rm_path``; ``reward.env``, the environment's name)"""


def _nested(key: str) -> str:
    """A checkpoint record's key as the tree names it now (``reward.rm_path`` -> ``reward.rm.path``)."""
    m = FLAT_REWARD.search(key)
    if m is None:
        return key
    return f"{key[: m.start()]}{m.group(1)}reward.{m.group(2)}.{m.group(3) or 'name'}"


def check_compatible(saved: dict, current: dict, where: str, allow=()) -> None:
    """Raise naming every field whose value differs between the checkpoint's record and this run's, except those
    that may change (``RESUMABLE_CHANGES``) and those the caller allows (a field name or a prefix of one). A record
    written with the reward section flat is read under the nested names."""
    a, b = {_nested(k): v for k, v in _flatten(saved).items()}, _flatten(current)
    allowed = set(RESUMABLE_CHANGES) | set(allow)
    added = _added_defaults()
    diffs = [
        k
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
        and not any(k == p or k.startswith(p + ".") for p in allowed)
        and not (k not in a and k in added and added[k] == b.get(k))
    ]
    if diffs:
        lines = "".join(f"\n  {k}: checkpoint {_short(a.get(k))}, this run {_short(b.get(k))}" for k in diffs)
        allowable = [k for k in diffs if not k.startswith("identity.")]
        fix = "start a new run, or give the checkpoint's values"
        if allowable:
            fix += f"; to accept the change: --resume-allow {','.join(allowable)}"
        if len(allowable) < len(diffs):
            fix += " (the model's weights or data differ: a checkpoint resumes its own run only)"
        raise ValueError(f"checkpoint {where} does not match this run; {fix}:{lines}")


def _added_defaults() -> dict:
    """Every recorded field at its default, under the names ``check_compatible`` compares: a field a checkpoint
    written before it existed does not record (the critic section, PPO's algorithm fields) matches a run that leaves
    it at its default, the value that run trained with."""
    from coati.distributed.algo.config import AlgorithmConfig

    record = json.loads(json.dumps({"config": Config().training_record()}, default=str))
    algorithm = json.loads(json.dumps(dataclasses.asdict(AlgorithmConfig()), default=str))
    return {**_flatten(record), **_flatten({"config": {"algorithm": algorithm}})}


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fingerprint(path: str) -> dict:
    """What identifies a model folder: its config (architecture and shapes) and its weight files (names, sizes and
    the hash of each file's first and last MiB: different weights differ there, and it reads 2 MiB, not gigabytes)."""
    folder = Path(path)
    if not folder.is_dir():
        return {"hub_id": path}
    config = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()[:16]
    weights = hashlib.sha256()
    for f in sorted(p for pattern in ("*.safetensors", "*.bin") for p in folder.glob(pattern)):
        size = f.stat().st_size
        weights.update(f"{f.name}:{size}".encode())
        with f.open("rb") as fh:
            weights.update(fh.read(1 << 20))
            fh.seek(max(size - (1 << 20), 0))
            weights.update(fh.read(1 << 20))
    return {"config": config, "weights": weights.hexdigest()[:16]}


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
            name = pointer.read_text().strip() if pointer.is_file() and not pointer.is_symlink() else ""
            # only a step folder of this root: a pointer edited to "../elsewhere" names nothing
            if re.fullmatch(r"step-\d+", name) and (self.root / name / "meta.json").exists():
                return self.root / name
            found = self.list()
            if not found:
                raise FileNotFoundError(f"--resume latest: no checkpoint under {self.root}")
            return found[-1]
        path = Path(spec)
        if not (path / "meta.json").exists():
            raise FileNotFoundError(f"--resume {spec}: not a complete checkpoint (no meta.json)")
        return path


def checkpoint_meta(folder: Path) -> dict:
    """A checkpoint's ``meta.json``, once its step agrees with the folder's name (``step-K``) and with the step each
    consumer saved beside its weights: an edited or misplaced record would resume at the wrong step (retraining
    steps, or skipping them)."""
    import re

    import torch

    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())
    step = meta.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(
            f"checkpoint {folder}: meta.json's step is {step!r}, not a step number; the checkpoint is "
            "damaged: resume from another one (--resume <folder>)"
        )
    named = re.fullmatch(r"step-(\d+)", folder.name)
    saved = {p.name: torch.load(p, weights_only=True).get("step") for p in sorted(folder.glob("rng-consumer-*.pt"))}
    disagree = {
        **({"folder name": int(named.group(1))} if named and int(named.group(1)) != step else {}),
        **{name: s for name, s in saved.items() if s != step},
    }
    if disagree:
        raise ValueError(
            f"checkpoint {folder}: meta.json says step {step} but {disagree} say otherwise; the "
            "checkpoint is damaged or edited: resume from another one (--resume <folder>)"
        )
    return meta


def save_driver_state(folder: Path, buffer, producer_states: list, ledger: dict | None = None) -> None:
    """The driver's buffer (RolloutBatches), its ledger of groups (``Ledger.state``) and the producers' states as
    JSON plus one numpy archive."""
    arrays: dict[str, np.ndarray] = {}
    meta = {"buffer": [], "producers": [], "ledger": ledger}
    for k, batch in enumerate(buffer):
        names = []
        for f in dataclasses.fields(batch):
            value = getattr(batch, f.name)
            if f.name == "extras":
                for name, v in value.items():
                    arrays[f"buffer/{k}/extras/{name}"] = _plain_array(v, name)
            elif f.name == "calls":
                pass  # plain numbers, in the JSON
            elif f.name == "pixels":
                for j, inputs in enumerate(value):
                    for name, v in inputs.items():
                        arrays[f"buffer/{k}/pixels/{j}/{name}"] = _plain_array(v, name)
            elif value is not None:
                arrays[f"buffer/{k}/{f.name}"] = _plain_array(value, f.name)
                names.append(f.name)
        pixels = [sorted(inputs) for inputs in batch.pixels]
        meta["buffer"].append({"fields": names, "extras": sorted(batch.extras), "calls": batch.calls, "pixels": pixels})
    for i, state in enumerate(producer_states):
        arrays[f"producer/{i}/torch_rng"] = state["torch_rng"].numpy()
        meta["producers"].append({k: v for k, v in state.items() if k != "torch_rng"})
    np.savez(folder / "driver.npz", **arrays)
    (folder / "driver.json").write_text(json.dumps(meta))


def _plain_array(value, name: str) -> np.ndarray:
    array = np.asarray(value)
    assert array.dtype != object, f"{name}: object arrays cannot be checkpointed without pickle"
    return array


def load_driver_state(folder: Path) -> dict:
    import torch

    meta = json.loads((folder / "driver.json").read_text())
    with np.load(folder / "driver.npz", allow_pickle=False) as arrays:
        buffer = []
        for k, entry in enumerate(meta["buffer"]):
            kw = {name: arrays[f"buffer/{k}/{name}"] for name in entry["fields"]}
            kw["extras"] = {name: arrays[f"buffer/{k}/extras/{name}"] for name in entry["extras"]}
            kw["calls"] = entry.get("calls", [])  # a checkpoint from before calls had none
            kw["pixels"] = [
                {name: arrays[f"buffer/{k}/pixels/{j}/{name}"] for name in names}
                for j, names in enumerate(entry.get("pixels", []))
            ]
            buffer.append(RolloutBatch(**kw))
        producers = [
            {**state, "torch_rng": torch.from_numpy(arrays[f"producer/{i}/torch_rng"].copy())}
            for i, state in enumerate(meta["producers"])
        ]
    return {"buffer": buffer, "producers": producers, "ledger": meta.get("ledger")}


# ---- the run's actors <-> a checkpoint folder, and the final export ----------------------------------------------


def write_checkpoint(
    actors, manager: CheckpointManager, step: int, buffer_state: list, ledger: dict, meta: dict, also=None
) -> str:
    """Consumers save model and optimizer, producers their positions, the driver its buffer and ledger (and
    ``also(folder)`` whatever else), into a staging folder that becomes ``step-<step>`` when complete; returns its
    path."""

    folder = manager.staging(step)
    try:
        trainers = actors.consumers + actors.critics
        get([c.save_checkpoint.remote(str(folder)) for c in trainers], f"checkpoint {step} (consumers)")
        states = get([p.state.remote() for p in actors.producers], f"checkpoint {step} (producers)")
        save_driver_state(folder, buffer_state, states, ledger)
        if also is not None:
            also(str(folder))
    except (RunError, OSError) as e:
        free = shutil.disk_usage(manager.root).free / 2**20
        raise RunError(f"writing checkpoint {folder} failed: {e} ({manager.root} has {free:.0f} MiB free)") from e
    return str(manager.commit(folder, step, {"step": step, **meta}))


def read_checkpoint(actors, folder: str) -> tuple[dict, dict]:
    """Load a checkpoint (already checked against this run) into the running actors; returns its meta and the
    driver's state ({"buffer", "ledger", "producers"}, ``load_driver_state``)."""

    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())  # checked by ``checkpoint_meta`` before the run started
    trainers = actors.consumers + actors.critics
    steps = get([c.load_checkpoint.remote(str(folder)) for c in trainers], f"loading {folder} (consumers)")
    if any(s != meta["step"] for s in steps):
        raise ValueError(f"checkpoint {folder} is at step {meta['step']} but its consumers loaded steps {steps}")
    state = load_driver_state(folder)
    if len(state["producers"]) != len(actors.producers):
        raise ValueError(f"checkpoint has {len(state['producers'])} producers, this run {len(actors.producers)}")
    get([p.restore.remote(s) for p, s in zip(actors.producers, state["producers"], strict=True)], "restoring producers")
    return meta, state


TEACHER_FILE = "teacher.safetensors"
"""a self-teacher's weights in a checkpoint (the policy as it was at the teacher's last refresh)"""


def save_teacher(weights_ref, folder: str) -> None:
    """The self-teacher's weights (an object-store ref of the state dict it was given) into ``folder``."""
    import ray
    from safetensors.torch import save_file

    state = ray.get(weights_ref)
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in state.items()}, os.path.join(folder, TEACHER_FILE))


def load_teacher(folder) -> dict:
    """The self-teacher's weights a checkpoint holds (``save_teacher``)."""
    from safetensors.torch import load_file

    path = os.path.join(str(folder), TEACHER_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint {folder} records a self-teacher but holds no {TEACHER_FILE}; it is incomplete")
    return load_file(path)


def final_folder(save_dir: str) -> str:
    """Where a run exports its final model (complete once there: it is written elsewhere and renamed)."""
    return os.path.join(save_dir, "final")


def export_model(state: dict, model_path: str, tokenizer, path: str, value_head: bool = False) -> str:
    """Write ``state`` as a Hugging Face folder (weights, config, ``tokenizer``: or a processor) loadable by
    AutoModelForCausalLM, or AutoModelForImageTextToText for a vision-language model (with ``value_head``: by
    AutoModelForTokenClassification, one label, a critic), atomically (a temporary folder renamed into place)."""
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    what = "critic weights" if value_head else "weights"
    bad = [k for k, v in state.items() if not all_finite([v])]
    if bad:
        raise RunError(f"refusing to export {path}: non-finite {what} in {bad[:5]} ({len(bad)} tensors)")
    if value_head:
        from coati.distributed.trainer.engine import value_model_config  # deferred: imports ColossalAI

        config, cls = value_model_config(model_path), AutoModelForTokenClassification
    else:
        config, cls = AutoConfig.from_pretrained(model_path), auto_model_class(model_path)
    with torch.device("meta"):
        model = cls.from_config(config)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if not value_head:
        model.tie_weights()  # a tied LM head is missing from the state: the embedding's
    still_meta = [n for n, p in model.named_parameters() if p.is_meta]
    assert not still_meta and not unexpected and not (value_head and missing), (still_meta, unexpected, missing)
    return write_atomically(path, lambda tmp: (model.save_pretrained(tmp), tokenizer.save_pretrained(tmp)))


def export_critic(actors, model_path: str, tokenizer, path: str) -> str:
    """The critic (rank 0's weights: data-parallel ranks hold the same; every rank takes part in the TP gathers) as
    a Hugging Face folder that ``AutoModelForTokenClassification`` loads with its value head (``export_model``)."""
    state = get([c.weights.remote() for c in actors.critics], "gathering the critic's weights")[0]
    return export_model(state, model_path, tokenizer, path, value_head=True)


def export_adapter(adapter: dict, lora_config, tokenizer, path: str) -> str:
    """Write a LoRA adapter (wire names, see ``lora``) as a PEFT folder, ``adapter_config.json`` and
    ``adapter_model.safetensors`` plus the tokenizer, that ``PeftModel.from_pretrained(base, path)`` loads;
    atomically."""

    return write_atomically(path, lambda tmp: write_adapter(adapter, lora_config, tokenizer, tmp))


def export_policy(actors, consumer, model_path: str, tokenizer, path: str) -> str:
    """Write the consumers' model as a Hugging Face folder (weights, config, tokenizer), atomically; with LoRA
    (``consumer.lora_rank``) the adapter as a PEFT folder, and the merged model in ``<path>/merged`` when
    ``consumer.lora_export_merged``."""
    if not consumer.lora_rank:
        return export_model(actors.full_weights(), model_path, tokenizer, path)
    export_lora(actors, consumer, model_path, tokenizer, path)
    if consumer.lora_export_merged:
        export_model(actors.full_weights(), model_path, tokenizer, os.path.join(path, "merged"))
    return path


def export_lora(actors, consumer, model_path: str, tokenizer, path: str) -> str:
    """The consumers' LoRA adapter (DP replicas hold the same one) as a PEFT folder."""
    adapter = get(actors.consumers[0].adapter.remote(), "gathering the adapter")
    c = consumer
    config = peft_config(c.lora_rank, c.lora_alpha, c.lora_dropout, c.lora_target_modules, model_path)
    return export_adapter(adapter, config, tokenizer, path)


def write_atomically(path: str, write) -> str:
    """``write(tmp)`` into a temporary folder beside ``path``, then rename it into place (replacing ``path``)."""

    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        os.makedirs(tmp, exist_ok=True)
        write(tmp)
    except (OSError, RuntimeError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free / 2**20
        raise RunError(f"exporting {path} failed: {e} ({free:.0f} MiB free there)") from e
    readable(tmp)
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    os.replace(tmp, path)
    return path


def readable(folder: str) -> None:
    """Files 0644 and folders 0755 under ``folder``, as the rest of a run folder (a writer's temporary files are
    created 0600, which left the exported weights unreadable to anyone else)."""
    os.chmod(folder, 0o755)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
