"""What a run leaves behind: a progress bar, metrics.jsonl, samples.jsonl, evals.json, PNG plots, and (optionally)
wandb. wandb runs offline when no API key is set and can be turned off; nothing here is needed to train."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

PLOTS = {
    "reward": ["reward/mean", "reward/train_batch_mean"],
    "accuracy": ["reward/strict_accuracy", "reward/lenient_accuracy", "eval/strict", "eval/lenient"],
    "kl": ["loss/approx_kl", "loss/kl"],
    "entropy": ["actor/entropy"],
    "response_length": ["response/length_mean"],
}


class Reporter:
    def __init__(self, out_dir: str, total_steps: int | None = None, use_wandb: bool = False, project: str = "coati",
                 config: dict | None = None, progress: bool = True, append: bool = False):  # fmt: skip
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.out / "metrics.jsonl"
        if not append:  # a resumed run keeps the metrics of the steps before the checkpoint
            self.metrics_path.write_text("")
        self.history: list[dict] = []
        self.start = time.perf_counter()
        self.bar = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, desc="RL steps", unit="step", dynamic_ncols=True)
        self.wandb = None
        if use_wandb:
            self.wandb = _start_wandb(project, config, self.out)

    def on_step(self, metrics: dict) -> None:
        samples = metrics.pop("samples", None)
        metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, bool))}
        metrics["time/elapsed"] = time.perf_counter() - self.start
        self.history.append(metrics)
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
        if samples:
            with (self.out / "samples.jsonl").open("a") as f:
                for s in samples:
                    f.write(json.dumps({"step": metrics["step"], **s}) + "\n")
        if self.bar is not None:
            if self.bar.total is None and "total_steps" in metrics:
                self.bar.total = metrics["total_steps"]
            tok_s = metrics.get("response/tokens", 0) / max(metrics.get("time/step", 1e-9), 1e-9)
            post = {"reward": f"{metrics.get('reward/mean', float('nan')):.3f}",
                    "acc": f"{metrics.get('reward/lenient_accuracy', float('nan')):.2f}",
                    "strict": f"{metrics.get('reward/strict_accuracy', float('nan')):.2f}", "tok/s": f"{tok_s:.0f}"}  # fmt: skip
            post["reward_err"] = f"{metrics.get('reward/errors', 0)}/{metrics.get('reward/timeouts', 0)}t"
            if metrics.get("actor/skipped_steps"):
                post["skipped"] = metrics["actor/skipped_steps"]
            if "eval/lenient" in metrics:
                post["eval"] = f"{metrics['eval/lenient']:.3f}"
            self.bar.set_postfix(post)
            self.bar.update(1)
        if self.wandb is not None:
            self.wandb.log(metrics, step=int(metrics["step"]))

    def finish(self, result: dict) -> dict:
        if self.bar is not None:
            self.bar.close()
        (self.out / "evals.json").write_text(json.dumps(result.get("evals", []), indent=2))
        plots = plot_history(self.history, self.out / "plots", result.get("evals", []))
        summary = {"steps": len(self.history), "wall_s": time.perf_counter() - self.start,
                   "evals": result.get("evals", []), "final_model": result.get("final_model"), "plots": plots}  # fmt: skip
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        if self.wandb is not None:
            self.wandb.finish()
        return summary


def plot_history(history: list[dict], folder: Path, evals: list[dict] = ()) -> list[str]:
    """One PNG per PLOTS entry with the series that the run recorded (evaluations, including the one before
    training at step 0, come from ``evals``); returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, keys in PLOTS.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        drawn = 0
        for key in keys:
            source = evals if key.startswith("eval/") and evals else history
            pts = [(m["step"], m[key]) for m in source if key in m and isinstance(m[key], (int, float))
                   and math.isfinite(m[key])]  # fmt: skip
            if pts:
                ax.plot(*zip(*pts), marker="o" if len(pts) < 30 else None, label=key)
                drawn += 1
        if not drawn:
            ax.text(0.5, 0.5, f"no {name} data recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("step")
        ax.set_title(name)
        if drawn:
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(str(path))
    return written


def _start_wandb(project: str, config: dict | None, out: Path):
    try:
        import wandb
    except ImportError as e:
        raise ImportError("wandb logging was asked for but wandb is not installed: pip install wandb") from e
    mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return wandb.init(project=project, config=config or {}, dir=str(out), mode=mode)
