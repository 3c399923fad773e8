"""The run reporter and its loggers: metrics.jsonl and samples.jsonl, TensorBoard event files read back, the wandb run
(offline, as without an API key), the evaluation before training logged as step 0, and plots of what was measured."""

import json
import logging
import time
from pathlib import Path

import pytest

from coati.distributed.driver.reporting import PHASES, Reporter, ema, phase


def steps():
    for step, reward in [(1, 0.125), (2, 0.375)]:
        yield {
            "step": step,
            "total_steps": 2,
            "reward/mean": reward,
            "loss/policy": 0.5,
            "loss/kl": 0.0,
            "loss/approx_kl": 0.0,
            "actor/lr": 1e-5,
            "samples": [{"prompt": "1+1=", "response": "2|x", "reward": reward, "policy_version": step - 1}],
        }


def test_every_logger_gets_the_steps_the_completions_and_the_evaluation_before_training(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    reporter = Reporter(
        str(tmp_path), report_to=("jsonl", "tensorboard", "wandb"), config={"algo": "DAPO-test"}, progress=False
    )
    reporter.on_step({"step": 0, "eval/lenient": 0.25, "eval/count": 4})
    for metrics in steps():
        reporter.on_step(metrics)
    summary = reporter.finish({"evals": [{"step": 0, "eval/lenient": 0.25}]})

    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("reward/mean"), r.get("eval/lenient")) for r in rows] == [
        (0, None, 0.25),
        (1, 0.125, None),
        (2, 0.375, None),
    ]
    assert [json.loads(x)["step"] for x in (tmp_path / "samples.jsonl").read_text().splitlines()] == [1, 2]
    assert summary["steps"] == 2 and all(Path(p).exists() for p in summary["plots"])

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 0.125), (2, 0.375)]
    assert [(e.step, e.value) for e in events.Scalars("eval/lenient")] == [(0, 0.25)]
    (text,) = [t for t in events.Tensors("completions/text_summary") if t.step == 2]
    assert "| 1+1= | 2\\|x | 0.375 | 1 |" in text.tensor_proto.string_val[0].decode()

    # The wandb run file holds the config, every logged value and the completions table (uncompressed protobuf).
    (run,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    data = run.read_bytes()
    service_log = "".join(p.read_text() for p in run.parent.glob("logs/debug*.log"))
    for needle in [b"DAPO-test", b"reward/mean", b"eval/lenient", b"0.125", b"0.375", b"completions"]:
        assert needle in data, (needle, len(data), service_log[-3000:])
    (table,) = {p.name for p in run.parent.glob("files/media/table/completions_2_*.table.json")} or {None}
    assert table is not None


def test_plots_are_labelled_and_leave_out_what_was_not_measured(tmp_path):
    reporter = Reporter(str(tmp_path), report_to=(), progress=False)
    for metrics in steps():  # the KL is 0 at every step (beta 0): no kl plot
        reporter.on_step(metrics)
    plots = {Path(p).stem for p in reporter.finish({"evals": []})["plots"]}
    assert plots == {"reward", "learning_rate"}
    assert not (tmp_path / "metrics.jsonl").exists()  # report_to without jsonl writes none
    assert ema([1.0, 0.0], 0.5) == pytest.approx([1.0, 1 / 3])  # debiased: the first point is itself


def test_phases_show_on_the_progress_bar_and_nowhere_else(tmp_path, caplog):
    reporter = Reporter(str(tmp_path), report_to=(), progress=True)
    with caplog.at_level(logging.INFO):
        phase("starting 1 producer(s) and 1 consumer(s): loading models")
        assert reporter.bar.desc.startswith("starting 1 producer(s)") and not caplog.records
        reporter.on_step(next(steps()))
        assert reporter.bar.desc.startswith("RL steps") and "train_lenient" in str(reporter.bar.postfix)
    reporter.finish({"evals": []})
    assert not PHASES.handlers


def _step(step: int, reward: float) -> dict:
    return {
        "step": step,
        "total_steps": 6,
        "reward/mean": reward,
        "samples": [{"prompt": "p", "response": f"r{step}", "reward": reward, "policy_version": step - 1}],
    }


def test_a_resume_or_restart_logs_each_step_once(tmp_path):
    """A kill after step 3 (checkpoint at 2) and a resume: steps 1, 2 from the first process, 3 onwards from the
    second, once each, in metrics.jsonl, samples.jsonl and TensorBoard; a restart inside one process alike."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = Reporter(str(tmp_path), report_to=("jsonl", "tensorboard"), progress=False)
    for step in (1, 2, 3):
        first.on_step(_step(step, 0.1 * step))
    for logger in first.loggers:  # killed: no finish
        logger.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "rew')  # a line cut short by the kill
    resumed = Reporter(str(tmp_path), report_to=("jsonl", "tensorboard"), progress=False, append=True)
    for step in (3, 4, 5):
        resumed.on_step(_step(step, 1.0 + step))
    for step in (4, 5, 6):  # an actor died after step 5; the run restarted from its checkpoint at step 3
        resumed.on_step(_step(step, 2.0 + step))
    summary = resumed.finish({"evals": []})

    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reward/mean"]) for r in rows] == [(1, 0.1), (2, 0.2), (3, 4.0), (4, 6.0), (5, 7.0), (6, 8.0)]
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1, 2, 3, 4, 5, 6] and samples[2]["response"] == "r3"
    assert summary["steps"] == 6  # every step of the run once: the first process's 1-2 and this one's 3-6
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, round(e.value, 3)) for e in events.Scalars("reward/mean")] == [
        (1, 0.1),
        (2, 0.2),
        (3, 4.0),
        (4, 6.0),
        (5, 7.0),
        (6, 8.0),
    ]


def test_coati_report_and_compare_read_run_folders_the_reporter_wrote(tmp_path, capsys):
    """``coati report RUN`` draws a run's plots again from its files; ``coati compare A B`` tables both runs' results
    and overlays their curves."""
    from coati.cli import main

    for name, gain in (("grpo", 0.25), ("dapo", 0.5)):
        reporter = Reporter(
            str(tmp_path / name),
            report_to=("jsonl",),
            progress=False,
            describe={"config.yaml": f"algo: {name.upper()}\n"},
        )
        evals = [
            {"step": 0, "eval/strict": 0.1, "eval/lenient": 0.2, "eval/count": 4},
            {"step": 2, "eval/strict": 0.1 + gain, "eval/lenient": 0.2 + gain, "eval/count": 4},
        ]
        reporter.on_step(dict(evals[0]))
        for metrics in steps():
            reporter.on_step(metrics)
        reporter.finish({"evals": evals})
    (tmp_path / "dapo" / "plots").rename(tmp_path / "old_plots")
    assert main(["report", str(tmp_path / "dapo")]) == 0
    assert (tmp_path / "dapo" / "plots" / "reward.png").is_file() and "0.200 -> 0.700" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "grpo"), str(tmp_path / "dapo"), "--out", str(tmp_path / "cmp")]) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| GRPO | 2 |" in table and "0.200 -> 0.450" in table and "0.200 -> 0.700" in table
    assert {p.name for p in (tmp_path / "cmp").glob("*.png")} == {"compare_reward.png", "compare_held_out.png"}
    assert main(["compare", str(tmp_path / "nothing")]) == 2
    assert "is not a run folder" in capsys.readouterr().err


def test_plots_draw_evaluations_as_points_the_schedule_as_it_is_and_name_series_plainly():
    from coati.distributed.driver.reporting import plot_lines

    history = [
        {
            "step": s,
            "reward/mean": s / 12,
            "actor/lr": 1e-6 * s,
            "actor/grad_norm": 0.5,
            "time/step": 2.0,
            "time/train": 1.0,
            "rollout/drawn_groups": 5,
        }
        for s in range(1, 13)
    ]
    evals = [{"step": 0, "eval/lenient": 0.2}, {"step": 12, "eval/lenient": 0.4}]
    lines = plot_lines(history, evals)
    assert lines["accuracy"][1] == [("held-out, lenient", "points", [(0, 0.2), (12, 0.4)])]
    assert [(legend, style) for legend, style, _ in lines["learning_rate"][1]] == [("learning rate", "plain")]
    assert [(legend, style) for legend, style, _ in lines["reward"][1]] == [("drawn completions", "smoothed")]
    assert {"grad_norm", "time", "groups"} <= set(lines)
    assert [legend for legend, _, _ in lines["time"][1]] == ["whole step", "training"]
    assert "critic" not in lines  # no critic trained


def test_a_ppo_run_plots_its_critic():
    from coati.distributed.driver.reporting import plot_lines

    history = [
        {"step": s, "critic/value_loss": 1 / s, "critic/explained_variance": s / 4, "critic/values_mean": 0.1 * s}
        for s in range(1, 5)
    ]
    lines = plot_lines(history)
    assert [k for k, _, _ in lines["critic"][1]] == ["value loss", "explained variance"]
    assert lines["critic"][1][1][2] == [(1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)]
    assert [k for k, _, _ in lines["values"][1]] == ["value before training"]


def test_a_distilling_run_plots_its_kl_to_the_teacher():
    from coati.distributed.driver.reporting import plot_lines

    history = [{"step": s, "teacher/kl": 2.0 / s, "teacher/top1_match": 0.1 * s} for s in range(1, 4)]
    lines = plot_lines(history)
    assert [k for k, _, _ in lines["teacher"][1]] == [
        "KL to the teacher (nats per token)",
        "tokens the teacher would pick",
    ]
    assert lines["teacher"][1][0][2] == [(1, 2.0), (2, 1.0), (3, 2.0 / 3)]
    assert "teacher" not in plot_lines([{"step": 1, "reward/mean": 0.5}])


def test_the_start_up_account_times_each_phase_and_the_first_step(tmp_path, monkeypatch):
    """summary.json says when each start-up phase began and when the first training step ended, counted from the
    process's start (the command's imports included) for the process's first run."""
    from coati.distributed.driver import reporting
    from coati.distributed.driver.reporting import STARTUP, since_process_start

    monkeypatch.setattr(reporting, "_ACCOUNT", {"origin": 0.0, "ended": False})  # as in a fresh process
    STARTUP.clear()
    phase("checking the inputs")
    reporter = Reporter(str(tmp_path), report_to=(), progress=False)
    phase("first weight push")
    for metrics in steps():
        reporter.on_step(metrics)
    startup = reporter.finish({"evals": []})["startup"]
    assert [p["phase"] for p in startup["phases"]] == ["checking the inputs", "first weight push"]
    first, second = (p["at_s"] for p in startup["phases"])
    assert 0 < first <= second <= startup["first_step_s"] <= since_process_start()
    assert STARTUP == []  # the next run reports its own


def test_the_wall_account_splits_the_command_into_install_conversion_start_up_steps_and_the_rest(monkeypatch):
    from coati.distributed.driver.reporting import CONVERTING, INSTALL_ENV, loop_phase, wall_account

    phases = [("checking the inputs", 0.4), (CONVERTING, 1.0), ("checking the inputs: the rest", 21.0)]
    phases += [("first weight push", 40.0), (loop_phase(1), 44.0), ("first step trained", 60.0)]
    monkeypatch.setenv(INSTALL_ENV, "212.5")
    wall = wall_account(phases, steps_s=200.0, command_s=270.0)
    assert wall == {
        "command_s": 270.0,
        "install_s": 212.5,
        "conversion_s": 20.0,
        "startup_s": 44.0,
        "steps_s": 200.0,
        "other_s": 26.0,
        "wall_over_steps": 1.35,
    }
    monkeypatch.delenv(INSTALL_ENV)
    later = wall_account([phases[0], *phases[3:]], steps_s=200.0, command_s=250.0)
    assert "install_s" not in later and "conversion_s" not in later and later["wall_over_steps"] == 1.25
    assert wall_account(phases[:4], steps_s=None, command_s=41.0) == {"command_s": 41.0, "conversion_s": 20.0}


def test_a_later_run_of_the_same_process_counts_its_start_up_from_its_own_start(tmp_path):
    """A script that launches several runs: the first run's account counts from the process's start, each later
    run's from its own first phase (it counted from the process's start, so a run that took 20 s reported its first
    step at 57 s)."""
    from coati.distributed.driver.reporting import STARTUP, since_process_start

    for i in range(2):
        STARTUP.clear()
        phase("checking the inputs")
        reporter = Reporter(str(tmp_path / str(i)), report_to=(), progress=False)
        started = time.monotonic()
        phase("first weight push")
        for metrics in steps():
            reporter.on_step(metrics)
        startup = reporter.finish({"evals": []})["startup"]
        first, second = (p["at_s"] for p in startup["phases"])
        if i == 1:
            assert first == 0.0 and second <= startup["first_step_s"] <= time.monotonic() - started + 0.05
            assert since_process_start() > startup["first_step_s"] + 1


def test_actors_start_up_marks_go_on_the_run_s_time_line(tmp_path, monkeypatch):
    """Each actor's marks (epoch seconds, from its own process) become seconds on the account's time line, with its
    imports, engine and setup spans; the run's end prints each actor's imports and engine."""
    from coati.distributed.driver import reporting
    from coati.distributed.driver.reporting import STARTUP, actors_started, describe_startup

    monkeypatch.setattr(reporting, "_ACCOUNT", {"origin": 0.0, "ended": True})  # a later run: counts from its start
    STARTUP.clear()
    phase("checking the inputs")
    t0 = time.time()  # the account's origin, to within the time these lines take
    producer = {"process": t0 + 10.0, "imported": t0 + 18.5, "setup": t0 + 19.0, "engine": t0 + 22.0, "ready": t0 + 23}
    consumer = {"imported": t0 + 20.0, "setup": t0 + 20.5}  # no /proc, and a setup that never ended
    actors_started("r", [("producer-0", {"startup": producer}), ("consumer-0", {"startup": consumer})])
    actors_started("r", [("producer-0", {"startup": {**producer, "ready": t0 + 40}})])  # restarted: added again
    reporter = Reporter(str(tmp_path), report_to=(), progress=False)
    for metrics in steps():
        reporter.on_step(metrics)
    actors = reporter.finish({"evals": []})["startup"]["actors"]
    assert [a["actor"] for a in actors] == ["producer-0", "consumer-0", "producer-0"]
    p, c, again = actors
    assert p["process_at_s"] == pytest.approx(10.0, abs=0.05) and p["ready_at_s"] == pytest.approx(23.0, abs=0.05)
    assert (p["imports_s"], p["engine_s"], p["setup_s"]) == (8.5, 3.0, 4.0)
    assert "process_at_s" not in c and "imports_s" not in c and c["setup_at_s"] == pytest.approx(20.5, abs=0.05)
    assert again["setup_s"] == 21.0
    lines = describe_startup({"actors": actors})
    assert lines[0] == "start-up of producer-0: imports 8.5 s, engine 3.0 s, ready 23 s after the command started"
    assert lines[1:] == ["start-up of producer-0: imports 8.5 s, engine 3.0 s, ready 40 s after the command started"]
    actors_started("r", [("producer-0", {"startup": producer})])
    phase("checking the inputs")  # the next run's account starts without the last run's actors
    assert reporting.ACTOR_STARTUP == []
    STARTUP.clear()


def test_a_run_s_account_holds_none_of_an_earlier_unreported_run_s_phases(tmp_path, monkeypatch):
    """A script (or the suite) that launches without a run folder and then with one: each launch ends its account,
    refused or not, so the reported run's summary holds its own phases only (it held every earlier run's)."""
    from coati.distributed.config.cli import parse_config
    from coati.distributed.driver import reporting
    from coati.distributed.driver.launch import launch
    from coati.distributed.driver.reporting import STARTUP

    monkeypatch.setattr(reporting, "_ACCOUNT", {"origin": 0.0, "ended": False})
    STARTUP.clear()
    phase("first weight push")  # an earlier run of this process, with no reporter
    with pytest.raises(FileNotFoundError, match="is not a local folder"):
        launch(parse_config(["-m", str(tmp_path / "no_model"), "-b", "transformers"]))  # refused by its preflight
    phase("checking the inputs")
    reporter = Reporter(str(tmp_path / "run"), report_to=(), progress=False)
    for metrics in steps():
        reporter.on_step(metrics)
    startup = reporter.finish({"evals": []})["startup"]
    assert [p["phase"] for p in startup["phases"]] == ["checking the inputs"] and startup["actors"] == []
    assert startup["phases"][0]["at_s"] == 0.0  # counted from its own start, as a later run is


def test_a_full_disk_under_the_run_folder_is_a_run_error_naming_it(tmp_path):
    """The kernel's own ENOSPC (``/dev/full`` behind the metrics file): the run stops with a RunError that names the
    folder and the space left, not a bare ``OSError: [Errno 28]`` from deep in a logger."""
    from coati.distributed.guards import RunError

    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    reporter = Reporter(str(tmp_path), report_to=("jsonl",), progress=False)
    with pytest.raises(
        RunError,
        match=rf"writing step 1's metrics into {tmp_path} failed \(No space left on device; "
        r"\d+ MiB free there\); free some space or use another --save-dir",
    ):
        reporter.on_step(next(steps()))
    (tmp_path / "metrics.jsonl").unlink()
    (tmp_path / "summary.json").symlink_to("/dev/full")
    with pytest.raises(RunError, match=rf"writing the run's summary into {tmp_path} failed \(No space left"):
        reporter.finish({})


def test_a_resumed_run_keeps_the_evaluations_made_before_its_checkpoint(tmp_path):
    """evals.json and the summary hold the run's evaluations, not only the last process's: a resume from step 1
    keeps the evaluation before training and replaces the one past its checkpoint; a resume that only exports (it
    trains and evaluates nothing) keeps them all (it had written an empty list)."""
    first = Reporter(str(tmp_path), report_to=("jsonl",), progress=False)
    first.on_step({"step": 0, "eval/lenient": 0.25, "eval/count": 4})
    for metrics in steps():
        first.on_step(metrics)
    first.finish({"evals": [{"step": 0, "eval/lenient": 0.25}, {"step": 2, "eval/lenient": 0.5}]})

    resumed = Reporter(str(tmp_path), report_to=("jsonl",), progress=False, append=True)
    resumed.on_step(list(steps())[1])  # step 2 again, from the checkpoint of step 1
    summary = resumed.finish({"evals": [{"step": 2, "eval/lenient": 0.75}]})
    expected = [{"step": 0, "eval/lenient": 0.25}, {"step": 2, "eval/lenient": 0.75}]
    assert json.loads((tmp_path / "evals.json").read_text()) == expected and summary["evals"] == expected

    exporting = Reporter(str(tmp_path), report_to=("jsonl",), progress=False, append=True)
    assert exporting.finish({"evals": []})["evals"] == expected
    assert json.loads((tmp_path / "evals.json").read_text()) == expected
