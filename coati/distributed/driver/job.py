"""A whole job as the command line runs it: Ray (joining ``run.address`` or starting a local cluster), the run folder,
the reporter (progress bar, plots, the loggers of ``run.report_to``), then ``launch``. Returns the run's summary."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shlex
import sys
import uuid
from collections.abc import Callable

import yaml

from coati.distributed.config.colossalchat import config_from_launch_kwargs, translate
from coati.distributed.config.tree import Config
from coati.distributed.driver.actor_group import ActorGroups
from coati.distributed.driver.launch import launch
from coati.distributed.driver.loop import evaluation_result
from coati.distributed.driver.preflight import Inputs, check_inputs, preflight
from coati.distributed.driver.ray_start import check_address, start_ray  # noqa: F401 (check_address: public here)
from coati.distributed.driver.reporting import Reporter, end_account, phase
from coati.distributed.driver.run_folder import (
    RunFolder,
    choose_folder,
    link_latest,
    submitted_job_folder_error,
)
from coati.provenance import environment

log = logging.getLogger(__name__)


def launch_distributed(*args, on_step: Callable[[dict], None] | None = None, **kwargs) -> dict:
    """ColossalChat's entry point: its arguments (``config_from_launch_kwargs``) become the config tree, which
    ``launch`` runs. Checkpoints go to ``<save_dir>/checkpoints`` every ``save_interval`` steps and at the end;
    ``resume`` ("latest" or a checkpoint folder) continues a run from one, after checking that its config and
    identity (model, data, reward, seed, staleness) match; ``resume_allow`` names fields that may differ. ``save_dir``
    is locked for the run; a folder holding another run is refused unless resuming or ``overwrite``. ``colocate`` lets
    producer i and consumer i share GPU i; ``sleep_while_training`` has producers free their accelerator memory while
    consumers train (it needs ``max_staleness=0``). With an eval set, the policy is evaluated before training, at the
    end, and every ``eval_interval`` steps when that is > 0. ColossalChat's own parameters (its ``rl_example.py``
    call) are translated first (``colossalchat.translate``), each one without a field here stated once in the log.
    With a ``save_dir`` the run folder is written as the command line writes it (metrics.jsonl, samples.jsonl,
    evals.json, summary.json, plots)."""
    kwargs, statements = translate(kwargs)
    config = config_from_launch_kwargs(*args, **kwargs)
    for statement in statements:
        log.warning("ColossalChat parameter %s", statement)
    if config.run.folder is None:
        return launch(config, on_step)
    return run_reported(config, on_step)[0]


PATH_FIELDS = (
    ("model", "path"),
    ("model", "inference_path"),
    ("model", "tokenizer_path"),
    ("data", "train"),
    ("data", "eval"),
    ("run", "save_dir"),
    ("run", "run_dir"),
)
"""the config fields that name local files or folders (config.yaml writes them absolute)"""


def description(config: Config) -> dict[str, str]:
    """The files that say how a run was made: ``config.yaml`` (the resolved tree, the algorithm's preset written out:
    ``--config config.yaml`` runs it again, from any folder: its local paths are absolute), ``command.txt`` (the
    command line) and ``env.json`` (the code's commit, package versions, the machine and its speed)."""
    tree = json.loads(json.dumps(dataclasses.asdict(config)))  # tuples as lists: plain YAML
    for section, key in PATH_FIELDS:  # absolute: the file runs again from any folder
        value = tree[section][key]
        if isinstance(value, str) and not os.path.isabs(value) and os.path.exists(value):
            tree[section][key] = os.path.abspath(value)
    tree["algorithm"] = json.loads(json.dumps(dataclasses.asdict(config.algo_config)))
    return {
        "config.yaml": yaml.safe_dump(tree, sort_keys=False),
        "command.txt": shlex.join(["python", *sys.argv]) + "\n",
        "env.json": json.dumps(environment(), indent=2) + "\n",
    }


def with_run_folder(config: Config, create: bool = True) -> Config:
    """The config with its run folder chosen (``choose_folder``): unchanged where ``run.run_dir`` names it or the run
    writes nothing."""
    r = config.run
    if r.run_dir is not None or r.save_dir is None:
        return config
    folder = choose_folder(r.save_dir, r.project, r.resume, r.overwrite, create)
    return dataclasses.replace(config, run=dataclasses.replace(r, run_dir=folder))


def run_job(config: Config, inputs: Inputs | None = None) -> dict:
    """Ray (``run.address``, or a local cluster), then ``run_reported``; returns the run's summary. ``inputs``: what
    ``check_inputs`` resolved, when the caller has checked them (else they are checked here, before Ray starts)."""
    if inputs is None:
        phase("checking the inputs")
        try:
            inputs = check_inputs(config)  # a mistake in the inputs ends here, before Ray starts
        except BaseException:
            end_account()  # a refused run leaves no phase to the next run of this process
            raise

    def start() -> None:
        import ray

        if not ray.is_initialized():
            phase("starting Ray")
        start_ray(config.run.address)

    return run_reported(config, start=start, inputs=inputs)[1]


def dry_run(config: Config) -> dict:
    """Every check of a run and the placement of its actors, without starting them: the plan, as plain values."""
    import ray

    inputs = check_inputs(config)
    started = not ray.is_initialized()
    start_ray(config.run.address)
    try:
        plan = preflight(config, inputs)
    finally:
        if started:
            ray.shutdown()
    per_step = config.global_train_batch_size
    return {
        "producers": [dataclasses.asdict(slot) for slot in plan.producer_slots],
        "consumers": [dataclasses.asdict(slot) for slot in plan.consumer_slots],
        "critics": [dataclasses.asdict(slot) for slot in plan.critic_slots],
        "reference_servers": [dataclasses.asdict(slot) for slot in plan.ref_slots],
        "reward_servers": {k: len(v) for k, v in plan.server_slots.items()},
        "model": plan.train_model_path,
        "training_rows": plan.num_rows,
        "held_out_rows": None if plan.eval_dataset is None else plan.eval_dataset.size,
        "prompts_per_step": per_step,
        "completions_per_step": per_step * config.producer.num_generations,
        "steps_per_episode": plan.steps_per_episode,
        "steps": plan.total_steps,
        "in_flight_weight_updates": plan.in_flight,
        "stream_prompts": plan.stream_prompts,
        "sandbox": plan.sandbox,
        "run_folder": with_run_folder(config, create=False).run.folder,
    }


def evaluate_model(config: Config) -> dict:
    """The held-out evaluation of the config's model alone, as a run evaluates (its producers, greedy, its reward;
    no consumer, no training): accuracy, counts and each item's prediction (``eval_samples``)."""
    if config.data.datasets(config.run.seed)[1] is None:
        raise ValueError(
            "no held-out set to evaluate on: give one with --data-eval (a reasoning_gym: task has its own)"
        )
    inputs = check_inputs(config)
    start_ray(config.run.address)
    plan = preflight(config, inputs)
    actors = ActorGroups(config, plan, run_name=f"{config.run.project}-eval-{uuid.uuid4().hex[:8]}")
    try:
        actors.start(consumers=False)
        return evaluation_result(actors.evaluate(), config.reward)
    finally:
        actors.shutdown()


def run_reported(config: Config, on_step=None, start=None, inputs: Inputs | None = None) -> tuple[dict, dict]:
    """``launch`` with the run folder claimed and the reporter writing it (metrics.jsonl, samples.jsonl, evals.json,
    summary.json, plots); ``start`` runs once the folder is claimed (joining Ray), ``on_step`` sees each step's
    metrics before the reporter. Returns (launch's result, the summary)."""

    if config.run.folder is None:
        raise ValueError("a job writes its outputs to <save_dir>/<project>: set save_dir (or run_dir)")
    problem = submitted_job_folder_error(config.run.folder)
    if problem:
        raise ValueError(problem)
    describe = description(config)  # as given: its config.yaml starts another run, not this one's folder again
    project = None if config.run.save_dir is None else os.path.join(config.run.save_dir, config.run.project)
    config = with_run_folder(config)
    r = config.run
    # Claimed before anything writes there (the reporter appends metrics); launch claims the same folder again.
    folder = RunFolder.claim(r.folder, "resume" if r.resume else "overwrite" if r.overwrite else "new")
    try:
        if project is not None and os.path.dirname(os.path.abspath(r.folder)) == os.path.abspath(project):
            link_latest(r.folder)  # a run of the project's own
        if start is not None:
            start()
        reporter = Reporter(
            r.folder,
            report_to=r.report_to,
            project=r.project,
            config=dataclasses.asdict(config),
            progress=r.progress,
            append=bool(r.resume),
            describe=describe,
        )

        def step(metrics: dict) -> None:
            if on_step is not None:
                on_step(dict(metrics))
            reporter.on_step(metrics)

        try:
            result = launch(config, on_step=step, inputs=inputs)
        except BaseException:
            reporter.close_bar()
            raise
        return result, reporter.finish(result)
    finally:
        folder.release()
