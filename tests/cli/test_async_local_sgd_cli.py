"""``lsgd train algo=async_local_sgd``: a failing worker stops the whole job (server and the other
worker included) and the run folder names it with its traceback."""

from __future__ import annotations

from runner import TINY, lsgd, run_dirs, summary


def test_a_failing_worker_stops_the_job_with_its_traceback(tmp_path):
    res = lsgd(["train", *TINY, "algo=async_local_sgd", "launcher.nproc_per_node=3", "cluster.step_time_s=0.01",
                "algo.local_steps=2", "max_steps=8", "inject_failure.step=5", "inject_failure.rank=2",
                f"results_dir={tmp_path}/r"], tmp_path)
    assert res.returncode != 0
    assert "inject_failure: rank 2 fails at step 5" in res.stdout + res.stderr  # the failing rank's traceback
    (run,) = run_dirs(tmp_path / "r")
    s = summary(run)
    assert s["status"] == "failed" and s["failed_rank"] == 2, s
    assert "inject_failure: rank 2 fails at step 5" in s["error"]
