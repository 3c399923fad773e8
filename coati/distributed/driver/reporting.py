"""What a run leaves behind: a progress bar that says what the run is doing, evals.json, summary.json, PNG plots,
and whatever the loggers of ``run.report_to`` write (metrics.jsonl and samples.jsonl, TensorBoard event files, a
wandb run; see ``loggers``). Nothing here is needed to train."""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import statistics
import time
from pathlib import Path

from coati.distributed.driver.report_page import flipped, write_report
from coati.distributed.driver.run_folder import writing
from coati.distributed.loggers import logger_class
from coati.distributed.loggers.base import require
from coati.distributed.loggers.jsonl_logger import truncate_jsonl
from coati.distributed.loggers.metrics import headline
from coati.distributed.runtime.startup import MARKS, process_age_s

PLOTS = {
    "reward": ("reward (mean per step)", ["reward/mean", "reward/train_batch_mean"]),
    "accuracy": (
        "fraction correct",
        ["reward/strict_accuracy", "reward/lenient_accuracy", "eval/strict", "eval/lenient", "eval/at_max"],
    ),
    "kl": ("KL (nats per token)", ["loss/approx_kl", "loss/kl"]),
    "teacher": ("to the teacher (on-policy distillation)", ["teacher/kl", "teacher/top1_match"]),
    "critic": ("the critic (PPO)", ["critic/value_loss", "critic/explained_variance", "critic/clipfrac"]),
    "values": ("value and return (mean per token)", ["critic/values_mean", "critic/return_mean"]),
    "entropy": ("entropy (nats per token)", ["actor/entropy"]),
    "response_length": ("response length (tokens)", ["response/length_mean"]),
    "learning_rate": ("learning rate", ["actor/lr"]),
    "grad_norm": ("gradient norm (before clipping)", ["actor/grad_norm"]),
    "time": ("seconds per step", ["time/step", "time/train", "time/rollout_wait", "time/weight_push"]),
    "groups": ("prompt groups per step", ["rollout/drawn_groups", "rollout/dropped_zero_signal_groups"]),
}
"""file name -> (y axis label, the series it draws); a series that is absent or zero at every step is not drawn (the
KL with beta 0, say), and a plot with no series is not written"""
LABELS = {
    "critic/value_loss": "value loss",
    "critic/explained_variance": "explained variance",
    "critic/clipfrac": "value clip fraction",
    "critic/values_mean": "value before training",
    "critic/return_mean": "return",
    "reward/mean": "drawn completions",
    "reward/train_batch_mean": "trained completions",
    "reward/strict_accuracy": "training, strict",
    "reward/lenient_accuracy": "training, lenient",
    "eval/strict": "held-out, strict",
    "eval/lenient": "held-out, lenient",
    "eval/at_max": "held-out, at the reward's maximum",
    "loss/approx_kl": "to the sampling policy",
    "loss/kl": "to the reference (penalised)",
    "teacher/kl": "KL to the teacher (nats per token)",
    "teacher/top1_match": "tokens the teacher would pick",
    "actor/entropy": "policy entropy",
    "response/length_mean": "mean length",
    "actor/lr": "learning rate",
    "actor/grad_norm": "gradient norm",
    "time/step": "whole step",
    "time/train": "training",
    "time/rollout_wait": "waiting for rollouts",
    "time/weight_push": "weight push",
    "rollout/drawn_groups": "drawn",
    "rollout/dropped_zero_signal_groups": "dropped: no signal",
}
"""each series' name in a legend"""
UNSMOOTHED = {"actor/lr"}
"""series drawn as they are even when long (a schedule is exact: a moving average would only blur it)"""
SMOOTHING = 0.6
"""weight of the past in the exponential moving average drawn over series of 10 points or more"""
LOOP_TOTALS = {
    "loop_s": "time/step",
    "train_s": "time/train",
    "rollout_wait_s": "time/rollout_wait",
    "weight_push_s": "time/weight_push",
    "groups_drawn": "rollout/drawn_groups",
    "groups_dropped_no_signal": "rollout/dropped_zero_signal_groups",
    "groups_dropped_stale": "rollout/stale_dropped_groups",
    "groups_filled_zero_signal": "rollout/filled_zero_signal_groups",
    "prompts_skipped": "rollout/skipped_prompts",
    "trained_tokens": "rollout/trained_tokens",
    "trained_tokens_unique": "rollout/trained_tokens_unique",
    "reward_errors": "reward/errors",
    "reward_timeouts": "reward/timeouts",
    "skipped_optimizer_steps": "actor/skipped_steps",
}
"""summary.json's ``loop.totals``: name -> the per-step metric summed over the steps (the loop's seconds are its steps'
seconds: evaluations and checkpoints between steps are not in them)"""
LOOP_MEDIANS = {
    "step_s": "time/step",
    "train_s": "time/train",
    "rollout_wait_s": "time/rollout_wait",
    "weight_push_s": "time/weight_push",
    "push_paused_s": "weights/paused_s",
    "engine_trainer_gap_abs": "rollout/engine_trainer_gap_abs",
    "truncated_frac": "response/truncated_frac",
}
"""summary.json's ``loop.medians``: name -> the per-step metric whose median over the steps is reported"""
_IMPORTED = time.perf_counter()
log = logging.getLogger(__name__)
PHASES = logging.getLogger("coati.phase")
"""the driver's phase messages ("starting 1 producer and 1 consumer", "evaluating before training", ...): shown on
the progress bar by a reporter, otherwise at INFO level"""


FIRST_STEP_TRAINED = "first step trained"
"""the phase the loop marks when its first step has trained and pushed (before any evaluation after it): the end of
the start-up account (``first_step_s``)"""

LOOP_STARTS = ": first rollouts and training"
"""the end of the phase the loop marks as its first step begins (``step N: first rollouts and training``)"""
CONVERTING = "converting the embedded model (once on this machine)"
"""the phase of the embedded model's first conversion on a machine (preflight marks it)"""
INSTALL_ENV = "COATI_INSTALL_S"
"""seconds ``make run`` spent installing before the command (the Makefile sets it; the run's wall account keeps it)"""


def loop_phase(step: int) -> str:
    return f"step {step}{LOOP_STARTS}"


def wall_account(phases: list[tuple[str, float]], steps_s: float | None, command_s: float) -> dict:
    """Where a run's time from the command went: the install before it (``make run``), the embedded model's
    conversion, start-up (the command to the loop's first step, the conversion included), the steps themselves,
    and the rest (evaluations, checkpoints, the final export and report), with the whole over the steps."""
    out: dict = {"command_s": round(command_s, 2)}
    try:
        out["install_s"] = float(os.environ[INSTALL_ENV])
    except (KeyError, ValueError):
        pass
    for (message, t), (_, after) in zip(phases, [*phases[1:], ("the end", command_s)], strict=False):
        if message == CONVERTING:  # until the phase after it
            out["conversion_s"] = round(after - t, 2)
    loop_start = next((t for message, t in phases if message.endswith(LOOP_STARTS)), None)
    if loop_start is not None and steps_s:
        out.update(startup_s=loop_start, steps_s=round(steps_s, 2))
        out["other_s"] = round(command_s - loop_start - steps_s, 2)
        out["wall_over_steps"] = round(command_s / steps_s, 3)
    return out


def describe_wall(wall: dict) -> str | None:
    """The line a run's end prints of its wall account (None without steps)."""
    if "steps_s" not in wall:
        return None
    conversion = f" (the embedded model's conversion {wall['conversion_s']:.0f} s)" if "conversion_s" in wall else ""
    install = f"; install before it {wall['install_s']:.0f} s" if "install_s" in wall else ""
    return (
        f"wall time {wall['command_s']:.0f} s: start-up {wall['startup_s']:.0f} s{conversion}, steps "
        f"{wall['steps_s']:.0f} s, evaluations, checkpoints and export {wall['other_s']:.0f} s "
        f"({wall['wall_over_steps']:.2f}x the steps){install}"
    )


ACTOR_SPANS = {"imports_s": ("process", "imported"), "engine_s": ("setup", "engine"), "setup_s": ("setup", "ready")}
"""an actor's start-up spans: its process's start to its class's imports done (Ray's worker and the imports), its
engine's build (model load: the inference engine, or the trainer's booster) and its whole ``setup``"""
ACTOR_STARTUP: list[dict] = []
"""each actor's start-up marks (``startup``) as seconds on the account's time line, and its spans, in start order"""
STARTUP: list[tuple[str, float]] = []
"""every phase of the run being started: (message, seconds since the account began), the start-up account's source"""

_ACCOUNT = {"origin": 0.0, "ended": False}
"""where the start-up account counts from: the process's start for its first run (the command's imports included);
for a later run of the same process (a script that launches several, reported or not), its own first phase"""


def phase(message: str) -> None:
    now = since_process_start()
    if _ACCOUNT["ended"]:  # a later run of this process: a new account, without the last run's phases and actors
        STARTUP.clear()
        ACTOR_STARTUP.clear()
        _ACCOUNT.update(origin=now, ended=False)
    STARTUP.append((message, round(now - _ACCOUNT["origin"], 2)))
    PHASES.info(message)


def end_account() -> None:
    """The run the account is of has ended (trained, failed or refused): the next phase begins the next run's."""
    _ACCOUNT["ended"] = True


def since_account_start() -> float:
    """Seconds since the start-up account of the run being started began (``_ACCOUNT``)."""
    return since_process_start() - _ACCOUNT["origin"]


def since_process_start() -> float:
    """Seconds since this process started (the command, imports included), from the kernel's record of it."""
    age = process_age_s()
    return time.perf_counter() - _IMPORTED if age is None else age


def actors_started(run_name: str, infos: list[tuple[str, dict]]) -> None:
    """Put the start-up marks of run ``run_name``'s actors just set up ((name, what its ``setup`` returned)) on the
    start-up account's time line (``ACTOR_STARTUP``; the actors of a restart are added to those of the run it
    continues)."""
    origin = time.time() - since_account_start()
    for name, info in infos:
        m = info.get("startup") or {}
        entry: dict = {"run": run_name, "actor": name}
        entry.update({f"{k}_at_s": round(m[k] - origin, 2) for k in ("process", *MARKS) if k in m})
        for span, (a, b) in ACTOR_SPANS.items():
            if a in m and b in m:
                entry[span] = round(m[b] - m[a], 2)
        ACTOR_STARTUP.append(entry)


def describe_startup(startup: dict) -> list[str]:
    """The lines a run's end prints of its start-up account: each actor's imports and engine (an actor without either
    mark is left out)."""
    lines = []
    for a in startup.get("actors", []):
        spans = (("imports_s", "imports"), ("engine_s", "engine"))
        parts = [f"{what} {a[span]:.1f} s" for span, what in spans if span in a]
        if "ready_at_s" in a:
            parts.append(f"ready {a['ready_at_s']:.0f} s after the command started")
        if parts:
            lines.append(f"start-up of {a['actor']}: " + ", ".join(parts))
    return lines


MOSTLY_TRUNCATED = 0.5
"""the share of a step's responses cut at max_new_tokens above which the run says its budget is too small"""


def truncation_warning(fraction: float, where: str) -> str:
    """What a run says when ``fraction`` of its responses ran out of tokens."""
    return (
        f"{where} {fraction:.0%} of the responses were cut at max_new_tokens before they ended: the budget is "
        "too small for this task (raise --max-new-tokens; truncated responses rarely reach an answer)"
    )


class Reporter:
    def __init__(
        self,
        out_dir: str,
        total_steps: int | None = None,
        report_to: tuple[str, ...] = ("jsonl",),
        project: str = "coati",
        config: dict | None = None,
        progress: bool = True,
        append: bool = False,
        describe: dict[str, str] | None = None,
    ):

        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.history: list[dict] = []
        self.start = time.perf_counter()
        self.started_at = _now()
        self.samples: list[dict] = []
        """the last step's sample completions (for the report page)"""
        self.first_step_s: float | None = None
        """seconds from the process's start to the first training step's metrics"""
        self.predictions: dict[str, tuple[int, list[dict]]] = {}
        """the first and the last held-out evaluation's predictions: (step, items), for the report's flipped items"""
        self.describe = dict(describe or {})
        """files that say how the run was made (name -> text), written with its first metrics"""
        classes = [logger_class(name) for name in report_to]
        for cls in classes:  # an uninstalled backend is refused now, before the run starts
            if cls.REQUIRES:
                require(*cls.REQUIRES)
        self._logger_args = classes, project, config or {}, append
        self.earlier_evals: list[dict] = _read_evals(self.out / "evals.json") if append else []
        """a resumed run's evaluations made before its checkpoint (kept in its evals.json and summary)"""
        self.last_step: int | None = None
        self.warned_truncation = False
        self.loggers: list | None = None
        """made at the first step: a run refused before it starts writes nothing into the folder (a second try
        would find another run's files there), and an overwrite's old metrics stay until the new run begins"""
        self.bar = self.phases = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, desc="starting", unit="step", dynamic_ncols=True)
            self.phases = _BarPhases(self.bar)
            self.phases.saved = PHASES.level, PHASES.propagate
            PHASES.addHandler(self.phases)
            PHASES.setLevel(logging.INFO)
            PHASES.propagate = False  # on the bar only

    def on_step(self, metrics: dict) -> None:
        """A training step's metrics, or (step 0) the evaluation before training."""
        with writing(self.out, f"step {metrics.get('step')}'s metrics"):
            self._on_step(metrics)

    def _on_step(self, metrics: dict) -> None:
        samples = metrics.pop("samples", None)
        if samples:
            self.samples = samples
        predictions = metrics.pop("eval_samples", None)
        metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, bool)) or _ints(v)}
        metrics["time/elapsed"] = time.perf_counter() - self.start
        step = int(metrics["step"])
        if self.loggers is None:
            classes, project, config, append = self._logger_args
            self.loggers = [cls(self.out, project, config, append) for cls in classes]
            for name, text in self.describe.items():
                (self.out / name).write_text(text)
            if not append:  # a new run's predictions only (a resumed one keeps those before its checkpoint)
                (self.out / "eval_samples.jsonl").unlink(missing_ok=True)
            if append:  # a resumed run: what an earlier process logged past its checkpoint is trained again now
                self._truncate(step)
                self.history = _read_history(self.out / "metrics.jsonl", step)  # the run's steps before it
        elif self.last_step is not None and step <= self.last_step:  # restarted from a checkpoint in this process
            self._truncate(step)
        self.last_step = step
        if step > 0 and self.first_step_s is None:
            marks = [at for message, at in STARTUP if message == FIRST_STEP_TRAINED]
            self.first_step_s = marks[-1] if marks else round(since_account_start(), 2)
        if step > 0:
            self.history.append(metrics)
            truncated = metrics.get("response/truncated_frac", 0.0)
            if truncated > MOSTLY_TRUNCATED and not self.warned_truncation:
                self.warned_truncation = True
                log.warning(truncation_warning(truncated, f"step {step}:"))
        for logger in self.loggers:
            logger.log(step, metrics)
            if samples:
                logger.completions(step, samples)
        if predictions:
            self._predictions(step, predictions)
        if self.bar is not None:
            self._show(metrics)

    def _predictions(self, step: int, items: list[dict]) -> None:
        """A held-out evaluation's predictions: appended to ``eval_samples.jsonl``, the first and the last kept."""
        self.predictions.setdefault("first", (step, items))
        self.predictions["last"] = (step, items)
        with (self.out / "eval_samples.jsonl").open("a") as f:
            for item in items:
                f.write(json.dumps({"step": step, **item}, default=str) + "\n")

    def _truncate(self, from_step: int) -> None:
        """Each step once: drop what was logged for ``from_step`` and later, here and in every logger."""
        self.history = [m for m in self.history if m["step"] < from_step]
        self.earlier_evals = [e for e in self.earlier_evals if e.get("step", 0) < from_step]
        truncate_jsonl(self.out / "eval_samples.jsonl", from_step)
        for logger in self.loggers:
            logger.truncate(from_step)

    def _show(self, metrics: dict) -> None:
        if metrics["step"] == 0:
            key = headline(metrics)
            self.bar.set_postfix({key.replace("/", "_"): f"{metrics.get(key, float('nan')):.3f}"})
            return
        if self.bar.total is None and "total_steps" in metrics:
            self.bar.total = metrics["total_steps"]
        self.bar.set_description("RL steps")
        tok_s = metrics.get("response/tokens", 0) / max(metrics.get("time/step", 1e-9), 1e-9)
        post = {
            "reward": f"{metrics.get('reward/mean', float('nan')):.3f}",
            "train_lenient": f"{metrics.get('reward/lenient_accuracy', float('nan')):.2f}",
            "train_strict": f"{metrics.get('reward/strict_accuracy', float('nan')):.2f}",
            "tok/s": f"{tok_s:.0f}",
        }
        post["reward_err"] = f"{metrics.get('reward/errors', 0)}/{metrics.get('reward/timeouts', 0)}t"
        if metrics.get("actor/skipped_steps"):
            post["skipped"] = metrics["actor/skipped_steps"]
        key = headline(metrics)
        if key in metrics:
            post[key.replace("/", "_")] = f"{metrics[key]:.3f}"
        self.bar.set_postfix(post)
        self.bar.update(1)

    def close_bar(self) -> None:
        """Close the progress bar (at the end, or when the run fails) and give the phase messages back to logging."""
        if self.bar is not None:
            PHASES.removeHandler(self.phases)
            PHASES.level, PHASES.propagate = self.phases.saved
            self.bar.close()
            self.bar = None

    def finish(self, result: dict) -> dict:
        """Write the run's summary, plots and report page; the summary."""
        self.close_bar()
        with writing(self.out, "the run's summary"):
            return self._finish(result)

    def _finish(self, result: dict) -> dict:
        evals = self.earlier_evals + list(result.get("evals", []))
        (self.out / "evals.json").write_text(json.dumps(evals, indent=2))
        plots = plot_history(self.history, self.out / "plots", evals)
        loop = loop_summary(self.history)
        summary = {
            "steps": len(self.history),
            "run_folder": str(self.out.resolve()),
            "started_at": self.started_at,
            "finished_at": _now(),
            "wall_s": time.perf_counter() - self.start,
            "loop": loop,
            "startup": {
                "phases": [{"phase": m, "at_s": t} for m, t in STARTUP],
                "actors": list(ACTOR_STARTUP),
                "first_step_s": self.first_step_s,
            },
            "wall": wall_account(STARTUP, loop["totals"].get("loop_s"), since_account_start()),
            # (counted from the process's start for its first run, else from the run's own first phase)
            "evals": evals,
            "final_model": result.get("final_model"),
            "plots": plots,
            "restarts": result.get("restarts", []),
            "groups": result.get("groups"),
            # (every group the producers handed out, by fate: ``Ledger.account``)
            "sandbox": result.get("sandbox"),
        }
        flips = flipped(self.predictions["first"][1], self.predictions["last"][1]) if self.predictions else []
        summary["report"] = str(write_report(self.out, summary, self.samples, describe_loop(summary["loop"]), flips))
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        STARTUP.clear()
        ACTOR_STARTUP.clear()
        end_account()
        for logger in self.loggers or []:
            logger.close()
        return summary


def _read_history(path: Path, before: int) -> list[dict]:
    """The training steps an earlier process of this run logged in ``metrics.jsonl`` before step ``before`` (the
    last record of a step wins; a line a kill cut short is skipped)."""
    steps: dict[int, dict] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and 0 < int(record.get("step", 0)) < before:
            steps[int(record["step"])] = record
    return [steps[k] for k in sorted(steps)]


def _read_evals(path: Path) -> list[dict]:
    """The evaluations an earlier process of this run wrote (none when it wrote none, or a file it left unreadable)."""
    try:
        evals = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [e for e in evals if isinstance(e, dict)] if isinstance(evals, list) else []


def _ints(value) -> bool:
    """A list of ints (the trained groups' rows and epochs: metrics.jsonl keeps them, the scalar loggers skip them)."""
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


class _BarPhases(logging.Handler):
    """Shows the driver's phase messages as the progress bar's description, so the minute of start-up before the
    first step says what it is doing."""

    def __init__(self, bar):
        super().__init__(logging.INFO)
        self.bar = bar

    def emit(self, record: logging.LogRecord) -> None:
        self.bar.set_description(record.getMessage())


def loop_summary(history: list[dict]) -> dict:
    """The training loop at a glance, from the steps' metrics (a resumed run's from every process of it):
    ``totals`` sums LOOP_TOTALS over the steps, ``medians`` takes LOOP_MEDIANS' median over the steps that measured
    it (non-finite values left out). A metric no step measured is left out, never reported as 0."""
    totals, medians = {}, {}
    for name, key in LOOP_TOTALS.items():
        values = [m[key] for m in history if key in m]
        if values:
            totals[name] = sum(values)
    for name, key in LOOP_MEDIANS.items():
        values = [m[key] for m in history if key in m and math.isfinite(m[key])]
        if values:
            medians[name] = statistics.median(values)
    return {"steps": len(history), "totals": totals, "medians": medians}


def describe_loop(loop: dict) -> list[str]:
    """``loop_summary``'s result as the lines the end of a run prints: what the loop drew, where a step's time went."""
    t, m = loop["totals"], loop["medians"]
    drawn = "".join(f"; {t[k]:.0f} {what}" for k, what in _DRAWN if k in t)
    timed = ", ".join(f"{what} {m[k]:.2f} s" for k, what in _TIMED if k in m)
    lines = [f"training loop {t['loop_s']:.0f} s over {loop['steps']} steps{drawn}"] if "loop_s" in t else []
    lines += [f"per step (medians): {timed}"] if timed else []
    if m.get("truncated_frac", 0.0) > MOSTLY_TRUNCATED:
        lines.append("WARNING: " + truncation_warning(m["truncated_frac"], "in the median step"))
    return lines


_DRAWN = (
    ("groups_drawn", "groups drawn"),
    ("groups_dropped_no_signal", "dropped for no signal"),
    ("groups_dropped_stale", "dropped as stale"),
    ("prompts_skipped", "prompts skipped"),
)
_TIMED = (
    ("step_s", "step"),
    ("train_s", "training"),
    ("rollout_wait_s", "waiting for rollouts"),
    ("weight_push_s", "weight push"),
    ("push_paused_s", "engine paused by it"),
)


def plot_history(history: list[dict], folder: Path, evals: list[dict] = ()) -> list[str]:
    """One PNG per PLOTS entry that has a series to draw (evaluations, including the one before training at step 0,
    come from ``evals``); long series are drawn faintly with their moving average over them. Returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (label, lines) in plot_lines(history, evals).items():
        with plt.rc_context({"font.size": 11}):
            fig, ax = plt.subplots(figsize=(7, 4))
            for legend, style, pts in lines:
                steps, values = zip(*pts, strict=True)
                if style == "points":  # a few evaluations: points, not a trend between them
                    ax.plot(steps, values, linestyle="none", marker="o", markersize=7, label=legend)
                elif style == "smoothed":
                    (line,) = ax.plot(steps, values, alpha=0.3)
                    ax.plot(steps, ema(values, SMOOTHING), color=line.get_color(), label=f"{legend} (smoothed)")
                else:
                    ax.plot(steps, values, marker="o" if len(pts) < 10 else None, label=legend)
            ax.set_xlabel("step")
            ax.set_ylabel(label)
            ax.set_title(name.replace("_", " "))
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(fontsize=9)
            fig.tight_layout()
            path = folder / f"{name}.png"
            fig.savefig(path, dpi=100)
            plt.close(fig)
        written.append(str(path))
    return written


def plot_lines(history: list[dict], evals: list[dict] = ()) -> dict[str, tuple[str, list]]:
    """What each plot draws: {name: (y label, [(legend, style, [(step, value)])])}, style "points" (evaluations),
    "smoothed" (10 points or more, drawn faintly under their moving average) or "plain"; a series absent or zero at
    every step is left out, and a plot with none is too."""
    out = {}
    for name, (label, keys) in PLOTS.items():
        lines = []
        for key in keys:
            source = evals if key.startswith("eval/") and evals else history
            pts = [
                (m["step"], m[key])
                for m in source
                if key in m and isinstance(m[key], (int, float)) and math.isfinite(m[key])
            ]
            if not any(v != 0 for _, v in pts):
                continue
            style = (
                "points"
                if key.startswith("eval/")
                else "smoothed"
                if len(pts) >= 10 and key not in UNSMOOTHED
                else "plain"
            )
            lines.append((LABELS.get(key, key), style, pts))
        if lines:
            out[name] = (label, lines)
    return out


def ema(values, weight: float) -> list[float]:
    """Exponential moving average, debiased at the start: s_t = weight s_{t-1} + (1 - weight) x_t, over 1 - weight^t."""
    out, s = [], 0.0
    for t, x in enumerate(values, 1):
        s = weight * s + (1 - weight) * x
        out.append(s / (1 - weight**t))
    return out


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
