"""The small runs the e2e tests launch, in the native config tree:

- ``tiny_tree``/``tiny_config``: one producer drawing 4 prompts of 4 completions a step from 64 prompts, one
  trainer at lr 3e-3, 12 new tokens at temperature 1, two steps, nothing written; each section can be overridden;
- ``train``: launch a Config, writing its run folder when it has one (as the command line does);
- ``small_tree``: the same shape for a given model, rows, reward and folder;
- ``new_run``/``start_run``: a ``Run`` with its actors started, joined and pushed once, for tests that drive the
  loop themselves.

ColossalChat's ``launch_distributed`` keywords are tested in ``test_colossalchat.py`` alone."""

import uuid
from pathlib import Path

from coati.distributed.config.tree import Config, config_from_dict
from coati.distributed.driver.job import run_reported
from coati.distributed.driver.launch import launch
from coati.distributed.driver.loop import Run
from coati.distributed.driver.preflight import preflight

REWARD = "tests.component.reward_fns:digit_fraction"
FP32 = {"dtype": "float32"}
"""engine weights as the trainer's fp32 masters, so pushes can be compared bitwise (the default follows the trainer's
compute dtype: bf16 on a CPU with native bf16)"""
ROWS = [{"prompt": f"q{i}"} for i in range(64)]


def tiny_tree(path, folder=None, /, **sections) -> dict:
    """The small run as a tree. ``folder``: the run folder (its parent becomes ``run.save_dir``); ``sections``
    are merged into the sections, one level deep (``consumer={"plugin": {...}}`` replaces the plugin dict whole),
    or set whole where they are not dicts (``algo``)."""
    tree = {
        "algo": "GRPO",
        "model": {"path": path},
        "data": {"train": ROWS},
        "producer": {
            "num_producers": 1,
            "inference_batch_size": 4,
            "inference_microbatch_size": 4,
            "num_generations": 4,
            "backend": "transformers",
        },
        "consumer": {
            "train_batch_size": 4,
            "train_minibatch_size": 4,
            "train_microbatch_size": 8,
            "learning_rate": 3e-3,
        },
        "generation": {"max_new_tokens": 12, "temperature": 1.0},
        "reward": {"fn": REWARD},
        "run": {"max_steps": 2, "num_episodes": 1, "max_staleness": 0, "save_dir": None},
    }
    if folder is not None:
        tree["run"] |= {"save_dir": str(Path(folder).parent), "run_dir": str(folder)}
    for name, value in sections.items():
        tree[name] = {**tree[name], **value} if isinstance(value, dict) and name in tree else value
    return tree


def tiny_config(path, folder=None, /, **sections) -> Config:
    return config_from_dict(tiny_tree(path, folder, **sections))


def train(config: Config, on_step=None) -> dict:
    """``launch``'s result; a run with a folder writes it (metrics, samples, summary) as the command line does."""
    return launch(config, on_step) if config.run.folder is None else run_reported(config, on_step)[0]


def small_tree(model, rows, reward, save_dir, steps, backend="transformers", lr=3e-3, **sections) -> dict:
    """A native config tree (``config_from_dict``'s) of a small run: one producer drawing 4 prompts of 4 completions
    a step, one trainer at ``lr``, 12 new tokens at temperature 1, fp32 engine weights, no held-out set, synchronous;
    ``sections`` are merged into the tree's sections (or set whole, for ``algo``)."""
    tree = {
        "model": {"path": model, "inference_options": dict(FP32)},
        "data": {"train": rows, "eval": None},
        "producer": {
            "num_producers": 1,
            "inference_batch_size": 4,
            "inference_microbatch_size": 4,
            "num_generations": 4,
            "backend": backend,
        },
        "consumer": {"train_batch_size": 4, "learning_rate": lr},
        "generation": {"max_new_tokens": 12, "temperature": 1.0},
        "reward": {"fn": reward},
        "run": {"max_steps": steps, "max_staleness": 0, "save_dir": str(save_dir), "progress": False},
    }
    for name, value in sections.items():
        tree[name] = {**tree[name], **value} if isinstance(value, dict) and name in tree else value
    return tree


def new_run(
    tiny,
    colocate=False,
    sleep_while_training=False,
    inference_options=FP32,
    backend="transformers",
    max_staleness=0,
    in_flight=False,
    follow_work=True,
    run_name=None,
    **sections,
):
    """A Run of ``tiny_tree(tiny, **sections)`` with its actors started, not yet joined to the weight group."""
    tree = tiny_tree(tiny, **sections)
    tree["model"]["inference_options"] = dict(inference_options or {})
    tree["producer"]["backend"] = backend
    tree["run"] |= {
        "colocate": colocate,
        "in_flight_weight_updates": in_flight,
        "max_staleness": max_staleness,
        "sleep_while_training": sleep_while_training,
        "threads_follow_work": follow_work,
        "weight_sync_timeout_s": 60,
    }
    config = config_from_dict(tree)
    run = Run(config, preflight(config), run_name=run_name or f"t-{uuid.uuid4().hex[:8]}")
    run.start_actors()
    return run


def start_run(tiny, **over):
    """A Run joined to its weight group, with the consumer's weights pushed once."""
    run = new_run(tiny, **over)
    run.connect_weight_group()
    run.push_weights()
    return run
