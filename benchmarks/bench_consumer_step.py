"""A consumer's whole training step (a real GRPOConsumer actor: ColossalAI booster, DDP wrapper, HybridAdam) with
coati's gradient clipping and synchronisation against ColossalAI's as shipped, side by side in one run.

coati: the global gradient norm from float32 norms of blocks summed in float64, the clip applied by Adam's update as
the gradients' divisor (``coati/distributed/trainer/grad_clip.py``), and torch DDP's all-reduce skipped where it changes
nothing (one DP rank) or would repeat (every pass but a minibatch's last). ColossalAI: the norm from float64 copies of
every gradient, the gradients scaled in a pass of their own, DDP's all-reduce in every backward (the same consumer
class with those two parts put back, as in tests/e2e/test_training_options.py).

Both train SmolLM2-135M (the default model) on the batches of ``bench_step_profile.py`` (4 groups of 4, prompts of
50-60 tokens, packed), DAPO, the default precision (bf16 autocast over fp32 weights), one thread each, one actor at
a time: their steps alternate, each batch trained by one then the other, so that drift in the machine's speed falls
on both.

Writes ``benchmarks/results/consumer_step.json``.

    python benchmarks/bench_consumer_step.py [--steps 12]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.results_file import write_result  # noqa: E402


def rollout_batch(seed: int):
    import numpy as np
    from bench_step_profile import batch

    from coati.distributed.record import RolloutBatch

    (pid, pm, rid, rm), _, _ = batch(seed)
    n, rmask = len(pid), rm.numpy().astype(bool)
    rewards = np.random.default_rng(seed).permuted(np.tile([0.0, 1.0], n // 2)).astype(np.float32)
    return RolloutBatch(
        prompt_ids=pid.numpy(),
        prompt_mask=pm.numpy().astype(bool),
        response_ids=rid.numpy(),
        response_mask=rmask,
        rollout_logprobs=np.where(rmask, -3.0, 0.0).astype(np.float32),
        response_lengths=rmask.sum(1),
        truncated=np.zeros(n, bool),
        group_ids=np.repeat(np.arange(n // 4), 4),
        policy_version=np.zeros(n, np.int64),
        token_versions=np.zeros(rmask.shape, np.int64),
        rewards=rewards,
    ).validate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12, help="timed steps of each (after 2 warm-up steps)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(HERE))
    import ray

    from coati.default_model import default_model_path
    from coati.distributed.algo.presets import resolve_algorithm
    from coati.distributed.driver.actor_group import cpu_actor_env
    from coati.distributed.inference.config import GenerationConfig
    from coati.distributed.runtime.placement import free_port
    from coati.distributed.trainer.config import ConsumerConfig
    from coati.distributed.trainer.consumer import GRPOConsumer
    from coati.distributed.trainer.plan import TrainerPlan

    class ColossalAIConsumer(GRPOConsumer):
        def setup(self):
            import coati.distributed.trainer.engine as engine_module

            engine_module.fold_clipping = lambda *a: None
            info = super().setup()
            self.runner._grad_sync = lambda last: contextlib.nullcontext()  # DDP's all-reduce in every backward
            return info

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    env = {"num_cpus": 1, "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}}}
    actors = {}
    for name, cls in (("coati", GRPOConsumer), ("ColossalAI", ColossalAIConsumer)):
        actors[name] = (
            ray.remote(cls)
            .options(**cpu_actor_env(env, 0))
            .remote(
                0,
                TrainerPlan(
                    1,
                    "127.0.0.1",
                    free_port(),
                    default_model_path(),
                    ConsumerConfig(),
                    resolve_algorithm("DAPO"),
                    GenerationConfig(max_new_tokens=48),
                    4,
                ),
            )
        )
        info = ray.get(actors[name].setup.remote())
        print(f"{name}: clipping {info['clipping']}, compute {info['compute_dtype']}")
    batches = [rollout_batch(seed) for seed in range(6)]
    times = {name: [] for name in actors}
    for i in range(args.steps + 2):
        for name, actor in actors.items():
            metrics = ray.get(actor.train_step.remote(batches[i % len(batches)], total_steps=100))
            if i >= 2:
                times[name].append(metrics["time/train_step"])
    mean = {name: statistics.mean(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"{name:<11} mean {mean[name]:.3f} s per step, median {statistics.median(t):.3f} ({len(t)} steps)")
    print(f"ColossalAI / coati: {mean['ColossalAI'] / mean['coati']:.3f}x")
    ray.shutdown()
    result = {
        "steps": args.steps,
        "seconds_per_step": {name: {"mean": mean[name], "median": statistics.median(t)} for name, t in times.items()},
        "colossalai_over_coati": mean["ColossalAI"] / mean["coati"],
    }
    print(f"wrote {write_result('consumer_step', result)}")


if __name__ == "__main__":
    main()
