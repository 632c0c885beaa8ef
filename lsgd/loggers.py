"""Where records go besides metrics.jsonl: Weights & Biases (rank 0) and the progress display.

W&B and rich do the work; this module only picks one and keeps the rank-0 / always-finish rules
(design.md pitfalls: log from rank 0 only, pass the resolved config, always finish the run).
"""

from __future__ import annotations

import os
from pathlib import Path


class JsonlOnly:
    """metrics.jsonl is always written by the recorder; this logger adds nothing."""

    def log(self, line: dict) -> None:
        pass

    def finish(self, summary: dict) -> None:
        pass


class WandbLogger:
    """Weights & Biases on rank 0: resolved config, group = experiment, WANDB_MODE respected.

    Every line of metrics.jsonl reaches W&B at its ``step``: records as they are, per-step
    compression rows (lines with a ``kind``) as ``<kind>/<key>`` (e.g. ``gravac/cf``), so W&B's
    history holds what metrics.jsonl holds.

    Resume: W&B drops a ``log`` at a step below the run's last one, and a crashed run has logged
    steps past its last checkpoint, so continuing its W&B run would keep the pre-crash values. Each
    attempt is therefore its own W&B run (same name and group; id ``<run_id>`` for the first,
    ``<run_id>-r<k>`` for the k-th resume, listed in ``wandb_runs.json`` in the run folder), and a
    resumed attempt first replays the kept metrics.jsonl lines (the recorder does), so the newest
    attempt's history equals metrics.jsonl. Works offline; W&B's server-side rewind
    (``resume_from``) would need the service.
    """

    def __init__(self, cfg: dict, run_dir: Path, resumed_step: int | None = None):
        import json

        import wandb

        from lsgd.files import write_atomic

        wcfg = cfg["logger"]
        attempts_file = Path(run_dir) / "wandb_runs.json"
        attempts = json.loads(attempts_file.read_text()) if attempts_file.exists() else []
        run_id = cfg.get("run_id")
        wandb_id = run_id if not attempts else f"{run_id}-r{len(attempts)}"
        write_atomic(attempts_file, json.dumps([*attempts, wandb_id]))
        self.run = wandb.init(
            project=wcfg.get("project", "lsgd"),
            entity=wcfg.get("entity"),
            group=cfg["experiment_name"],
            name=run_id,
            id=wandb_id,
            config={**cfg, "wandb_attempt": len(attempts), "resumed_from_step": resumed_step},
            dir=str(run_dir),
            mode=os.environ.get("WANDB_MODE", wcfg.get("mode", "online")),
        )

    def log(self, line: dict) -> None:
        """One metrics.jsonl line (a record, or a per-step row with a ``kind``)."""
        if "kind" in line:
            kind = line["kind"]
            line = {"step": line["step"], **{f"{kind}/{k}": v for k, v in line.items() if k not in ("kind", "step")}}
        self.run.log(line, step=line["step"])

    def finish(self, summary: dict) -> None:
        """Summary values, then finish the run (once; later calls do nothing)."""
        if self.run is None:
            return
        run, self.run = self.run, None
        for k, v in summary.items():
            if v is not None:
                run.summary[k] = v
        if summary["status"] == "preempted":
            run.mark_preempting()
        run.finish(exit_code=0 if summary["status"] == "completed" else 1)


def build_logger(cfg: dict, run_dir: Path, resumed_step: int | None = None):
    """``logger.name``: ``wandb`` or ``jsonl`` (metrics.jsonl only). ``resumed_step``: the
    checkpoint step this attempt resumes from (None: a fresh start)."""
    if cfg["logger"].get("name", "jsonl") == "wandb":
        return WandbLogger(cfg, run_dir, resumed_step)
    return JsonlOnly()


class Progress:
    """A rich progress bar (rank 0, TTY only): step, epoch, loss, accuracy, samples/s, MB sent."""

    def __init__(self, total: int):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeRemainingColumn,
        )
        from rich.progress import (
            Progress as RichProgress,
        )

        self.progress = RichProgress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
        )
        self.task = self.progress.add_task("train", total=total, info="")
        self.progress.start()
        self.info = ""

    def update(self, step: int, rec: dict | None) -> None:
        if rec is not None:
            acc = f" acc {rec['test_acc']:.3f}" if "test_acc" in rec else ""
            loss = f"{rec['train_loss']:.3f}" if "train_loss" in rec else "-"  # no step finished in the window
            self.info = (
                f"epoch {rec['epoch']:.2f} loss {loss}{acc} "
                f"{rec['samples_per_s']:.0f} samples/s {rec['comm_bytes'] / 1e6:.1f} MB sent"
            )
        self.progress.update(self.task, completed=step, info=self.info)

    def close(self) -> None:
        self.progress.stop()
