"""Producers and consumers on a CPU run with malloc settings that keep freed memory mapped (real Ray, real worker
processes): a training step's largest tensors, and a push's reloaded layers, then reuse pages instead of faulting
fresh ones every time."""

import ray

from coati.distributed.driver.actor_group import KEEP_FREED_MEMORY, cpu_actor_env

PAGES = 2**16  # a 256 MiB float32 tensor, in 4 KiB pages
BASE = {"runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1"}}}


@ray.remote(num_cpus=0)
def faults_reallocating() -> int:
    """Page faults taken while a tensor 1 MiB smaller than one just freed is allocated and written (smaller, so that
    it fits the freed block whatever malloc's alignment padding and whatever was allocated after it)."""
    import resource

    import torch

    torch.ones(PAGES * 1024)  # allocated, written, freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    again = torch.ones((PAGES - 256) * 1024)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del again
    return faults


def test_a_cpu_consumer_reuses_the_pages_of_a_freed_tensor(ray_cluster):
    kept = ray.get(faults_reallocating.options(**cpu_actor_env(BASE, 0)).remote())
    default = ray.get(faults_reallocating.options(**BASE).remote())
    assert default > PAGES // 2, default  # glibc's default: a large tensor is mapped afresh and faulted in
    assert kept < PAGES // 20, kept


def test_the_setting_reaches_cpu_actors_only_and_yields_to_the_drivers(monkeypatch):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert cpu_actor_env(BASE, 0)["runtime_env"]["env_vars"] == {
        "OMP_NUM_THREADS": "1",
        "GLIBC_TUNABLES": KEEP_FREED_MEMORY,
    }
    assert (
        cpu_actor_env(BASE, 1) == BASE and cpu_actor_env(BASE, 0.5) == BASE
    )  # an actor on a GPU keeps glibc's defaults
    assert BASE["runtime_env"]["env_vars"] == {"OMP_NUM_THREADS": "1"}  # not modified in place
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert cpu_actor_env(BASE, 0)["runtime_env"]["env_vars"]["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
