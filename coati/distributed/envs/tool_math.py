"""Math with a Python tool: the model may write code between <tool> tags; the code runs in the reward sandbox (no
network, capped memory and time) and what it prints comes back as the next message, between <output> tags. A turn
with a final answer (in \\boxed{}, <answer> or '#### ', outside every tool call, and not empty) ends the episode,
scored by the math reward against the row's ``gt_answer``. A turn with neither gets a reminder of the two
(``nudge``) and the episode goes on, until the turn limit ends it with reward 0.
"""

from __future__ import annotations

import re
from functools import lru_cache

from coati.distributed.envs.base import Environment, EnvStep, register_environment
from coati.distributed.reward.math_reward import check_gold, extract_answer, math_reward
from coati.distributed.reward.sandbox import Sandbox

SYSTEM = (
    "Solve the problem. To compute something, write Python code between <tool> and </tool>; it runs, and what it "
    "prints comes back between <output> and </output>. Finish with the final answer in \\boxed{}."
)
NUDGE = "Run code between <tool> and </tool>, or give the final answer in \\boxed{}."
TOOL_CALL = re.compile(r"<tool>(.*?)</tool>", re.S)


@register_environment
class ToolMath(Environment):
    """Reward: the math reward of the final turn (1 for a right answer); tool calls earn nothing by themselves."""

    name = "tool_math"
    max_turns = 4

    def __init__(
        self,
        row: dict,
        system_prompt: str = SYSTEM,
        timeout_s: float = 5.0,
        max_output_chars: int = 600,
        observation_role: str = "user",
        nudge: str = NUDGE,
    ):
        super().__init__(row)
        if "gt_answer" not in row:
            raise ValueError(f"tool_math needs a gt_answer column; the row has {sorted(row)}")

        check_gold(row["gt_answer"])
        self.system_prompt, self.timeout_s, self.max_output_chars = system_prompt, timeout_s, max_output_chars
        self.observation_role, self.nudge = observation_role, nudge
        self.tool_calls = 0

    def reset(self) -> list[dict]:
        if "messages" in self.row:
            messages = list(self.row["messages"])
            return (
                messages
                if messages and messages[0]["role"] == "system"
                else [{"role": "system", "content": self.system_prompt}, *messages]
            )
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": str(self.row["prompt"])}]

    def step(self, text: str) -> EnvStep:

        calls = TOOL_CALL.findall(text)
        # A final answer is one given outside every tool call (a '####' comment or a \\boxed{} in code is code), and
        # says something (an empty box is not an answer).
        outside = TOOL_CALL.sub(" ", text)
        answered = bool(extract_answer(outside)[0])
        if calls and not answered:  # a call and no answer yet: run the last call
            self.tool_calls += 1
            output = run_python(calls[-1], self.timeout_s, self.max_output_chars)
            message = {"role": self.observation_role, "content": f"<output>\n{output}\n</output>"}
            return EnvStep(observation=[message], info={"tool_calls": self.tool_calls})
        if not answered:
            return EnvStep(
                observation=[{"role": self.observation_role, "content": self.nudge}],
                info={"tool_calls": self.tool_calls},
            )
        # math_verify's own timeout sets SIGALRM, which only a main thread may: steps run on the producer's pool
        # threads, bounded by the step deadline instead.
        result = math_reward([outside], [self.row["gt_answer"]], timeout_s=0)[0]
        return EnvStep(
            done=True,
            reward=result.reward,
            answer_ok=result.answer_ok,
            info={
                "tool_calls": self.tool_calls,
                "answer": result.info.get("answer", ""),
                "lenient_ok": result.info.get("lenient_ok", False),
            },
        )


def run_python(code: str, timeout_s: float, max_chars: int) -> str:
    """What ``code`` prints, run in the sandbox (its error's last line if it fails), cut to ``max_chars``."""
    result = _sandbox().run(code, timeout_s=timeout_s)
    if result.timed_out:
        text = f"timed out after {timeout_s:g} s"
    elif result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        text = (result.stdout + (lines[-1] if lines else f"exit code {result.returncode}")).strip()
    else:
        text = result.stdout.strip()
    return text if len(text) <= max_chars else text[:max_chars] + " ...(cut)"


@lru_cache(maxsize=1)
def _sandbox():
    """One sandbox per process (it stages its interpreter once); each run gets a uid of its own."""

    return Sandbox()
