"""Each kind of fault, injected into a tiny-model run: what the user sees and how many seconds after the fault.

Every fault is made for real on this machine: a process killed with SIGKILL (a producer, the consumer, the reward
model's server, a reward worker) or stopped with SIGSTOP (a producer), a reward function that stops answering, a
weight push and a reward-model server that stop answering while their processes live (``fault_hooks``), a run
folder whose disk fills up during the run, a read-only run folder, a Ray address where nothing listens, a cluster
whose CPUs another job holds. The seconds run from the fault to the error the run ends with (or, where the run goes
on, to the end of the step that met it); a run's start-up is not counted, except for the faults found before any
actor starts, timed from the call. Faults not made here are listed with the deadline that bounds them and why they
are not measured.

    python benchmarks/bench_faults.py [--only NAME ...]

Writes ``benchmarks/results/faults.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks.chaos import pids  # noqa: E402
from benchmarks.results_file import write_result  # noqa: E402

REWARD = "benchmarks.fault_rewards:digits"


def job(tiny: str, **over) -> dict:
    kw = dict(
        num_producers=1,
        num_proc_per_producer=1,
        num_consumer_procs=1,
        num_episodes=1,
        inference_batch_size=4,
        inference_microbatch_size=4,
        train_batch_size=4,
        train_minibatch_size=4,
        train_dataset_config={"rows": [{"prompt": f"q{i}"} for i in range(64)]},
        inference_model_config={"path": tiny},
        train_model_config={"path": tiny},
        generate_config={"max_new_tokens": 12, "temperature": 1.0},
        grpo_config={"lr": 3e-3, "reward_fn_type": REWARD, "train_microbatch_size": 8},
        plugin_config={},
        num_generations=4,
        core_algo="GRPO",
        max_steps=4,
        inference_backend="transformers",
        max_staleness=0,
    )
    grpo = over.pop("grpo", {})
    kw.update(over)
    kw["grpo_config"] = {**kw["grpo_config"], **grpo}
    return kw


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0]}"


def run_until(kw: dict, fault, at_step: int = 1) -> dict:
    """Launch ``kw``; after step ``at_step`` is reported, ``fault()`` (returns a description); the seconds from then
    to the run's error (or to the next step's report, when the run goes on)."""
    from coati.distributed.launch import launch_distributed

    mark: dict = {}

    def on_step(metrics):
        if "t" in mark and "next" not in mark and metrics["step"] > at_step:
            mark["next"] = time.monotonic() - mark["t"]
            mark["next_metrics"] = {k: metrics.get(k) for k in ("reward/errors", "reward/timeouts", "step")}
        if metrics["step"] == at_step and "t" not in mark:
            mark["what"] = fault()
            mark["t"] = time.monotonic()

    try:
        launch_distributed(**kw, on_step=on_step)
    except Exception as e:  # noqa: BLE001 - the fault's error: what the user sees
        if "t" not in mark:  # failed before the fault was made
            return {"injected": None, "seconds": None, "error": first_line(e)}
        return {"injected": mark.get("what"), "seconds": time.monotonic() - mark["t"], "error": first_line(e)}
    return {"injected": mark.get("what"), "seconds": mark.get("next"), "error": None, "run_went_on": mark}


def timed_call(fn) -> dict:
    begun = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - whatever the fault raises is its result
        return {"seconds": time.monotonic() - begun, "error": first_line(e)}
    return {"seconds": time.monotonic() - begun, "error": None}


# ---- the faults --------------------------------------------------------------------------------------------------


def kill(title: str, children: bool = False):
    def fault():
        import psutil

        (pid,) = pids(title)[:1]
        if children:
            (pid,) = [c.pid for c in psutil.Process(pid).children(recursive=True)][:1]
        os.kill(pid, signal.SIGKILL)
        return f"SIGKILL to pid {pid} ({'a child of ' if children else ''}{title})"

    return fault


def dead_producer(tiny, work):
    return run_until(job(tiny), kill("ray::Producer"))


def dead_consumer(tiny, work):
    return run_until(job(tiny), kill("ray::GRPOConsumer"))


def stopped_producer(tiny, work):
    """SIGSTOP: the producer neither answers nor dies (``run.hang_timeout_s``, the default)."""

    def stop():
        (pid,) = pids("ray::Producer")[:1]
        os.kill(pid, signal.SIGSTOP)
        return f"SIGSTOP to pid {pid} (ray::Producer)"

    from coati.distributed.config.tree import RunConfig

    return {**run_until(job(tiny), stop), "bound_s": RunConfig().hang_timeout_s}


def dead_reward_worker(tiny, work):
    return run_until(job(tiny), kill("ray::Producer", children=True))


def dead_reward_model_server(tiny, work):
    from coati.testing import build_tiny_reward_model

    rm = str(build_tiny_reward_model(work / "rm"))
    grpo = {"rm_path": rm, "reward_components": {REWARD: 0.0, "rm": 1.0}, "rm_placement": "any", "rm_cpus": 0.5}
    return run_until(job(tiny, grpo=grpo), kill("ray::RewardModelServer"))


def hung_reward(tiny, work):
    flag = work / "hang"
    grpo = {"reward_kwargs": {"hang_flag": str(flag)}, "reward_timeout_s": 10.0}
    return {**run_until(job(tiny, grpo=grpo), lambda: flag.touch() or f"{REWARD} hangs from step 2"), "bound_s": 10.0}


def hung_environment_step(tiny, work):
    """A one-turn environment whose step hangs from step 2 on (``reward.env.step_timeout_s`` 10 s)."""
    flag = work / "env_hang"
    grpo = {
        "env": "benchmarks.fault_rewards:HangingEnv",
        "env_kwargs": {"hang_flag": str(flag)},
        "env_step_timeout_s": 10.0,
        "env_max_tokens": 64,
    }
    fault = lambda: flag.touch() or "the environment's step hangs from step 2"  # noqa: E731
    return {**run_until(job(tiny, grpo=grpo), fault), "bound_s": 10.0}


def hung_collective(tiny, work):
    """From step 2's push on, the producer's side of the weight group's collectives waits for ever while its process
    lives and beats (``fault_hooks``): the consumer's broadcast hangs with it (``run.hang_timeout_s``)."""
    from coati.distributed.config.tree import RunConfig

    fault = lambda: (work / "flags" / "hang-push").touch() or "the producer stops taking part in pushes"  # noqa: E731
    try:
        return {**run_until(job(tiny), fault), "bound_s": RunConfig().hang_timeout_s}
    finally:
        (work / "flags" / "hang-push").unlink(missing_ok=True)


def silent_reward_model_server(tiny, work):
    """From step 2 on, the reward-model server's ``score`` never returns while its process lives and beats
    (``fault_hooks``; ``reward.rm.timeout_s``, the default)."""
    from coati.distributed.reward.config import RewardModelConfig
    from coati.testing import build_tiny_reward_model

    rm = str(build_tiny_reward_model(work / "rm"))
    grpo = {"rm_path": rm, "reward_components": {REWARD: 0.0, "rm": 1.0}, "rm_placement": "any", "rm_cpus": 0.5}
    fault = lambda: (work / "flags" / "hang-rm").touch() or "the reward-model server stops answering"  # noqa: E731
    try:
        return {**run_until(job(tiny, grpo=grpo), fault), "bound_s": RewardModelConfig().timeout_s}
    finally:
        (work / "flags" / "hang-rm").unlink(missing_ok=True)


def disk_full(tiny, work):
    """The run folder on a 256 MiB tmpfs (enough for the run's checkpoints, checked before it starts), filled to the
    last byte after step 1; step 1's checkpoint follows."""
    mount = work / "small_disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(mount)], check=True)
    try:

        def fill():
            with open(mount / "filler", "wb", buffering=0) as f:  # unbuffered: nothing left to fail at its close
                try:
                    while True:
                        f.write(b"\0" * (1 << 20))
                except OSError:
                    pass
            return "the run folder's disk filled"

        return run_until(job(tiny, save_dir=str(mount / "run"), save_interval=1), fill)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def read_only_folder(tiny, work):
    from coati.distributed.launch import launch_distributed

    mount = work / "read_only"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,ro", "tmpfs", str(mount)], check=True)
    try:
        return timed_call(lambda: launch_distributed(**job(tiny, save_dir=str(mount / "run"))))
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def unreachable_address(tiny, work):
    """The command line with ``--address`` where nothing listens, timed from the command."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, str(ROOT / "rl_example.py"), "-m", tiny, "--address", f"127.0.0.1:{port}", "--no-progress"]
    begun = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    lines = out.stderr.strip().splitlines()
    return {"seconds": time.monotonic() - begun, "error": lines[-1] if lines else "", "exit_status": out.returncode}


def cpus_held_elsewhere(tiny, work):
    """Another job's actor holds all but one of the cluster's CPUs; the run needs more."""
    import ray

    from coati.distributed.launch import launch_distributed

    free = ray.available_resources().get("CPU", 0)
    holder = ray.remote(num_cpus=free - 0.5)(_Holder).remote()
    ray.get(holder.ready.remote())
    try:
        return timed_call(lambda: launch_distributed(**job(tiny)))
    finally:
        ray.kill(holder)


class _Holder:
    def ready(self) -> bool:
        return True


FAULTS = {
    "dead producer": dead_producer,
    "dead consumer": dead_consumer,
    "stopped producer": stopped_producer,
    "dead reward worker": dead_reward_worker,
    "dead reward-model server": dead_reward_model_server,
    "silent reward-model server": silent_reward_model_server,
    "hung collective": hung_collective,
    "hung reward": hung_reward,
    "hung environment step": hung_environment_step,
    "full disk": disk_full,
    "unwritable folder": read_only_folder,
    "unreachable Ray address": unreachable_address,
    "too few CPUs": cpus_held_elsewhere,
}

NOT_MADE_HERE = {
    "actor killed for memory": "the kernel's or Ray's OOM killer ends the process as SIGKILL does: as a dead producer "
    "or consumer above",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(FAULTS), default=None)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    import ray

    from coati.testing import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="faults-"))
    (work / "flags").mkdir()
    tiny = str(build_tiny_model(work / "policy"))
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env["COATI_FAULT_FLAGS"] = str(work / "flags")
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": env, "worker_process_setup_hook": "benchmarks.fault_hooks.install"},
    )
    results = {}
    try:
        for name in args.only or FAULTS:
            results[name] = FAULTS[name](tiny, work)
            print(name, json.dumps(results[name], default=str), flush=True)
    finally:
        ray.shutdown()
    result = {"measured": results, "not_measured": NOT_MADE_HERE}
    if not args.no_write and not args.only:
        print(f"wrote {write_result('faults', result)}")


if __name__ == "__main__":
    main()
