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

import importlib

_HOMES = {
    "ADVANTAGE_ESTIMATORS": "advantage",
    "AdvantageOutput": "advantage",
    "LOSS_AGGREGATIONS": "aggregation",
    "LossNorm": "aggregation",
    "aggregate_loss": "aggregation",
    "OFF_POLICY_CORRECTIONS": "correction",
    "KL_ESTIMATORS": "kl",
    "LossInput": "loss",
    "compute_policy_loss": "loss",
    "POLICY_LOSSES": "policy_loss",
    "ALGO_MAP": "presets",
    "resolve_algorithm": "presets",
}
"""each public name and its module: imported when first asked for, so the config (presets, names) loads without torch"""


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


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
