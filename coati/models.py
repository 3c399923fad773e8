"""The tiny-model builders' earlier import path: they live in ``coati.testing`` now."""

from coati.testing import (  # noqa: F401 - the same names at their old path
    CHAT_TEMPLATE,
    build_tiny_model,
    build_tiny_reward_model,
    char_tokenizer,
    train_tiny_reward_model,
)
