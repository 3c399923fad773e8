"""The producer's scoring unit: completions to rewards. It owns the reward worker pools (the run's reward function
and the further functions among its components), the clients of the reward-model and judge servers and the running
normalisation, and turns the results of a draw into the record's typed reward fields. No Ray of its own: tests
drive it in process."""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, Future, wait

import numpy as np
import torch

from coati.distributed.algo.grouping import degenerate_groups
from coati.distributed.algo.shaping import overlong_penalty
from coati.distributed.guards import NOT_SCORED
from coati.distributed.record import RewardStatus, RolloutBatch
from coati.distributed.reward import RewardPool, RewardResult
from coati.distributed.reward.base import TrainerState
from coati.distributed.reward.compose import RunningNorm, combine, fill_unscored, normalize
from coati.distributed.reward.config import RewardConfig
from coati.distributed.reward.model_actors import RewardModelClient
from coati.distributed.reward.pool import RewardPools
from coati.distributed.reward.sandbox import ALLOW_DEGRADED_ENV
from coati.distributed.rollout.data import reward_fields

ERROR_CHARS = 300
"""the longest reason kept per failed row (fixed-width text: checkpoints hold no pickled objects)"""


class Scorer:
    """Scores the completions of groups of ``group_size`` under ``reward``; ``servers`` are the reward's model
    components ({"rm" or "judge": [(name, actor)]}, shared by all producers)."""

    def __init__(self, reward: RewardConfig, group_size: int, tokenizer, servers: dict[str, list] | None = None):
        self.reward, self.n, self.tokenizer = reward, group_size, tokenizer
        r = reward
        if r.allow_degraded_sandbox:  # the reward workers' and environments' sandboxes follow the run's setting
            os.environ[ALLOW_DEGRADED_ENV] = "1"
        pool = RewardPool(r.fn, r.workers, r.item_timeout_s, fn_kwargs=r.kwargs, batch_size=r.calls_of(r.fn, self.n))
        if r.other_fns:  # further reward functions among the components (TRL's list), each in its own pool
            others = {
                name: RewardPool(name, r.workers, r.item_timeout_s, batch_size=r.calls_of(name, self.n))
                for name in r.other_fns
            }
            pool = RewardPools(pool, others)
        self.pool = pool
        timeouts = {"rm": r.rm.timeout_s, "judge": r.judge.timeout_s}
        self.models = {
            c: RewardModelClient([a for _, a in named], [n for n, _ in named], timeouts[c], f"reward.{c}.timeout_s")
            for c, named in (servers or {}).items()
        }
        self.rm_norm = RunningNorm()
        """the reward model's statistics for running normalisation (checkpointed with the producer)"""

    def submit(self, batch: RolloutBatch, rows: list[dict], version: int) -> list[Future]:
        """Send a generated batch's completions (row i of ``batch`` answers ``rows[batch.group_ids[i]]``) to the
        reward pools, together, so that a batched reward function gets them in few calls; their futures."""
        items = []
        for i in range(len(batch)):
            ids = batch.response_ids[i, : batch.response_lengths[i]].tolist()
            row = rows[batch.group_ids[i]]
            fields = reward_fields(row)
            if "prompts" in self.pool.wants:
                fields["prompts"] = row.get("prompt", row.get("messages"))
            if "completion_ids" in self.pool.wants:
                fields["completion_ids"] = ids
            if "trainer_state" in self.pool.wants:
                fields["trainer_state"] = TrainerState(global_step=version)
            items.append((self.tokenizer.decode(ids, skip_special_tokens=True), fields, "messages" in row))
        futures = self.pool.submit_many(items)
        for future, (text, _, _) in zip(futures, items, strict=True):
            future.completion_text = text  # the reward models score the same text: decoded once, here
        return futures

    @staticmethod
    def done(results: list[RewardResult]) -> list[Future]:
        """Futures already holding ``results`` (rollouts scored where they ran: an environment's episodes)."""
        futures = []
        for result in results:
            futures.append(Future())
            futures[-1].set_result(result)
        return futures

    def gather(self, futures: list[Future]) -> list[RewardResult]:
        """The results of a draw's ``futures``, in order. Once more than ``max_error_fraction`` of the draw has failed
        (the driver stops the run on this draw whatever the rest scores) the rest is not waited for: each is failed
        as ``NOT_SCORED`` at once, so a reward function that hangs on every completion stops the run after a few
        item limits rather than one limit per completion."""
        allowed, failed, pending = self.reward.max_error_fraction * len(futures), 0, set(futures)
        while pending and failed <= allowed:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            failed += sum(_status(f.result()) in (RewardStatus.ERROR, RewardStatus.TIMEOUT) for f in done)
        reason = f"{NOT_SCORED}: {failed} of the draw's {len(futures)} completions had failed"
        skipped = RewardResult(0.0, info={"error": reason, "components": dict.fromkeys(self.reward.other_fns)})
        return [f.result() if f.done() else skipped for f in futures]

    def apply(
        self, out: RolloutBatch, results: list[RewardResult], rows: list[dict], texts: list | None = None
    ) -> None:
        """Fill ``out``'s reward fields from its rows' ``results`` (row i of ``out`` answers ``rows[i // n]``):
        ``task_rewards`` (the components' weighted sum; an unscored or failed row its group's scored mean),
        ``reward_status``, ``reward_error``, ``no_signal``, ``rewards`` (= task rewards, for the caller to shape) and
        the verdicts among the extras; an unscored or failed row is masked from the loss. ``texts``: the rows'
        completions as ``submit`` decoded them (None, or a None among them: decoded here where reward models need
        them)."""
        r = self.reward
        rewards = np.array([x.reward for x in results], dtype=np.float64)
        status = np.array([_status(x) for x in results], dtype=np.int8)
        others = {name: np.array([x.info["components"][name] for x in results], dtype=object) for name in r.other_fns}
        unscored = status == RewardStatus.NO_SCORE
        bad = np.flatnonzero(~np.isfinite(rewards) & ~unscored)
        if len(bad):
            i = int(bad[0])
            raise ValueError(
                f"reward function {r.fn} returned {rewards[i]} for row {out.extras['prompt_index'][i]} of the "
                f"training set ({len(bad)} non-finite of {len(rewards)}); rewards must be finite numbers"
            )
        # A function's None counts 0 beside the others' scores (TRL's sum); none scoring it at all is no score.
        for name, values in others.items():
            unscored &= np.array([v is None for v in values], dtype=bool)
            others[name] = np.array([0.0 if v is None else v for v in values], dtype=np.float64)
            if not np.isfinite(others[name]).all():
                raise ValueError(f"reward function {name} returned a non-finite reward; rewards must be finite numbers")
        status[(status == RewardStatus.NO_SCORE) & ~unscored] = RewardStatus.SCORED  # another function scored it
        rewards = np.where(np.isfinite(rewards), rewards, 0.0)
        rewards = self._compose(rewards.astype(np.float32), out, rows, others, texts)
        out.reward_status = status
        # No score, or scoring failed (an error, a timeout, a sandbox crash): its group's mean of the scored rows (so
        # reported means stay finite and no group gains a false signal), and no loss on it.
        left_out = out.left_out()
        if left_out.any():
            rewards = fill_unscored(rewards, left_out, self.n).astype(np.float32)
            out.loss_mask = out.trained_mask() & ~left_out[:, None]
            out.rollout_logprobs = np.where(out.loss_mask, out.rollout_logprobs, 0.0).astype(out.rollout_logprobs.dtype)
            if out.turn_index is not None:  # an episode's turns mark the tokens it trains: none now
                out.turn_index = np.where(out.loss_mask, out.turn_index, 0).astype(out.turn_index.dtype)
        out.task_rewards = rewards.astype(np.float32)
        out.rewards = out.task_rewards.copy()
        out.reward_error = np.array([str(x.info.get("error") or "")[:ERROR_CHARS] for x in results], dtype="<U300")
        out.no_signal = degenerate_groups(torch.from_numpy(out.task_rewards), torch.from_numpy(out.group_ids)).numpy()
        out.extras["answer_ok"] = np.array([x.answer_ok for x in results])
        out.extras["format_ok"] = np.array([x.format_ok for x in results])
        out.extras["lenient_ok"] = np.array([bool(x.info.get("lenient_ok", x.answer_ok)) for x in results])
        # each row's reference answer, for the samples a run keeps (fixed-width text, as every per-row string)
        references = [str(rows[i // self.n].get("gt_answer", "") or "")[:ERROR_CHARS] for i in range(len(out))]
        out.extras["reference"] = np.array(references, dtype="<U300")

    def _compose(
        self, fn_rewards: np.ndarray, out: RolloutBatch, rows: list[dict], others: dict, texts: list | None = None
    ) -> np.ndarray:
        """The reward: the components' weighted sum (the reward function's values alone when it is the only one; the
        further reward functions' ``others``), each component's values kept in ``extras["component/<name>"]``."""
        r = self.reward
        values = {r.fn: fn_rewards, **{k: v.astype(np.float32) for k, v in others.items()}}
        if self.models:
            if texts is None or len(texts) != len(out) or any(t is None for t in texts):
                texts = [
                    self.tokenizer.decode(
                        out.response_ids[i, : out.response_lengths[i]].tolist(), skip_special_tokens=True
                    )
                    for i in range(len(out))
                ]
            owners = [rows[i // self.n] for i in range(len(out))]  # rows are prompt-major, n per prompt
            prompts = [row.get("messages", row.get("prompt")) for row in owners]
        if "rm" in self.models:
            scored = self.models["rm"].score(prompts, texts)
            scores = np.array([score for score, _ in scored], dtype=np.float32)
            out.extras["rm_truncated"] = np.array([bool(note) for _, note in scored])  # scored on the text's end
            if not np.isfinite(scores).all():
                raise ValueError(
                    f"reward model {r.rm.path} returned {int((~np.isfinite(scores)).sum())} non-finite "
                    f"scores of {len(scores)}; check the model (its head, its dtype)"
                )
            values["rm"] = normalize(r.rm.normalize, scores, out.group_ids, self.rm_norm)
        if "judge" in self.models:
            graded = self.models["judge"].score(
                prompts, texts, [row.get("gt_answer") for row in owners], [row.get("rubric") for row in owners]
            )
            values["judge"] = np.array([score for score, _ in graded], dtype=np.float32)
            out.extras["judge_unread"] = np.array([bool(why) for _, why in graded])  # read as 0: the reason kept
            out.extras["judge_unread_msg"] = np.array([why[:ERROR_CHARS] for _, why in graded], dtype="<U300")
        if r.components:
            for name, v in values.items():
                out.extras[f"component/{name}"] = v
        return combine(values, r.weights)

    def state(self) -> dict:
        return {"rm_norm": self.rm_norm.state()} if "rm" in self.models else {}

    def restore(self, state: dict) -> None:
        if "rm" in self.models and "rm_norm" in state:
            self.rm_norm.restore(state["rm_norm"])

    def close(self) -> None:
        self.pool.close()


ENV_TIMEOUT = "no reply within"
"""how an episode's error says its environment's step hung past ``step_timeout_s`` (``envs.episodes``)"""


def episode_results(batch: RolloutBatch) -> list[RewardResult]:
    """The reward results of a batch of episodes, scored by their environment: an episode whose environment failed
    (raised, hung past its step timeout, or replied malformed: ``env_error``) is a failed sample, an error or a
    timeout, left out of its group's statistics and the loss as a failed reward is (not scored 0)."""
    ex = batch.extras
    out = []
    for i in range(len(batch)):
        info = {"lenient_ok": bool(ex["lenient_ok"][i])}
        if bool(ex["env_error"][i]):
            message = f"environment {ex['env_error_msg'][i]}"
            info.update({"error": message, "timeout": ENV_TIMEOUT in message})
        out.append(RewardResult(float(batch.rewards[i]), answer_ok=bool(ex["answer_ok"][i]), info=info))
    return out


def _status(result: RewardResult) -> RewardStatus:
    if result.info.get("timeout"):
        return RewardStatus.TIMEOUT
    if result.info.get("error"):
        return RewardStatus.ERROR
    return RewardStatus.NO_SCORE if result.info.get("no_score") else RewardStatus.SCORED


def shaped_rewards(out: RolloutBatch, algorithm, max_new_tokens: int) -> np.ndarray:
    """The rewards the advantages see: the task rewards plus the algorithm's soft overlong penalty (DAPO), where it
    has one; the task rewards otherwise."""
    buffer = algorithm.overlong_buffer_len(max_new_tokens)
    if not buffer:
        return out.rewards
    lengths = torch.from_numpy(out.response_lengths)
    penalty = overlong_penalty(lengths, max_new_tokens, buffer, algorithm.overlong_penalty_factor)
    return (out.task_rewards + penalty.numpy()).astype(np.float32)
