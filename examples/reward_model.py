"""Math RL with a learned reward model beside the verifier: reward = math + 0.5 x rm, the reward model's scores
standardised within each prompt's group, the model served by its own Ray actor.

    python examples/reward_model.py --rm-path /path/to/reward_model [rl_example flags...]
    python examples/reward_model.py --rm-path RM --judge-path JUDGE   # and an LLM judge's grade, weight 0.5

The reward model is any AutoModelForSequenceClassification folder with one output (it scores the prompt and the
completion under its own chat template). The judge is any generative model folder; its reply's 'Score: N' (0-10) is
read as N/10, and a reply without one scores 0 (counted in reward/judge_unread). Each component's mean is reported
per step as reward/component/<name>.
"""

import argparse
import json

import rl_example

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rm-path", required=True)
    parser.add_argument("--judge-path")
    args, rest = parser.parse_known_args()
    components = {"math": 1.0, "rm": 0.5, **({"judge": 0.5} if args.judge_path else {})}
    judge = ["--reward-judge-path", args.judge_path] if args.judge_path else []
    rl_example.main(
        [
            "--algo",
            "GRPO",
            "--reward-rm-path",
            args.rm_path,
            "--reward-rm-normalize",
            "group",
            "--reward-components",
            json.dumps(components),
            *judge,
            "-p",
            "reward_model",
            *rest,
        ]
    )
