"""ColossalChat's import path for the consumer: ``from coati.distributed.grpo_consumer import GRPOConsumer``. The
consumer lives in ``trainer/``."""

from coati.distributed.trainer.consumer import GRPOConsumer

__all__ = ["GRPOConsumer"]
