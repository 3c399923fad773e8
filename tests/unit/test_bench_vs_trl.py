"""The benchmarks' coati runs are configs coati accepts: checked here, before a benchmark's hour-long run (a preset's
new default once left bench_vs_trl's config refused at start)."""

import pytest

from benchmarks.bench_vs_trl import PRECISIONS, coati_kwargs
from coati.distributed.driver.launch import config_from_launch_kwargs


@pytest.mark.parametrize("staleness", [0, 1])
@pytest.mark.parametrize("precision", sorted(PRECISIONS))
def test_bench_vs_trl_runs_a_config_coati_accepts(precision, staleness):
    rows = [{"question": f"{i} + 1 =", "answer": str(i + 1)} for i in range(8)]
    config = config_from_launch_kwargs(**coati_kwargs("model", rows, 6, 32, 1e-5, staleness, PRECISIONS[precision][1]))
    algorithm = config.algo_config
    assert (algorithm.dynamic_sampling, algorithm.skip_no_signal_after, algorithm.overlong_buffer_ratio) == (
        False,
        0,
        0,
    )
    assert config.run.max_staleness == staleness


@pytest.mark.parametrize("at_steps", [[], [10, 20]])
def test_bench_main_job_vs_trl_reruns_into_its_own_folder(at_steps):
    """Without ``--reuse`` the benchmark's job replaces the folder an earlier invocation left (it refused to start
    there, as a run folder holding another run is refused), and checkpoints where asked."""
    from benchmarks.bench_main_job_vs_trl import coati_args
    from coati.distributed.config.cli import parse_config

    run = parse_config(coati_args(3, at_steps, 30, ["--skip-no-signal-after", "0"])).run
    assert run.overwrite and run.seed == 3
    assert run.project == "bench-main-job" + ("-curve" if at_steps else "") + "-3-skipnosignalafter-0"
    if at_steps:
        assert (run.save_interval, run.keep_checkpoints) == (10, 3)


def test_the_trainers_rate_counts_each_prompt_once_and_the_head_on_response_tokens():
    """6 x (body weights x unique tokens + head weights x response tokens) over the steps' training seconds, by hand;
    the steady-state rate is the same sum over the steps after the warm-up."""
    from benchmarks.bench_vs_trl import WARMUP_STEPS, trainer_gflops

    steps = [
        {"rollout/trained_tokens_unique": 100, "rollout/trained_response_tokens": 40, "time/train_step": 4.0},
        {"rollout/trained_tokens_unique": 200, "rollout/trained_response_tokens": 80, "time/train_step": 1.0},
        {"rollout/trained_tokens_unique": 300, "rollout/trained_response_tokens": 60, "time/train_step": 2.0},
    ]
    body, head = 2_000_000, 500_000
    flops = [6 * (body * 100 + head * 40), 6 * (body * 200 + head * 80), 6 * (body * 300 + head * 60)]
    assert trainer_gflops(steps, (body, head)) == pytest.approx(sum(flops) / 7.0 / 1e9)
    assert WARMUP_STEPS == 2 and trainer_gflops(steps[WARMUP_STEPS:], (body, head)) == pytest.approx(
        flops[2] / 2.0 / 1e9
    )


def test_a_result_file_records_the_machine_s_vector_features_and_probe(tmp_path, monkeypatch):
    """Machines of one name differ by 100x in bf16 with and without AVX512-BF16: a result file says which it ran on."""
    import json

    from benchmarks import results_file
    from coati.provenance import ISA_FLAGS

    monkeypatch.setattr(results_file, "RESULTS", tmp_path)
    record = json.loads(results_file.write_result("probe", {"x": 1}, ["bench.py"]).read_text())
    machine = record["machine"]
    assert set(machine["isa"]) <= set(ISA_FLAGS) and machine["cores"] >= 1
    flags = open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0].split()
    assert ("avx512_bf16" in machine["isa"]) == ("avx512_bf16" in flags)
    assert machine["matmul_gflops_1_thread"]["float32"] > 0 and record["result"] == {"x": 1}


def test_the_matmul_probe_runs_once_per_process_and_within_its_budget(monkeypatch):
    """Every run's env.json carries the probe; a process launching many runs (a script, the test session) measures
    once. Each dtype takes at least two products and stops past its budget."""
    import torch

    from coati import provenance

    monkeypatch.setattr(provenance, "_probed", {})
    calls, products = [], []
    real_probe, real_matmul = provenance._probe, torch.Tensor.__matmul__
    monkeypatch.setattr(provenance, "_probe", lambda *a: calls.append(a) or real_probe(*a))
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: products.append(a.dtype) or real_matmul(a, b))
    first = provenance.matmul_probe(size=64, reps=50, budget_s=0.0)
    assert provenance.matmul_probe(size=64, reps=50, budget_s=0.0) == first and len(calls) == 1
    assert products == [torch.float32] * 2 + [torch.bfloat16] * 2 and min(first.values()) > 0
