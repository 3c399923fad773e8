"""Random kill -9s over tiny-model jobs: what is lost, what is trained twice, how long a run takes to go on.

One Ray cluster of this machine runs jobs of the command line (``rl_example.py``, GRPO, a tiny Llama policy scored
by a tiny reward model served by its own actor, 2 producers, 1 consumer, staleness bound 1, a checkpoint every step,
``--max-restarts``). At random moments (``--gap-s``: uniform seconds after the run trains a step it had not
trained before; a share ``--during-start`` while it still recovers from the previous kill) a random process of the
job gets SIGKILL: the driver, a producer, the consumer, a producer's reward worker or the reward-model server. A
killed actor is the run's to recover from (it restarts from its last checkpoint by itself); a killed driver is
started again with ``--resume latest``, as a user would. A run that ends is checked from its run folder, and the
next one starts, until ``--kills`` kills have landed.

Each run is checked without the run's own accounting: the steps of ``metrics.jsonl`` (each step once, as the run
that continued trained it) name the groups each step trained (``rollout/epoch``, ``rollout/prompt_index``); every
group of every epoch must be there exactly once (lost: missing, duplicated: there twice), and every step's weight push
attested (``weights/attested``: tensors compared, none unlike they were sent) with no restart caused by an
attestation. The run's own ledger (``summary.json`` ``groups``) is reported beside it. Recovery: seconds from a kill
to the next step the run trains that it had not trained before.

    python benchmarks/chaos.py --kills 50 [--seed 0] [--gap-s 0 15] [--epochs 40]

Writes ``benchmarks/results/chaos.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results_file import write_result  # noqa: E402

ROWS = 16
GROUPS_PER_STEP = 4
TARGETS = ("driver", "producer", "consumer", "reward_worker", "reward_model")
"""what a kill may hit"""
ATTESTATION = "unlike the consumers sent them"
"""what the error of a push an engine did not load whole says (``ActorGroups.attest``)"""
FINISHED = "nothing left to train"
"""a resume's refusal of a run whose last step was trained and whose final model was exported"""
RUN_LIMIT_S = 600
"""a run that has not ended this long after its last kill is reported as hung"""


def build_models(folder: Path) -> tuple[str, str, str]:
    """The tiny policy, the tiny reward model and the training rows."""
    from coati.testing import build_tiny_model, build_tiny_reward_model

    policy = str(build_tiny_model(folder / "policy"))
    rm = str(build_tiny_reward_model(folder / "rm"))
    rows = folder / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "gt_answer": "1"}) + "\n" for i in range(ROWS)))
    return policy, rm, str(rows)


def job_command(policy: str, rm: str, rows: str, save_dir: str, project: str, address: str, epochs: int) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "rl_example.py"),
        "--algo",
        "GRPO",
        "-m",
        policy,
        "-b",
        "transformers",
        "--data-train",
        rows,
        "--num-episodes",
        str(epochs),
        "--num-producers",
        "2",
        "--train-batch-size",
        str(GROUPS_PER_STEP),
        "--inference-batch-size",
        "2",
        "--inference-microbatch-size",
        "2",
        "--num-generations",
        "4",
        "--max-new-tokens",
        "16",
        "--reward-fn",
        "math",
        "--reward-components",
        json.dumps({"math": 0.0, "rm": 1.0}),
        "--reward-rm-path",
        rm,
        "--reward-rm-cpus",
        "0.5",
        "--reward-rm-placement",
        "any",
        "--reward-rm-normalize",
        "none",
        "--no-reward-stop-on-first-step-error",
        "--max-staleness",
        "1",
        "--save-interval",
        "1",
        "--max-restarts",
        "1000",
        "--weight-sync-timeout-s",
        "30",
        "--address",
        address,
        "--save-dir",
        save_dir,
        "--project",
        project,
        "--report-to",
        "jsonl",
        "--no-progress",
    ]


# ---- the processes of a job ----------------------------------------------------------------------------------------


def pids(title: str, among: list) -> list[int]:
    """The processes of ``among`` whose title starts with ``title`` (a Ray actor's: ``ray::Producer`` ...)."""
    import psutil

    found = []
    for p in among:
        try:
            if (p.cmdline() or [""])[0].startswith(title):
                found.append(p.pid)
        except psutil.Error:  # ended meanwhile
            pass
    return found


def victims(driver_pid: int) -> dict[str, list[int]]:
    """The job's processes by target: the actor processes of the cluster its driver started (the driver's
    descendants: its raylet's workers), found by their title, and a producer's reward workers as its children. A
    process of any other run on the machine, whatever its title, is never one."""
    import psutil

    try:
        ours = psutil.Process(driver_pid).children(recursive=True)
    except psutil.Error:
        ours = []
    producers = pids("ray::Producer", ours)
    workers = []
    for pid in producers:
        try:
            workers += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            pass
    return {
        "driver": [driver_pid],
        "producer": producers,
        "consumer": pids("ray::GRPOConsumer", ours),
        "reward_worker": workers,
        "reward_model": pids("ray::RewardModel", ours),
    }


def steps_trained(run_folder: Path | None) -> dict[int, dict]:
    """{step: its metrics} from the run's metrics.jsonl (training steps; the last record of a step wins)."""
    out: dict[int, dict] = {}
    path = run_folder / "metrics.jsonl" if run_folder else None
    if path is None or not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill
            continue
        if record.get("step", 0) >= 1 and "rollout/prompt_index" in record:
            out[record["step"]] = record
    return out


def run_folder(save_dir: str, project: str) -> Path | None:
    latest = Path(save_dir) / project / "latest"
    return latest.resolve() if latest.exists() else None


# ---- one run ---------------------------------------------------------------------------------------------------------


class Job:
    """A job's driver process, started again with ``--resume latest`` after its driver is killed."""

    def __init__(self, command: list[str], log_path: Path):
        self.command, self.log_path = command, log_path
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, resume: bool) -> None:
        command = self.command + (["--resume", "latest"] if resume else [])
        log = self.log_path.open("a")
        log.write(f"\n==== start {self.starts}: {' '.join(command[-4:])} resume={resume}\n")
        log.flush()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        self.starts += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def has_checkpoint(save_dir: str, project: str) -> bool:
    folder = run_folder(save_dir, project)
    return folder is not None and (folder / "checkpoints" / "latest").exists()


def check_run(folder: Path, epochs: int) -> dict:
    """What the run's metrics.jsonl says it trained, against every group of every epoch; its ledger beside."""
    steps = steps_trained(folder)
    total = epochs * ROWS // GROUPS_PER_STEP
    trained = [
        (e, r)
        for s in sorted(steps)
        for e, r in zip(steps[s]["rollout/epoch"], steps[s]["rollout/prompt_index"], strict=True)
    ]
    expected = {(e, r) for e in range(epochs) for r in range(ROWS)}
    summary_path = folder / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return {
        "steps": sorted(steps) == list(range(1, total + 1)),
        "groups_expected": len(expected),
        "groups_trained": len(trained),
        "lost": len(expected - set(trained)),
        "duplicated": len(trained) - len(set(trained)),
        "outside_the_epochs": len(set(trained) - expected),
        "unattested_steps": [s for s, m in steps.items() if not m.get("weights/attested")],
        "attestation_restarts": [r.splitlines()[0] for r in summary.get("restarts", []) if ATTESTATION in r],
        "restarts_in_run": len(summary.get("restarts", [])),
        "ledger": summary.get("groups"),
    }


def chaos_run(index: int, args, models, address: str, work: Path, rng: random.Random, kills_left: int) -> dict:
    """One job under kills until it ends (or ``kills_left`` kills have landed and it then ends). A kill is armed
    when the run trains a step it had not trained before (``--gap-s`` later), or, for a share ``--during-start`` of
    kills, while the run is still recovering from the previous one (2-30 s after it)."""
    save_dir, project = str(work / "runs"), f"chaos-{index}"
    job = Job(job_command(*models, save_dir, project, address, args.epochs), work / f"{project}.log")
    job.start(resume=False)
    kills, armed, pending, best, driver_exits = [], None, None, 0, []
    while True:
        time.sleep(0.25)
        top = max(steps_trained(run_folder(save_dir, project)), default=0)
        if top > best:
            if pending is not None:
                pending["recovery_s"] = time.monotonic() - pending["t"]
                pending = None
            if armed is None:
                armed = time.monotonic() + rng.uniform(*args.gap_s)
            best = top
        if not job.alive():
            code = job.proc.returncode
            tail = (work / f"{project}.log").read_text().strip().splitlines()[-1:]
            if code == 0 or (code == 2 and tail and FINISHED in tail[0]):
                break  # ended; or killed after exporting its final model, before reporting: nothing left to do
            if code != -signal.SIGKILL:  # the run stopped by itself: a finding, then resumed as a user would
                driver_exits.append({"status": code, "last_line": tail[0] if tail else ""})
            job.start(resume=has_checkpoint(save_dir, project))
            continue
        if len(kills) < kills_left and armed is not None and time.monotonic() >= armed:
            found = victims(job.proc.pid)
            target = rng.choice([t for t in TARGETS if found[t]])
            pid = rng.choice(found[target])
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                armed = time.monotonic() + 0.5
                continue
            if pending is not None:
                pending["recovery_s"] = None  # killed again before it recovered
            pending = {"target": target, "t": time.monotonic(), "at_step": best, "recovery_s": None}
            kills.append(pending)
            print(f"run {index}: kill {len(kills)} ({target}, pid {pid}) after step {best}", flush=True)
            if target == "driver":
                job.proc.wait()
                job.start(resume=has_checkpoint(save_dir, project))
            armed = time.monotonic() + rng.uniform(2, 30) if rng.random() < args.during_start else None
        if kills and time.monotonic() - kills[-1]["t"] > RUN_LIMIT_S:
            job.proc.kill()
            return {"hung": True, "kills": kills, "driver_starts": job.starts}
    check = check_run(run_folder(save_dir, project), args.epochs)
    for k in kills:
        k.pop("t")
    return {**check, "kills": kills, "driver_starts": job.starts, "driver_exits": driver_exits, "hung": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--gap-s", type=float, nargs=2, default=(0.0, 15.0), help="seconds from a newly trained step to the next kill"
    )
    parser.add_argument(
        "--during-start", type=float, default=0.25, help="share of kills that land while the run recovers"
    )
    parser.add_argument("--epochs", type=int, default=40, help="epochs of each run (4 steps each)")
    parser.add_argument("--no-write", action="store_true", help="print the result without writing its file")
    args = parser.parse_args()

    import ray

    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="chaos-"))
    models = build_models(work)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    address = ray.get_runtime_context().gcs_address
    runs, landed, begun = [], 0, time.monotonic()
    try:
        while landed < args.kills:
            run = chaos_run(len(runs), args, models, address, work, rng, args.kills - landed)
            runs.append(run)
            landed += len(run["kills"])
            print(json.dumps({k: v for k, v in run.items() if k != "kills"}), flush=True)
            if run["hung"]:
                break
    finally:
        ray.shutdown()
    recoveries = sorted(k["recovery_s"] for r in runs for k in r["kills"] if k["recovery_s"] is not None)
    by_target = {t: sum(k["target"] == t for r in runs for k in r["kills"]) for t in TARGETS}
    result = {
        "kills": landed,
        "kills_by_target": by_target,
        "runs": len(runs),
        "hung_runs": sum(r["hung"] for r in runs),
        "lost_groups": sum(r.get("lost", 0) for r in runs),
        "duplicated_groups": sum(r.get("duplicated", 0) for r in runs),
        "groups_trained": sum(r.get("groups_trained", 0) for r in runs),
        "every_step_once": all(r.get("steps") for r in runs),
        "unattested_steps": sum(len(r.get("unattested_steps", [])) for r in runs),
        "attestation_restarts": sum(len(r.get("attestation_restarts", [])) for r in runs),
        "restarts_in_runs": sum(r.get("restarts_in_run", 0) for r in runs),
        "driver_starts": sum(r["driver_starts"] for r in runs),
        "ledger_lost": sum((r.get("ledger") or {}).get("lost", 0) for r in runs),
        "recovery_s": {
            "measured": len(recoveries),
            "median": recoveries[len(recoveries) // 2] if recoveries else None,
            "max": recoveries[-1] if recoveries else None,
        },
        "wall_s": time.monotonic() - begun,
        "per_run": runs,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "per_run"}, indent=2))
    if not args.no_write:
        print(f"wrote {write_result('chaos', result)}")


if __name__ == "__main__":
    main()
