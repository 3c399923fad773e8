"""coati: producer/consumer RL post-training of language models with verifiable rewards, on Ray."""

__version__ = "0.1.0"
