"""``lsgd train algo=async_local_sgd``: a failing worker stops the whole job (server and the other
worker included) and the run folder names it with its traceback; in virtual timing the same seed
twice gives identical records, one run beside a CPU hog."""

from __future__ import annotations

import subprocess
import sys

from runner import TINY, lsgd, metrics, run_dirs, summary


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


def test_virtual_mode_same_seed_twice_identical_beside_a_cpu_hog(tmp_path):
    """issue 13: ``algo.timing=virtual`` decides the arrival order on the cluster clock, not by which
    process is first, so the same config twice gives identical records (losses, evaluations of the
    server's model, staleness, server updates, modeled times), the second run with two CPU-burning
    processes beside it (started here, always stopped); only the measured-time keys may differ."""
    args = [*TINY, "algo=async_local_sgd", "launcher.nproc_per_node=3", "cluster.speeds=very",
            "cluster.step_time_s=0.01", "algo.local_steps=3", "algo.dylu=true",
            "algo.outer_optimizer=delayed_nesterov", "algo.dn_buffer=2", "max_steps=12", "log_every=1",
            "eval_unit=step", "eval_every=4", "checkpoint_every=0"]
    _ok(lsgd(["train", *args, f"results_dir={tmp_path}/a"], tmp_path))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        _ok(lsgd(["train", *args, f"results_dir={tmp_path}/b"], tmp_path))
        assert all(h.poll() is None for h in hogs)  # they burnt CPU during the whole second run
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    (a,), (b,) = run_dirs(tmp_path / "a"), run_dirs(tmp_path / "b")
    ra, rb = metrics(a), metrics(b)  # without runner.TIME_KEYS (measured on this machine)
    assert ra == rb and [r["step"] for r in ra] == list(range(1, 13))
    # no NaN: a record over which no worker finished a step has no train_loss (issue 24)
    assert not [r for r in ra for v in r.values() if isinstance(v, float) and v != v]
    assert 0 < sum("train_loss" in r for r in ra) < len(ra)
    assert [r["step"] for r in ra if "test_loss" in r] == [4, 8, 12]
    last = ra[-1]
    assert last["staleness_max"] > 0 and last["server_updates"] == last["comm_rounds"] > 0
    assert [r["server_updates"] for r in ra] == sorted(r["server_updates"] for r in ra)
    assert summary(a)["modeled_time_s"] == summary(b)["modeled_time_s"] > 0
    # the measured keys were there and were dropped, not missing
    assert {"wall_time_s", "compute_time_s"} <= set(metrics(a, drop_time=False)[-1])


def _ok(res):
    assert res.returncode == 0, f"exit {res.returncode}\nSTDOUT\n{res.stdout[-3000:]}\nSTDERR\n{res.stderr[-6000:]}"
