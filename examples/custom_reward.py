"""A custom reward function, resolved by dotted path (``module:function``) in the reward worker processes.

    python examples/custom_reward.py [rl_example flags...]

The contract: ``fn(completions: list[str], **sample_fields) -> list[RewardResult]``, batched; dataset columns
arrive by name. This one rewards answers that are short and end with the expected word.
"""

import os
import sys
from pathlib import Path

# The reward is named by its dotted path, examples.custom_reward:ends_with_word, so the repository root must be
# importable here and in every actor (they inherit PYTHONPATH), whatever folder this script is started from.
ROOT = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))

import rl_example  # noqa: E402
from coati.distributed.reward import RewardResult  # noqa: E402


def ends_with_word(completions, gt_answer, **_fields):
    """1.0 when the completion's last word is the ground truth, minus 0.01 per word beyond ten."""
    out = []
    for text, gold in zip(completions, gt_answer, strict=True):
        words = text.strip().rstrip(".!").split()
        ok = bool(words) and words[-1].lower() == str(gold).lower()
        reward = float(ok) - 0.01 * max(len(words) - 10, 0)
        out.append(RewardResult(reward, format_ok=bool(words), answer_ok=ok, info={"words": len(words)}))
    return out


if __name__ == "__main__":
    rl_example.main(
        [
            "--algo",
            "RLOO",
            "-d",
            "reasoning_gym:spell_backward",
            "-rt",
            "examples.custom_reward:ends_with_word",
            "--reward-kwargs",
            "{}",
            "-mnt",
            "32",
            "--max-steps",
            "10",
            "-p",
            "custom_reward",
            *sys.argv[1:],
        ]
    )
