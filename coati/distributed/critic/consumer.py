"""CriticConsumer: one critic rank, a Ray shell over a value-head engine (``trainer.engine.build_engine`` with
``value_head``) and its step (``step.CriticStep``). The driver asks it for the values of a step's batch before the
step trains, then trains it on the returns while the policy trains; it checkpoints beside the policy's consumers
(``<checkpoint>/critic``) and hands its weights over for the export of ``final/critic``."""

from __future__ import annotations

import os

import torch

from coati.distributed.critic.plan import CriticPlan
from coati.distributed.critic.step import CriticStep
from coati.distributed.record import RolloutBatch
from coati.distributed.runtime.liveness import start_heartbeat
from coati.distributed.runtime.startup import mark, marks
from coati.distributed.runtime.threads import ThreadLease
from coati.distributed.trainer.engine import build_engine
from coati.distributed.trainer.offload import Residency, resident


class CriticConsumer:
    def __init__(self, rank: int, plan: CriticPlan):
        mark("imported")
        start_heartbeat()
        self.rank, self.plan = rank, plan
        self.threads = ThreadLease()

    def setup(self) -> dict:
        mark("setup")
        p = self.plan
        self.engine = build_engine(
            self.rank,
            p.world_size,
            p.master_addr,
            p.master_port,
            p.model_path,
            p.trainer,
            False,  # no reference model
            p.seed,
            self.threads,
            value_head=True,
        )
        self.step = CriticStep(self.engine, p.trainer, p.algorithm, p.generation, self.threads)
        e = self.engine
        self.residency = Residency(e.device, lambda: (e.model.unwrap(),), lambda: e.optimizer)
        mark("ready")
        return {**self.engine.describe(), "startup": marks()}

    def set_threads(self, n: int, call: int) -> None:
        self.threads.lend(n, call)

    @resident
    def values(self, batch: RolloutBatch, threads: int | None = None, call: int | None = None) -> dict:
        """V(s_t) of this rank's DP shard of ``batch`` (``CriticStep.values``)."""
        with self.threads.running(call, threads):
            return self.step.values(batch)

    @resident
    def train_step(
        self, batch: RolloutBatch, threads: int | None = None, call: int | None = None, total_steps: int | None = None
    ) -> dict:
        with self.threads.running(call, threads):
            metrics = self.step.run(batch, total_steps or self.step.step_count + 1)
        return self.residency.reloaded(metrics, "time/critic_reload")

    def offload(self, copy: bool = False) -> dict:
        """Park the critic's weights and optimizer states in host memory (``GRPOConsumer.offload``)."""
        return self.residency.park(copy)

    @resident
    def weights(self) -> dict[str, torch.Tensor]:
        """The critic's whole weights on CPU under the Hugging Face names; collective over its TP group (every rank
        takes part, each returns them)."""
        from coati.distributed.trainer.colossal_policy import gathered_weights  # deferred: imports ColossalAI

        return {k: v.cpu().clone() for k, v in gathered_weights(self.engine.model.unwrap()).items()}

    @resident
    def save_checkpoint(self, folder: str) -> bool:
        os.makedirs(os.path.join(folder, "critic"), exist_ok=True)
        self.engine.save(os.path.join(folder, "critic"), self.step.step_count)
        return True

    @resident
    def load_checkpoint(self, folder: str) -> int:
        self.step.step_count = self.engine.load(os.path.join(folder, "critic"))
        return self.step.step_count
