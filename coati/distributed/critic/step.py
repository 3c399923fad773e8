"""A critic rank's work on a step's batch: the values V(s_t) of its DP shard before the step trains (``values``),
then its training step on the estimator's returns (``CriticStep.run``): the same rows, minibatches and passes as the
policy's step (``trainer.step.StepPlan``), each micro-batch's clipped value loss (``algo.value_loss``) aggregated
over its global minibatch's valid tokens, one optimizer step per minibatch."""

from __future__ import annotations

import time

import numpy as np
import torch

from coati.distributed.algo import LossNorm, aggregate_loss
from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.algo.value_loss import explained_variance, value_loss
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.record import RolloutBatch
from coati.distributed.runtime.threads import ThreadLease
from coati.distributed.trainer.config import ConsumerConfig
from coati.distributed.trainer.engine import Engine
from coati.distributed.trainer.forward import model_inputs, row_tensors, token_budget_chunks
from coati.distributed.trainer.step import StepPlan, dp_all_reduce, step_estimate, step_loss_mask
from coati.distributed.trainer.step_metrics import StepMetrics


class CriticStep:
    def __init__(
        self, engine: Engine, cfg: ConsumerConfig, algo: AlgorithmConfig, generation: GenerationConfig, threads
    ):
        self.engine, self.cfg, self.algo, self.generation = engine, cfg, algo, generation
        self.threads: ThreadLease = threads
        self.step_count = 0
        """training steps taken (restored from a checkpoint)"""

    def plan(self, batch: RolloutBatch) -> StepPlan:
        e, c = self.engine, self.cfg
        return StepPlan(len(batch), e.dp_size, e.dp_rank, c.num_minibatches, c.num_iterations)

    def tensors(self, batch: RolloutBatch, rows) -> dict[str, torch.Tensor]:
        return row_tensors(batch, rows, self.engine.device)

    def forward(self, t: dict) -> torch.Tensor:
        """[N, R] V(s_t) before each of the R response tokens: the head's output at the position that predicts it."""
        r = t["response_ids"].shape[1]
        with self.engine.compute():
            out = self.engine.model(**model_inputs(**t))
        return out.logits[:, -(r + 1) : -1, 0].float()

    def chunks(self, batch: RolloutBatch, rows: np.ndarray) -> list[slice]:
        """``rows`` (ordered by length) in passes of at most ``train_microbatch_tokens`` padded tokens."""
        return token_budget_chunks(
            batch.prompt_mask[rows].sum(-1), batch.response_lengths[rows], 1, self.cfg.train_microbatch_tokens, False
        )

    def by_length(self, batch: RolloutBatch, rows: np.ndarray) -> np.ndarray:
        return rows[np.argsort(batch.prompt_mask[rows].sum(-1) + batch.response_lengths[rows], kind="stable")]

    @torch.no_grad()
    def values(self, batch: RolloutBatch) -> dict:
        """{"rows": this rank's DP shard, "values": float32 [S, R]} (zeros on padding)."""
        rows = self.plan(batch).shard_rows
        out = np.zeros((len(rows), batch.response_ids.shape[1]), dtype=np.float32)
        ordered = np.argsort(batch.prompt_mask[rows].sum(-1) + batch.response_lengths[rows], kind="stable")
        for chunk in self.chunks(batch, rows[ordered]):
            idx = ordered[chunk]
            self.threads.apply()
            t = self.tensors(batch, rows[idx])
            v = self.forward(t)
            out[idx, : v.shape[1]] = (v * t["response_mask"]).cpu().numpy()
        return {"rows": rows, "values": out}

    def run(self, batch: RolloutBatch, total_steps: int) -> dict:
        """One training step on the returns of the global ``batch``; its metrics, reduced over the DP ranks."""
        start, e, metrics = time.perf_counter(), self.engine, StepMetrics()
        plan = self.plan(batch)
        loss_mask = step_loss_mask(batch, self.algo)
        returns = step_estimate(batch, loss_mask, self.algo).returns
        assert returns is not None and batch.experience is not None and batch.experience.values is not None
        old_values = torch.from_numpy(np.array(batch.experience.values, dtype=np.float32))
        step_loss, per_step = 0.0, plan.optimizer_steps
        e.steps.begin()
        for k in range(per_step):
            m = k % plan.num_minibatches
            norm = LossNorm.from_mask(loss_mask[plan.global_rows(m)], self.generation.max_new_tokens, plan.dp_size)
            rows = self.by_length(batch, plan.shard_rows[plan.local(m)])
            losses = []
            for chunk in self.chunks(batch, rows):
                self.threads.apply()
                losses.append(self._microbatch(batch, rows[chunk], loss_mask, returns, old_values, norm, metrics))
            step_loss += sum(losses) / e.dp_size / per_step
            e.steps.step(losses, self.step_count * per_step + k, total_steps * per_step, per_step)
        self.step_count += 1
        out = metrics.reduce((lambda t, op: dp_all_reduce(e, t, op)) if e.dp_size > 1 else None)
        total = torch.tensor([step_loss], dtype=torch.float64)
        if e.dp_size > 1:
            torch.distributed.all_reduce(total, group=e.plugin.dp_group)
        valid = loss_mask > 0
        out["critic/value_loss"] = float(total)
        out["critic/return_mean"] = float(returns[valid].mean()) if valid.any() else float("nan")
        out["critic/explained_variance"] = explained_variance(old_values, returns, loss_mask)
        out["time/critic_step"] = time.perf_counter() - start
        out.update(e.steps.report())
        return out

    def _microbatch(self, batch, rows, loss_mask, returns, old_values, norm, metrics: StepMetrics) -> float:
        """Forward and backward of one micro-batch's value loss; returns the loss."""
        e = self.engine
        t = self.tensors(batch, rows)
        r = t["response_ids"].shape[1]
        values = self.forward(t)
        mask = loss_mask[rows, :r].to(e.device)
        token_loss, m = value_loss(
            values, old_values[rows, :r].to(e.device), returns[rows, :r].to(e.device), mask, self.algo.value_clip
        )
        loss = aggregate_loss(token_loss, mask, "token-mean", norm)
        e.booster.backward(loss, e.optimizer)
        weight = float(mask.sum())
        for k, v in m.items():
            metrics.add(k, v, weight)
        return loss.item()
