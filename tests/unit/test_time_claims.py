"""The time-claims study's table logic (lsgd.analysis.time_claims; scripts/time_claims.py runs the
study; no emulation here): one evaluation's wall cost from the record intervals, time to target
with the earlier evaluations taken out, the perplexity direction and the markdown table of run
folders. Records are built from a known schedule (training seconds per record interval, seconds
per evaluation), so every expected value is closed form."""

from __future__ import annotations

import json
import math

import pytest

from lsgd.analysis import time_claims


@pytest.fixture(scope="module")
def tc():
    return time_claims


def schedule(metric: list[float | None], train_s: float, eval_s: float, key: str = "test_acc", every: int = 24):
    """Records every ``every`` steps; ``metric[i]`` (None: no evaluation) at record i. Record i's wall
    time is i+1 training intervals plus the evaluations of records 0..i-1 (a record's wall time is
    read before its own evaluation); modeled time is the training intervals alone, at half speed."""
    recs, wall, evals = [], 0.0, 0
    for i, m in enumerate(metric):
        wall = (i + 1) * train_s + evals * eval_s
        rec = {"step": (i + 1) * every, "wall_time_s": wall, "modeled_time_s": (i + 1) * train_s / 2}
        if m is not None:
            rec[key] = m
            evals += 1
        recs.append(rec)
    return recs


def test_eval_cost_is_the_extra_seconds_of_intervals_that_start_at_an_evaluation(tc):
    recs = schedule([None, 0.5, None, 0.7, None, 0.8, None, 0.9], train_s=3.0, eval_s=0.75)
    assert tc.eval_cost(recs) == pytest.approx(0.75)
    # no evaluated interval start (only the last record is evaluated): unknown, not zero
    assert math.isnan(tc.eval_cost(schedule([None, None, None, 0.9], 3.0, 0.75)))


def test_time_to_target_takes_out_the_earlier_evaluations(tc):
    recs = schedule([None, 0.5, None, 0.84, None, 0.86, None, 0.9], train_s=3.0, eval_s=0.75)
    t = tc.time_to(recs, 0.85, tc.eval_cost(recs))
    # reached at the 6th record (step 144): 6 intervals of training, 2 earlier evaluations
    assert t["step"] == 144 and t["evals_before"] == 2
    assert t["raw_s"] == pytest.approx(6 * 3.0 + 2 * 0.75)
    assert t["wall_s"] == pytest.approx(6 * 3.0)
    assert t["prev_s"] == pytest.approx(4 * 3.0)  # the evaluation before it, its own cost out too
    assert t["modeled_s"] == pytest.approx(6 * 3.0 / 2)
    never = tc.time_to(recs, 0.95, 0.75)
    assert never["step"] is None and math.isnan(never["wall_s"]) and never["evals_before"] == 4


def test_perplexity_targets_are_reached_from_above(tc):
    recs = schedule([None, 21.8, None, 15.9, None, 13.4], train_s=2.0, eval_s=0.0, key="test_ppl", every=25)
    t = tc.time_to(recs, 14.0, tc.eval_cost(recs))
    assert t["step"] == 150 and t["wall_s"] == pytest.approx(12.0)


def test_table_has_one_row_per_run_folder(tc, tmp_path):
    runs = tmp_path / "runs"
    for arm, accs, train_s in (("demo_ddp", [None, 0.8, None, 0.86], 6.0), ("demo_local_sgd", [None, 0.86], 2.0)):
        run = runs / arm / "20261126-000000-000000-0000"
        run.mkdir(parents=True)
        rows = schedule(accs, train_s, 1.0) + [{"kind": "compression", "step": 1}]  # per-step rows are skipped
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "config.yaml").write_text("seed: 3\nexperiment_name: x\n")
    md = tc.table(runs, {"demo": 0.85})
    lines = [ln for ln in md.splitlines() if ln.startswith("| demo")]
    assert [ln.split(" | ")[0] for ln in lines] == ["| demo_ddp (seed 3)", "| demo_local_sgd (seed 3)"]
    ddp = lines[0].split(" | ")
    assert ddp[2] == "96" and ddp[3] == "24.0"  # 4 x 6 s of training; the evaluation at step 48 taken out
    # reached at its first evaluation: nothing to take out, though one evaluation's cost is unknown here
    lsgd = lines[1].split(" | ")
    assert lsgd[2] == "48" and lsgd[3] == "4.0" and lsgd[8] == "nan"
