"""Pure conversions from inference-engine outputs to a RolloutBatch (unit-tested without the engines).

vLLM: ``RequestOutput.outputs[j]`` has ``token_ids``, ``logprobs`` (one ``{token_id: Logprob}`` per token, with
``SamplingParams(logprobs=0)`` holding the sampled token), ``finish_reason`` ('stop' or 'length') and
``weight_versions`` (spans ``[start, end)`` of output tokens sampled by the weights labelled ``version``; None when the
engine had no label).
SGLang: ``Engine.generate(..., return_logprob=True)`` returns dicts with ``output_ids`` and ``meta_info`` holding
``output_token_logprobs`` (``(logprob, token_id, text)`` per token) and ``finish_reason`` (``{'type': ...}``).
Which log-probs each engine reports, and so when ``logprobs_valid`` holds, is the backend's business (see
``vllm_backend.py`` and ``sglang_backend.py``); without valid log-probs the batch's are zero.
"""

from __future__ import annotations

import numpy as np

from coati.distributed.record import RolloutBatch, batch_from_responses


def _batch(prompts, n, tokens, logprobs, finished, pad_id, logprobs_valid) -> RolloutBatch:
    valid = {"logprobs_valid": np.full(len(prompts) * n, logprobs_valid)}
    return batch_from_responses(prompts, n, tokens, logprobs if logprobs_valid else None, finished, pad_id, valid)


def token_versions_from_spans(spans, length: int) -> np.ndarray:
    """int64 [length]: the version of each output token, from vLLM's contiguous ``weight_versions`` spans."""
    out = np.empty(length, dtype=np.int64)
    covered = 0
    for span in spans:
        assert span.start == covered and span.end <= length, (span, covered, length)
        out[span.start : span.end] = int(span.version)
        covered = span.end
    assert covered == length, f"weight-version spans cover {covered} of {length} tokens"
    return out


def rollout_from_vllm(outputs, prompts, n: int, pad_id: int, logprobs_valid: bool) -> RolloutBatch:
    """``outputs``: one RequestOutput per prompt (in order), each with n completions."""
    assert len(outputs) == len(prompts), (len(outputs), len(prompts))
    tokens, logprobs, finished, versions = [], [], [], []
    for req in outputs:
        assert len(req.outputs) == n, f"expected {n} completions, got {len(req.outputs)}"
        for comp in req.outputs:
            ids = list(comp.token_ids)
            tokens.append(ids)
            if logprobs_valid:
                assert comp.logprobs is not None and len(comp.logprobs) == len(ids)
                logprobs.append([step[t].logprob for t, step in zip(ids, comp.logprobs, strict=True)])
            finished.append(comp.finish_reason != "length")
            spans = getattr(comp, "weight_versions", None)
            versions.append(None if spans is None else token_versions_from_spans(spans, len(ids)))
    batch = _batch(prompts, n, tokens, logprobs, finished, pad_id, logprobs_valid)
    if all(v is not None for v in versions):
        batch.token_versions = np.zeros(batch.response_ids.shape, dtype=np.int64)
        for i, v in enumerate(versions):
            batch.token_versions[i, : len(v)] = v
    return batch


def rollout_from_sglang(outputs, prompts, n: int, pad_id: int, logprobs_valid: bool) -> RolloutBatch:
    """``outputs``: one dict per row, rows prompt-major (each prompt repeated n times)."""
    assert len(outputs) == len(prompts) * n, (len(outputs), len(prompts), n)
    tokens, logprobs, finished = [], [], []
    for out in outputs:
        ids = list(out["output_ids"])
        meta = out["meta_info"]
        tokens.append(ids)
        if logprobs_valid:
            steps = meta["output_token_logprobs"]
            assert [s[1] for s in steps] == ids, "log-prob token ids do not match output_ids"
            logprobs.append([s[0] for s in steps])
        reason = meta.get("finish_reason") or {}
        finished.append((reason.get("type") if isinstance(reason, dict) else reason) != "length")
    return _batch(prompts, n, tokens, logprobs, finished, pad_id, logprobs_valid)
