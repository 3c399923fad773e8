"""One training step of a consumer rank: the step's plan (``StepPlan``: the rank's DP shard, its minibatches and the
global rows each minibatch's loss is normalised over; pure), advantages over the global batch, the old and reference
log-probs, then for each minibatch its passes' forward, loss and backward and an optimizer step (``StepRunner``; the
pipelined minibatch in ``pipeline_step``). Returns the step's metrics reduced over the DP ranks."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from coati.distributed.algo import ADVANTAGE_ESTIMATORS, AdvantageOutput, LossInput, LossNorm, compute_policy_loss
from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.algo.distill import distill_advantages
from coati.distributed.algo.grouping import without_unscored
from coati.distributed.algo.kl_reward import kl_penalty
from coati.distributed.algo.shaping import mask_truncated
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.record import RolloutBatch, fresh_rows
from coati.distributed.runtime.threads import ThreadLease
from coati.distributed.trainer.config import ConsumerConfig
from coati.distributed.trainer.engine import Engine
from coati.distributed.trainer.passes import Passes
from coati.distributed.trainer.pipeline_step import PipelineStep
from coati.distributed.trainer.step_inputs import MicroBatch, StepTensors
from coati.distributed.trainer.step_metrics import StepMetrics

log = logging.getLogger(__name__)


def step_loss_mask(batch: RolloutBatch, algo) -> torch.Tensor:
    """float32 [B, T]: the sampled tokens that train (truncated rows masked when ``algo.mask_truncated``); the policy
    and the critic train on the same."""
    loss_mask = torch.tensor(batch.trained_mask(), dtype=torch.float32)  # a copy: object-store arrays are read-only
    return mask_truncated(loss_mask, torch.tensor(batch.truncated)) if algo.mask_truncated else loss_mask


def step_estimate(batch: RolloutBatch, loss_mask: torch.Tensor, algo) -> AdvantageOutput:
    """Advantages (and a critic's returns) of a batch under ``algo``'s estimator, with what the driver added to it
    (``batch.experience``: the critic's values, the KL penalty's log-probs and coefficient, reward statistics) and,
    when the run distils, the teacher's per-token term (``algo/distill.py``); a
    completion without a score (its reward function's None, or a scoring error or timeout) is left out of its
    group's statistics, and its loss mask is empty."""
    group_ids = torch.tensor(batch.group_ids)
    left_out = batch.left_out()
    if left_out.any():
        group_ids = without_unscored(group_ids, torch.tensor(~left_out))
    exp = batch.experience
    rewards = torch.tensor(batch.rewards)
    values = token_rewards = None
    if exp is not None:
        rewards = ((rewards.double() - exp.reward_mean) / (exp.reward_std + 1e-8)).float()
        values = None if exp.values is None else torch.from_numpy(np.array(exp.values, dtype=np.float32))
        if algo.kl_in_reward:
            old, ref = (torch.from_numpy(np.array(a, dtype=np.float32)) for a in (exp.old_logprobs, exp.ref_logprobs))
            token_rewards, _ = kl_penalty(old, ref, loss_mask, exp.kl_coef, algo.kl_reward_estimator)
    else:
        assert not (algo.uses_critic or algo.kl_in_reward), "values and KL rewards come with the batch's experience"
    out = ADVANTAGE_ESTIMATORS.get(algo.advantage_estimator)(
        rewards, group_ids, loss_mask, algo, values=values, token_rewards=token_rewards
    )
    if algo.distills:  # the teacher's per-token term beside (OPD: instead of) the reward's
        assert batch.teacher_logprobs is not None, "a distilling run's batches carry the teacher's log-probs"
        student, teacher = (
            torch.from_numpy(np.array(a, dtype=np.float32)) for a in (batch.rollout_logprobs, batch.teacher_logprobs)
        )
        out = dataclasses.replace(
            out, advantages=out.advantages + distill_advantages(student, teacher, loss_mask, algo.distill_coef)
        )
    return out


def batch_advantages(batch: RolloutBatch, loss_mask: torch.Tensor, algo) -> torch.Tensor:
    """[B, T] advantages of a batch under ``algo``'s estimator (``step_estimate``)."""
    return step_estimate(batch, loss_mask, algo).advantages


@dataclass(frozen=True)
class StepPlan:
    """How a step's ``rows`` (prompt-major, whole groups) divide: DP rank ``dp_rank`` of ``dp_size`` trains the
    contiguous shard ``shard_rows``, in ``num_minibatches`` minibatches, ``num_iterations`` passes over them; the loss
    of minibatch m is normalised over ``global_rows(m)``, the rows of minibatch m on every rank."""

    rows: int
    dp_size: int
    dp_rank: int
    num_minibatches: int
    num_iterations: int

    @property
    def shard(self) -> int:
        return self.rows // self.dp_size

    @property
    def minibatch(self) -> int:
        """rows of one minibatch on one rank"""
        return self.shard // self.num_minibatches

    @property
    def optimizer_steps(self) -> int:
        return self.num_minibatches * self.num_iterations

    @property
    def shard_rows(self) -> np.ndarray:
        return np.arange(self.dp_rank * self.shard, (self.dp_rank + 1) * self.shard)

    def local(self, m: int) -> np.ndarray:
        """Minibatch ``m`` as indices into the shard."""
        return np.arange(m * self.minibatch, (m + 1) * self.minibatch)

    def global_rows(self, m: int) -> np.ndarray:
        """Minibatch ``m``'s rows of the batch on every rank."""
        return np.concatenate(
            [
                np.arange(r * self.shard + m * self.minibatch, r * self.shard + (m + 1) * self.minibatch)
                for r in range(self.dp_size)
            ]
        )


def dp_all_reduce(engine: Engine, tensor: torch.Tensor, op: str) -> None:
    """All-reduce ``tensor`` (on CPU) in place over the engine's DP group: "sum", "max" or "min"."""
    ops = {"sum": torch.distributed.ReduceOp.SUM, "max": torch.distributed.ReduceOp.MAX}
    ops["min"] = torch.distributed.ReduceOp.MIN
    on_device = tensor.to(engine.device)
    torch.distributed.all_reduce(on_device, op=ops[op], group=engine.plugin.dp_group)
    tensor.copy_(on_device.cpu())


class StepRunner:
    def __init__(
        self,
        engine: Engine,
        passes: Passes,
        cfg: ConsumerConfig,
        algo: AlgorithmConfig,
        generation: GenerationConfig,
        num_generations: int,
        threads: ThreadLease,
    ):
        self.engine, self.passes, self.threads = engine, passes, threads
        self.cfg, self.algo, self.generation, self.n = cfg, algo, generation, num_generations
        self.step_count = 0
        """training steps taken (restored from a checkpoint)"""
        self._warned_unavailable = False
        self.pipeline = (
            PipelineStep(engine, passes, cfg.plugin.pp_num_microbatches, generation.temperature, self._loss)
            if cfg.plugin.pp_size > 1
            else None
        )
        """the minibatch and log-prob passes through ColossalAI's pipeline schedule (``pp_size > 1``), else None"""

    def shard_rows(self, batch: RolloutBatch) -> np.ndarray:
        """The rows of ``batch`` this rank's DP shard trains."""
        e = self.engine
        return StepPlan(len(batch), e.dp_size, e.dp_rank, 1, 1).shard_rows

    def run(self, batch: RolloutBatch, total_steps: int) -> dict:
        """One training step on the global ``batch`` of a run of ``total_steps`` (the learning-rate schedule's
        horizon); its metrics, reduced over the DP ranks."""
        start = time.perf_counter()
        metrics = StepMetrics()
        e = self.engine
        assert len(batch) % (e.dp_size * self.n) == 0, (len(batch), e.dp_size, self.n)
        plan = StepPlan(
            len(batch),
            e.dp_size,
            e.dp_rank,
            self.cfg.num_minibatches,
            self.cfg.num_iterations,
        )
        loss_mask = step_loss_mask(batch, self.algo)
        adv = batch_advantages(batch, loss_mask, self.algo)
        shard_rows = plan.shard_rows
        old_lp, t_old = None, time.perf_counter()
        exp = batch.experience
        if exp is not None and exp.old_logprobs is not None:  # computed for the KL penalty just before this step
            old_lp = torch.from_numpy(np.array(exp.old_logprobs[shard_rows], dtype=np.float32)).to(e.device)
        elif plan.optimizer_steps > 1:  # the policy before this step's first update, over the whole shard
            old_lp = (
                self.pipeline.logprobs(batch, shard_rows, plan.minibatch)
                if self.pipeline is not None
                else self.passes.old_logprobs(batch, shard_rows, plan.minibatch)
            )
        t_old = time.perf_counter() - t_old
        ref_lp = None
        if exp is not None and exp.ref_logprobs is not None:
            ref_lp = torch.from_numpy(np.array(exp.ref_logprobs[shard_rows], dtype=np.float32)).to(e.device)
        elif e.ref_model is not None and self.algo.beta > 0:
            ref_lp = self.passes.logprobs_no_grad(e.ref_model, batch, shard_rows)
        step = StepTensors(loss_mask, adv, old_lp, ref_lp, metrics)
        step_loss = torch.zeros(1, dtype=torch.float64)
        per_step = plan.optimizer_steps
        e.steps.begin()
        for k in range(per_step):  # pass k // num_minibatches over the batch, its minibatch k % num_minibatches
            losses = self._minibatch(batch, plan, k % plan.num_minibatches, step, k == 0)
            step_loss += sum(losses) / e.dp_size / per_step
            e.steps.step(losses, self.step_count * per_step + k, total_steps * per_step, per_step)
        self.step_count += 1
        agreement = self.passes.route_agreement()
        if agreement is not None:
            metrics.add("moe/routing_agreement", *agreement)
        out = metrics.reduce(self._dp_all_reduce if e.dp_size > 1 else None)
        if e.dp_size > 1:
            torch.distributed.all_reduce(step_loss, group=e.plugin.dp_group)
        out["loss/policy"] = float(step_loss)
        out["time/train_step"] = time.perf_counter() - start
        out["time/old_logprobs"] = t_old
        out["actor/threads"] = self.threads.used
        out.update(e.steps.report())
        return out

    def _minibatch(self, batch, plan: StepPlan, m: int, step: StepTensors, first: bool) -> list[float]:
        """Forward and backward of minibatch ``m`` of this rank's shard, in passes; returns each pass's loss. The
        step's ``first`` minibatch runs before any update: its forward writes its rows' old log-probs."""
        norm = LossNorm.from_mask(step.loss_mask[plan.global_rows(m)], self.generation.max_new_tokens, plan.dp_size)
        local, shard_rows = plan.local(m), plan.shard_rows
        if self.pipeline is not None:
            return [self.pipeline.minibatch(batch, shard_rows[local], local, step, norm)]
        order = self.passes.by_length(batch, shard_rows, local)
        losses = []
        chunks = self.passes.chunks(batch, shard_rows[order])
        for i, chunk in enumerate(chunks):
            idx = order[chunk]
            self.threads.apply()
            with self._grad_sync(last=i == len(chunks) - 1):
                losses.append(self._microbatch(batch, shard_rows[idx], idx, step, norm, first))
        return losses

    def _grad_sync(self, last: bool):
        """Whether torch DDP (which ColossalAI wraps the model in without PP, and with several DP ranks only without
        ZeRO) all-reduces this pass's gradients: only in the minibatch's last pass (the passes before accumulate
        theirs, which that all-reduce then sums), and never with one DP rank, where the all-reduce changes nothing
        yet copies every gradient into DDP's buckets. With expert parallelism (no DDP) the model's own
        ``sync_dp_grads`` averages them after the last pass."""
        if self.engine.ep_group is not None:  # no DDP with experts sharded: the model averages after the last pass
            return _then(self.engine.model.sync_dp_grads) if last else contextlib.nullcontext()
        ddp = self.engine.model.module
        if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel) or (last and self.engine.grad_ranks > 1):
            return contextlib.nullcontext()
        return ddp.no_sync()

    def _microbatch(self, batch, rows, idx, step: StepTensors, norm: LossNorm, first: bool) -> float:
        """Forward and backward of one micro-batch (``rows`` of the batch, ``idx`` of the shard), trimmed to its
        own longest prompt and response; returns its loss. ``first``: no update yet this step, so its log-probs are
        the old ones (kept in ``step.old_logprobs`` for the later passes)."""
        e = self.engine
        t = self.passes.tensors(batch, rows)
        r = t["response_ids"].shape[1]
        layout = self.passes.layout(t)
        logprobs, entropy = self.passes.logprobs(e.model, t, with_entropy=True, layout=layout)
        step.metrics.add("actor/packed_rows_frac", float(layout == "packed"), len(rows))
        old_lp, ref_lp = step.old_logprobs, step.ref_logprobs
        if first and old_lp is not None:
            old_lp[idx, :r] = logprobs.detach()
        micro = MicroBatch(
            rows,
            step.loss_mask[rows, :r].to(e.device),
            step.advantages[rows, :r].to(e.device),
            old_lp[idx, :r] if old_lp is not None else None,
            ref_lp[idx, :r] if ref_lp is not None else None,
            self.passes.rollout_logprobs(batch, rows, r),
        )
        loss = self._loss(batch, micro, logprobs, entropy, norm, step.metrics)
        # The pass's share of the minibatch's loss tokens over all DP ranks (token-mean: the shares sum to 1).
        share = float(micro.mask.sum()) * norm.dp_size / max(norm.num_tokens, 1.0)
        router = self.passes.router_loss(share, step.metrics)
        if router is not None:
            loss = loss + router
        e.booster.backward(loss, e.optimizer)
        return loss.item()

    def _loss(self, batch, micro: MicroBatch, logprobs, entropy, norm: LossNorm, metrics: StepMetrics):
        """The policy loss of a micro-batch's log-probs (``micro.old_logprobs`` None: they are their own old policy,
        detached), recording its metrics weighted by its loss tokens, the entropy and the engine-trainer gap; both
        the plain and the pipelined step call it."""
        mask, rollout = micro.mask, micro.rollout_logprobs
        inp = LossInput(
            logprobs=logprobs,
            old_logprobs=micro.old_logprobs if micro.old_logprobs is not None else logprobs.detach(),
            advantages=micro.advantages,
            mask=mask,
            ref_logprobs=micro.ref_logprobs,
            rollout_logprobs=rollout,
        )
        loss, m_metrics = compute_policy_loss(inp, self.algo, norm)
        self._behaviour_metrics(metrics, batch, micro.rows, inp.old_logprobs, rollout, mask)
        weight = float(mask.sum())
        for k, v in m_metrics.items():
            if k != "loss/policy":
                metrics.add(k, v, weight)
        metrics.add("actor/entropy", (entropy * mask).sum() / mask.sum().clamp(min=1), weight)
        return loss

    def _dp_all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        dp_all_reduce(self.engine, tensor, op)

    def _behaviour_metrics(self, metrics: StepMetrics, batch, rows, old, rollout, mask) -> None:
        """The engine-trainer log-prob gap over the fresh rows, those whose every token was sampled by the very
        weights this step starts from (so any gap is the engines' and precisions' difference, not staleness; a row
        that spans a push is left out whole, its later tokens attending to keys the earlier weights computed), and the
        share of tokens whose engine log-probs are not valid for the sampling settings (no off-policy correction
        possible for them)."""
        tokens = float(mask.sum())
        metrics.add("loss/is_unavailable_frac", float(rollout is None), tokens)
        if rollout is None:
            if self.algo.off_policy_correction != "none" and not self._warned_unavailable:
                self._warned_unavailable = True
                log.warning(
                    "consumer %d: the engine's log-probs are not valid for these sampling settings; %s is not "
                    "applied to such rows (loss/is_unavailable_frac)",
                    self.engine.rank,
                    self.algo.off_policy_correction,
                )
            return
        fresh = fresh_rows(batch.token_versions[rows][:, : mask.shape[1]], mask.cpu().numpy() > 0, self.step_count)
        same = torch.from_numpy(fresh[:, None]).to(mask) * mask
        n = float(same.sum())
        if n:
            metrics.add("rollout/engine_trainer_gap_abs", ((old.detach() - rollout).abs() * same).sum() / n, n)


@contextlib.contextmanager
def _then(action):
    """Runs ``action`` after the block."""
    yield
    action()
