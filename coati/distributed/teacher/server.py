"""TeacherServer: one teacher model in a Ray actor of its own (``teacher.servers`` of them, placed as the reward
models' are), answering producers with the teacher's log-prob of each sampled token and whether that token is the
teacher's own argmax. Each request carries token ids only: the prompt as the teacher renders it (its chat template,
with any privileged context) and the completion the student sampled, the same ids under one tokenizer (checked by
preflight). A self-teacher (``self:N``) starts from the policy's folder and loads the policy's weights every N steps.
"""

from __future__ import annotations

import numpy as np
import torch

from coati.distributed.algo.logprobs import logprobs_and_entropy
from coati.distributed.record import left_pad, responses_from_token_lists
from coati.distributed.runtime.liveness import note_progress, start_heartbeat
from coati.distributed.runtime.placement import whereabouts
from coati.distributed.runtime.startup import mark, marks
from coati.distributed.trainer.forward import DecoderStates, model_inputs, token_budget_chunks


class TeacherServer:
    """Hosts one teacher; run as a Ray actor (``ray.remote(TeacherServer)``)."""

    def __init__(self, path: str, temperature: float, batch_tokens: int = 8192, threads: int = 1):
        mark("imported")
        start_heartbeat()
        mark("setup")
        torch.set_num_threads(threads)
        from coati.distributed.trainer.engine import reference_model  # deferred: imports ColossalAI

        self.device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        from transformers import AutoConfig

        self.model = reference_model(path, self.device)
        self.pad_id = int(AutoConfig.from_pretrained(path).pad_token_id or 0)
        """the id padding carries (masked: any id would do)"""
        self.temperature, self.budget = temperature, batch_tokens
        self.version = 0
        """the policy version a self-teacher holds (0: the folder's weights)"""
        mark("engine")
        mark("ready")

    def ping(self) -> dict:
        """Answered once the model has loaded: where the server runs and its start-up marks (``startup``)."""
        return {**whereabouts(), "startup": marks()}

    def load_weights(self, state: dict, version: int) -> int:
        """Take the policy's weights of ``version`` (a self-teacher's refresh); every tensor of the model must be
        there. Returns the version held."""
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        tied = {k for k in missing if "lm_head" in k and getattr(self.model.config, "tie_word_embeddings", False)}
        assert not (set(missing) - tied) and not unexpected, (sorted(missing)[:5], sorted(unexpected)[:5])
        self.version = version
        return version

    @torch.no_grad()
    def score(self, prompts: list[list[int]], responses: list[list[int]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """(log-probs float32 [len], top-1 bool [len]) of each response's tokens after its prompt, at the sampling
        temperature; forwards of at most ``batch_tokens`` padded tokens, each counted as progress."""
        assert len(prompts) == len(responses), (len(prompts), len(responses))
        order = np.argsort([len(p) + len(r) for p, r in zip(prompts, responses, strict=True)], kind="stable")
        out: list = [None] * len(prompts)
        lengths = np.array([len(prompts[i]) for i in order]), np.array([len(responses[i]) for i in order])
        for chunk in token_budget_chunks(*lengths, 1, self.budget, False):
            rows = order[chunk]
            answers = self._forward([prompts[i] for i in rows], [responses[i] for i in rows])
            for i, answer in zip(rows, answers, strict=True):
                out[i] = answer
            note_progress()
        return out

    def _forward(self, prompts: list[list[int]], responses: list[list[int]]) -> list[tuple[np.ndarray, np.ndarray]]:
        pad = self.pad_id
        p_ids, p_mask = left_pad(prompts, pad)
        r_ids, r_mask, _, lengths, _ = responses_from_token_lists(responses, None, [True] * len(responses), pad)
        t = {k: torch.from_numpy(v).to(self.device) for k, v in dict(p=p_ids, pm=p_mask, r=r_ids, rm=r_mask).items()}
        inputs = model_inputs(t["p"], t["pm"], t["r"], t["rm"])
        with DecoderStates(self.model) as d:
            self.model(**inputs, use_cache=False, logits_to_keep=1)
        real = t["rm"].bool()
        # Position j predicts token j + 1: response token k is predicted at position P - 1 + k.
        hidden = d.states[0][:, p_ids.shape[1] - 1 : -1][real]
        logits = d.lm_head(hidden).float()
        tokens = t["r"][real]
        lp, _ = logprobs_and_entropy(logits[None], tokens[None], self.temperature)
        top1 = logits.argmax(-1) == tokens
        lp, top1 = lp[0].cpu().numpy(), top1.cpu().numpy()
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        return [(lp[bounds[i] : bounds[i + 1]], top1[bounds[i] : bounds[i + 1]]) for i in range(len(responses))]
