"""The metrics registry: a declared key, a member of a declared family and a step record's payloads pass; an
undeclared key fails where the registry is enforced (the test suite) and warns once elsewhere."""

import logging

import pytest

from coati.distributed.loggers import metrics
from coati.distributed.loggers.metrics import check_declared, declared


def test_declared_keys_and_families():
    assert declared("loss/policy") and declared("reward/component/math") and declared("rollout/lag12_groups")
    assert not declared("rollout/lag_groups") and not declared("reward/component/a/b") and not declared("loss/x")


def test_an_undeclared_metric_fails_where_enforced_and_warns_once_elsewhere(monkeypatch, caplog):
    record = {"step": 1, "loss/policy": 0.1, "reward/component/rm": 0.5, "samples": [], "loss/new": 1.0}
    monkeypatch.setenv("COATI_STRICT_METRICS", "1")
    with pytest.raises(KeyError, match=r"\['loss/new'\] are not declared"):
        check_declared(record)
    check_declared({k: v for k, v in record.items() if k != "loss/new"})
    monkeypatch.setenv("COATI_STRICT_METRICS", "0")
    monkeypatch.setattr(metrics, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="coati.distributed.loggers.metrics"):
        check_declared(record)
        check_declared(record)
    assert [r.getMessage() for r in caplog.records].count(
        "metric loss/new is not declared in coati/distributed/loggers/metrics.py"
    ) == 1
