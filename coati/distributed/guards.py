"""Guards that stop a run rather than let it train on garbage: reward failures counted per step with a threshold,
and finiteness checks the consumer applies to losses, gradient norms and weights before they are kept. Pure
functions of arrays and tensors, no Ray.
"""

from __future__ import annotations

import numpy as np


class RunError(RuntimeError):
    """An actor died, failed or stopped answering; the message names it and the last checkpoint."""


NOT_SCORED = "not scored"
"""how a failed row's reason begins when it was not waited for: its draw had already failed past
``max_error_fraction`` (``Scorer.gather``)"""


class RewardFailure(RuntimeError):
    """Too many completions of a step could not be scored; the message carries the first error and its row."""


def reward_failures(failed: np.ndarray, timed_out: np.ndarray) -> dict:
    """Per-step counts: scoring failures (timeouts included), timeouts alone, and the rows scored."""
    return {"reward/errors": int(failed.sum()), "reward/timeouts": int(timed_out.sum()), "reward/scored": len(failed)}


def check_reward_failures(
    failed: np.ndarray,
    timed_out: np.ndarray,
    messages: np.ndarray,
    rows: np.ndarray,
    scored_by: str,
    max_fraction: float,
    first_step: bool,
    where: str,
) -> dict:
    """The counts of ``reward_failures`` of a step's rows (``messages``: why each failed; ``rows``: its dataset
    row); raises RewardFailure when any row failed on the run's first step or more than ``max_fraction`` of them
    did, naming what scores them (``scored_by``: "reward function X" or "environment Y"), the first error and its
    row."""
    counts = reward_failures(failed, timed_out)
    errors, total = counts["reward/errors"], counts["reward/scored"]
    if errors and (first_step or errors > max_fraction * total):
        scored = [i for i in np.flatnonzero(failed) if not str(messages[i]).startswith(NOT_SCORED)]
        i = int(scored[0] if scored else np.flatnonzero(failed)[0])  # an error seen, not a row left unscored
        rule = "on the run's first step" if first_step else f"more than {max_fraction:.0%} of the step"
        raise RewardFailure(
            f"{where}: {scored_by} failed on {errors} of {total} completions ({rule}); first error, "
            f"dataset row {int(rows[i])}: {messages[i]}. Fix the {scored_by.rsplit(' ', 1)[0]} or the data (or raise "
            "max_error_fraction)"
        )
    return counts


UNSCORED_DRAWS = 8
"""draws in a row with not one completion scored after which a run stops (a reward that never scores trains
nothing)"""


def check_unscored(unscored: np.ndarray, streak: int, first_step: bool, scored_by: str, where: str) -> int:
    """The count of draws in a row in which ``scored_by`` scored no completion (``unscored``: rows without a score,
    not failed); raises RewardFailure when the run's first draw, or ``UNSCORED_DRAWS`` in a row, scored none."""
    streak = streak + 1 if len(unscored) and bool(unscored.all()) else 0
    if streak and (first_step or streak >= UNSCORED_DRAWS):
        when = "the run's first draw" if first_step else f"{streak} draws in a row"
        raise RewardFailure(
            f"{where}: {scored_by} scored none of the {len(unscored)} completions of {when} (each result was None "
            "or NaN), so there is nothing to train on; make it return a number for these rows"
        )
    return streak


def all_finite(tensors) -> bool:
    """True when every tensor holds only finite values."""
    import torch

    return all(bool(torch.isfinite(t).all()) for t in tensors)


class EngineMismatch(RuntimeError):
    """The engines sample from another model than the one trained: their log-probs of fresh tokens are further from
    the trainer's than the two precisions explain."""


GAP_TOLERANCE = {"fp32": 5e-3, "low": 0.1}
"""the largest mean |engine - trainer| log-prob over a step's fresh tokens a correct run shows: both sides computing
in fp32 (the engines' kernels differ from the trainer's: 1e-7..1e-5 measured), or either in bf16/fp16 (the engine
rounds each pushed weight to its dtype: 1.4e-5..2e-5 measured on the default job's fresh rows)"""


def gap_tolerance(configured: float | None, engine_dtype: str | None, trainer_fp32: bool) -> float:
    """The tolerance of ``check_engine_trainer_gap``: ``configured`` when set (0: no check), else by precisions
    (``engine_dtype`` as the engines hold their weights, None when they do not say)."""
    if configured is not None:
        return configured
    return GAP_TOLERANCE["fp32" if engine_dtype == "float32" and trainer_fp32 else "low"]


def check_engine_trainer_gap(metrics: dict, tolerance: float, step: int) -> None:
    """Raises EngineMismatch when step ``step``'s engine/trainer gap (``rollout/engine_trainer_gap_abs``, over the
    rows the step's starting weights sampled whole) exceeds ``tolerance`` (0: never)."""
    gap = metrics.get("rollout/engine_trainer_gap_abs")
    if tolerance and gap is not None and not gap <= tolerance:
        raise EngineMismatch(
            f"step {step}: the engines' log-probs of the tokens they sampled with the weights this step started from "
            f"are {gap:.3g} from the trainer's on average (tolerance {tolerance:.3g} for these precisions): the "
            "engines generate from another model than the one trained (a push not loaded as sent, or a layout the "
            "engine computes differently); stopping rather than training on it (max_engine_trainer_gap sets the "
            "tolerance, 0 turns the check off)"
        )
