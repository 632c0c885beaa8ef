"""The trainer's checkpoints: per-rank shards under ``checkpoints/step_XXXXXXXX/`` and
``checkpoints/last.json``, with every random state of the process.

What a shard holds is the trainer's to say (:meth:`lsgd.training.trainer.Trainer.save_checkpoint`);
the checkpointer writes it atomically, points ``last.json`` at the newest folder once every rank has
written (uncounted barriers) and drops the older ones.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import torch

from lsgd.core.files import write_atomic


class Checkpointer:
    """Per-rank shards ``checkpoints/step_XXXXXXXX/rank{r}.pt`` (atomic), then rank 0 points
    ``checkpoints/last.json`` at the folder and drops older ones (after a barrier)."""

    def __init__(self, run_dir: Path, rank: int, world_size: int, device: torch.device):
        self.dir = Path(run_dir) / "checkpoints"
        self.rank, self.world_size, self.device = rank, world_size, device
        self.is_main = rank == 0

    def exists(self) -> bool:
        return (self.dir / "last.json").exists()

    def save(self, step: int, state: dict, comm) -> None:
        step_dir = self.dir / f"step_{step:08d}"
        step_dir.mkdir(parents=True, exist_ok=True)
        state = {**state, "step": step, "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None,
            "python": random.getstate(),
            "numpy": np.random.get_state(),
        }}
        path = step_dir / f"rank{self.rank}.pt"
        tmp = path.with_suffix(".pt.tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        comm.barrier()
        if self.is_main:
            write_atomic(self.dir / "last.json", json.dumps({"step": step, "dir": step_dir.name, "world_size": self.world_size}))
            for old in self.dir.glob("step_*"):
                if old.name != step_dir.name:
                    for f in old.iterdir():
                        f.unlink()
                    old.rmdir()
        comm.barrier()

    def load(self) -> tuple[dict, str]:
        """This rank's shard named by last.json (RNG states restored); returns (state, folder name).

        Raises:
            ValueError: the checkpoint was written by another number of processes.
        """
        meta = json.loads((self.dir / "last.json").read_text())
        if meta["world_size"] != self.world_size:
            raise ValueError(f"checkpoint was written by {meta['world_size']} workers; this run has {self.world_size}")
        state = torch.load(self.dir / meta["dir"] / f"rank{self.rank}.pt", map_location=self.device, weights_only=False)
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None:
            torch.cuda.set_rng_state_all(rng["cuda"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        return state, meta["dir"]
