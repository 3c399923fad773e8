"""Math RL with boxed answers: GRPO on a reasoning-gym task, strict format (the answer must be in \\boxed{}).

    python examples/math_boxed.py [--steps 20]

The system prompt asks for \\boxed{}; the reward is 1 only for a correct boxed answer (format_gate on), plus a small
format bonus that teaches the format first.
"""

import argparse

import rl_example

SYSTEM = "Solve the problem. Put only the final number inside \\boxed{}, for example \\boxed{42}."

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    args, rest = parser.parse_known_args()
    rl_example.main(
        [
            "--algo",
            "GRPO",
            "-kl",
            "0",
            "-s",
            SYSTEM,
            "-mnt",
            "64",
            "--max-steps",
            str(args.steps),
            "-d",
            "reasoning_gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=2",
            "--reward-kwargs",
            '{"format_gate": true, "format_bonus": 0.1}',
            "-p",
            "math_boxed",
            *rest,
        ]
    )
