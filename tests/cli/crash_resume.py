"""One tiny GraVAC run made three times and read by several CLI tests (the session fixture
``gravac_crash`` of tests/cli/conftest.py): each ``lsgd train`` costs 5-7 s on 2 cores, most of it
starting the launcher and importing torch in every worker.

The runs: uninterrupted, crashed on one rank after a checkpoint, and resumed with ``resume=true``.
Four tests read them, each checking what it checked on runs of its own before (which ran about the
same tiny config 2-3 times each, 9 runs in all):

* test_cli.py::test_gravac_writes_per_step_rows_and_resumes_exactly (the per-step rows, resume equals
  the uninterrupted run);
* test_cli.py::test_resume_after_crash_matches_uninterrupted_run (failed status, environment.json of
  both sessions, resume equals the uninterrupted run);
* test_wandb.py (W&B history of the resumed attempt equals metrics.jsonl);
* test_tensorboard.py (TensorBoard and W&B beside metrics.jsonl, on the uninterrupted run).

The config is the union of what they need: per-step rows (GraVAC), every logger, a checkpoint every
5 steps, an evaluation every 5 steps off the record period of 2 (evaluation records between the
regular ones), and a crash of rank 1 at step 13, after the checkpoint at 10 and the record of step 12
(the resume must replace the crashed attempt's records past its checkpoint). The tests only read
the run folders.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from runner import TINY, lsgd, run_dirs

WANDB = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}

#: the shared config (20 steps on 2 workers, seed 1)
GRAVAC = [*TINY, "algo=gravac", "algo.compressor=topk", "algo.epsilon=0.3", "algo.window=1000",
          "logger=[jsonl,tensorboard,wandb]", "seed=1", "checkpoint_every=5", "eval_every=5", "log_every=2"]
CRASH_STEP, CRASH_RANK, CHECKPOINT = 13, 1, 10  # the failing rank, and the checkpoint the resume starts from


@dataclass(frozen=True)
class CrashAndResume:
    """``plain``: the uninterrupted run's folder; ``run``: the folder of the crashed run, resumed;
    ``crashed`` / ``resumed``: the two ``lsgd train`` processes of ``run``; what ``run`` held when
    the crashed attempt ended: ``crashed_summary``, ``crashed_steps`` (steps of its metrics.jsonl
    lines), ``first_environment`` (its environment.json)."""

    plain: Path
    run: Path
    crashed: subprocess.CompletedProcess
    resumed: subprocess.CompletedProcess
    crashed_summary: dict
    crashed_steps: list[int]
    first_environment: dict


def crash_and_resume(tmp: Path) -> CrashAndResume:
    """Under ``tmp``: :data:`GRAVAC` uninterrupted (``plain``), then crashed at :data:`CRASH_STEP`
    and resumed with ``resume=true`` in another results folder (``run``). Only the uninterrupted
    run must succeed here; what the other two did is the tests' to check."""
    plain = lsgd(["train", *GRAVAC, f"results_dir={tmp}/a"], tmp, env=WANDB)
    assert plain.returncode == 0, plain.stderr[-4000:]
    crashed = lsgd(["train", *GRAVAC, f"results_dir={tmp}/b", f"inject_failure.step={CRASH_STEP}",
                    f"inject_failure.rank={CRASH_RANK}"], tmp, env=WANDB)
    (run,) = run_dirs(tmp / "b")
    crashed_summary = json.loads((run / "summary.json").read_text())
    crashed_steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    first_environment = json.loads((run / "environment.json").read_text())
    resumed = lsgd(["train", *GRAVAC, f"results_dir={tmp}/b", "resume=true"], tmp, env=WANDB)
    (plain_run,) = run_dirs(tmp / "a")
    return CrashAndResume(plain_run, run, crashed, resumed, crashed_summary, crashed_steps, first_environment)
