"""W&B (offline) after a crash and resume: its history equals metrics.jsonl."""

from __future__ import annotations

import json

from crash_resume import CHECKPOINT
from runner import summary
from wandb_history import history


def expected_history(run) -> dict[int, dict]:
    """metrics.jsonl as W&B should hold it: records as they are, per-step rows as <kind>/<key>."""
    out: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "kind" in row:
            row = {"step": row["step"], **{f"{row['kind']}/{k}": v for k, v in row.items() if k not in ("kind", "step")}}
        out.setdefault(row["step"], {}).update(row)
    return out


def test_wandb_history_equals_metrics_after_a_crash_and_resume(gravac_crash):
    """GraVAC (per-step rows, conftest.gravac_crash) crashes at step 13 after a checkpoint at 10 and
    records up to 12; the resumed attempt is a new W&B run (<run_id>-r1) whose history holds exactly
    metrics.jsonl: the record of step 12 is the resumed run's, not the crashed attempt's, and the
    rows are there."""
    run = gravac_crash.run
    assert gravac_crash.crashed.returncode != 0
    assert gravac_crash.crashed_summary["status"] == "failed"
    # the crashed attempt recorded past its checkpoint: the resume must replace those records
    assert max(gravac_crash.crashed_steps) > CHECKPOINT
    assert gravac_crash.resumed.returncode == 0, gravac_crash.resumed.stderr[-4000:]
    assert summary(run)["status"] == "completed"
    ids = json.loads((run / "wandb_runs.json").read_text())
    assert ids == [run.name, f"{run.name}-r1"]
    (latest,) = (run / "wandb").glob(f"offline-run-*-{ids[1]}/run-{ids[1]}.wandb")
    got, want = history(latest), expected_history(run)
    assert sorted(got) == sorted(want)
    assert any("/" in k for row in want.values() for k in row)  # rows are covered
    for step, row in want.items():
        assert {k: got[step].get(k) for k in row} == row, step
    # the crashed attempt's own W&B run exists; what it holds is best effort (the launcher stops
    # rank 0 when rank 1 fails, and W&B may not have flushed by then; a CI run saw it empty)
    assert list((run / "wandb").glob(f"offline-run-*-{ids[0]}/run-{ids[0]}.wandb"))
