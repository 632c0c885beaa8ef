"""lsgd.analysis.gravac_gains (scripts/gravac_gains.py): the gains GraVAC's controller saw, pooled over an arm's seeds per CF and
role, and its decisions (shares sent, the omega rule's gap at window ends, theta_min's path),
against a hand-computed example."""

from __future__ import annotations

from pathlib import Path

import pytest

from lsgd.analysis import gravac_gains
from lsgd.analysis.load import RunData


def _run(seed: int, rows: list[tuple], algo: str = "gravac", **keys) -> RunData:
    config = {"experiment_name": "e", "seed": seed, "algo.name": algo, "algo.compressor": "dgc",
              "algo.epsilon": 0.7, "algo.omega": 0.01, "algo.window": 2, **keys}
    keys = ("step", "cf_min", "cf_candidate", "gain_min", "gain_candidate", "sent")
    return RunData(run_dir=Path(f"/r{seed}"), config=config, summary=None,
                   compression=[{"kind": "compression", **dict(zip(keys, r))} for r in rows])


RUNS = [
    _run(0, [(1, 10, 20, 0.8, 0.5, "min"), (2, 10, 20, 0.7, 0.6, "dense"), (3, 10, 40, 0.9, 0.4, "min"),
             (4, 10, 40, 0.9, 0.891, "candidate"), (5, 40, 80, 0.5, 0.3, "min")]),
    _run(1, [(1, 10, 20, 0.6, 0.55, "min"), (2, 10, 10, 0.6, 0.6, "min")]),  # settled at 10x at step 2
    _run(2, [(1, 10, 20, 0.1, 0.1, "dense")], algo="ddp"),                    # not GraVAC: ignored
]


def test_gains_pool_the_seeds_per_cf_and_role():
    gains, decisions = gravac_gains.summarize(RUNS)
    by = {(g["cf"], g["as"]): g for g in gains}
    assert list(by) == [(10, "theta_min"), (20, "candidate"), (40, "theta_min"), (40, "candidate"), (80, "candidate")]
    # theta_min 10x: 0.8, 0.7, 0.9, 0.9 (seed 0) and 0.6, 0.6 (seed 1)
    assert by[10, "theta_min"]["steps"] == 6
    assert by[10, "theta_min"]["median"] == pytest.approx(0.75)
    assert (by[10, "theta_min"]["min"], by[10, "theta_min"]["max"]) == (0.6, 0.9)
    # candidate 20x: 0.5, 0.6 (seed 0), 0.55 (seed 1); the settled row (candidate = theta_min) is not a candidate
    assert by[20, "candidate"]["steps"] == 3 and by[20, "candidate"]["median"] == pytest.approx(0.55)
    assert by[40, "candidate"]["median"] == pytest.approx((0.4 + 0.891) / 2)
    assert by[40, "theta_min"]["steps"] == 1 and by[80, "candidate"]["max"] == 0.3

    (d,) = decisions
    assert (d["sent_candidate"], d["sent_min"], d["sent_dense"]) == pytest.approx((1 / 7, 5 / 7, 1 / 7))
    # window ends (window 2): steps 2 and 4 of seed 0, step 2 of seed 1: gaps 0.1/0.7, 0.009/0.9, 0
    assert d["gap_median"] == pytest.approx(0.01) and d["gap_min"] == 0.0
    assert d["paths"] == ["seed 0: 10x@1 -> 40x@5", "seed 1: 10x@1 (settled)"]


def test_skip_leaves_out_the_first_steps():
    gains, _ = gravac_gains.summarize(RUNS, skip=1)
    by = {(g["cf"], g["as"]): g for g in gains}
    assert by[10, "theta_min"]["steps"] == 4 and by[20, "candidate"]["steps"] == 1


def test_markdown_has_the_two_tables():
    gains, decisions = gravac_gains.summarize(RUNS)
    lines = gravac_gains.markdown(gains, decisions).splitlines()
    arm = "e: GraVAC/dgc eps=0.7 omega=0.01 window=2"
    assert lines[0] == "| arm | CF | as | steps | median | p10 | p90 | min | max |"
    assert lines[2] == f"| {arm} | 10x | theta_min | 6 | 0.750 | 0.600 | 0.900 | 0.600 | 0.900 |"
    assert lines[2 + len(gains)] == ""  # then the decisions
    assert lines[-1] == (f"| {arm} | 14.3% / 71.4% / 14.3% | 0.010 (0.000) | "
                         "seed 0: 10x@1 -> 40x@5; seed 1: 10x@1 (settled) |")


def test_the_gain_rules_are_separate_arms():
    """Runs under algo.gain=authors_code are not pooled with the paper's (a run without the key,
    from before it existed, is the paper's)."""
    runs = [*RUNS, _run(3, [(1, 10, 20, 1.2, 1.1, "candidate")], **{"algo.gain": "authors_code"}),
            _run(4, [(1, 10, 20, 0.5, 0.4, "min")], **{"algo.gain": "paper"})]
    gains, decisions = gravac_gains.summarize(runs)
    arms = [d["arm"] for d in decisions]
    assert arms == ["e: GraVAC/dgc eps=0.7 omega=0.01 window=2 gain=authors_code", "e: GraVAC/dgc eps=0.7 omega=0.01 window=2"]
    authors = {(g["cf"], g["as"]): g for g in gains if g["arm"] == arms[0]}
    assert authors[10, "theta_min"]["steps"] == 1 and authors[10, "theta_min"]["median"] == 1.2
    paper = {(g["cf"], g["as"]): g for g in gains if g["arm"] == arms[1]}
    assert paper[10, "theta_min"]["steps"] == 7  # seeds 0, 1 (no algo.gain) and 4 (paper)
    assert decisions[1]["paths"][-1] == "seed 4: 10x@1"
