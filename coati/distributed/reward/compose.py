"""Rewards made of named components: reward = sum_k w_k * r_k, each component's values kept for the step's metrics
(``reward/component/<name>``). A component is a rule function, a reward model or a judge; this module only combines
their values and normalises a model's scores. Pure numpy, no Ray.

Normalisation of a model's raw scores (``none``, ``group`` or ``running``):
- ``group``: (s - mean_g) / (std_g + eps) within each prompt's group of completions (the scale of a group-relative
  advantage; a group of equal scores becomes zeros);
- ``running``: (s - mean) / (std + eps) with the mean and std of every score seen so far, this batch included
  (merged batch by batch with Chan et al.'s pairwise update; the state is checkpointed so a resumed run normalises
  as the uninterrupted one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NORMALIZATIONS = ("none", "group", "running")


def combine(values: dict[str, np.ndarray], weights: dict[str, float]) -> np.ndarray:
    """float32 [N]: sum of ``weights[k] * values[k]`` over the components; every component must be present."""
    missing = sorted(set(weights) - set(values))
    assert not missing, f"component values missing: {missing}"
    total = sum(np.asarray(values[k], dtype=np.float64) * w for k, w in weights.items())
    return np.asarray(total, dtype=np.float32)


def fill_unscored(rewards: np.ndarray, unscored: np.ndarray, group_size: int) -> np.ndarray:
    """float [N]: ``rewards`` with each unscored completion's (a reward function's None) set to the mean of its
    group's scored ones (0 when none is), so that the rewards the run reports and compares (dynamic sampling's
    all-equal test) stay finite and move no group's mean; the caller masks it from the loss, and the advantages leave
    it out of its group (``consumer.batch_advantages``)."""
    out = np.array(rewards, dtype=np.float64)
    groups = out.reshape(-1, group_size)
    missing = np.asarray(unscored, dtype=bool).reshape(-1, group_size)
    scored = np.where(missing, 0.0, groups)
    counts = (~missing).sum(-1, keepdims=True)
    means = np.divide(
        scored.sum(-1, keepdims=True), counts, out=np.zeros_like(counts, dtype=np.float64), where=counts > 0
    )
    return np.where(missing, means, groups).reshape(-1)


def normalize_per_group(scores: np.ndarray, group_ids: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """(s - mean_g) / (std_g + eps) within each group (population std)."""
    s = np.asarray(scores, dtype=np.float64)
    out = np.empty_like(s)
    for g in np.unique(group_ids):
        idx = group_ids == g
        out[idx] = (s[idx] - s[idx].mean()) / (s[idx].std() + eps)
    return out.astype(np.float32)


@dataclass
class RunningNorm:
    """Mean and variance of every score seen, for ``running`` normalisation; each producer keeps its own, saved in
    checkpoints with the producer's state."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    eps: float = 1e-6

    def update(self, scores: np.ndarray) -> None:
        """Merge a batch's count, mean and squared deviations into the totals (Chan et al.'s pairwise update)."""
        x = np.asarray(scores, dtype=np.float64).ravel()
        if x.size == 0:
            return
        n, mean = self.count + x.size, float(x.mean())
        delta = mean - self.mean
        self.m2 += float(((x - mean) ** 2).sum()) + delta * delta * self.count * x.size / n
        self.mean += delta * x.size / n
        self.count = n

    @property
    def std(self) -> float:
        return float(np.sqrt(self.m2 / self.count)) if self.count else 1.0

    def __call__(self, scores: np.ndarray) -> np.ndarray:
        """Update with ``scores``, then normalise them."""
        self.update(scores)
        return ((np.asarray(scores, dtype=np.float64) - self.mean) / (self.std + self.eps)).astype(np.float32)

    def state(self) -> dict:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def restore(self, state: dict) -> None:
        self.count, self.mean, self.m2 = int(state["count"]), float(state["mean"]), float(state["m2"])


def normalize(kind: str, scores: np.ndarray, group_ids: np.ndarray, running: RunningNorm | None = None) -> np.ndarray:
    """A model's scores under normalisation ``kind`` (one of NORMALIZATIONS)."""
    if kind == "none":
        return np.asarray(scores, dtype=np.float32)
    if kind == "group":
        return normalize_per_group(scores, group_ids)
    if kind == "running":
        assert running is not None, "running normalisation needs its RunningNorm"
        return running(scores)
    raise ValueError(f"reward normalisation must be one of {NORMALIZATIONS}, got {kind!r}")
