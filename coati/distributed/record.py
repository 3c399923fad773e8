"""The one record that crosses process boundaries: a batch of rollouts, producer -> consumer.

Arrays are numpy so the Ray object store moves them zero-copy. N rows = prompts x completions, P = padded prompt
length, R = padded response length. Invariants (checked by ``validate``):
- prompts are LEFT-padded, responses RIGHT-padded; ``prompt_mask``/``response_mask`` mark real tokens;
- ``response_mask`` is also the loss mask: the response tokens up to and including EOS (or the stop string's last
  token); the inference backend fills it, nobody recomputes it (DAPO may zero rows of truncated responses);
- multi-turn episodes put the whole conversation after the first prompt in the response (sampled turns and the
  environment's observations) and set ``loss_mask``, True on the sampled tokens only, within ``response_mask``;
  ``rollout_logprobs`` and ``token_versions`` are 0 off it;
- ``rollout_logprobs[i, t]`` is log p(response_ids[i, t]) under the sampling distribution at the configured
  temperature (no top-k/top-p renormalisation), 0 where ``response_mask`` is 0;
- rows of one prompt share ``group_ids``; ``token_versions[i, t]`` is the weight version that sampled response token
  t (a row spans versions when weights are loaded while it is being generated: in-flight updates), and
  ``policy_version[i]`` is the row's oldest (the version it started with): its lag bounds every token's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np


class RewardStatus(enum.IntEnum):
    """How a row's reward came to be (``RolloutBatch.reward_status``)."""

    SCORED = 0
    NO_SCORE = 1
    """no reward function scored it (TRL's None): masked from the loss and left out of its group's statistics"""
    ERROR = 2
    """scoring failed (the reason in ``reward_error``): as NO_SCORE (not scored 0), and counted against
    ``max_error_fraction``"""
    TIMEOUT = 3
    """scoring ran past its time limit: as ERROR"""


SAID_ONCE = (("calls", "call_index"), ("pixels", "pixel_index"))
"""lists of entries said once for many rows, each with the row field that indexes it"""
SAID_BY_INDEX = {said for said, _ in SAID_ONCE}
ROW_FIELDS = (
    "group_ids",
    "policy_version",
    "rewards",
    "task_rewards",
    "no_signal",
    "reward_status",
    "reward_error",
    "call_index",
    "pixel_index",
)
"""the record's typed fields of one value per row"""


@dataclass(frozen=True)
class Experience:
    """What the driver adds to a step's batch before training, for the estimators beyond group baselines (PPO's
    critic, the KL in the reward, running reward statistics): computed once, the same for the policy and the critic,
    so both derive the same advantages and returns from it."""

    values: np.ndarray | None = None
    """float32 [N, R] the critic's V(s_t) before each response token, when the batch was scored"""
    old_logprobs: np.ndarray | None = None
    """float32 [N, R] the policy's log-probs before the step's first update (the KL penalty's pi)"""
    ref_logprobs: np.ndarray | None = None
    """float32 [N, R] the reference's log-probs"""
    kl_coef: float = 0.0
    """the KL-in-reward coefficient of this step (the adaptive controller's value)"""
    reward_mean: float = 0.0
    """running reward statistics (normalize_reward): the estimators see (r - reward_mean) / reward_std"""
    reward_std: float = 1.0


@dataclass
class RolloutBatch:
    prompt_ids: np.ndarray
    """int64 [N, P] left-padded prompt token ids"""
    prompt_mask: np.ndarray
    """bool [N, P] True on real prompt tokens"""
    response_ids: np.ndarray
    """int64 [N, R] right-padded sampled token ids"""
    response_mask: np.ndarray
    """bool [N, R] True on response tokens up to and including EOS: the loss mask"""
    rollout_logprobs: np.ndarray
    """float32 [N, R] log-prob of each sampled token at the sampling temperature; 0 on padding"""
    response_lengths: np.ndarray
    """int64 [N] number of True in response_mask"""
    truncated: np.ndarray
    """bool [N] the response hit max_new_tokens without EOS or stop string"""
    group_ids: np.ndarray | None = None
    """int64 [N] one id per prompt, shared by its completions"""
    policy_version: np.ndarray | None = None
    """int64 [N] oldest weight version that sampled any of the row's tokens (the version the row started with)"""
    token_versions: np.ndarray | None = None
    """int64 [N, R] weight version that sampled each response token; 0 on padding"""
    rewards: np.ndarray | None = None
    """float32 [N] scalar reward (after shaping), filled by the producer"""
    task_rewards: np.ndarray | None = None
    """float32 [N] the reward before length shaping (an unscored or failed row: its group's scored mean)"""
    no_signal: np.ndarray | None = None
    """bool [N] the row's group has all-equal task rewards (no learning signal), decided once, by the producer"""
    reward_status: np.ndarray | None = None
    """int8 [N] a ``RewardStatus`` per row"""
    reward_error: np.ndarray | None = None
    """str [N] (at most 300 characters) why scoring failed, "" where it did not"""
    extras: dict = field(default_factory=dict)
    """name -> array [N]: per-row diagnostics (answer_ok, format_ok, prompt index, ...)"""
    calls: list = field(default_factory=list)
    """one dict of plain numbers per rollout call that made these rows, said once: the producer, its timings
    (``time/...``), its threads at start, most and end, the prompts it passed over"""
    call_index: np.ndarray | None = None
    """int64 [N] the row's call, an index into ``calls``; None with no calls"""
    pixels: list = field(default_factory=list)
    """vision-language prompts: one dict of image inputs per prompt (numpy arrays as its processor made them:
    ``pixel_values`` [images, ...] and the family's sizes or grids), said once for the prompt's group"""
    pixel_index: np.ndarray | None = None
    """int64 [N] the row's prompt's entry in ``pixels``; None for text-only rows"""
    loss_mask: np.ndarray | None = None
    """bool [N, R] True on the tokens the policy sampled, within response_mask (multi-turn episodes: environment
    tokens are False); None: response_mask is the loss mask"""

    turn_index: np.ndarray | None = None
    """int64 [N, R] multi-turn episodes: the 1-based model turn each sampled token belongs to, 0 elsewhere (turn k
    spans the tokens where it equals k); None for single-turn rows"""
    prompt_routes: np.ndarray | None = None
    """int16 [N, P, L, k] routing replay: the k experts a mixture-of-experts engine routed each prompt token to in
    each of the model's L MoE layers; -1 on padding (``model/routing.py``)"""
    response_routes: np.ndarray | None = None
    """int16 [N, R, L, k] the same for each response token as it was fed back; -1 on padding and on a row's last
    sampled token (never fed)"""
    teacher_logprobs: np.ndarray | None = None
    """float32 [N, R] on-policy distillation: the teacher's log-prob of each sampled token at the sampling
    temperature, under the teacher's own rendering of the prompt; 0 off the loss mask (``teacher/``)"""
    teacher_top1: np.ndarray | None = None
    """bool [N, R] the sampled token is the teacher's most likely one there; False off the loss mask"""
    experience: Experience | None = None
    """added by the driver to a step's whole batch just before it trains (never selected or concatenated)"""

    def failed(self) -> np.ndarray:
        """bool [N]: rows whose scoring failed (an error or a timeout); none where no status is recorded."""
        if self.reward_status is None:
            return np.zeros(len(self), dtype=bool)
        return np.isin(self.reward_status, (RewardStatus.ERROR, RewardStatus.TIMEOUT))

    def unscored(self) -> np.ndarray:
        """bool [N]: rows no reward function scored; none where no status is recorded."""
        if self.reward_status is None:
            return np.zeros(len(self), dtype=bool)
        return np.asarray(self.reward_status) == RewardStatus.NO_SCORE

    def left_out(self) -> np.ndarray:
        """bool [N]: rows without a score (unscored or failed): out of their group's statistics and the loss."""
        return self.unscored() | self.failed()

    def trained_mask(self) -> np.ndarray:
        """bool [N, R] the tokens the loss covers."""
        return self.response_mask if self.loss_mask is None else self.loss_mask

    def __len__(self) -> int:
        return int(self.prompt_ids.shape[0])

    def validate(self) -> RolloutBatch:
        n = len(self)
        assert self.prompt_mask.shape == self.prompt_ids.shape, (self.prompt_mask.shape, self.prompt_ids.shape)
        r = self.response_ids.shape
        assert r[0] == n and self.response_mask.shape == r and self.rollout_logprobs.shape == r
        assert self.response_lengths.shape == (n,) and self.truncated.shape == (n,)
        assert np.array_equal(self.response_mask.sum(-1), self.response_lengths), "response_mask != lengths"
        # Right padding: the mask is a prefix of ones.
        assert np.array_equal(self.response_mask, np.arange(r[1])[None, :] < self.response_lengths[:, None])
        # Left padding: the prompt mask is a suffix of ones.
        if self.prompt_ids.shape[1]:
            plen = self.prompt_mask.sum(-1)
            assert np.array_equal(self.prompt_mask, np.arange(self.prompt_ids.shape[1])[None, ::-1] < plen[:, None])
        for name in ROW_FIELDS:
            value = getattr(self, name)
            assert value is None or value.shape == (n,), (name, None if value is None else value.shape)
        if self.token_versions is not None:
            assert self.token_versions.shape == r, (self.token_versions.shape, r)
            if self.policy_version is not None:
                assert np.array_equal(
                    oldest_versions(self.token_versions, self.trained_mask(), self.policy_version), self.policy_version
                ), "policy_version is not each row's oldest token version"
        for name, value in self.extras.items():
            assert len(value) == n, (name, len(value))
        for said, index in SAID_ONCE:
            rows, entries = getattr(self, index), getattr(self, said)
            if rows is not None:
                assert n == 0 or 0 <= rows.min() <= rows.max() < len(entries), index
            else:
                assert not entries, f"{said} without {index}"
        if self.loss_mask is not None:
            assert self.loss_mask.shape == r, (self.loss_mask.shape, r)
            assert not (self.loss_mask & ~self.response_mask).any(), "loss_mask outside response_mask"
            assert not self.rollout_logprobs[~self.loss_mask].any(), "rollout log-probs off the loss mask"
        if self.prompt_routes is not None or self.response_routes is not None:
            assert self.prompt_routes is not None and self.response_routes is not None, "routes come in pairs"
            p, q = self.prompt_routes.shape, self.response_routes.shape
            assert p[:2] == self.prompt_ids.shape and q[:2] == r and p[2:] == q[2:], (p, q)
        if self.teacher_logprobs is not None or self.teacher_top1 is not None:
            assert self.teacher_logprobs is not None and self.teacher_top1 is not None, "teacher fields come in pairs"
            assert self.teacher_logprobs.shape == r and self.teacher_top1.shape == r, self.teacher_logprobs.shape
            off = ~self.trained_mask()
            assert not self.teacher_logprobs[off].any() and not self.teacher_top1[off].any(), "teacher off the mask"
        if self.turn_index is not None:
            assert self.turn_index.shape == r and np.array_equal(self.turn_index > 0, self.trained_mask()), "turn_index"
        return self

    def select(self, index) -> RolloutBatch:
        """Rows ``index`` (array of ints or bool mask) as a new batch."""
        kw: dict[str, Any] = {}
        assert self.experience is None, "a batch with its experience is whole"
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extras":
                kw[f.name] = {k: np.asarray(v)[index] for k, v in value.items()}
            elif f.name in SAID_BY_INDEX:  # kept whole: the row indices still point into them
                kw[f.name] = list(value)
            else:
                kw[f.name] = None if value is None else value[index]
        return RolloutBatch(**kw)

    @staticmethod
    def concat(batches: list[RolloutBatch], pad_id: int = 0) -> RolloutBatch:
        """Stack batches, re-padding prompts (left) and responses (right) to the longest."""
        assert batches, "nothing to concatenate"
        p = max(b.prompt_ids.shape[1] for b in batches)
        r = max(b.response_ids.shape[1] for b in batches)

        def left(a, width, fill):
            return np.pad(a, ((0, 0), (width - a.shape[1], 0)), constant_values=fill)

        def right(a, width, fill):
            return np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=fill)

        out = RolloutBatch(
            prompt_ids=np.concatenate([left(b.prompt_ids, p, pad_id) for b in batches]),
            prompt_mask=np.concatenate([left(b.prompt_mask, p, False) for b in batches]),
            response_ids=np.concatenate([right(b.response_ids, r, pad_id) for b in batches]),
            response_mask=np.concatenate([right(b.response_mask, r, False) for b in batches]),
            rollout_logprobs=np.concatenate([right(b.rollout_logprobs, r, 0.0) for b in batches]),
            response_lengths=np.concatenate([b.response_lengths for b in batches]),
            truncated=np.concatenate([b.truncated for b in batches]),
        )
        for name in ROW_FIELDS:
            values = [getattr(b, name) for b in batches]
            if all(v is not None for v in values):
                setattr(out, name, np.concatenate(values))
        for said, index in SAID_ONCE:
            if all(getattr(b, index) is not None for b in batches):
                offsets = np.cumsum([0] + [len(getattr(b, said)) for b in batches[:-1]])
                setattr(out, said, [c for b in batches for c in getattr(b, said)])
                rows = [getattr(b, index) + o for b, o in zip(batches, offsets, strict=True)]
                setattr(out, index, np.concatenate(rows))
        if all(b.token_versions is not None for b in batches):
            out.token_versions = np.concatenate([right(b.token_versions, r, 0) for b in batches])
        if any(b.loss_mask is not None for b in batches):
            out.loss_mask = np.concatenate([right(b.trained_mask(), r, False) for b in batches])
        prompt_routes = [b.prompt_routes for b in batches if b.prompt_routes is not None]
        response_routes = [b.response_routes for b in batches if b.response_routes is not None]
        if len(prompt_routes) == len(response_routes) == len(batches):
            out.prompt_routes = np.concatenate([_pad_columns(a, p, -1, left=True) for a in prompt_routes])
            out.response_routes = np.concatenate([_pad_columns(a, r, -1) for a in response_routes])
        if all(b.teacher_logprobs is not None for b in batches):
            out.teacher_logprobs = np.concatenate([right(b.teacher_logprobs, r, 0.0) for b in batches])
            out.teacher_top1 = np.concatenate([right(b.teacher_top1, r, False) for b in batches])
        if all(b.turn_index is not None for b in batches):
            out.turn_index = np.concatenate([right(b.turn_index, r, 0) for b in batches])
        keys = set.intersection(*(set(b.extras) for b in batches))
        out.extras = {k: np.concatenate([np.asarray(b.extras[k]) for b in batches]) for k in keys}
        return out


def _pad_columns(a: np.ndarray, width: int, fill, left: bool = False) -> np.ndarray:
    """``a`` [N, C, ...] padded to ``width`` columns with ``fill``, on the left or the right."""
    gap = (width - a.shape[1], 0) if left else (0, width - a.shape[1])
    return np.pad(a, ((0, 0), gap, *[(0, 0)] * (a.ndim - 2)), constant_values=fill)


def oldest_versions(token_versions: np.ndarray, mask: np.ndarray, empty: np.ndarray) -> np.ndarray:
    """int64 [N]: each row's oldest token version (``empty[i]`` for a row with no tokens)."""
    top = np.iinfo(np.int64).max
    oldest = np.where(mask, token_versions, top).min(-1, initial=top)
    return np.where(mask.any(-1), oldest, empty).astype(np.int64)


def fresh_rows(token_versions: np.ndarray, mask: np.ndarray, version: int) -> np.ndarray:
    """bool [N]: the rows whose every token (under ``mask``) was sampled by weights ``version``; a row that spans a
    push is not fresh even in its tokens after it (they attend to keys the earlier weights computed)."""
    return (np.where(mask, token_versions, version) == version).all(-1) & mask.any(-1)


def responses_from_token_lists(
    token_lists: list[list[int]],
    logprob_lists: list[list[float]] | None,
    finished: list[bool],
    pad_id: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Right-pad ragged responses: (ids, mask, logprobs, lengths, truncated). ``finished[i]`` is False when the
    response ended because it ran out of budget. Used by every backend to build a RolloutBatch."""
    n = len(token_lists)
    width = max((len(t) for t in token_lists), default=0)
    ids = np.full((n, width), pad_id, dtype=np.int64)
    mask = np.zeros((n, width), dtype=bool)
    logprobs = np.zeros((n, width), dtype=np.float32)
    lengths = np.zeros(n, dtype=np.int64)
    for i, tokens in enumerate(token_lists):
        k = len(tokens)
        ids[i, :k] = tokens
        mask[i, :k] = True
        lengths[i] = k
        if logprob_lists is not None:
            assert len(logprob_lists[i]) == k, f"row {i}: {len(logprob_lists[i])} log-probs for {k} tokens"
            logprobs[i, :k] = logprob_lists[i]
    truncated = ~np.asarray(finished, dtype=bool)
    return ids, mask, logprobs, lengths, truncated


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad prompt token lists: (ids [N, P], mask [N, P])."""
    width = max((len(p) for p in prompts), default=0)
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=bool)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p) :] = p
            mask[i, width - len(p) :] = True
    return ids, mask


def batch_from_responses(
    prompts: list[list[int]],
    n: int,
    tokens: list[list[int]],
    logprobs: list[list[float]] | None,
    finished: list[bool],
    pad_id: int,
    extras: dict | None = None,
) -> RolloutBatch:
    """A validated RolloutBatch from tokenised prompts and ragged responses, rows prompt-major (the n completions of
    prompt i are rows i*n .. i*n+n-1, group id i). Every backend builds its record here."""
    p_ids, p_mask = left_pad([p for p in prompts for _ in range(n)], pad_id)
    ids, mask, lps, lengths, truncated = responses_from_token_lists(tokens, logprobs, finished, pad_id)
    return RolloutBatch(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        response_ids=ids,
        response_mask=mask,
        rollout_logprobs=lps,
        response_lengths=lengths,
        truncated=truncated,
        group_ids=np.repeat(np.arange(len(prompts), dtype=np.int64), n),
        extras=dict(extras or {}),
    ).validate()


CALL_BITS, INDEX_BITS = 20, 20
"""a group id's layout: the producer's index, then its rollout call's number (``CALL_BITS``), then the group's index
within the call (``INDEX_BITS``)"""


def attach_pixels(batch: RolloutBatch, pixels: list[dict] | None, n: int) -> RolloutBatch:
    """``batch`` (prompt-major, ``n`` rows per prompt) holding each prompt's image inputs once for its rows."""
    if pixels and any(pixels):
        batch.pixels = [dict(p or {}) for p in pixels]
        batch.pixel_index = np.repeat(np.arange(len(pixels), dtype=np.int64), n)
        batch.validate()
    return batch


def called_rows(batch: RolloutBatch) -> list[dict]:
    """The calls some row of ``batch`` came from, each once, in order."""
    return [] if batch.call_index is None else [batch.calls[i] for i in np.unique(batch.call_index)]


def call_values(batch: RolloutBatch, key: str) -> np.ndarray | None:
    """Each row's value of its call's ``key`` ([N]), or None where no call has it."""
    if batch.call_index is None or not any(key in c for c in batch.calls):
        return None
    return np.array([c.get(key, np.nan) for c in batch.calls])[batch.call_index]


def run_group_ids(local: np.ndarray, producer: int, call: int) -> np.ndarray:
    """int64 [N]: ids unique across the run for the groups ``local`` (their indices within one rollout call) of call
    ``call`` of producer ``producer``: the one place a group id is made."""
    assert call < 1 << CALL_BITS and (not len(local) or int(local.max()) < 1 << INDEX_BITS), (call, local.max())
    return local + (producer << (CALL_BITS + INDEX_BITS)) + (call << INDEX_BITS)


def group_versions(batch: RolloutBatch) -> np.ndarray:
    """int64 [N]: each row's group's oldest ``policy_version``."""
    assert batch.group_ids is not None and batch.policy_version is not None, "a record without groups or versions"
    _, inverse = np.unique(batch.group_ids, return_inverse=True)
    oldest = np.full(int(inverse.max()) + 1 if len(inverse) else 0, np.iinfo(np.int64).max)
    np.minimum.at(oldest, inverse, batch.policy_version)
    return oldest[inverse]
