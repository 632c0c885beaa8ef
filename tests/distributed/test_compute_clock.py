"""The compute model on a real run: the clock advances by forward + backward + the optimizer's
step (the roofline profile, lsgd/compute/model.py), and a compressor's counted work adds to it."""

from __future__ import annotations

import json

import pytest
from trainer_runs import run

STEPS = 6


def summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_the_clock_advances_by_forward_backward_and_optimizer(tmp_path):
    """Local SGD that never synchronizes: a worker's modeled time is its compute alone, STEPS x
    (forward + backward + optimizer step) of the profile, the optimizer's share included."""
    s = summary(run(tmp_path, ["algo=local_sgd", "algo.local_steps=1000", f"max_steps={STEPS}", "optim=sgd"]))
    p = {k[len("profile_"):]: v for k, v in s.items() if k.startswith("profile_")}
    assert p["source"] == "roofline" and p["device"] == "a100" and p["optimizer_s"] > 0
    assert p["step_time_s"] == pytest.approx(p["forward_s"] + p["backward_s"] + p["optimizer_s"], rel=1e-12)
    assert s["modeled_compute_s"] == pytest.approx(STEPS * p["step_time_s"], rel=1e-12)
    assert s["modeled_time_s"] == pytest.approx(STEPS * p["step_time_s"], rel=1e-12)


def test_a_compressor_costs_compute_on_the_clock(tmp_path):
    """topk's compression (error feedback, selection, decompression) is counted and charged: the
    same run's compute exceeds the step profile by at least one launch per compressed tensor and step."""
    s = summary(run(tmp_path, ["algo=compressed", "algo.compressor=topk", "algo.cf=10", f"max_steps={STEPS}"]))
    step = s["profile_step_time_s"]
    assert s["modeled_compute_s"] > STEPS * step + STEPS * s["profile_launch_s"]
