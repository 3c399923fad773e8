"""Every metric a run logs, declared once with its meaning and unit: the step metrics of ``metrics.jsonl`` (and the
loggers), the evaluations' ``eval/*``. A key with a ``{...}`` part stands for a family (``reward/component/{name}``).
The metrics page of the docs is generated from ``METRICS`` (``scripts/metrics_glossary.py``); a run that logs a key
the registry lacks warns once per key, and raises where ``COATI_STRICT_METRICS=1`` (the test suite)."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Metric:
    meaning: str
    unit: str = ""


METRICS: dict[str, Metric] = {
    # the step
    "step": Metric("the training step (0: the evaluation before training)", "step"),
    "total_steps": Metric("the run's length in steps", "steps"),
    # the critic (PPO)
    "critic/value_loss": Metric("the critic's clipped value loss, 1/2 (V - R)^2 token-mean over the step"),
    "critic/clipfrac": Metric("share of trained tokens whose value the value clip bounded"),
    "critic/value_mean": Metric("mean value the critic predicts over the trained tokens while it trains"),
    "critic/values_mean": Metric("mean value the critic gave the step's rollout before training (GAE's V)"),
    "critic/return_mean": Metric("mean return (the critic's regression target) over the trained tokens"),
    "critic/explained_variance": Metric(
        "1 - Var[R - V] / Var[R] of the rollout's values against its returns: 1 perfect, 0 a constant, < 0 worse"
    ),
    "critic/grad_norm": Metric("the critic's gradient norm before clipping"),
    "critic/lr": Metric("the critic's learning rate"),
    "critic/skipped_steps": Metric("critic optimizer steps skipped in this step for a non-finite gradient", "steps"),
    "critic/skipped_steps_total": Metric("critic optimizer steps skipped so far in the run", "steps"),
    "time/critic_step": Metric("the critic's training step", "s"),
    "time/experience": Metric("values and KL log-probs of the step's batch before it trains", "s"),
    "reward/kl": Metric("mean KL(pi_old || pi_ref) per completion, summed over its tokens (the reward's penalty)"),
    "reward/kl_coef": Metric("the KL-in-reward coefficient this step used (adaptive under kl_target)"),
    "reward/running_mean": Metric("running mean of every reward so far (normalize_reward)"),
    "reward/running_std": Metric("running std of every reward so far (normalize_reward)"),
    # on-policy distillation
    "teacher/kl": Metric(
        "mean over the trained tokens of log pi_student - log pi_teacher of the sampled token (the reverse KL per "
        "token, k1)",
        "nats",
    ),
    "teacher/top1_match": Metric("share of the trained tokens that are the teacher's own most likely token", "share"),
    "teacher/version": Metric("the policy version the self-teacher holds (teacher.model self:N)", "step"),
    "time/teacher": Metric("the longest a producer waited for the teacher's log-probs in the step's draws", "s"),
    # the trainer
    "actor/entropy": Metric("mean entropy of the policy over the trained tokens", "nats"),
    "actor/grad_norm": Metric("gradient norm before clipping (the last optimizer step of the training step)"),
    "actor/lr": Metric("learning rate of the step's last optimizer step"),
    "actor/packed_rows_frac": Metric(
        "share of trained rows whose group was packed into one row (its prompt once)", "share"
    ),
    "moe/expert_load_layer{k}": Metric(
        "MoE layer k: the busiest expert's share of the trained tokens' assignments over the mean (1: even)"
    ),
    "moe/router_entropy_layer{k}": Metric("MoE layer k: mean entropy of the router over experts", "nats"),
    "moe/load_balancing_loss": Metric(
        "the routers' load-balancing loss, mean over MoE layers (k, the experts per token: even routing)"
    ),
    "moe/router_z_loss": Metric("the routers' z-loss, mean over MoE layers"),
    "moe/routing_agreement": Metric(
        "routing replay: share of tokens x MoE layers whose own top-k experts were already the engine's, over the "
        "step's passes (those after an update within the step run on weights that moved on)",
        "share",
    ),
    "actor/skipped_steps": Metric("optimizer steps skipped in this step for a non-finite gradient", "steps"),
    "actor/skipped_steps_total": Metric("optimizer steps skipped so far in the run", "steps"),
    "actor/threads": Metric("the most CPU threads a consumer's training step ran with", "threads"),
    # the loss
    "loss/policy": Metric("the policy loss of the step (mean over its optimizer steps and DP ranks)"),
    "loss/kl": Metric("KL(pi || pi_ref) estimate over the trained tokens (beta > 0)", "nats"),
    "loss/approx_kl": Metric("k3 estimate of KL(pi_old || pi) over the trained tokens", "nats"),
    "loss/clipfrac": Metric("share of trained tokens whose ratio was clipped", "share"),
    "loss/dual_clipfrac": Metric("share of trained tokens the dual clip bounded (negative advantages)", "share"),
    "loss/ratio_mean": Metric("mean importance ratio pi / pi_old over the trained tokens"),
    "loss/ratio_min": Metric("smallest importance ratio"),
    "loss/ratio_max": Metric("largest importance ratio"),
    "loss/is_weight_mean": Metric("mean off-policy correction weight (pi_old / engine) over the trained tokens"),
    "loss/is_weight_max": Metric("largest off-policy correction weight after truncation"),
    "loss/is_ratio_max": Metric("largest pi_old / engine ratio before truncation"),
    "loss/is_corrected_frac": Metric("share of trained tokens the correction truncated or masked", "share"),
    "loss/is_unavailable_frac": Metric(
        "share of trained tokens without valid engine log-probs (no correction)", "share"
    ),
    # completions
    "response/length_mean": Metric("mean completion length of the trained rows", "tokens"),
    "response/tokens": Metric("completion tokens of the trained rows", "tokens"),
    "response/truncated_frac": Metric("share of trained completions cut at max_new_tokens", "share"),
    # rewards
    "reward/mean": Metric("mean reward (after shaping) of the trained completions"),
    "reward/train_batch_mean": Metric("mean task reward (before shaping) of the trained completions"),
    "reward/component/{name}": Metric("mean of one named reward component before weighting"),
    "reward/strict_accuracy": Metric("share of trained completions whose answer the strict check accepts", "share"),
    "reward/lenient_accuracy": Metric("share of trained completions whose answer the lenient check accepts", "share"),
    "reward/scored": Metric("completions scored this step", "completions"),
    "reward/errors": Metric("completions whose reward function raised", "completions"),
    "reward/timeouts": Metric("completions whose reward call ran past item_timeout_s", "completions"),
    "reward/no_score": Metric(
        "completions no reward function scored (None): out of their group's statistics", "completions"
    ),
    "reward/rm_truncated": Metric("completions cut to fit the reward model's context", "completions"),
    "reward/judge_unread": Metric("completions whose judge verdict could not be read", "completions"),
    "reward/sandbox_degraded": Metric("1 when model-written code ran without bwrap (allow_degraded_sandbox)", "0/1"),
    # environments
    "env/turns_mean": Metric("mean model turns per trained episode", "turns"),
    "env/turns_max": Metric("most model turns of a trained episode", "turns"),
    "env/tool_calls_mean": Metric("mean tool calls per trained episode", "calls"),
    "env/turn_limit_frac": Metric("share of trained episodes ended by the turn limit", "share"),
    "env/errors": Metric("episodes whose environment raised, hung or answered nonsense", "episodes"),
    # rollouts and the buffer
    "rollout/draws": Metric("rollout calls the step's groups came from", "calls"),
    "rollout/drawn_groups": Metric("groups drawn for this step (trained, dropped or kept for the next)", "groups"),
    "rollout/dropped_zero_signal_groups": Metric("groups dropped because their task rewards were all equal", "groups"),
    "rollout/filled_zero_signal_groups": Metric("groups without signal trained to fill the step", "groups"),
    "rollout/stale_dropped_groups": Metric("groups dropped as older than max_staleness", "groups"),
    "rollout/skipped_prompts": Metric("prompts passed over without a draw (their last group had no signal)", "prompts"),
    "rollout/prompt_index": Metric("the dataset rows of the trained groups", "rows"),
    "rollout/epoch": Metric("the epoch of each trained group (with its row: the group's name)", "epochs"),
    "rollout/policy_lag_mean": Metric(
        "mean versions between a trained row's oldest token and the trained weights", "versions"
    ),
    "rollout/policy_lag_max": Metric("largest such lag", "versions"),
    "rollout/token_lag_mean": Metric(
        "mean versions between a trained token's sampler and the trained weights", "versions"
    ),
    "rollout/lag{k}_groups": Metric("trained groups k versions old", "groups"),
    "rollout/mixed_version_rows": Metric("trained rows whose tokens span a weight push", "rows"),
    "rollout/logprob_gap_abs": Metric("mean |trainer - engine| log-prob over the trained tokens", "nats"),
    "rollout/engine_trainer_gap_abs": Metric(
        "the same over rows sampled whole by the weights the step starts from", "nats"
    ),
    "rollout/trained_tokens": Metric("tokens the trainer computed (prompts and completions)", "tokens"),
    "rollout/trained_tokens_unique": Metric("the same with each group's prompt counted once", "tokens"),
    "rollout/trained_response_tokens": Metric("completion tokens trained", "tokens"),
    "rollout/threads": Metric("the most CPU threads a producer's rollout call ran with", "threads"),
    "rollout/rows_lent_cores": Metric("rows generated with cores lent by the consumers", "rows"),
    "rollout/rows_cores_taken_back": Metric("rows whose call had lent cores taken back", "rows"),
    # time
    "time/step": Metric("wall time of the step at the driver", "s"),
    "time/rollout_wait": Metric("driver time waiting for the step's rollouts", "s"),
    "time/train": Metric("driver time waiting for the training step", "s"),
    "time/weight_push": Metric("driver time of the weight push", "s"),
    "time/overhead": Metric("step time that is none of the above (batching, object store, metrics)", "s"),
    "time/train_step": Metric("a consumer's training step", "s"),
    "time/old_logprobs": Metric("a consumer's forward for the old log-probs", "s"),
    "time/generate": Metric("producers' generation time for the step's rows (the slowest rollout call)", "s"),
    "time/reward_wait": Metric("producers' wait for rewards after generation", "s"),
    "time/producer_total": Metric("producers' whole rollout call", "s"),
    "time/sleep": Metric("producers freeing accelerator memory (sleep_while_training)", "s"),
    "time/wake": Metric("producers taking it back", "s"),
    "time/trainer_offload": Metric(
        "trainers parking their states in host memory after the push (offload_trainers)", "s"
    ),
    "time/trainer_reload": Metric("a policy consumer moving them back before its step", "s"),
    "time/critic_reload": Metric("a critic rank moving them back before its values and step", "s"),
    "trainer/mem_resident_mb": Metric("a trainer's accelerator memory before offloading (the most over ranks)", "MiB"),
    "trainer/mem_offloaded_mb": Metric("the same offloaded", "MiB"),
    "trainer/offloaded_mb": Metric("trainers' states moved to host memory (all ranks)", "MiB"),
    "time/elapsed": Metric("time since the run started (written by the run folder's reporter)", "s"),
    # weight pushes
    "weights/transfers": Metric("collective calls of the push", "calls"),
    "weights/bytes": Metric("bytes pushed", "bytes"),
    "weights/direct_fraction": Metric("share of bytes sent straight from the trainer's weights (not packed)", "share"),
    "weights/in_place_fraction": Metric("share of bytes received straight into the engine's weights", "share"),
    "weights/receive_s": Metric("an engine's time receiving and loading the push", "s"),
    "weights/paused_s": Metric("seconds generation stood still for the push", "s"),
    "weights/load_threads": Metric("threads an engine loaded the push with", "threads"),
    "weights/attest_s": Metric("time fingerprinting what the engines hold", "s"),
    "weights/attested": Metric(
        "tensors of the push whose fingerprints every engine matched (the fewest over engines; a mismatch stops the "
        "run)",
        "tensors",
    ),
    # memory
    "inference/mem_awake_mb": Metric("producers' accelerator memory before sleeping", "MiB"),
    "inference/mem_asleep_mb": Metric("the same asleep", "MiB"),
    # evaluation
    "eval/strict": Metric("held-out greedy accuracy, strict check", "share"),
    "eval/lenient": Metric("held-out greedy accuracy, lenient check", "share"),
    "eval/at_max": Metric(
        "held-out share at the reward's maximum (a reward returning numbers: its max_reward, 1.0 by default)", "share"
    ),
    "eval/reward_mean": Metric("held-out mean reward of the scored items", "reward"),
    "eval/count": Metric("held-out items evaluated", "items"),
    "eval/reward_errors": Metric("held-out items whose scoring failed", "items"),
    "eval/cached": Metric("1 where the evaluation before training was the base model's cached one (not rerun)", "flag"),
}

EVAL_RESULTS = ("eval/strict", "eval/lenient", "eval/at_max", "eval/reward_mean")
"""an evaluation's results, in the order they are shown: strict and lenient where the reward defines them, else the
share at its maximum; the mean reward always"""


def headline(evaluation: dict) -> str:
    """The one result a run is summed up by: lenient accuracy where the reward defines it, else the share at the
    reward's maximum, else the mean reward."""
    return next((k for k in ("eval/lenient", "eval/at_max", "eval/reward_mean") if k in evaluation), "eval/lenient")


PAYLOADS = ("samples", "eval_samples")
"""what a step's record carries besides metrics: sample completions (``samples.jsonl``) and held-out predictions
(``eval_samples.jsonl``)"""

_FAMILIES = [re.compile("^" + re.sub(r"\\\{\w+\\\}", r"[^/]+", re.escape(key)) + "$") for key in METRICS if "{" in key]
_WARNED: set[str] = set()


def declared(key: str) -> bool:
    return key in METRICS or any(f.match(key) for f in _FAMILIES)


def check_declared(metrics: dict) -> None:
    """Warn once per key of ``metrics`` that ``METRICS`` lacks; raise where ``COATI_STRICT_METRICS=1``."""
    missing = sorted(k for k in metrics if k not in PAYLOADS and not declared(k))
    if not missing:
        return
    if os.environ.get("COATI_STRICT_METRICS") == "1":
        raise KeyError(
            f"metrics {missing} are not declared in coati/distributed/loggers/metrics.py; declare each once there"
        )
    for key in set(missing) - _WARNED:
        _WARNED.add(key)
        log.warning("metric %s is not declared in coati/distributed/loggers/metrics.py", key)
