"""A learned reward model: any ``AutoModelForSequenceClassification`` folder with one output (a scalar head) scores a
prompt and its completion, rendered as a conversation with the model's own chat template (the prompt's messages, then
the completion as the assistant's turn). Batched, no gradients; the score is the head's raw output.

This module is the scorer itself (model in, floats out); placing it in Ray actors of its own and sharing them among
producers is the caller's business.
"""

from __future__ import annotations

import torch


class RewardModel:
    """Scores (prompt, completion) pairs with a sequence-classification model."""

    def __init__(
        self,
        path: str,
        batch_size: int = 8,
        max_tokens: int | None = None,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        labels = AutoConfig.from_pretrained(path).num_labels
        if labels != 1:
            raise ValueError(
                f"reward model {path} has {labels} outputs; a reward model has one (num_labels=1, a scalar head)"
            )
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype).to(device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.model.config.pad_token_id is None:
            if self.tokenizer.pad_token_id is None:
                raise ValueError(f"reward model {path} has no pad token: batched scoring needs one")
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        context = getattr(self.model.config, "max_position_embeddings", None) or 1024
        self.max_tokens = min(max_tokens or context, context)
        """the longest conversation scored whole (at most the model's context); longer ones keep their end"""
        self.batch_size, self.device = batch_size, device
        self.truncated: list[bool] = []
        """per pair of the last ``score`` call: its conversation was over max_tokens and lost its beginning"""

    def render(self, prompt, completion: str) -> str:
        """The conversation the model scores: ``prompt`` (text or messages) and the completion as the answer."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        return self.tokenizer.apply_chat_template(
            messages + [{"role": "assistant", "content": completion}], tokenize=False
        )

    @torch.no_grad()
    def score(self, prompts: list, completions: list[str], on_batch=None) -> list[float]:
        """One float per pair; texts over ``max_tokens`` keep their last tokens (the completion's end) and are
        flagged in ``truncated``; ``on_batch()`` is called after each batch (a server counts its progress)."""
        texts = [self.render(p, c) for p, c in zip(prompts, completions, strict=True)]
        lengths = [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        self.truncated = [n > self.max_tokens for n in lengths]
        out: list[float] = []
        side = self.tokenizer.truncation_side
        self.tokenizer.truncation_side = "left"
        try:
            for lo in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(
                    texts[lo : lo + self.batch_size],
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=self.max_tokens,
                    add_special_tokens=False,
                )
                logits = self.model(**{k: v.to(self.device) for k, v in enc.items()}).logits
                out += [float(x) for x in logits[:, 0].float().cpu()]
                if on_batch is not None:
                    on_batch()
        finally:
            self.tokenizer.truncation_side = side
        return out
