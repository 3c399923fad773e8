"""The consumer's step under pipeline parallelism (``pp_size > 1``): minibatches and log-probs through ColossalAI's
pipeline schedule, which passes hidden states between stages, so every row's prompt is computed in full and the
last stage computes the loss from the model's own logits. Mixed into ``StepRunner``, whose state it uses."""

from __future__ import annotations

import torch

from coati.distributed.algo.logprobs import logprobs_and_entropy
from coati.distributed.record import RolloutBatch
from coati.distributed.trainer.forward import model_inputs, response_logits


class PipelineSteps:
    def _pipeline_minibatch(self, batch, rows, loss_mask, adv, norm, metrics, old_lp, ref_lp) -> float:
        """One minibatch through ColossalAI's pipeline schedule. The last stage computes the loss per micro-batch in
        ``criterion``; the schedule divides it by the number of micro-batches, which we undo so the loss keeps its
        global normalisation. (The schedule calls criterion in micro-batch order, which the counter relies on.)
        ``old_lp``/``ref_lp``: this minibatch's old-policy and reference log-probs (last stage; None when unused).
        Returns this rank's loss of the minibatch (the sum over its micro-batches)."""
        t = self.passes.tensors(batch, rows, trim=False)  # the schedule splits one padded minibatch into micro-batches
        inputs = model_inputs(**t)
        r = t["response_ids"].shape[1]
        n_micro = self.cfg.plugin.pp_num_microbatches
        size = len(rows) // n_micro
        seen = {"i": 0, "loss": 0.0}

        def criterion(outputs, _micro):
            i = seen["i"]
            seen["i"] += 1
            sl = slice(i * size, (i + 1) * size)
            logits = response_logits(outputs.logits, r, self.engine.vocab_size)
            logprobs, entropy = logprobs_and_entropy(logits, t["response_ids"][sl], self.generation.temperature, True)
            loss = self._loss(
                batch,
                rows[sl],
                logprobs,
                entropy,
                loss_mask[rows[sl]].to(self.engine.device),
                adv[rows[sl]].to(self.engine.device),
                old_lp[sl] if old_lp is not None else None,
                ref_lp[sl] if ref_lp is not None else None,
                self.passes.rollout_logprobs(batch, rows[sl]),
                norm,
                metrics,
            )
            seen["loss"] += loss.item()
            return loss * n_micro

        e = self.engine
        with e.compute():
            e.booster.execute_pipeline(iter([inputs]), e.model, criterion, e.optimizer, return_loss=True)
        return seen["loss"]

    @torch.no_grad()
    def _pipeline_logprobs(self, batch: RolloutBatch, rows, chunk: int) -> torch.Tensor | None:
        """Current-policy log-probs of ``rows`` [len(rows), R] through the pipeline, forward only (the schedule
        skips backward under no_grad), ``chunk`` rows per pass; on the last stage, None on the others."""
        out = []
        size = chunk // self.cfg.plugin.pp_num_microbatches
        for lo in range(0, len(rows), chunk):
            t = self.passes.tensors(batch, rows[lo : lo + chunk], trim=False)
            micro = iter(t["response_ids"].split(size))  # the schedule calls criterion once per micro-batch, in order

            def criterion(outputs, _batch, micro=micro):
                ids = next(micro)
                logits = response_logits(outputs.logits, ids.shape[1], self.engine.vocab_size)
                out.append(logprobs_and_entropy(logits, ids, self.generation.temperature)[0])
                return logits.new_zeros(())

            e = self.engine
            with e.compute():
                e.booster.execute_pipeline(iter([model_inputs(**t)]), e.model, criterion, None, return_loss=False)
        return torch.cat(out) if out else None
