"""A producer's share of a held-out evaluation: greedy rollouts of its held-out rows, scored as training scores them;
the counts the driver adds up (``EvalShare``) and every item's prediction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from coati.distributed.record import RolloutBatch


@dataclass
class EvalShare:
    """One producer's share of an evaluation."""

    count: int = 0
    strict_correct: int = 0
    lenient_correct: int = 0
    reward_errors: int = 0
    scored: int = 0
    """items the reward scored (no error, a score)"""
    reward_sum: float = 0.0
    """the sum of the scored items' rewards"""
    plain: int = 0
    """items whose reward is a plain number (it defines no strict or lenient check; ``answer_ok`` then means the
    reward reached its maximum)"""
    first_error: str = ""
    """the first scoring error's message ("" without one)"""
    items: list[dict] = field(default_factory=list)
    """each item's prediction: index, prompt, response, reference, strict_ok, lenient_ok"""


def evaluate_share(
    rows: list[dict],
    indices: list[int],
    microbatch_size: int,
    rollouts: Callable[[list[dict]], tuple[RolloutBatch, list]],
    decode: Callable[[list[int]], str],
) -> EvalShare:
    """Greedy rollouts (``rollouts``: one per row, with their reward futures) of ``rows[i]`` for each of ``indices``,
    ``microbatch_size`` rows at a time, counted and kept item by item."""
    out = EvalShare(count=len(indices))
    for lo in range(0, len(indices), microbatch_size):
        chunk = indices[lo : lo + microbatch_size]
        batch, scored = rollouts([rows[i] for i in chunk])
        for j, (index, future) in enumerate(zip(chunk, scored, strict=True)):
            r = future.result()
            lenient = bool(r.info.get("lenient_ok", r.answer_ok))
            out.strict_correct += bool(r.answer_ok)
            out.lenient_correct += lenient
            failed = bool(r.info.get("error"))
            out.reward_errors += failed
            if not failed and not r.info.get("no_score"):
                out.scored += 1
                out.reward_sum += float(r.reward)
            out.plain += bool(r.info.get("plain"))
            out.first_error = out.first_error or str(r.info.get("error") or "")
            row = rows[index]
            out.items.append(
                {
                    "index": index,
                    "prompt": row.get("prompt", row.get("messages")),
                    "response": decode(batch.response_ids[j, : batch.response_lengths[j]].tolist()),
                    "reference": row.get("gt_answer"),
                    "strict_ok": bool(r.answer_ok),
                    "lenient_ok": lenient,
                    "reward": None if failed or r.info.get("no_score") else float(r.reward),
                }
            )
    return out
