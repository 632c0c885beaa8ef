"""``lsgd train algo=async_local_sgd algo.timing=real``: a failing worker stops the whole job (the
server, blocked waiting for pushes, and the other worker included) and the run folder names it."""

from __future__ import annotations

import pytest
from runner import TINY, lsgd, run_dirs, summary


@pytest.mark.timeout(300)
def test_a_failing_worker_in_real_timing_stops_the_job(tmp_path):
    res = lsgd(["train", *TINY, "algo=async_local_sgd", "algo.timing=real", "checkpoint_every=0",
                "launcher.nproc_per_node=3", "cluster.step_time_s=0.01", "algo.local_steps=2", "max_steps=8",
                "inject_failure.step=5", "inject_failure.rank=2", f"results_dir={tmp_path}/r"], tmp_path)
    assert res.returncode != 0
    assert "inject_failure: rank 2 fails at step 5" in res.stdout + res.stderr
    (run,) = run_dirs(tmp_path / "r")
    s = summary(run)
    assert s["status"] == "failed" and s["failed_rank"] == 2, s
    assert "inject_failure: rank 2 fails at step 5" in s["error"]
