"""The small runs the e2e tests launch: ``small_tree`` (a native config tree), ``run_kwargs`` (launch_distributed's
ColossalChat-style arguments for a tiny model, two steps),
``new_run``/``start_run`` (a ``Run`` with its actors started, joined and pushed once, for tests that drive the loop
themselves)."""

import dataclasses
import uuid

from coati.distributed.driver.launch import config_from_launch_kwargs
from coati.distributed.driver.loop import Run
from coati.distributed.driver.preflight import preflight

REWARD = "tests.component.reward_fns:digit_fraction"
FP32 = {"dtype": "float32"}
"""engine weights as the trainer's fp32 masters, so pushes can be compared bitwise (the default follows the trainer's
compute dtype: bf16 on a CPU with native bf16)"""


def run_kwargs(tiny, **over):
    kw = dict(
        num_producers=1,
        num_proc_per_producer=1,
        num_consumer_procs=1,
        num_episodes=1,
        inference_batch_size=4,
        inference_microbatch_size=4,
        train_batch_size=4,
        train_minibatch_size=4,
        train_dataset_config={"rows": [{"prompt": f"q{i}"} for i in range(64)]},
        inference_model_config={"path": tiny},
        train_model_config={"path": tiny},
        generate_config={"max_new_tokens": 12, "temperature": 1.0},
        grpo_config={"lr": 3e-3, "reward_fn_type": REWARD, "train_microbatch_size": 8},
        plugin_config={},
        num_generations=4,
        core_algo="GRPO",
        max_steps=2,
        inference_backend="transformers",
        max_staleness=0,
    )
    kw.update(over)
    return kw


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
    **over,
):
    """A Run with its actors started, not yet joined to the weight group."""
    config = config_from_launch_kwargs(**run_kwargs(tiny, inference_backend=backend, colocate=colocate, **over))
    config = dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, inference_options=dict(inference_options or {})),
        run=dataclasses.replace(
            config.run,
            in_flight_weight_updates=in_flight,
            max_staleness=max_staleness,
            sleep_while_training=sleep_while_training,
            threads_follow_work=follow_work,
            weight_sync_timeout_s=60,
        ),
    )
    run = Run(config, preflight(config), run_name=run_name or f"t-{uuid.uuid4().hex[:8]}")
    run.start_actors()
    return run


def start_run(tiny, **over):
    """A Run joined to its weight group, with the consumer's weights pushed once."""
    run = new_run(tiny, **over)
    run.connect_weight_group()
    run.push_weights()
    return run
