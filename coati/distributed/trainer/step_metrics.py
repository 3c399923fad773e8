"""A training step's metrics. Consumers' (``StepMetrics``): reduced over micro-batches and then over data-parallel
ranks, each by its kind: a key ending in ``_max`` is a maximum (the largest value any micro-batch on any rank saw),
``_min`` a minimum, any other key a mean weighted by the tokens each micro-batch contributed; every consumer returns
the same reduced values, so they describe the whole global batch, not DP rank 0's shard. The driver's
(``rollout_metrics``): the rows drawn for the step and the rows it trained.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np
import torch

from coati.distributed.algo.distill import teacher_metrics
from coati.distributed.guards import reward_failures
from coati.distributed.model.pixels import seen_images
from coati.distributed.record import RewardStatus, RolloutBatch, call_values, called_rows, group_versions


def metric_kind(key: str) -> str:
    if key.endswith("_max"):
        return "max"
    if key.endswith("_min"):
        return "min"
    return "mean"


class StepMetrics:
    def __init__(self):
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)
        self.extremes: dict[str, float] = {}

    def add(self, key: str, value: float, weight: float) -> None:
        """One micro-batch's value of ``key``; ``weight`` is its number of loss tokens (for means)."""
        kind = metric_kind(key)
        value = float(value)
        if kind == "mean":
            self.sums[key] += value * weight
            self.weights[key] += weight
        elif key not in self.extremes:
            self.extremes[key] = value
        else:
            self.extremes[key] = max(self.extremes[key], value) if kind == "max" else min(self.extremes[key], value)

    def reduce(self, all_reduce: Callable[[torch.Tensor, str], None] | None = None) -> dict[str, float]:
        """The reduced metrics; ``all_reduce(tensor, op)`` (op: "sum", "max" or "min", in place) combines them across
        data-parallel ranks, which must have added the same keys."""
        means = sorted(self.sums)
        maxes = sorted(k for k in self.extremes if metric_kind(k) == "max")
        mins = sorted(k for k in self.extremes if metric_kind(k) == "min")
        sums = torch.tensor([[self.sums[k] for k in means], [self.weights[k] for k in means]], dtype=torch.float64)
        hi = torch.tensor([self.extremes[k] for k in maxes], dtype=torch.float64)
        lo = torch.tensor([self.extremes[k] for k in mins], dtype=torch.float64)
        if all_reduce is not None:
            for tensor, op in ((sums, "sum"), (hi, "max"), (lo, "min")):
                if tensor.numel():
                    all_reduce(tensor, op)
        out = {k: float(sums[0, i] / max(float(sums[1, i]), 1e-9)) for i, k in enumerate(means)}
        out.update({k: float(hi[i]) for i, k in enumerate(maxes)})
        out.update({k: float(lo[i]) for i, k in enumerate(mins)})
        return out


def rollout_metrics(step: int, batch, draws, num_generations: int, max_staleness: int, tokenizer) -> dict:
    """``reward/*`` and ``response/*`` over the rows drawn for this step (``draws.rollouts``, before filtering);
    ``reward/train_batch_mean``, the lags and two sample rows over the rows it trained (``batch``, trained from
    version step - 1). Row lag: from the row's oldest token; token lag: per trained token."""
    drawn = RolloutBatch.concat(draws.rollouts) if draws.rollouts else batch
    return {
        **drawn_metrics(drawn, draws, num_generations),
        **trained_metrics(step, batch, num_generations, max_staleness),
        "samples": sample_rows(batch, tokenizer, num_generations),
    }


def drawn_metrics(drawn, draws, n: int) -> dict:
    """The rewards, responses, draws and producer threads of the rows drawn for a step (``drawn``)."""
    ex, calls = drawn.extras, called_rows(drawn)
    threads, start, end = (call_values(drawn, k) for k in ("threads", "threads_start", "threads_end"))
    lent = threads is not None and start is not None and end is not None
    out = {
        "reward/mean": float(drawn.rewards.mean()),
        "reward/strict_accuracy": float(np.mean(ex["answer_ok"])) if "answer_ok" in ex else float("nan"),
        "reward/lenient_accuracy": float(np.mean(ex["lenient_ok"])) if "lenient_ok" in ex else float("nan"),
        "response/length_mean": float(drawn.response_lengths.mean()),
        "response/truncated_frac": float(drawn.truncated.mean()),
        "response/tokens": int(drawn.response_lengths.sum()),
        "rollout/drawn_groups": len(drawn) // n,
        "rollout/draws": draws.draws,
        "rollout/dropped_zero_signal_groups": draws.dropped_zero_signal_groups,
        "rollout/filled_zero_signal_groups": draws.filled_zero_signal_groups,
        "rollout/stale_dropped_groups": draws.stale_dropped_groups,
        "rollout/skipped_prompts": sum(int(c.get("skipped_prompts", 0)) for c in calls),
        "rollout/threads": max((int(c["threads"]) for c in calls if "threads" in c), default=1),  # a call's most
        # Rows of rounds that took the consumers' cores once training ended, and of those that gave them back when
        # the next training step began before the round ended.
        "rollout/rows_lent_cores": int((threads > start).sum()) if lent else 0,
        "rollout/rows_cores_taken_back": int((threads > end).sum()) if lent else 0,
        **reward_failures(drawn.failed(), drawn.reward_status == RewardStatus.TIMEOUT),
        **episode_metrics(ex),
        "reward/judge_unread": int(ex["judge_unread"].sum()) if "judge_unread" in ex else 0,
        "reward/no_score": int(drawn.unscored().sum()),
        "reward/rm_truncated": int(ex["rm_truncated"].sum()) if "rm_truncated" in ex else 0,
        # each reward component's mean over the drawn rows (when the reward has components)
        **{
            f"reward/component/{k[len('component/') :]}": float(np.mean(v))
            for k, v in ex.items()
            if k.startswith("component/")
        },
    }
    for key in ("time/generate", "time/reward_wait", "time/teacher", "time/producer_total"):
        if any(key in c for c in calls):
            out[key] = max(float(c[key]) for c in calls if key in c)
    return out


def trained_metrics(step: int, batch, n: int, max_staleness: int) -> dict:
    """The reward, lags, versions and token counts of the rows a step trained (``batch``, from version step - 1)."""
    lag = (step - 1) - batch.policy_version
    mask = batch.trained_mask()  # the sampled tokens (an episode's environment tokens carry no version)
    token_lag = ((step - 1) - batch.token_versions)[mask]
    versions = np.where(mask, batch.token_versions, batch.policy_version[:, None])
    out = {
        "reward/train_batch_mean": float(batch.rewards.mean()),
        "rollout/policy_lag_mean": float(lag.mean()),
        "rollout/policy_lag_max": int(lag.max()),
        "rollout/token_lag_mean": float(token_lag.mean()) if token_lag.size else 0.0,
        # Real tokens the step trained on, and the same with each group's prompt counted once (the compute needed).
        "rollout/trained_tokens": int(batch.prompt_mask.sum() + batch.response_lengths.sum()),
        "rollout/trained_tokens_unique": int(batch.prompt_mask[::n].sum() + batch.response_lengths.sum()),
        "rollout/trained_response_tokens": int(batch.response_lengths.sum()),
        "rollout/mixed_version_rows": int((versions.max(-1) > versions.min(-1)).sum()),
    }
    group_lag = (step - 1) - group_versions(batch)
    for j, count in enumerate(np.bincount(group_lag[::n], minlength=max_staleness + 1)):
        out[f"rollout/lag{j}_groups"] = int(count)  # trained groups whose oldest row started j versions back
    out["rollout/prompt_index"] = batch.extras["prompt_index"][::n].tolist()
    if batch.teacher_logprobs is not None:  # on-policy distillation: the teacher on the tokens the step trains
        t = (torch.from_numpy(np.asarray(a)) for a in (batch.rollout_logprobs, batch.teacher_logprobs))
        out.update(teacher_metrics(*t, torch.from_numpy(batch.teacher_top1), torch.from_numpy(mask)))
    if "episode" in batch.extras:
        out["rollout/epoch"] = batch.extras["episode"][::n].tolist()
    return out


def sample_rows(batch, tokenizer, n: int) -> list[dict]:
    """The first row of the first two trained groups, decoded, with its reward, version and verdicts; with a
    vision-language model's processor for ``tokenizer``, its prompt's images as the model received them (base64
    PNGs, ``model.pixels.seen_images``)."""
    rows = []
    for i in range(0, min(len(batch), 2 * n), n):
        row = {
            "prompt": tokenizer.decode(batch.prompt_ids[i][batch.prompt_mask[i]].tolist()),
            "response": tokenizer.decode(batch.response_ids[i, : batch.response_lengths[i]].tolist()),
            "reward": float(batch.rewards[i]),
            "policy_version": int(batch.policy_version[i]),
            **_verdicts(batch.extras, i),
        }
        if batch.pixel_index is not None and hasattr(tokenizer, "image_processor"):
            row["images"] = seen_images(batch.pixels[batch.pixel_index[i]], tokenizer.image_processor)
        rows.append(row)
    return rows


def _verdicts(ex: dict, i: int) -> dict:
    """A sample row's reference answer and the reward's verdicts on it, where the batch carries them."""
    out = {"reference": str(ex["reference"][i])} if "reference" in ex else {}
    for key, name in (("answer_ok", "strict_ok"), ("lenient_ok", "lenient_ok")):
        if key in ex:
            out[name] = bool(ex[key][i])
    return out


def episode_metrics(ex: dict) -> dict:
    """``env/*`` of multi-turn episodes (none for single-turn rollouts): model turns, tool calls, and the episodes
    that ended by the turn limit, by the token budget or by an environment failure."""
    if "turns" not in ex:
        return {}
    return {
        "env/turns_mean": float(np.mean(ex["turns"])),
        "env/turns_max": int(np.max(ex["turns"])),
        "env/tool_calls_mean": float(np.mean(ex["tool_calls"])),
        "env/turn_limit_frac": float(np.mean(ex["turn_limit"])),
        "env/errors": int(np.sum(ex["env_error"])),
    }
