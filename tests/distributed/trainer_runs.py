"""Run the real trainer on N gloo ranks from Hydra overrides (hook order, schedule, services)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from gloo import run_gloo

from lsgd.config.validation import compose_config

#: tiny synthetic settings; 2 gloo workers unless the world size says otherwise
TINY = ["debug=default", "dataset.num_train=512", "dataset.num_test=64", "log_every=1", "eval_every=1000",
        "checkpoint_every=0", "schedule=cosine"]


def compose_cfg(overrides: list[str]) -> dict:
    return compose_config(overrides)


def _train(rank, world, cfg, run_dir):
    from lsgd.training.trainer import Trainer

    trainer = Trainer(cfg, Path(run_dir), "cpu")
    trainer.fit()
    torch.save({"params": [p.detach().clone() for p in trainer.model.parameters()],
                "buffers": [b.clone() for b in trainer.model.buffers()]}, Path(run_dir) / f"rank{rank}.pt")


def run(tmp_path: Path, overrides: list[str], world: int = 2, name: str = "run", resume: bool = False) -> Path:
    """Train on ``world`` ranks in ``tmp_path / name`` (``resume``: from its last checkpoint);
    returns the run directory. A failing rank raises (torch.multiprocessing.ProcessRaisedException)."""
    cfg = compose_cfg([*TINY, f"launcher.nproc_per_node={world}", f"results_dir={tmp_path}", *overrides])
    cfg["run_id"] = name
    cfg["resume"] = resume
    run_dir = tmp_path / name
    run_dir.mkdir(exist_ok=resume)
    run_gloo(_train, world, cfg, str(run_dir))
    return run_dir


def records(run_dir: Path) -> list[dict]:
    """Every line of metrics.jsonl: the records and the per-step rows (``kind``)."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train(tmp_path: Path, overrides: list[str], world: int = 2, name: str = "run") -> tuple[list[dict], list[dict]]:
    """Train on ``world`` ranks; returns (metrics records without per-step rows, per-rank final
    parameters and buffers)."""
    run_dir = run(tmp_path, overrides, world, name)
    models = [torch.load(run_dir / f"rank{r}.pt") for r in range(world)]
    return [r for r in records(run_dir) if "kind" not in r], models
