"""How producers sample completions: the generation section of the config tree."""

from __future__ import annotations

from dataclasses import dataclass

from coati.distributed.checks import as_strings, positive, require


@dataclass(frozen=True)
class GenerationConfig:
    """How producers sample completions."""

    temperature: float = 1.0
    """sampling temperature; the trainer computes log-probs at the same temperature"""
    top_k: int = 0
    """keep only the k most likely tokens (0 = off)"""
    top_p: float = 1.0
    """nucleus sampling mass in (0, 1] (1 = off)"""
    max_new_tokens: int = 48
    """response budget in tokens; longer responses are cut and flagged truncated"""
    max_prompt_tokens: int = 256
    """prompts longer than this (after the chat template) are rejected"""
    stop_strings: tuple[str, ...] = ()
    """extra strings that end a response (EOS always does)"""

    def __post_init__(self):
        require(self.temperature > 0, f"temperature must be > 0, got {self.temperature}; use greedy eval for 0")
        require(self.top_k >= 0, f"top_k must be >= 0 (0 = off), got {self.top_k}")
        require(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        positive(self, "max_new_tokens", "max_prompt_tokens")
        object.__setattr__(self, "stop_strings", as_strings(self.stop_strings, "generation.stop_strings"))
        require(
            all(isinstance(x, str) and x for x in self.stop_strings),
            f"stop_strings must be non-empty strings (an empty one would end every response at once), got "
            f"{list(self.stop_strings)}; leave the empty one out",
        )
