"""summary.json's account of the training loop: totals and medians over the steps, by hand, and the lines a run
prints."""

import math

from coati.distributed.driver.reporting import describe_loop, loop_summary


def history():
    return [
        {
            "step": 1,
            "time/step": 4.0,
            "time/train": 2.0,
            "time/rollout_wait": 1.5,
            "time/weight_push": 0.5,
            "rollout/drawn_groups": 20,
            "rollout/dropped_zero_signal_groups": 16,
            "rollout/skipped_prompts": 3,
            "rollout/engine_trainer_gap_abs": math.nan,
            "reward/errors": 0,
        },
        {
            "step": 2,
            "time/step": 6.0,
            "time/train": 3.0,
            "time/rollout_wait": 2.5,
            "time/weight_push": 0.5,
            "rollout/drawn_groups": 12,
            "rollout/dropped_zero_signal_groups": 8,
            "rollout/skipped_prompts": 0,
            "rollout/stale_dropped_groups": 2,
            "rollout/engine_trainer_gap_abs": 0.04,
            "reward/errors": 1,
        },
        {
            "step": 3,
            "time/step": 5.0,
            "time/train": 4.0,
            "time/rollout_wait": 0.5,
            "time/weight_push": 0.5,
            "rollout/drawn_groups": 4,
            "rollout/dropped_zero_signal_groups": 0,
            "rollout/skipped_prompts": 5,
            "rollout/engine_trainer_gap_abs": 0.02,
            "reward/errors": 0,
        },
    ]


def test_totals_sum_the_steps_and_medians_skip_what_a_step_did_not_measure():
    loop = loop_summary(history())
    assert loop["steps"] == 3
    assert loop["totals"] == {
        "loop_s": 15.0,
        "train_s": 9.0,
        "rollout_wait_s": 4.5,
        "weight_push_s": 1.5,
        "groups_drawn": 36,
        "groups_dropped_no_signal": 24,
        "groups_dropped_stale": 2,
        "prompts_skipped": 8,
        "reward_errors": 1,
    }
    # The NaN gap of step 1 is left out (median of 0.04 and 0.02); unmeasured metrics (weights/paused_s) are absent.
    assert loop["medians"] == {
        "step_s": 5.0,
        "train_s": 3.0,
        "rollout_wait_s": 1.5,
        "weight_push_s": 0.5,
        "engine_trainer_gap_abs": 0.03,
    }


def test_the_printed_lines_name_only_what_was_measured():
    lines = describe_loop(loop_summary(history()))
    assert lines == [
        "training loop 15 s over 3 steps; 36 groups drawn; 24 dropped for no signal; 2 dropped as stale; 8 prompts "
        "skipped",
        "per step (medians): step 5.00 s, training 3.00 s, waiting for rollouts 1.50 s, weight push 0.50 s",
    ]
    assert describe_loop(loop_summary([])) == []


def test_a_run_whose_responses_are_mostly_cut_says_so_in_its_log_and_report(tmp_path, caplog):
    from coati.distributed.driver.reporting import Reporter

    steps = [{**m, "response/truncated_frac": f} for m, f in zip(history(), (0.9, 0.75, 0.2), strict=True)]
    lines = describe_loop(loop_summary(steps))
    assert lines[-1].startswith("WARNING: in the median step 75% of the responses were cut at max_new_tokens")
    assert not any("WARNING" in line for line in describe_loop(loop_summary(history())))
    reporter = Reporter(str(tmp_path), progress=False)
    with caplog.at_level("WARNING", logger="coati.distributed.driver.reporting"):
        for m in steps:
            reporter.on_step(dict(m))
    warned = [r.getMessage() for r in caplog.records if "cut at max_new_tokens" in r.getMessage()]
    assert warned == [warned[0]] and warned[0].startswith("step 1: 90% of the responses")  # once, at the first


def test_a_held_out_set_that_is_the_training_file_is_named_as_such(tmp_path):
    from coati.distributed.config.tree import DataConfig

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "q", "gt_answer": "1"}\n')
    assert DataConfig(train=str(data), eval=str(data)).evaluates_training_rows
    assert not DataConfig(train=str(data), eval=str(tmp_path / "other.jsonl")).evaluates_training_rows
    assert not DataConfig().evaluates_training_rows  # reasoning-gym: fresh items of the task
    assert not DataConfig(train="org/set", eval="org/set").evaluates_training_rows  # a hub set's test split
