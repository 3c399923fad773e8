"""What a run guarantees against bad rewards, bad data, bad flags and lost work (real Ray, real ColossalAI)."""

import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import ray
import torch

from coati.distributed.driver.actor_group import RunError
from coati.distributed.driver.run_folder import RunFolderError
from coati.distributed.guards import RewardFailure
from coati.testing import build_tiny_model
from tests.e2e.runs import tiny_config, train

ROOT = Path(__file__).resolve().parents[2]
FNS = "tests.component.reward_fns"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("reliability_model")))


def rows(n=16, **fields):
    return [{"prompt": f"q{i}", "label": f"q{i}", **fields} for i in range(n)]


def config(tiny, folder=None, **sections):
    """This file's small run: 16 labelled prompts, 6 new tokens, lr 1e-3, one step; ``sections`` merged over it."""
    base = {
        "data": {"train": rows()},
        "generation": {"max_new_tokens": 6},
        "consumer": {"learning_rate": 1e-3, "train_microbatch_size": None},
        "reward": {"fn": f"{FNS}:digit_fraction"},
        "run": {"max_steps": 1},
    }
    for name, value in sections.items():
        base[name] = {**base[name], **value} if name in base else value
    return tiny_config(tiny, folder, **base)


def no_actors_left():
    return not [n for n in ray.util.list_named_actors() if "producer" in n or "consumer" in n]


# ---- bad input: refused before any actor starts, naming the value and the fix --------------------------------------


def smaller_vocab_model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path_factory.mktemp("small_vocab"))
    model = AutoModelForCausalLM.from_pretrained(path)
    model.resize_token_embeddings(64)
    model.save_pretrained(path)
    return str(path)


def bad_utf8_jsonl(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "q0", "gt_answer": "1"}\n{"prompt": "caf\xe9", "gt_answer": "2"}\n')
    return str(path)


MATH = {"fn": "math"}
BAD_INPUTS = {
    "unknown reward option": (
        dict(reward={**MATH, "kwargs": {"format_gat": False}}, data={"train": rows(gt_answer="1")}),
        ValueError,
        r"takes no option 'format_gat'; known options: \[.*'format_gate'",
    ),
    "reward option as a string": (
        dict(reward={**MATH, "kwargs": {"format_gate": "false"}}, data={"train": rows(gt_answer="1")}),
        ValueError,
        r"format_gate='false' is a str, but math expects a bool",
    ),
    "reward options not an object": (
        dict(reward={**MATH, "kwargs": ["format_gate"]}),
        ValueError,
        r"reward kwargs must be a JSON object \(dict\), got list",
    ),
    "missing gold column": (dict(reward=MATH), ValueError, r"math needs column\(s\) \['gt_answer'\]"),
    "null gold": (
        dict(reward=MATH, data={"train": rows(gt_answer=None)}),
        ValueError,
        r"row 0: column 'gt_answer' is None",
    ),
    "empty gold": (
        dict(reward=MATH, data={"train": rows(gt_answer=" ")}),
        ValueError,
        r"row 0: column 'gt_answer' is ' '",
    ),
    "missing test cases": (dict(reward={"fn": "code"}), ValueError, r"needs column\(s\) \['test_cases'\]"),
    "negative max_steps": (dict(run={"max_steps": -1}), ValueError, r"max_steps must be a positive integer, got -1"),
    "negative staleness": (
        dict(run={"max_staleness": -1}),
        ValueError,
        r"max_staleness must be a non-negative integer.*got -1",
    ),
    "unknown dynamic sampling signal": (
        dict(algorithm={"dynamic_sampling_signal": "accuracy"}),
        ValueError,
        r"dynamic_sampling_signal must be one of task_reward, reward",
    ),
    "bad error fraction": (dict(reward={"max_error_fraction": 2}), ValueError, r"in \[0, 1\], got 2"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_refused_before_any_actor(ray_cluster, tiny, case):
    over, error, match = BAD_INPUTS[case]
    with pytest.raises(error, match=match):
        train(config(tiny, **over))
    assert no_actors_left()


def test_bad_data_and_models_are_refused_before_any_actor(ray_cluster, tiny, tmp_path, tmp_path_factory):
    with pytest.raises(ValueError, match=r"latin1.jsonl:2: not UTF-8 \(byte 0xe9"):
        train(config(tiny, data={"train": bad_utf8_jsonl(tmp_path)}))
    small = smaller_vocab_model(tmp_path_factory)
    with pytest.raises(ValueError, match=r"vocab_size=64 but its tokenizer has \d+ tokens"):
        train(config(tiny, model={"path": small}))
    assert no_actors_left()


def test_run_folders_are_protected_and_a_resume_refuses_another_run(ray_cluster, tiny, tmp_path, tmp_path_factory):
    """One run's folder: a second run refuses it (and a locked one), a resume refuses another model, data, reward,
    seed or staleness bound and a run with nothing left, then resumes with an allowed change; an overwrite replaces
    it; a folder that cannot be written or lacks the space for its checkpoints is refused up front."""
    run_dir = tmp_path / "run"
    out = train(config(tiny, run_dir))
    assert out["final_model"]
    with pytest.raises(RunFolderError, match="holds another run .*checkpoints.*--resume latest.*--overwrite"):
        train(config(tiny, run_dir))
    assert (run_dir / "final").exists() and (run_dir / "checkpoints" / "step-1").exists()  # untouched
    with open(run_dir / ".lock", "a+") as other:  # another process's run holds the folder
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunFolderError, match="in use by another run"):
            train(config(tiny, run_dir, run={"overwrite": True}))
    other_model = str(build_tiny_model(tmp_path_factory.mktemp("wider"), hidden_size=48))
    changes = {
        "identity.train_model.config": dict(model={"path": other_model}),
        "identity.dataset.rows": dict(data={"train": rows(n=16, extra="x")}),
        "config.reward.fn": dict(reward={"fn": f"{FNS}:plain_floats"}),
        "identity.seed": dict(run={"seed": 7}),
        "identity.max_staleness": dict(run={"max_staleness": 1}),
    }
    resume = {"resume": "latest", "max_steps": 2}
    for field, over in changes.items():
        with pytest.raises(ValueError, match=rf"(?s)does not match this run.*\n  {field}: checkpoint") as e:
            others = {k: v for k, v in over.items() if k != "run"}
            train(config(tiny, run_dir, run={**resume, **over.get("run", {})}, **others))
        assert "--resume-allow identity" not in str(e.value)  # other weights or data are never offered
    with pytest.raises(ValueError, match="at step 1 and this run has 1 steps: nothing left to train"):
        train(config(tiny, run_dir, run={"resume": "latest"}))
    assert no_actors_left()
    out = train(config(tiny, run_dir, run={**resume, "seed": 7, "resume_allow": ("identity.seed",)}))
    assert [m["step"] for m in out["history"]] == [2]
    out = train(config(tiny, run_dir, run={"overwrite": True}))
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) == ["step-1"]  # step-2 went with the run
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(RunFolderError, match="not writable"):
        train(config(tiny, blocker / "run"))
    with pytest.raises(RunFolderError, match=r"GiB free but 10000000 checkpoints need about"):
        train(config(tiny, tmp_path / "big", run={"keep_checkpoints": 10_000_000}))
    assert no_actors_left()


def test_checkpoints_load_no_pickle(tmp_path):
    from coati.distributed.driver.checkpoint import load_driver_state, save_driver_state
    from coati.distributed.record import RolloutBatch

    marker = tmp_path / "pwned"
    (tmp_path / "driver.pkl").write_bytes(
        b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    )  # a pickle that runs a shell command when loaded
    with pytest.raises(FileNotFoundError):
        load_driver_state(tmp_path)
    assert not marker.exists()
    batch = RolloutBatch(
        prompt_ids=np.ones((2, 3), np.int64),
        prompt_mask=np.ones((2, 3), bool),
        response_ids=np.ones((2, 2), np.int64),
        response_mask=np.ones((2, 2), bool),
        rollout_logprobs=np.zeros((2, 2), np.float32),
        response_lengths=np.array([2, 2]),
        truncated=np.zeros(2, bool),
        group_ids=np.array([5, 5]),
        policy_version=np.array([1, 1]),
        rewards=np.array([0.5, 1.0], np.float32),
        extras={"reward_error_msg": np.array(["", "boom"], dtype="<U300"), "answer_ok": np.array([True, False])},
    )
    state = {"cursor": {"episode": 1, "position": 3}, "calls": 4, "version": 2, "torch_rng": torch.get_rng_state()}
    save_driver_state(tmp_path, [batch], [state])
    loaded = load_driver_state(tmp_path)
    assert torch.equal(loaded["producers"][0]["torch_rng"], state["torch_rng"])
    assert loaded["producers"][0]["cursor"] == state["cursor"]
    got = loaded["buffer"][0]
    for name in ("prompt_ids", "rewards", "group_ids", "policy_version"):
        assert np.array_equal(getattr(got, name), getattr(batch, name)), name
    assert list(got.extras["reward_error_msg"]) == ["", "boom"]


def test_a_pickle_planted_in_a_checkpoint_shard_never_runs_whatever_the_environment(tmp_path, monkeypatch):
    """ColossalAI reads optimizer and model shards with ``torch.load`` and no ``weights_only``, which
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` turns into a full unpickle; the consumer's loads are weights-only."""
    import pickle

    from colossalai.checkpoint_io.utils import load_shard_state_dict

    from coati.distributed.trainer.engine import weights_only_loads

    marker = tmp_path / "pwned"
    shard = tmp_path / "pytorch_optim-00001.bin"

    class Planted:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"state": Planted()}, shard)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.warns(UserWarning):  # the attack is real: ColossalAI's reader runs the pickle
        load_shard_state_dict(shard, use_safetensors=False)
    assert marker.exists()
    marker.unlink()
    with weights_only_loads(), pytest.raises(pickle.UnpicklingError):
        load_shard_state_dict(shard, use_safetensors=False)
    assert not marker.exists() and os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1"
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ


# ---- rewards: failures are loud, never trained on -------------------------------------------------------------------


def test_non_finite_reward_fails_the_step_naming_function_and_row(ray_cluster, tiny, tmp_path):
    with pytest.raises(RunError, match=r"nan_on_q1 returned nan for row 1 of the training set"):
        train(config(tiny, tmp_path / "run", reward={"fn": f"{FNS}:nan_on_q1"}))
    assert not (tmp_path / "run" / "final").exists() and not (tmp_path / "run" / "checkpoints").exists()
    assert no_actors_left()


def test_reward_errors_stop_the_run_with_the_first_error(ray_cluster, tiny):
    """The rule itself is unit-tested (test_guards.py); here the errors travel from the reward pool to the driver."""
    with pytest.raises(RewardFailure, match=r"always_raises failed on 16 of 16 .*first step.*KeyError: 'gold'"):
        train(config(tiny, reward={"fn": f"{FNS}:always_raises"}))
    # One prompt in sixteen fails (4 of 64 completions of a draw): past the first step and under the threshold the run
    # goes on, counting the errors in every step's metrics.
    reward = {"fn": f"{FNS}:raises_on_q1", "stop_on_first_step_error": False, "max_error_fraction": 0.1}
    out = train(
        config(
            tiny,
            producer={"inference_batch_size": 16, "inference_microbatch_size": 16},
            consumer={"train_batch_size": 16, "train_minibatch_size": 16, "train_microbatch_size": 16},
            reward=reward,
        )
    )
    assert out["history"][0]["reward/errors"] == 4 and out["history"][0]["reward/timeouts"] == 0
    assert no_actors_left()


# ---- non-finite training never reaches the weights ------------------------------------------------------------------


def test_non_finite_loss_skips_the_step_and_the_limit_stops_the_run(ray_cluster, tiny, tmp_path):
    from tests.e2e.runs import start_run

    run = start_run(tiny, consumer={"learning_rate": 1e-3, "max_skipped_steps": 1})
    try:
        consumer = run.consumers[0]
        batch = ray.get(run.producers[0].generate.remote(4))
        poisoned = batch.select(np.arange(len(batch)))
        poisoned.rewards = poisoned.rewards.copy()
        poisoned.rewards[0] = np.nan  # bypasses the producer's check: the consumer must still not step
        before = run.full_weights()
        metrics = ray.get(consumer.train_step.remote(poisoned))
        assert metrics["actor/skipped_steps"] == 1 and not np.isfinite(metrics["loss/policy"])
        after = run.full_weights()
        assert all(torch.equal(before[k], after[k]) for k in before), "a skipped step changed weights"
        metrics = ray.get(consumer.train_step.remote(batch))  # a clean batch trains
        assert metrics["actor/skipped_steps"] == 0 and np.isfinite(metrics["actor/grad_norm"])
        assert metrics["actor/grad_norm"] > 0
        with pytest.raises(ray.exceptions.RayTaskError, match=r"2 optimizer steps skipped .* max_skipped_steps=1"):
            ray.get(consumer.train_step.remote(poisoned))
    finally:
        run.shutdown()
    run = start_run(tiny, consumer={"learning_rate": 1e39})
    try:  # a learning rate that overflows the weights: neither a checkpoint nor an export is written from them
        batch = ray.get(run.producers[0].generate.remote(4))
        ray.get(run.consumers[0].train_step.remote(batch))
        with pytest.raises(ray.exceptions.RayTaskError, match="refusing to checkpoint .* non-finite weights"):
            ray.get(run.consumers[0].save_checkpoint.remote(str(tmp_path / "ckpt")))
        with pytest.raises(RunError, match="refusing to export .* non-finite weights"):
            run.save(str(tmp_path / "final"))
        assert not (tmp_path / "final").exists()
    finally:
        run.shutdown()


# ---- the command line -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--reward-kwargs", "{format_gate: false}"], r"argument --reward-kwargs: not valid JSON"),
        (["--inference-options", "[1, 2]"], r"argument .*--inference-options: must be a JSON object"),
        (["--max-steps", "-1"], r"RunConfig.max_steps must be a positive integer, got -1"),
        (["-tbs", "x"], r"argument -tbs/--train-batch-size: 'x' is not an integer"),
        (["--train-batch-size", "x"], r"argument -tbs/--train-batch-size: 'x' is not an integer"),
        (["-tbs", "6", "-tMbs", "4"], r"train_batch_size=6 is not divisible by train_minibatch_size=4"),
        (["--algo", "dappo"], r"error: unknown algorithm 'dappo'; known: CISPO, DAPO, DR_GRPO"),
        (["--policy-loss", "ppo"], r"error: unknown policy loss 'ppo'; known: "),
    ],
)
def test_cli_refuses_bad_flags_naming_them(capsys, argv, match):
    import re

    from coati.distributed.config.cli import parse_config

    with pytest.raises(SystemExit):
        parse_config(argv)
    assert re.search(match, capsys.readouterr().err)


def test_unreachable_address_fails_fast(tmp_path):
    """Refused as bad input: within seconds, and on the command line one line and exit status 2 (it was a bare
    message and status 1, as a run that had stopped), before the other inputs are read (a model folder that is not
    there is not reached: the address, a connection, is checked before seconds of tokenizer and file checks)."""
    import time

    from coati.distributed.driver.job import check_address

    start = time.monotonic()
    with pytest.raises(ValueError, match=r"--address 127.0.0.1:1: no Ray cluster answers there"):
        check_address("127.0.0.1:1")
    assert time.monotonic() - start < 10
    missing = str(tmp_path / "no-model")
    cmd = [sys.executable, str(ROOT / "rl_example.py"), "-m", missing, "--address", "127.0.0.1:1", "--no-progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert re.fullmatch(r"\S+: error: --address 127.0.0.1:1: no Ray cluster answers there .*", lines[-1]), lines
    assert "Traceback" not in out.stderr


def test_an_address_where_something_else_listens_fails_fast(ray_cluster):
    """Something listening that is not Ray (a silent server, an HTTP/1 one) made ray.init hang; the address is
    refused within seconds, and a real cluster's address passes."""
    import socket
    import threading

    import ray

    from coati.distributed.driver.job import check_address

    def serve(server, reply):
        conn, _ = server.accept()
        with conn:
            conn.recv(1024)
            if reply:
                conn.sendall(reply)
            threading.Event().wait(8)

    for reply in (b"", b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"):
        server = socket.create_server(("127.0.0.1", 0))
        port = server.getsockname()[1]
        threading.Thread(target=serve, args=(server, reply), daemon=True).start()
        with pytest.raises(
            ValueError,
            match=rf"--address 127.0.0.1:{port}: (something that is not a Ray cluster "
            r"listens there|no Ray cluster answers there \(timed out\))",
        ):
            check_address(f"127.0.0.1:{port}", timeout_s=2.0)
        server.close()
    check_address(ray.get_runtime_context().gcs_address)


START_LOCAL = """
import os, ray
from coati.distributed.driver.job import start_ray
start_ray(None)
print("nodes", len(ray.nodes()), ray.get_runtime_context().gcs_address != os.environ["RAY_ADDRESS"])
"""


@pytest.mark.background
def test_a_job_without_an_address_starts_its_own_cluster_whatever_ray_address_says(ray_cluster, tmp_path):
    """With RAY_ADDRESS naming a live cluster (here the suite's own; or a `ray start` cluster alive) a plain local
    run died with Ray's "num_cpus ... must not be provided"; without --address a job starts a cluster of its own."""
    root = str(Path(__file__).resolve().parents[2])  # this tree's coati, whatever is installed
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONPATH": root}
    out = subprocess.run(
        [sys.executable, "-c", START_LOCAL], capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-1500:]
    assert "nodes 1 True" in out.stdout, out.stdout


def test_jsonl_is_used_whole_unless_a_size_is_given():
    from coati.distributed.config.cli import parse_config

    def train_size(argv):
        return parse_config(argv).data.datasets(0)[0].size

    assert train_size(["-d", "data.jsonl"]) is None
    assert train_size(["-d", "data.jsonl", "--train-size", "5"]) == 5
    assert train_size([]) == 512  # a reasoning-gym task is drawn


def test_relative_paths_work_in_actors_and_a_trl_style_reward_gets_prompts_and_typed_options(
    ray_cluster, tiny, tmp_path, monkeypatch
):
    """The model and data given relative to the driver's folder, and a TRL-style reward (``prompts`` and typed
    options), in one run."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(16)))
    os.symlink(tiny, tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    out = train(
        config(
            "model",
            run={"max_steps": 4},
            data={"train": "data.jsonl"},
            reward={"fn": f"{FNS}:trl_style", "kwargs": {"scale": 2, "shout": True}},
        )
    )
    assert len(out["history"]) == 4
    prompts = [i for m in out["history"] for i in m["rollout/prompt_index"]]
    rewards = [m["reward/train_batch_mean"] for m in out["history"]]
    assert 3 in prompts and sum(rewards) == pytest.approx(1.0)  # only q3's group scored (2 x 2 for 4 of 16 rows)
    assert out["history"][0]["reward/errors"] == 0


@pytest.mark.background
def test_custom_reward_recipe_runs_as_documented(ray_cluster, tiny, tmp_path):
    """``python examples/custom_reward.py`` from another folder, in a process of its own (joining the session's Ray
    cluster by its address, as on a cluster)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    cmd = [
        sys.executable,
        str(ROOT / "examples" / "custom_reward.py"),
        "-m",
        tiny,
        "-b",
        "transformers",
        "--max-steps",
        "1",
        "-sd",
        str(tmp_path),
        "--no-progress",
        "-mnt",
        "8",
        "--eval-size",
        "2",
        "--train-size",
        "16",
        "--address",
        ray.get_runtime_context().gcs_address,
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (tmp_path / "custom_reward" / "latest" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1]  # the evaluation before training, one step


def test_a_run_folder_claimed_twice_by_one_process_stays_locked_until_both_release(tmp_path):
    from coati.distributed.driver.run_folder import RunFolder

    def locked_elsewhere():
        with open(tmp_path / ".lock", "a+") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(other, fcntl.LOCK_UN)
            return False

    cli = RunFolder.claim(str(tmp_path), "new")  # the command line claims first, then the launch it makes
    launch = RunFolder.claim(str(tmp_path), "new")
    assert launch is cli and locked_elsewhere()
    launch.release()
    assert locked_elsewhere()
    cli.release()
    assert not locked_elsewhere()


def test_evaluation_with_more_producers_than_held_out_rows(ray_cluster, tiny):
    """A producer with no held-out rows reports an empty evaluation the driver can add up."""
    out = train(
        config(
            tiny,
            producer={"num_producers": 2, "inference_batch_size": 2, "inference_microbatch_size": 2},
            data={"eval": rows(n=1)},
            run={"eval_interval": 1},
        )
    )
    assert [e["eval/count"] for e in out["evals"]] == [1, 1]
    assert all(e["eval/reward_errors"] == 0 for e in out["evals"])


def test_a_command_line_run_refused_for_bad_input_leaves_its_folder_as_it_found_it(ray_cluster, tiny, tmp_path):
    """A job refused before it starts (here: a dataset path that does not exist) writes no results, so the corrected
    command is not refused as "another run"; with --overwrite, the results it would replace survive the refusal."""
    from coati.distributed.config.cli import parse_config
    from coati.distributed.driver.job import run_job
    from coati.distributed.driver.run_folder import RUN_FILES, RunFolder

    folder = tmp_path / "run"

    def job(*flags):
        argv = [
            "-m",
            str(tiny),
            "-d",
            str(tmp_path / "missing.jsonl"),
            "--run-dir",
            str(folder),
            "--no-progress",
            "--report-to",
            "jsonl",
            "tensorboard",
            *flags,
        ]
        with pytest.raises(FileNotFoundError, match="missing.jsonl does not exist"):
            run_job(parse_config(argv))

    job()
    assert [n for n in RUN_FILES if (folder / n).exists()] == []
    RunFolder.claim(str(folder), "new").release()  # what the corrected command does first: not refused

    (folder / "checkpoints" / "step-3").mkdir(parents=True)  # an earlier run's results
    (folder / "checkpoints" / "step-3" / "meta.json").write_text('{"step": 3}')
    (folder / "metrics.jsonl").write_text('{"step": 3}\n')
    job("--overwrite")
    assert (folder / "metrics.jsonl").read_text() == '{"step": 3}\n'
    assert (folder / "checkpoints" / "step-3" / "meta.json").read_text() == '{"step": 3}'
    assert not (folder / "tensorboard").exists()
    assert no_actors_left()


def test_an_overwrite_counts_the_space_its_old_results_free(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from coati.distributed.driver.run_folder import RunFolder

    (tmp_path / "checkpoints" / "step-1").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-1" / "model.bin").write_bytes(b"x" * 3000)
    (tmp_path / "metrics.jsonl").write_bytes(b"x" * 1000)
    (tmp_path / "unrelated.txt").write_bytes(b"x" * 5000)  # not a run's result: not freed
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 500, 500))
    folder = RunFolder.claim(str(tmp_path), "overwrite")
    try:
        assert folder.results_bytes() == 4000
        with pytest.raises(RunFolderError, match="need about"):
            folder.check_space(4000, "the checkpoints")
        folder.check_space(4000, "the checkpoints", freed_bytes=folder.results_bytes())  # 500 free + 4000 freed
        with pytest.raises(RunFolderError, match="need about"):
            folder.check_space(4600, "the checkpoints", freed_bytes=folder.results_bytes())
        folder.clear()
        assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "unrelated.txt"]
    finally:
        folder.release()


def test_a_command_line_refusal_is_one_line_naming_the_fix(ray_cluster, tiny, tmp_path, monkeypatch, capsys):
    """A reward function written as a dotted path (TRL's `trl.rewards.accuracy_reward`) is refused naming the
    module:function form it needs, in one line on stderr with exit status 2, before any actor starts."""
    import rl_example

    monkeypatch.setattr(
        sys,
        "argv",
        [
            "rl_example.py",
            "-m",
            str(tiny),
            "-rt",
            "trl.rewards.accuracy_reward",
            "--run-dir",
            str(tmp_path / "run"),
            "--no-progress",
        ],
    )
    assert rl_example.cli() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "rl_example.py: error: unknown reward function 'trl.rewards.accuracy_reward'; a function of a "
        "module is named module:function (trl.rewards:accuracy_reward); registered: boxed, code, math, "
        "think_answer_tags"
    ], err
    assert no_actors_left()
