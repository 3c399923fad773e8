"""The consumer's step under pipeline parallelism (``pp_size > 1``): minibatches and log-probs through ColossalAI's
pipeline schedule, which passes hidden states between stages, so every row's prompt is computed in full and the
last stage computes the loss from the model's own logits. A strategy ``StepRunner`` holds and calls in place of its
plain passes; it is given what it uses (the engine, the passes, the loss), and reads nothing else of the runner's."""

from __future__ import annotations

from collections.abc import Callable

import torch

from coati.distributed.algo.logprobs import logprobs_and_entropy
from coati.distributed.record import RolloutBatch
from coati.distributed.trainer.forward import model_inputs, response_logits
from coati.distributed.trainer.step_inputs import MicroBatch, StepTensors


class PipelineStep:
    def __init__(self, engine, passes, num_microbatches: int, temperature: float, loss: Callable):
        """``loss(batch, micro, logprobs, entropy, norm, metrics)``: the step's policy loss of a micro-batch."""
        self.engine, self.passes, self.loss = engine, passes, loss
        self.num_microbatches, self.temperature = num_microbatches, temperature

    def minibatch(self, batch, rows, local, step: StepTensors, norm) -> float:
        """One minibatch (``rows`` of the batch, ``local`` of the shard) through ColossalAI's pipeline schedule. The
        last stage computes the loss per micro-batch in ``criterion``; the schedule divides it by the number of
        micro-batches, which we undo so the loss keeps its global normalisation. (The schedule calls criterion in
        micro-batch order, which the counter relies on.) Returns this rank's loss of the minibatch (the sum over its
        micro-batches)."""
        old_lp = step.old_logprobs[local] if step.old_logprobs is not None else None
        ref_lp = step.ref_logprobs[local] if step.ref_logprobs is not None else None
        t = self.passes.tensors(batch, rows, trim=False)  # the schedule splits one padded minibatch into micro-batches
        inputs = model_inputs(**t)
        r = t["response_ids"].shape[1]
        n_micro = self.num_microbatches
        size = len(rows) // n_micro
        seen = {"i": 0, "loss": 0.0}
        device = self.engine.device

        def criterion(outputs, _micro):
            i = seen["i"]
            seen["i"] += 1
            sl = slice(i * size, (i + 1) * size)
            logits = response_logits(outputs.logits, r, self.engine.vocab_size)
            logprobs, entropy = logprobs_and_entropy(logits, t["response_ids"][sl], self.temperature, True)
            micro = MicroBatch(
                rows[sl],
                step.loss_mask[rows[sl]].to(device),
                step.advantages[rows[sl]].to(device),
                old_lp[sl] if old_lp is not None else None,
                ref_lp[sl] if ref_lp is not None else None,
                self.passes.rollout_logprobs(batch, rows[sl]),
            )
            loss = self.loss(batch, micro, logprobs, entropy, norm, step.metrics)
            seen["loss"] += loss.item()
            return loss * n_micro

        e = self.engine
        with e.compute():
            e.booster.execute_pipeline(iter([inputs]), e.model, criterion, e.optimizer, return_loss=True)
        return seen["loss"]

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch, rows, chunk: int) -> torch.Tensor | None:
        """Current-policy log-probs of ``rows`` [len(rows), R] through the pipeline, forward only (the schedule
        skips backward under no_grad), ``chunk`` rows per pass; on the last stage, None on the others."""
        out = []
        size = chunk // self.num_microbatches
        for lo in range(0, len(rows), chunk):
            t = self.passes.tensors(batch, rows[lo : lo + chunk], trim=False)
            micro = iter(t["response_ids"].split(size))  # the schedule calls criterion once per micro-batch, in order

            def criterion(outputs, _batch, micro=micro):
                ids = next(micro)
                logits = response_logits(outputs.logits, ids.shape[1], self.engine.vocab_size)
                out.append(logprobs_and_entropy(logits, ids, self.temperature)[0])
                return logits.new_zeros(())

            e = self.engine
            with e.compute():
                e.booster.execute_pipeline(iter([model_inputs(**t)]), e.model, criterion, None, return_loss=False)
        return torch.cat(out) if out else None
