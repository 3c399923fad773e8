"""GRPOConsumer: the training actor, a Ray shell over its units. ColossalAI Booster + HybridParallelPlugin +
HybridAdam (``engine``); algorithm-blind.

Each training step receives the global RolloutBatch of the step (every DP rank gets the same object-store reference),
computes advantages over all of it, keeps its DP shard, and runs ``train_batch_size / train_minibatch_size``
optimizer steps of micro-batched forward/backward passes (``num_iterations`` times over the shard): ``step``, with the
passes of ``passes``. What the algorithm is comes only from the AlgorithmConfig fields: estimator, loss, aggregation,
KL, masking. Rank 0 pushes the new weights to the producers (``weights``).
"""

from __future__ import annotations

import torch

from coati.distributed.record import RolloutBatch
from coati.distributed.runtime.liveness import start_heartbeat
from coati.distributed.runtime.startup import mark, marks
from coati.distributed.runtime.threads import ThreadLease
from coati.distributed.trainer.engine import build_engine
from coati.distributed.trainer.offload import Residency, resident
from coati.distributed.trainer.passes import Passes
from coati.distributed.trainer.plan import TrainerPlan
from coati.distributed.trainer.step import StepRunner, batch_advantages
from coati.distributed.trainer.weights import WeightSender

__all__ = ["GRPOConsumer", "batch_advantages"]


class GRPOConsumer:
    """One consumer rank: ``plan`` its role's inputs, resolved once by preflight (``TrainerPlan``), ``rank`` its
    identity."""

    def __init__(self, rank: int, plan: TrainerPlan):
        mark("imported")  # the worker is up and this module's imports are done
        start_heartbeat()
        self.threads = ThreadLease()
        """the cores of the training step in progress, raised by ``set_threads``"""
        self.rank, self.world_size = rank, plan.world_size
        self.master_addr, self.master_port = plan.master_addr, plan.master_port
        self.model_path = plan.model_path
        self.cfg, self.algo, self.generation = plan.consumer, plan.algorithm, plan.generation
        self.n = plan.num_generations
        self.seed = plan.seed
        self.reference_inside = plan.reference_inside

    def setup(self) -> dict:
        """Build the engine and the units over it; returns where the rank runs, how it computes and its start-up
        marks."""
        mark("setup")
        self.engine = build_engine(
            self.rank,
            self.world_size,
            self.master_addr,
            self.master_port,
            self.model_path,
            self.cfg,
            # a reference for the KL in the loss or in the reward, unless servers of its own hold it
            (self.algo.beta > 0 or self.algo.kl_in_reward) and self.reference_inside,
            self.seed,
            self.threads,
        )
        mark("engine")
        self.passes = Passes(self.engine, self.cfg, self.generation, self.n)
        self.runner = StepRunner(self.engine, self.passes, self.cfg, self.algo, self.generation, self.n, self.threads)
        self.sender = WeightSender(self.engine, self.cfg)
        e = self.engine
        self.residency = Residency(e.device, lambda: (e.model.unwrap(), e.ref_model), lambda: e.optimizer)
        mark("ready")
        return {
            **self.engine.describe(),
            "startup": marks(),
            "shares_prompts": self.passes.share_prompts,
            "layouts": self.passes.layouts,
        }

    # ---- training --------------------------------------------------------------------------------------------

    def set_threads(self, n: int, call: int) -> None:
        """Train call ``call`` uses ``n`` threads from its next decoder layer (forward or backward) or pass on
        (called on a second thread: the driver lends the cores of producers that have stopped; ``ThreadLease``)."""
        self.threads.lend(n, call)

    @resident
    def train_step(
        self,
        batch: RolloutBatch,
        threads: int | None = None,
        call: int | None = None,
        total_steps: int | None = None,
        update: bool = True,
    ) -> dict:
        """One training step on the global batch of the step, with ``threads`` CPU threads (None: this actor's own;
        a ``set_threads`` for the same ``call`` may raise it while the step runs), of a run of ``total_steps`` (the
        learning-rate schedule's horizon); returns its metrics reduced over every DP rank. Without ``update`` (a
        critic's warm-up step) the step is counted and nothing trains: {}."""
        assert total_steps is not None or self.cfg.lr_schedule == "constant", "a decaying schedule needs its horizon"
        if not update:
            self.runner.step_count += 1
            return {}
        with self.threads.running(call, threads):  # cores go back to the producers with the step's end
            metrics = self.runner.run(batch, total_steps or self.runner.step_count + 1)
        return self.residency.reloaded(metrics)

    @resident
    def experience(self, batch: RolloutBatch, threads: int | None = None, call: int | None = None) -> dict | None:
        """The KL penalty's log-probs of this rank's DP shard before the step trains: {"rows", "old", "ref"} (float32
        [S, R]: the policy's and, where this rank holds the reference, the reference's), from the rank of each shard
        that holds them (TP rank 0); None from the others."""
        e = self.engine
        out = {}
        with self.threads.running(call, threads):
            out["rows"] = rows = self.runner.shard_rows(batch)
            out["old"] = self.passes.logprobs_no_grad(e.model, batch, rows).float().cpu().numpy()
            if e.ref_model is not None:
                out["ref"] = self.passes.logprobs_no_grad(e.ref_model, batch, rows).float().cpu().numpy()
        return out if e.tp_rank == 0 else None

    # ---- weights ---------------------------------------------------------------------------------------------

    def join_weight_group(
        self, world_size: int, group_name: str, backend: str, timeout_s: float, wire_dtype: str | None = None
    ) -> bool:
        """Join ``group_name`` as its sender (``WeightSender.join``)."""
        self.sender.join(world_size, group_name, backend, timeout_s, wire_dtype)
        return True

    @resident
    def push_weights(self, version: int) -> dict:
        """Push the weights of ``version`` to the producers (``WeightSender.push``): seconds and fingerprints."""
        return self.sender.push(version)

    @resident
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self.sender.full_state_dict()

    @resident
    def adapter(self) -> dict[str, torch.Tensor]:
        return self.sender.adapter()

    @resident
    def weights(self) -> dict[str, torch.Tensor]:
        return self.sender.weights()

    def offload(self, copy: bool = False) -> dict:
        """Park the weights, gradients, optimizer states and reference in host memory until the next call that needs
        them (``run.offload_trainers``; ``Residency.park``; ``copy``: copied even on a CPU trainer, and back)."""
        return self.residency.park(copy)

    # ---- checkpoints -----------------------------------------------------------------------------------------

    @resident
    def save_checkpoint(self, folder: str) -> bool:
        """This rank's shards of the model and optimizer, its RNG and step (``Engine.save``)."""
        self.engine.save(folder, self.runner.step_count)
        return True

    @resident
    def load_checkpoint(self, folder: str) -> int:
        self.runner.step_count = self.engine.load(folder)
        return self.runner.step_count
