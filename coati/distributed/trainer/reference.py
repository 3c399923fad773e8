"""ReferenceServer: the frozen reference policy as a Ray actor group of its own (``layout.ref_procs``), placed on its
own nodes or beside the actor's, as OpenRLHF runs its reference models. Each server holds a whole replica and answers
for a share of a step's rows: the reference's log-probs at the sampling temperature, as the consumers compute them
(``forward.sequence_logprobs``). Without such a group each policy consumer holds the reference itself (``engine``)."""

from __future__ import annotations

import numpy as np
import torch

from coati.distributed.record import RolloutBatch
from coati.distributed.runtime.liveness import start_heartbeat
from coati.distributed.runtime.placement import whereabouts
from coati.distributed.runtime.startup import mark, marks
from coati.distributed.runtime.threads import ThreadLease
from coati.distributed.trainer.forward import row_tensors, sequence_logprobs, token_budget_chunks


class ReferenceServer:
    def __init__(self, model_path: str, temperature: float, microbatch_tokens: int = 8192):
        mark("imported")
        start_heartbeat()
        from coati.distributed.trainer.engine import reference_model  # deferred: imports ColossalAI

        self.device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        self.model = reference_model(model_path, self.device)
        self.temperature, self.budget = temperature, microbatch_tokens
        self.threads = ThreadLease()
        self.vocab_size = self.model.config.vocab_size
        mark("ready")

    def ping(self) -> dict:
        return {**whereabouts(), "startup": marks()}

    def set_threads(self, n: int, call: int) -> None:
        self.threads.lend(n, call)

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch, rows, threads: int | None = None, call: int | None = None) -> dict:
        """{"rows": rows, "ref": float32 [len(rows), R]}: the reference's log-probs of those rows of ``batch``."""
        rows = np.asarray(rows)
        out = np.zeros((len(rows), batch.response_ids.shape[1]), dtype=np.float32)
        with self.threads.running(call, threads):
            lengths = batch.prompt_mask[rows].sum(-1), batch.response_lengths[rows]
            for chunk in token_budget_chunks(*lengths, 1, self.budget, False):
                t = row_tensors(batch, rows[chunk], self.device)
                self.threads.apply()
                lp, _ = sequence_logprobs(self.model, **t, temperature=self.temperature, vocab_size=self.vocab_size)
                out[chunk, : lp.shape[1]] = lp.float().cpu().numpy()
        return {"rows": rows, "ref": out}
