"""Reward models in Ray actors of their own: the server (one ``RewardModel`` per actor, with its own resources and
threads) and the producers' client, which spreads a batch over the servers (reward-model or judge servers alike) and
names the one that died or stopped answering instead of returning zeros.
"""

from __future__ import annotations

import time

import torch

from coati.distributed.liveness import start_heartbeat
from coati.distributed.reward.reward_model import RewardModel


class RewardModelServer:
    """Hosts one reward model; run as a Ray actor (``ray.remote(RewardModelServer)``)."""

    def __init__(self, path: str, batch_size: int = 8, max_tokens: int | None = None, threads: int = 1):
        start_heartbeat()
        torch.set_num_threads(threads)
        self.model = RewardModel(
            path, batch_size=batch_size, max_tokens=max_tokens, device="cuda" if torch.cuda.is_available() else "cpu"
        )

    def score(self, prompts: list, completions: list[str]) -> list[tuple[float, str]]:
        """(score, note) per pair; the note says when the pair was cut to the model's limit (else "")."""
        scores = self.model.score(prompts, completions)
        cut = f"truncated to the reward model's last {self.model.max_tokens} tokens"
        return [(s, cut if t else "") for s, t in zip(scores, self.model.truncated, strict=True)]

    def ping(self) -> bool:
        return True


class RewardModelClient:
    """A producer's handle on the reward-model servers: ``score`` splits the pairs evenly over them, waits up to
    ``timeout_s`` and raises naming the server that died or did not answer."""

    def __init__(self, servers: list, names: list[str], timeout_s: float):
        assert servers and len(servers) == len(names), (len(servers), names)
        self.servers, self.names, self.timeout_s = list(servers), list(names), timeout_s

    def score(self, prompts: list, completions: list[str], *columns: list) -> list:
        """The servers' (score, note) pairs, in order (a note: a judge reply left unread, a reward-model input cut)."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        k = len(self.servers)
        bounds = [len(prompts) * i // k for i in range(k + 1)]
        parts = [(i, bounds[i], bounds[i + 1]) for i in range(k) if bounds[i] < bounds[i + 1]]
        extra = list(columns)  # per-pair columns after the completions (a judge's references and rubrics)
        refs = [
            self.servers[i].score.remote(prompts[lo:hi], completions[lo:hi], *[x[lo:hi] for x in extra])
            for i, lo, hi in parts
        ]
        deadline, out = time.monotonic() + self.timeout_s, []
        for (i, _, _), ref in zip(parts, refs, strict=True):
            try:
                out += ray.get(ref, timeout=max(deadline - time.monotonic(), 0.0))
            except GetTimeoutError as e:
                raise RuntimeError(
                    f"reward model server {self.names[i]} did not answer within {self.timeout_s:g} s "
                    "(reward.rm.timeout_s)"
                ) from e
            except RayActorError as e:
                raise RuntimeError(f"reward model server {self.names[i]} died: {e}") from e
        return out
