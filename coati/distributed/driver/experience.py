"""What a step's batch gets before it trains, for the estimators beyond group baselines: the critic's values, the
policy's and the reference's log-probs for the KL in the reward (its coefficient from the adaptive controller), and
the running reward statistics (``normalize_reward``). Asked of the actors at once, put together here into the batch's
``Experience`` (``record.py``), so the policy and the critic derive the same advantages and returns from it; the
controller's and the statistics' state is part of every checkpoint."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.algo.kl_reward import KLController, RunningMoments, kl_penalty
from coati.distributed.record import Experience, RolloutBatch


class ExperienceMaker:
    def __init__(self, algo: AlgorithmConfig, actors):
        self.algo, self.actors = algo, actors
        self.kl = KLController(algo.init_kl_coef, algo.kl_target, algo.kl_horizon)
        self.moments = RunningMoments()

    @property
    def needed(self) -> bool:
        a = self.algo
        return a.uses_critic or a.kl_in_reward or a.normalize_reward or bool(self.actors.references)

    def attach(self, batch: RolloutBatch, generating: bool) -> tuple[RolloutBatch, dict]:
        """``batch`` with its experience, and the experience's metrics; the KL controller then moves by the batch's
        KL (the next step's coefficient)."""
        import ray

        a, metrics = self.algo, {}
        parts = {}
        if a.uses_critic or a.kl_in_reward or self.actors.references:
            parts = self.actors.experience(
                ray.put(batch),
                len(batch),
                batch.response_ids.shape[1],
                a.uses_critic,
                a.kl_in_reward,
                generating,
                ref=bool(self.actors.references),
            )
        scored = batch.rewards[~batch.left_out()]
        if a.normalize_reward:
            self.moments.update(scored)
            metrics["reward/running_mean"], metrics["reward/running_std"] = self.moments.mean, self.moments.std
        exp = Experience(
            values=parts.get("values"),
            old_logprobs=parts.get("old"),
            ref_logprobs=parts.get("ref"),
            kl_coef=self.kl.value,
            reward_mean=self.moments.mean if a.normalize_reward else 0.0,
            reward_std=self.moments.std if a.normalize_reward else 1.0,
        )
        if a.kl_in_reward:
            mask = torch.tensor(batch.trained_mask(), dtype=torch.float32)
            _, per_completion = kl_penalty(
                torch.from_numpy(exp.old_logprobs), torch.from_numpy(exp.ref_logprobs), mask, 1.0, a.kl_reward_estimator
            )
            kl = float(per_completion[torch.from_numpy(~batch.left_out())].mean()) if len(scored) else 0.0
            metrics["reward/kl"], metrics["reward/kl_coef"] = kl, self.kl.value
            self.kl.update(kl, len(batch))
        if exp.values is not None:
            valid = batch.trained_mask()
            metrics["critic/values_mean"] = float(np.mean(exp.values[valid])) if valid.any() else float("nan")
        return dataclasses.replace(batch, experience=exp), metrics

    def state(self) -> dict:
        return {"kl": self.kl.state(), "moments": self.moments.state()}

    def restore(self, state: dict | None) -> None:
        if state:
            self.kl.restore(state["kl"])
            self.moments.restore(state["moments"])
