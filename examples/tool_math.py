"""Multi-turn math with a Python tool: the model may run code between <tool> and </tool> (in the sandbox, no network)
and reads what it prints between <output> and </output> before answering in \\boxed{}; GRPO over whole episodes.

    python examples/tool_math.py [rl_example flags...]

Each rollout is an episode of up to three model turns. Only the model's own tokens are trained: the tool output and
the chat template around it are in the record (the model reads them) but masked out of the loss. The episode's
reward is the math reward of its final answer. See docs/environments.md to write your own.
"""

import sys

import rl_example

if __name__ == "__main__":
    rl_example.main(
        [
            "--algo",
            "GRPO",
            "--env",
            "tool_math",
            "--env-max-turns",
            "3",
            "--env-max-tokens",
            "640",
            "-mpt",
            "640",
            "-mnt",
            "128",
            "-p",
            "tool_math",
            *sys.argv[1:],
        ]
    )
