"""Fixtures the unit tests share."""

import pytest


@pytest.fixture
def no_ray(monkeypatch):
    """No Ray, and no inputs to check (the model folder here is empty)."""
    import ray

    import coati.distributed.driver.job as job

    monkeypatch.setattr(ray, "init", lambda *a, **k: None)
    import coati.distributed.driver.preflight as preflight

    monkeypatch.setattr(job, "check_inputs", lambda config, files_checked=None: None)
    monkeypatch.setattr(preflight, "check_inputs", lambda config, files_checked=None: None)
