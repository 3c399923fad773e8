"""Environments alone (real sandbox, real math reward) and the episode runner driven by a scripted policy: tool calls
executed, their output in the record but masked, the trained tokens equal to the template's rendering, and every
environment fault failing its episode only."""

import time

import numpy as np
import pytest

from coati.distributed.envs import ENVIRONMENTS, Environment, EnvStep, resolve_environment
from coati.distributed.envs.episodes import TurnTemplate, episodes_batch, retokenized_equal, run_episodes
from coati.distributed.envs.retry import Retry
from coati.distributed.envs.tool_math import ToolMath
from coati.distributed.record import RolloutBatch
from coati.testing import char_tokenizer


@pytest.fixture(scope="module")
def template():
    return TurnTemplate(char_tokenizer())


def test_tool_math_runs_the_call_in_the_sandbox_and_scores_the_answer():
    env = ToolMath({"prompt": "What is 6 * 7?", "gt_answer": "42"})
    first = env.reset()
    assert [m["role"] for m in first] == ["system", "user"] and "<tool>" in first[0]["content"]
    step = env.step("Let me compute. <tool>print(6 * 7)</tool>")
    assert not step.done and step.observation == [{"role": "user", "content": "<output>\n42\n</output>"}]
    assert "Error" in env.step("<tool>1 / 0</tool>").observation[0]["content"]  # the error's last line comes back
    assert (
        "timed out"
        in ToolMath({"prompt": "", "gt_answer": "1"}, timeout_s=0.5)
        .step("<tool>while True: pass</tool>")
        .observation[0]["content"]
    )
    assert "<tool>" in env.step("Hmm, let me think.").observation[0]["content"]  # neither: a reminder, no score yet
    done = env.step("So the answer is \\boxed{42}.")
    assert done.done and done.reward == 1.0 and done.answer_ok and done.info["tool_calls"] == 2
    wrong = ToolMath({"prompt": "", "gt_answer": "42"}).step("\\boxed{41}")
    assert wrong.done and wrong.reward == 0.0 and not wrong.answer_ok
    with pytest.raises(ValueError, match="tool_math needs a gt_answer column"):
        ToolMath({"prompt": "x"})


@pytest.mark.parametrize(
    "turn",
    [
        "<tool>x = 6 * 7\n#### compute the answer\nprint(x)</tool>",  # a '####' comment inside the code
        "<tool>print('\\\\boxed{42}')</tool>",  # a box printed by the code is the code's business
        "<tool>print(6 * 7)</tool> and then \\boxed{}",  # a call beside an empty box
        "<tool>print(6 * 7)</tool><answer></answer>",
    ],
)
def test_tool_math_ends_an_episode_only_on_a_final_answer_outside_the_tool_call(turn):
    step = ToolMath({"prompt": "6*7?", "gt_answer": "42"}).step(turn)
    assert not step.done and step.observation[0]["content"].startswith("<output>"), step


def test_tool_math_scores_the_answer_outside_the_call_and_refuses_a_gold_that_is_not_an_answer():
    step = ToolMath({"prompt": "", "gt_answer": "42"}).step("<tool>print(41)  # \\boxed{41}</tool> \\boxed{42}")
    assert step.done and step.reward == 1.0  # the box inside the (unrun) call is not a second answer
    for gold in ([42], float("nan"), True):
        with pytest.raises(ValueError, match="gt_answer"):
            ToolMath({"prompt": "x", "gt_answer": gold})


def test_retry_gives_feedback_and_decays_the_reward():
    env = Retry({"prompt": "2+2?", "gt_answer": "4"})
    assert env.reset() == [{"role": "user", "content": "2+2?"}]
    again = env.step("\\boxed{5}")
    assert not again.done and "not correct" in again.observation[0]["content"]
    right = env.step("\\boxed{4}")
    assert right.done and right.answer_ok and right.reward == 0.5 and right.info["attempts"] == 2


def test_environments_resolve_by_name_or_path():
    assert {"tool_math", "retry"} <= set(ENVIRONMENTS)
    for name in ENVIRONMENTS:  # registered environments say what they reward
        assert len((ENVIRONMENTS[name].__doc__ or "").strip()) > 20, name
    assert resolve_environment("retry") is Retry
    assert resolve_environment("tests.unit.test_envs:Script") is Script
    with pytest.raises(KeyError, match="unknown environment 'nope'; known: .*retry"):
        resolve_environment("nope")
    with pytest.raises(ValueError, match="not a subclass of coati's Environment"):
        resolve_environment("tests.unit.test_envs:template")


# ---- the runner, with a scripted policy -----------------------------------------------------------------------------


class Script(Environment):
    """Replies with a fixed list of steps (an EnvStep, or a callable raising or hanging)."""

    name = ""

    def __init__(self, row, steps=()):
        super().__init__(row)
        self.steps = list(steps)

    def reset(self):
        return [{"role": "user", "content": self.row["prompt"]}]

    def step(self, text):
        self.seen = getattr(self, "seen", []) + [text]
        step = self.steps.pop(0)
        return step() if callable(step) else step


def scripted_policy(tokenizer, replies: dict[str, list[str]], limit: int = 10**6):
    """A ``generate``: for the episode whose prompt is ``p``, its next reply from ``replies[p]`` (+ EOS), or the
    first ``limit`` tokens of it without EOS (a turn the engine cut)."""
    turns: dict[str, int] = {}

    def generate(contexts):
        rows = []
        for ids in contexts:
            prompt = tokenizer.decode(ids).split("\n")[0].removeprefix("user: ")
            k = turns[prompt] = turns.get(prompt, -1) + 1
            tokens = tokenizer.encode(replies[prompt][k], add_special_tokens=False) + [tokenizer.eos_token_id]
            rows.append(tokens[:limit])
        r = max(len(t) for t in rows)
        ids = np.zeros((len(rows), r), dtype=np.int64)
        for i, t in enumerate(rows):
            ids[i, : len(t)] = t
        lengths = np.array([len(t) for t in rows])
        mask = np.arange(r)[None, :] < lengths[:, None]
        return RolloutBatch(
            prompt_ids=np.zeros((len(rows), 0), dtype=np.int64),
            prompt_mask=np.zeros((len(rows), 0), dtype=bool),
            response_ids=ids,
            response_mask=mask,
            rollout_logprobs=np.where(mask, -0.5, 0.0).astype(np.float32),
            response_lengths=lengths,
            truncated=np.array([len(t) >= limit for t in rows]),
        )

    return generate


def test_a_tool_call_runs_and_its_output_is_in_the_record_but_masked(template):
    tok = template.tokenizer
    envs = [ToolMath({"prompt": "6*7?", "gt_answer": "42"}), ToolMath({"prompt": "1+1?", "gt_answer": "2"})]
    for env in envs:  # the scripted policy keys episodes by their first line
        env.reset = lambda env=env: [{"role": "user", "content": env.row["prompt"]}]
    policy = scripted_policy(tok, {"6*7?": ["<tool>print(6*7)</tool>", "\\boxed{42}"], "1+1?": ["\\boxed{2}"]})
    first, second = run_episodes(policy, template, envs, max_turns=4, max_tokens=1000)
    assert first.done and first.reward == 1.0 and first.info["turns"] == 2 and first.info["tool_calls"] == 1
    assert second.reward == 1.0 and second.info["turns"] == 1  # both in one engine call per turn
    text = tok.decode(first.ids)
    assert text == "<tool>print(6*7)</tool><eos>\nuser: <output>\n42\n</output>\nassistant: \\boxed{42}<eos>"
    mask = np.array(first.loss_mask)
    trained = tok.decode([t for t, m in zip(first.ids, mask, strict=True) if m])
    assert trained == "<tool>print(6*7)</tool><eos>\\boxed{42}<eos>"  # exactly the sampled tokens
    masked = tok.decode([t for t, m in zip(first.ids, mask, strict=True) if not m])
    assert masked == "\nuser: <output>\n42\n</output>\nassistant: "  # the tool's output and the template around it
    assert np.all(np.array(first.logprobs)[mask] == -0.5) and np.all(np.array(first.logprobs)[~mask] == 0.0)
    assert [tok.decode(first.ids[a:b]) for a, b in first.turns] == ["<tool>print(6*7)</tool><eos>", "\\boxed{42}<eos>"]
    assert retokenized_equal(first, template) and retokenized_equal(second, template)
    # The record: each episode's prompt and conversation, the loss on its sampled tokens only.
    batch = episodes_batch([first, second], n=1, pad_id=tok.pad_token_id)
    assert tok.decode(batch.prompt_ids[0][batch.prompt_mask[0]]) == "user: 6*7?\nassistant: "
    assert batch.loss_mask[0, : len(first.ids)].tolist() == first.loss_mask and batch.response_lengths.tolist() == [
        len(first.ids),
        len(second.ids),
    ]
    assert batch.rewards.tolist() == [1.0, 1.0] and batch.extras["turns"].tolist() == [2, 1]
    assert batch.extras["tool_calls"].tolist() == [1, 0] and batch.group_ids.tolist() == [0, 1]
    assert not batch.rollout_logprobs[~batch.loss_mask].any() and not batch.token_versions[~batch.loss_mask].any()
    turn_of = batch.turn_index[0, : len(first.ids)]
    assert [tok.decode([first.ids[j] for j in np.flatnonzero(turn_of == k)]) for k in (1, 2)] == [
        "<tool>print(6*7)</tool><eos>",
        "\\boxed{42}<eos>",
    ]


def test_environment_faults_fail_only_their_episode(template):
    tok = template.tokenizer

    def hang():
        time.sleep(3)
        return EnvStep(done=True, reward=1.0)

    def boom():
        raise RuntimeError("tool server down")

    envs = [
        Script({"prompt": "raises"}, [boom]),
        Script({"prompt": "hangs"}, [hang]),
        Script({"prompt": "malformed"}, [lambda: {"done": True}]),
        Script({"prompt": "bad observation"}, [EnvStep(observation=[{"role": "user"}])]),
        Script({"prompt": "talks forever"}, [EnvStep(observation=[{"role": "user", "content": "more"}])] * 9),
        Script({"prompt": "fine"}, [EnvStep(done=True, reward=1.0, answer_ok=True)]),
    ]
    replies = {e.row["prompt"]: ["ok"] * 9 for e in envs}
    start = time.monotonic()
    eps = run_episodes(scripted_policy(tok, replies), template, envs, max_turns=3, max_tokens=1000, step_timeout_s=0.5)
    assert time.monotonic() - start < 2.5  # the hung step was abandoned at its timeout
    errors = {e.env.row["prompt"]: e.info.get("error", "") for e in eps}
    assert errors["raises"] == "step: RuntimeError: tool server down"
    assert errors["hangs"] == "step: no reply within 0.5 s"
    assert "must return an EnvStep" in errors["malformed"] and "messages" in errors["bad observation"]
    assert all(e.reward == 0.0 and e.done for e in eps[:5]) and eps[5].reward == 1.0 and eps[5].answer_ok
    forever = eps[4]
    assert forever.info["turn_limit"] and forever.info["turns"] == 3 and retokenized_equal(forever, template)
    # A failed episode is a failed sample (an error; a hung step a timeout), left out of its group's statistics and
    # the loss as a failed reward is; the episode that only ran out of turns is scored.
    from coati.distributed.record import RewardStatus
    from coati.distributed.rollout.scoring import _status, episode_results

    batch = episodes_batch(eps, 1, pad_id=0)
    results = episode_results(batch)
    statuses = [_status(r) for r in results]
    assert statuses[:4] == [RewardStatus.ERROR, RewardStatus.TIMEOUT, RewardStatus.ERROR, RewardStatus.ERROR]
    assert statuses[4:] == [RewardStatus.SCORED] * 2
    # Scored as the producer scores a draw: the failed episodes train no token, and the record stays valid (their
    # turn indices, which mark the trained tokens, went with the loss mask: a run whose every step hung had failed
    # with "AssertionError: turn_index").
    from coati.distributed.reward.config import RewardConfig
    from coati.distributed.rollout.scoring import Scorer

    scorer = Scorer(RewardConfig(), 1, tok)
    try:
        scorer.apply(batch, results, [e.env.row for e in eps])
    finally:
        scorer.close()
    assert batch.validate() is batch
    assert not batch.loss_mask[:4].any() and not batch.turn_index[:4].any() and batch.turn_index[4:].any(axis=1).all()


def test_a_conversation_that_outgrows_its_budget_is_cut_and_flagged(template):
    tok = template.tokenizer
    long = [EnvStep(observation=[{"role": "user", "content": "x" * 50}])] * 5
    envs = [Script({"prompt": "grows"}, long), Script({"prompt": "cut"}, [])]
    policy = scripted_policy(tok, {"grows": ["ok"] * 5, "cut": ["a long reply"]}, limit=4)
    grows, cut = run_episodes(policy, template, envs, max_turns=5, max_tokens=80)
    assert grows.truncated and grows.info["token_limit"] and len(grows.context()) == 80 and grows.reward == 0.0
    assert cut.truncated and cut.info["truncated_turn"] and cut.info["turns"] == 1  # cut by the engine: no EOS
    assert sum(cut.loss_mask) == 4


def test_the_docs_environment_runs_as_written(template):
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text()
    code = readme.split("class Countdown(Environment):")[0].rsplit("```python\n", 1)[1]
    code += "class Countdown(Environment):" + readme.split("class Countdown(Environment):")[1].split("```")[0]
    scope: dict = {}
    exec(compile(code, "docs/environments.md", "exec"), scope)
    envs = [scope["Countdown"]({"prompt": p, "gt_answer": "7"}, hint="Higher.") for p in ("a", "b")]
    policy = scripted_policy(template.tokenizer, {"a": ["3", "7"], "b": ["1", "2", "3"]})
    right, never = run_episodes(policy, template, envs, max_turns=scope["Countdown"].max_turns, max_tokens=200)
    assert right.reward == 1.0 and right.answer_ok and right.info["turns"] == 2
    assert never.reward == 0.0 and never.info["turn_limit"] and never.info["turns"] == 3
    assert "Higher." in template.tokenizer.decode(never.ids)


def test_a_data_system_prompt_is_refused_with_an_environment():
    from coati.distributed.config.tree import config_from_dict

    with pytest.raises(ValueError, match="env 'retry' writes each episode's first messages itself"):
        config_from_dict({"reward": {"env": "retry"}, "data": {"system_prompt": "Be brief."}})
    assert config_from_dict({"reward": {"env": "retry"}}).reward.env.name == "retry"
