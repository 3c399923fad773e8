"""The algorithm core: pure tensor functions, registered by name, with one signature per kind.

Nothing here imports ray or touches CUDA; every function runs on whatever device its inputs live on.
- ``advantage``: estimators ``fn(rewards[B], group_ids[B], response_mask[B,T], cfg) -> AdvantageOutput``
- ``policy_loss``: ``fn(LossInput, cfg) -> (token_loss[B,T], metrics)``
- ``aggregation``: token-level losses -> the scalar whose gradient one optimizer step sums
- ``kl``: k1/k2/k3 estimators of KL(pi || pi_ref)
- ``correction``: off-policy corrections ``fn(old_logprobs, rollout_logprobs, mask, cfg) -> (weight[B,T], metrics)``
- ``shaping``: DAPO's soft overlong penalty and group filter
- ``presets``: ``ALGO_MAP``, each algorithm as a bundle of the above
"""

from coati.distributed.algo.advantage import ADVANTAGE_ESTIMATORS, AdvantageOutput
from coati.distributed.algo.aggregation import LOSS_AGGREGATIONS, LossNorm, aggregate_loss
from coati.distributed.algo.correction import OFF_POLICY_CORRECTIONS
from coati.distributed.algo.kl import KL_ESTIMATORS
from coati.distributed.algo.loss import LossInput, compute_policy_loss
from coati.distributed.algo.policy_loss import POLICY_LOSSES
from coati.distributed.algo.presets import ALGO_MAP, resolve_algorithm

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ALGO_MAP",
    "AdvantageOutput",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "LossInput",
    "LossNorm",
    "OFF_POLICY_CORRECTIONS",
    "POLICY_LOSSES",
    "aggregate_loss",
    "compute_policy_loss",
    "resolve_algorithm",
]
