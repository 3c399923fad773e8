"""Answer, and try again when wrong: after a wrong final answer the model is told so and answers again, until the
turn limit ends the episode (with reward 0). Any task with a ``gt_answer`` column works (reasoning-gym tasks
included); answers are checked by the math reward. The reward decays with each attempt, so a first-turn answer is
worth most: ``reward = decay ** (attempt - 1)`` for a right answer at attempt ``attempt``.
"""

from __future__ import annotations

from coati.distributed.envs.base import Environment, EnvStep, register_environment
from coati.distributed.reward.math_reward import math_reward

FEEDBACK = "That is not correct. Check your work and give the final answer again in \\boxed{}."


@register_environment
class Retry(Environment):
    """Feedback after each wrong answer; the reward of a right one decays with the attempts it took."""

    name = "retry"
    max_turns = 3

    def __init__(self, row: dict, decay: float = 0.5, feedback: str = FEEDBACK, system_prompt: str | None = None):
        super().__init__(row)
        if "gt_answer" not in row:
            raise ValueError(f"retry needs a gt_answer column; the row has {sorted(row)}")
        if not 0 < decay <= 1:
            raise ValueError(f"retry: decay must be in (0, 1], got {decay}")
        self.decay, self.feedback, self.system_prompt = decay, feedback, system_prompt
        self.attempt = 0

    def reset(self) -> list[dict]:
        messages = (
            list(self.row["messages"])
            if "messages" in self.row
            else [{"role": "user", "content": str(self.row["prompt"])}]
        )
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def step(self, text: str) -> EnvStep:

        self.attempt += 1
        # math_verify's own timeout sets SIGALRM, which only a main thread may: steps run on the producer's pool
        # threads, bounded by the step deadline instead.
        result = math_reward([text], [self.row["gt_answer"]], timeout_s=0)[0]
        info = {"attempts": self.attempt, "answer": result.info.get("answer", "")}
        if result.reward >= 1.0:
            return EnvStep(done=True, reward=self.decay ** (self.attempt - 1), answer_ok=True, info=info)
        return EnvStep(observation=[{"role": "user", "content": self.feedback}], info=info)
