"""Consumer training options with real Ray and ColossalAI: gradient checkpointing trains the same step as keeping the
activations, the learning-rate schedule's warmup reaches the optimizer (the schedule over several steps is checked in
test_datasets' run), and passes over a batch train as minibatches of its copies, the first pass's forward giving
the old log-probs."""

import dataclasses

import numpy as np
import pytest
import ray
import torch

from coati.distributed.algo.presets import resolve_algorithm
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.record import RolloutBatch
from coati.distributed.runtime.placement import free_port
from coati.distributed.trainer.config import ConsumerConfig
from coati.distributed.trainer.consumer import GRPOConsumer
from coati.distributed.trainer.plan import TrainerPlan
from coati.distributed.trainer.schedule import lr_factor
from tests.e2e.runs import start_run

LR = 1e-3


def one_step(tiny, checkpointing: bool):
    # Both compute every row in full, so that the step is the same to float rounding (Adam's first step moves a weight
    # by about lr x the sign of its gradient: a gradient near 0 that rounds differently flips it). Checkpointing alone
    # would pack each group in one row (its recompute keeps no KV cache); that layout under checkpointing is checked
    # against the model's own gradients in test_forward.py.
    shared = {"share_prompt_forward": False}
    options = {"gradient_checkpointing": True, **shared} if checkpointing else shared
    consumer = {"learning_rate": LR, "compute_dtype": "fp32", "lr_schedule": "linear", "warmup_steps": 2}
    run = start_run(tiny, consumer={**consumer, "train_microbatch_size": None, **options})
    try:
        (info,) = run.actors.consumer_info
        assert info["gradient_checkpointing"] is checkpointing
        assert info["layouts"] == ("rows",)
        before = run.full_weights()
        metrics = run.loop(max_steps=1, eval_interval=0, save_interval=0, save_dir=None, on_step=None)["history"][0]
        return metrics, {k: v - before[k] for k, v in run.full_weights().items()}
    finally:
        run.shutdown()


def test_gradient_checkpointing_trains_the_same_step(ray_cluster, tiny):
    (kept, d_kept), (recomputed, d_recomputed) = one_step(tiny, False), one_step(tiny, True)
    assert kept["reward/mean"] == recomputed["reward/mean"]  # the same rollouts
    for key in ("loss/policy", "actor/grad_norm", "actor/entropy"):
        assert recomputed[key] == pytest.approx(kept[key], rel=1e-5), key
    for name, d in d_kept.items():
        assert torch.allclose(d_recomputed[name], d, atol=1e-7), name
    # The first of two warmup steps runs at half the rate: Adam's first step moves each weight with a gradient by
    # about its learning rate, so the largest move is that half.
    half = LR * lr_factor(0, 1, "linear", warmup=2)
    assert half == LR / 2 and kept["actor/lr"] == pytest.approx(half)
    assert max(float(d.abs().max()) for d in d_kept.values()) == pytest.approx(half, rel=0.02)


def test_sequence_parallel_trainers_train_the_single_trainers_step(ray_cluster, tiny):
    """Two trainers splitting every pass's columns (sp_size=2, all_to_all), with gradient
    checkpointing recomputing the split layers, take the step one trainer takes: the same rollouts, loss, gradient
    norm and weights."""

    def step(**consumer):
        consumer = {"learning_rate": LR, "compute_dtype": "fp32", "train_microbatch_size": None, **consumer}
        run = start_run(tiny, consumer=consumer)
        try:
            before = run.full_weights()
            metrics = run.loop(max_steps=1, eval_interval=0, save_interval=0, save_dir=None, on_step=None)["history"]
            return metrics[0], {k: v - before[k] for k, v in run.full_weights().items()}
        finally:
            run.shutdown()

    one, d_one = step()
    split, d_split = step(gradient_checkpointing=True, num_consumer_procs=2, plugin={"sp_size": 2})
    assert split["reward/mean"] == one["reward/mean"]  # the same rollouts
    for key in ("loss/policy", "actor/grad_norm", "actor/entropy"):  # GRPO's first loss is 0 up to rounding
        assert split[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    # Adam's first step moves a weight by lr g / (|g| + eps): where |g| is near eps, the gradient's rounding shows
    # in the move (a few weights per tensor here); every move agrees to 1% of lr.
    for name, d in d_one.items():
        gap = (d_split[name] - d).abs()
        assert float(gap.max()) < LR / 100 and int((gap > 1e-7).sum()) <= d.numel() // 1000 + 1, name


def plan(world_size: int, port: int, tiny: str, cfg: ConsumerConfig) -> TrainerPlan:
    """A consumer's plan for one GRPO step over two completions per prompt."""
    algorithm, generation = resolve_algorithm("GRPO"), GenerationConfig(max_new_tokens=6)
    return TrainerPlan(world_size, "127.0.0.1", port, tiny, cfg, algorithm, generation, 2)


class CountingConsumer(GRPOConsumer):
    """A consumer that counts the rows its policy's forwards cover (with gradients or without)."""

    forwarded_rows = 0

    def setup(self):
        info = super().setup()
        logprobs = self.passes.logprobs

        def counting(model, t, **kw):
            if model is self.engine.model:
                self.forwarded_rows += len(t["response_ids"])
            return logprobs(model, t, **kw)

        self.passes.logprobs = counting
        return info

    def rows_forwarded(self) -> int:
        return self.forwarded_rows


def consumer_after_one_step(tiny, batch, **consumer):
    """A real consumer actor's metrics (with ``forwarded_rows``: rows its policy's forwards covered) and weights
    after one training step on ``batch`` (two completions per prompt, GRPO)."""
    cfg = ConsumerConfig(learning_rate=LR, lr_schedule="linear", warmup_steps=2, compute_dtype="fp32", **consumer)
    actor = ray.remote(CountingConsumer).options(num_cpus=0.5).remote(0, plan(1, free_port(), tiny, cfg))
    try:
        ray.get(actor.setup.remote())
        metrics = ray.get(actor.train_step.remote(batch, total_steps=4))
        return {**metrics, "forwarded_rows": ray.get(actor.rows_forwarded.remote())}, ray.get(actor.weights.remote())
    finally:
        ray.kill(actor)


def rollouts(groups: int, seed: int = 0):
    """``groups`` prompts of two completions each, of uneven lengths, with rewards that differ within every group."""
    rng = np.random.default_rng(seed)
    n, p, r = 2 * groups, 5, 6
    lengths = rng.integers(2, r + 1, n)
    response_mask = np.arange(r)[None] < lengths[:, None]
    return RolloutBatch(
        prompt_ids=np.repeat(rng.integers(4, 60, (groups, p)), 2, axis=0),
        prompt_mask=np.ones((n, p), bool),
        response_ids=rng.integers(4, 60, (n, r)) * response_mask,
        response_mask=response_mask,
        rollout_logprobs=np.where(response_mask, -3.0, 0.0).astype(np.float32),
        response_lengths=lengths,
        truncated=np.zeros(n, bool),
        group_ids=np.repeat(np.arange(groups), 2),
        policy_version=np.zeros(n, np.int64),
        token_versions=np.zeros((n, r), np.int64),
        rewards=rng.permuted(np.tile([0.0, 1.0], groups)).astype(np.float32),
    ).validate()


def test_passes_over_a_batch_train_as_minibatches_of_its_copies(ray_cluster, tiny):
    """num_iterations=2 over a batch makes the same two optimizer steps as one pass over the batch written out twice,
    in two minibatches: each pass's ratios against the trainer's log-probs from before the step's first update, the
    learning-rate schedule counting both optimizer steps."""
    once = rollouts(2)
    twice = dataclasses.replace(
        once,
        **{
            f.name: np.concatenate([getattr(once, f.name)] * 2)
            for f in dataclasses.fields(once)
            if f.name not in ("loss_mask", "turn_index") and isinstance(getattr(once, f.name), np.ndarray)
        },
    )
    twice.group_ids[4:] += 2
    passes, w_passes = consumer_after_one_step(tiny, once, train_batch_size=2, num_iterations=2)
    copies, w_copies = consumer_after_one_step(tiny, twice.validate(), train_batch_size=4, train_minibatch_size=2)
    one, w_one = consumer_after_one_step(tiny, once, train_batch_size=2)
    for key in ("loss/policy", "loss/clipfrac", "loss/ratio_mean", "actor/entropy", "actor/grad_norm", "actor/lr"):
        assert passes[key] == pytest.approx(copies[key], rel=1e-6, abs=1e-9), key
    for name, w in w_copies.items():
        assert torch.allclose(w_passes[name], w, rtol=0, atol=1e-7), name
    # The second pass trained on ratios away from 1. The warmup's 2 training steps are 4 optimizer steps with two
    # passes: the step's second optimizer step ran at 2/4 of the rate (as the copies' did), not at the full rate.
    assert passes["loss/ratio_mean"] != 1.0 and one["loss/ratio_mean"] == 1.0
    assert passes["actor/lr"] == pytest.approx(LR / 2) == one["actor/lr"]
    assert max(float((w_passes[k] - w).abs().max()) for k, w in w_one.items()) > LR / 4
    # The old log-probs cost no forward of their own where the first pass computes them before any update: the two
    # passes forward the batch's 4 rows twice; the copies' first minibatch likewise, the second needs one more.
    assert (one["forwarded_rows"], passes["forwarded_rows"], copies["forwarded_rows"]) == (4, 8, 12)


class MomentsConsumer(GRPOConsumer):
    """A consumer that reports Adam's first moments and counts torch DDP's gradient all-reduces (one per bucket of
    each backward that synchronises)."""

    def setup(self):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        info = super().setup()
        self.all_reduces = 0

        def counting(group, bucket):
            self.all_reduces += 1
            return allreduce_hook(group, bucket)

        self.engine.model.module.register_comm_hook(self.engine.plugin.dp_group, counting)
        return info

    def counted(self) -> int:
        return self.all_reduces

    def first_moments(self) -> torch.Tensor:
        """Adam's first moments of every parameter, flattened in the optimizer's order (0.1 x the gradients after
        one step: the weights, which Adam's first step moves by about lr x the sign of each gradient, would hide a
        clip, and flip where a gradient rounds across 0)."""
        opt = self.engine.optimizer.optim
        return torch.cat([opt.state[p]["exp_avg"].reshape(-1) for g in opt.param_groups for p in g["params"]])


class ColossalClippingConsumer(MomentsConsumer):
    """A consumer that clips as ColossalAI's optimizer wrapper does (float64 norm, gradients scaled in a pass of
    their own), for comparison."""

    def setup(self):
        import coati.distributed.trainer.engine as engine_module

        engine_module.fold_clipping = lambda *args: None
        return super().setup()


def one_step_of(tiny, cls, dp: int = 1, **consumer):
    """One GRPO step of ``dp`` consumers of class ``cls`` over 2 groups each (4 rows): the setup's clipping, each
    rank's all-reduce count, the gradient norm, and rank 0's Adam first moments."""
    cfg = ConsumerConfig(learning_rate=LR, compute_dtype="fp32", train_batch_size=2, **consumer)
    port = free_port()
    actors = [ray.remote(cls).options(num_cpus=0.5).remote(rank, plan(dp, port, tiny, cfg)) for rank in range(dp)]
    try:
        (info, *_) = ray.get([a.setup.remote() for a in actors])
        metrics = ray.get([a.train_step.remote(rollouts(2 * dp), total_steps=4) for a in actors])
        counts = ray.get([a.counted.remote() for a in actors])
        return info["clipping"], counts, metrics[0]["actor/grad_norm"], ray.get(actors[0].first_moments.remote())
    finally:
        for a in actors:
            ray.kill(a)


def test_clipping_in_the_update_trains_as_colossalai_clipping_does(ray_cluster, tiny):
    """The norm measured in float32 blocks and the clip applied by Adam's update as it reads the gradients give the
    update ColossalAI's own clipping gives, checked where a clip shows: Adam's first moments, (1 - beta1) x the
    clipped gradients. (Unclipped, the divisor is 1 and the update is Adam's as before.) One DP rank never
    all-reduces its gradients."""
    max_grad_norm = 0.05
    folded, counts, norm, m = one_step_of(tiny, MomentsConsumer, max_grad_norm=max_grad_norm)
    theirs, _, their_norm, their_m = one_step_of(tiny, ColossalClippingConsumer, max_grad_norm=max_grad_norm)
    assert (folded, theirs) == ("in the update", "colossalai")
    assert norm == pytest.approx(their_norm, rel=1e-6) and norm > max_grad_norm  # the step clips
    torch.testing.assert_close(m, their_m, rtol=1e-5, atol=1e-12)
    assert float(m.double().norm()) == pytest.approx(0.1 * max_grad_norm, rel=1e-5)
    assert counts == [0]


def test_ddp_all_reduces_once_per_minibatch(ray_cluster, tiny):
    """With two DP ranks, passes before a minibatch's last accumulate their gradients unsynchronised: 4 passes per
    rank all-reduce as often as 1, and train the same gradients."""
    _, passes, norm, m_passes = one_step_of(tiny, MomentsConsumer, dp=2, train_microbatch_size=1)
    _, whole, whole_norm, m_whole = one_step_of(tiny, MomentsConsumer, dp=2, train_microbatch_size=4)
    assert passes == whole and whole[0] > 0  # one all-reduce per bucket, in the last pass only
    assert norm == pytest.approx(whole_norm, rel=1e-5)
    torch.testing.assert_close(m_passes, m_whole, rtol=1e-4, atol=1e-9)
