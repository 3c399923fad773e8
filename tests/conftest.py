"""Shared fixtures: one Ray cluster per test session (a ray.init costs ~4 s), every worker single-threaded."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# No torch.compile in the tests: vLLM's CPU sampler compiles two helpers at each engine's first step (~2.6 s an
# engine, some 16 engines in the suite), and importing ColossalAI pulls in the compiler through bitsandbytes (~1 s an
# actor); eager, the same tokens and log-probs. Runs keep vLLM's default (benchmarks/bench_rollout.py --vllm-compile).
# Set before Ray starts, so every actor inherits it.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault(
    "COATI_STRICT_METRICS", "1"
)  # a run that logs a metric coati/distributed/loggers/metrics.py lacks fails


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CUDA; run on a GPU machine with `pytest -m gpu`")
    config.addinivalue_line(
        "markers", "background: run beside the suite at the lowest CPU priority (tests/background.py)"
    )
    # coati's bytecode written once, so the suite's hundreds of workers do not each compile its modules again (under
    # PYTHONDONTWRITEBYTECODE an import never writes it)
    import compileall

    compileall.compile_dir(ROOT / "coati", quiet=2)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(config, items):
    import torch

    from tests import background

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA (gpu mark)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    BESIDE[:] = [b for b in [background.take_marked(config, items)] if b is not None]
    if BESIDE or os.environ.get(background.RESULTS_ENV):
        # Two pytest processes share the cores: each computes on one thread, as every actor does. Two threads here
        # waited at each parallel region for the one the other process's work had displaced (a judge fitted in 7 s
        # alone took 33-54 s beside the background process).
        torch.set_num_threads(1)


BESIDE: list = []
"""the background pytest process of this run (``tests/background.py``), once started"""


def pytest_terminal_summary(terminalreporter):
    from tests import background

    for beside in BESIDE:
        for line in background.summary_lines(beside):
            terminalreporter.write_line(line)


def pytest_unconfigure(config):
    for beside in BESIDE:
        beside.stop()


@pytest.fixture(scope="session")
def ray_cluster():
    """The session's Ray cluster. Its workers are forked from processes that have imported torch, transformers,
    ColossalAI and vLLM once (``tests/prefork.py``; ``COATI_PREFORK=0`` starts each worker as a new interpreter), one
    in the environment a run gives its CPU actors, one in the session's own; a worker in any other environment starts
    as a new interpreter."""
    import shutil
    import tempfile

    import ray
    from ray._private import ray_constants

    from coati.distributed.driver.actor_group import cpu_actor_env
    from tests import prefork

    env_vars = {
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    servers, runtime_env = [], {"env_vars": env_vars}
    setup_worker = ray_constants.SETUP_WORKER_FILENAME
    if not ray.is_initialized() and os.environ.get("COATI_PREFORK", "1") != "0":
        # a run's CPU actors (with their malloc settings) and every other worker
        cpu_actor = cpu_actor_env({"runtime_env": {"env_vars": env_vars}}, 0)["runtime_env"]["env_vars"]
        folder = tempfile.mkdtemp(prefix="coati-pf-")  # the servers' sockets and the workers' log
        servers, routing = prefork.start([cpu_actor, env_vars], folder)
        runtime_env = {"py_executable": routing["py_executable"], "env_vars": {**env_vars, **routing["env_vars"]}}
        # Ray's setup step, which imports Ray in a process of its own for every worker, done without it (for the
        # session's cluster only: a cluster a test starts later in this process gets Ray's own)
        ray_constants.SETUP_WORKER_FILENAME = str(ROOT / "tests" / "ray_setup.py")
    if not ray.is_initialized():
        try:
            # "local": a cluster of the session's own, whatever else runs on the machine (a `ray start` cluster, the
            # background process's, which ray.init without an address would join)
            ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=True, runtime_env=runtime_env)
        finally:
            ray_constants.SETUP_WORKER_FILENAME = setup_worker
    for server in servers:
        prefork.wait_ready(server)
    yield ray
    ray.shutdown()
    for server in servers:
        server.terminate()
        server.wait()
    if servers:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def score7_judge(tmp_path_factory):
    """A tiny causal LM fitted to answer any judge prompt with 'Score: 7' (head size 32, which vLLM's CPU kernels
    take), shared by the judge's component and end-to-end tests."""
    from coati.testing import build_tiny_model
    from tests.component.test_judge import fit_reply

    return fit_reply(str(build_tiny_model(tmp_path_factory.mktemp("judge"), num_heads=2)), "Score: 7")
