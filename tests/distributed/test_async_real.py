"""``async_local_sgd`` in real timing (``algo.timing=real``) through the trainer on gloo: one worker
equals sync DiLoCo exactly; server + 3 workers of speeds spread 6 finish with every worker released,
faster workers applying more updates, staleness matching the server's log of versions; config
errors."""

from __future__ import annotations

import json

import pytest
import torch
from trainer_runs import records, run, train

from lsgd.algorithms.asynchronous.real_timing import ARRIVAL_KIND
from lsgd.compute.workers import resolve_speeds


@pytest.mark.timeout(120)
def test_one_worker_real_timing_equals_sync_diloco(tmp_path):
    """Server + 1 worker, H = 4, 12 steps: with one worker the order is forced, so the server's
    model and its evaluations (whole test set, on the server alone) equal DiLoCo's on one worker."""
    common = ["max_steps=12", "eval_every=4", "algo.local_steps=4", "algo.outer_optimizer=nesterov",
              "algo.outer_lr=0.7", "algo.outer_momentum=0.9", "cluster.compute=profile", "cluster.step_time_s=0.01"]
    sync_recs, sync_models = train(tmp_path, ["algo=diloco", *common], world=1, name="diloco")
    real_recs, real_models = train(tmp_path, ["algo=async_local_sgd", "algo.timing=real", "algo.time_scale=0.1",
                                              *common], world=2, name="real")
    for p, q in zip(real_models[0]["params"], sync_models[0]["params"]):
        assert torch.equal(p, q)
    for p, q in zip(real_models[0]["buffers"], sync_models[0]["buffers"]):
        if p.is_floating_point():
            assert torch.equal(p, q)
    assert [r["step"] for r in real_recs] == list(range(1, 13))
    evals = [(r["step"], r["test_acc"], r["test_loss"]) for r in real_recs if "test_acc" in r]
    assert evals == [(r["step"], r["test_acc"], r["test_loss"]) for r in sync_recs if "test_acc" in r]
    assert len(evals) == 3
    # the server's record at a task's end carries the mean loss of its 4 local steps
    sync_loss = [r["train_loss"] for r in sync_recs]
    for k in range(3):
        assert real_recs[4 * k]["train_loss"] == pytest.approx(sum(sync_loss[4 * k: 4 * k + 4]) / 4, rel=1e-9)
        assert [r["train_loss"] for r in real_recs[4 * k: 4 * k + 4]] == [real_recs[4 * k]["train_loss"]] * 4
    assert [r["lr"] for r in real_recs][3::4] == [r["lr"] for r in sync_recs][3::4]
    assert real_recs[-1]["updates_worker0"] == 3 and real_recs[-1]["staleness_max"] == 0


TOTAL = 12


@pytest.mark.timeout(180)
def test_heterogeneous_real_timing_releases_every_worker_and_faster_workers_apply_more(tmp_path):
    """Server + 3 workers of speeds spread 6 (cluster.speeds=very; 0.04 s per step at speed 1, so
    the workers' steps last 40, 132 and 240 ms of wall time), H = 2, no DyLU: the run ends with every
    worker released, the server handled the tasks that bring floor(local steps / 3) to T, the
    fastest worker applied the most updates and the slowest the fewest, the staleness in the
    records is that of the server's log of versions, and the records and evaluations exist."""
    over = ["algo=async_local_sgd", "algo.timing=real", "algo.time_scale=1.0", "algo.local_steps=2",
            "algo.outer_optimizer=delayed_nesterov", "algo.dn_buffer=3", "algo.outer_lr=0.5",
            "cluster.compute=profile", "cluster.speeds=very", "cluster.step_time_s=0.04", "epochs=3",
            f"max_steps={TOTAL}", "eval_unit=step", "eval_every=6", "log_every=1"]
    run_dir = run(tmp_path, over, world=4, name="real")
    lines = records(run_dir)
    rows = [r for r in lines if r.get("kind") == ARRIVAL_KIND]
    recs = [r for r in lines if "kind" not in r]
    # every rank finished (each saved its model), the summary is complete
    assert all((run_dir / f"rank{r}.pt").exists() for r in range(4))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == TOTAL
    assert summary["modeled_time_s"] > 0
    # the server handled exactly the tasks that bring the progress to T
    steps = [r["local_steps"] for r in rows]
    assert set(steps) == {2}
    assert sum(steps) // 3 >= TOTAL > (sum(steps) - steps[-1]) // 3
    assert [r["index"] for r in rows] == list(range(len(rows)))
    assert [r["step"] for r in rows] == [min(TOTAL, 2 * (i + 1) // 3) for i in range(len(rows))]
    # records at every progress count, evaluations of the server's model at 6 and 12
    assert [r["step"] for r in recs] == list(range(1, TOTAL + 1))
    assert [r["step"] for r in recs if "test_acc" in r] == [6, TOTAL]
    assert all(r["train_loss"] == r["train_loss"] for r in recs)  # no NaN: every record has a loss
    # faster workers applied more updates (speeds of ranks 1..3: 0.303, 1.0, 0.167)
    speeds = resolve_speeds("very", 4, 0)[1:]
    order = sorted(range(3), key=lambda w: -speeds[w])
    last = recs[-1]
    updates = [last[f"updates_worker{w}"] for w in range(3)]
    assert updates == [sum(r["worker"] == w for r in rows) for w in range(3)]
    assert updates[order[0]] > updates[order[1]] >= updates[order[2]] >= 1
    assert updates[order[0]] >= 2 * updates[order[2]]
    # staleness: the version each worker pulled is the server's count after its previous arrival
    for w in range(3):
        mine = [r for r in rows if r["worker"] == w]
        assert [r["pulled"] for r in mine] == [0] + [r["index"] + 1 for r in mine[:-1]]
    assert all(r["staleness"] == r["index"] - r["pulled"] for r in rows)
    assert last["staleness"] == pytest.approx(sum(r["staleness"] for r in rows) / len(rows))
    assert last["staleness_max"] == max(r["staleness"] for r in rows) > 0
    assert last["comm_rounds"] == len(rows)
    assert last["server_updates"] == len(rows)  # no drops, no FedBuff: one outer step per handled push
    walls = [r["wall_s"] for r in rows]
    assert walls == sorted(walls)


def test_real_timing_staleness_counts_server_steps_under_fedbuff_and_drops(tmp_path):
    """issue 22 item 6, real timing: FedBuff K = 2 and max_staleness = 1 (server + 3 workers of
    speeds spread 6). Whatever order the pushes arrive in, the server's log fixes the versions: a
    version is an outer step, one per K kept (not dropped) arrivals, so an arrival's staleness is
    (kept arrivals before it) // K - (kept arrivals before its worker's pull) // K, and it is
    dropped exactly when that exceeds 1; server_updates = kept // K."""
    k, max_staleness = 2, 1
    over = ["algo=async_local_sgd", "algo.timing=real", "algo.time_scale=1.0", "algo.local_steps=2",
            "algo.outer_optimizer=sgd", "algo.outer_lr=0.5", f"algo.fedbuff={k}", f"algo.max_staleness={max_staleness}",
            "cluster.compute=profile", "cluster.speeds=very", "cluster.step_time_s=0.04", "epochs=3",
            f"max_steps={TOTAL}", "eval_unit=step", "eval_every=6", "log_every=1"]
    lines = records(run(tmp_path, over, world=4, name="fedbuff"))
    rows = [r for r in lines if r.get("kind") == ARRIVAL_KIND]
    last = [r for r in lines if "kind" not in r][-1]
    kept_before = [0]  # kept_before[i]: arrivals 0..i-1 not dropped
    for r in rows:
        kept_before.append(kept_before[-1] + (not r["dropped"]))
    for i, r in enumerate(rows):
        assert r["index"] == i
        assert r["staleness"] == kept_before[i] // k - kept_before[r["pulled"]] // k, r
        assert r["dropped"] == (r["staleness"] > max_staleness), r
    assert last["server_updates"] == kept_before[-1] // k
    assert last["dropped"] == sum(r["dropped"] for r in rows)
    assert last["staleness_max"] == max(r["staleness"] for r in rows)
    # the arrival counts would say more: the slowest worker's pushes saw several arrivals
    assert max(r["index"] - r["pulled"] for r in rows) > last["staleness_max"]


def test_real_timing_config_errors():
    from trainer_runs import compose_cfg

    from lsgd.core.errors import ConfigError

    with pytest.raises(ConfigError, match="algo.timing='bogus' is not allowed; allowed: virtual, real"):
        compose_cfg(["algo=async_local_sgd", "algo.timing=bogus"])
    with pytest.raises(ConfigError, match="algo.time_scale must be a number > 0"):
        compose_cfg(["algo=async_local_sgd", "algo.timing=real", "algo.time_scale=0"])
    with pytest.raises(ConfigError, match="timing=real makes no checkpoints.*checkpoint_every=0"):
        compose_cfg(["algo=async_local_sgd", "algo.timing=real", "checkpoint_every=5"])
    with pytest.raises(ConfigError, match="timing=real needs cluster.compute=profile"):
        compose_cfg(["algo=async_local_sgd", "algo.timing=real", "cluster.compute=measured"])
    with pytest.raises(ConfigError, match="stretches its workers' steps itself.*set cluster.stretch=false"):
        compose_cfg(["algo=async_local_sgd", "algo.timing=real", "checkpoint_every=0", "cluster.stretch=true"])
    with pytest.raises(ConfigError, match="launcher.preemption=off"):
        compose_cfg(["algo=async_local_sgd", "algo.timing=real", "checkpoint_every=0",
                     "launcher.preemption=checkpoint"])
    with pytest.raises(ConfigError, match="algo.grace_period_s=0.5 needs algo.timing=virtual"):
        compose_cfg(["algo=async_local_sgd", "algo.timing=real", "checkpoint_every=0", "algo.grace_period_s=0.5"])
    with pytest.raises(ConfigError, match="algo.shard_policy='least_visited' needs algo.timing=virtual"):
        compose_cfg(["algo=async_local_sgd", "algo.timing=real", "checkpoint_every=0", "algo.shard_policy=least_visited"])
    assert compose_cfg(["algo=async_local_sgd", "algo.timing=real", "checkpoint_every=0"])["algo"]["time_scale"] == 1.0


@pytest.mark.timeout(120)
def test_a_diverging_real_timing_run_stops_and_releases_every_worker(tmp_path):
    """Outer lr 1e30: the workers' losses turn non-finite, the server's record sees the shipped
    non-finite count and stops with status diverged, and still releases both workers."""
    over = ["algo=async_local_sgd", "algo.timing=real", "algo.time_scale=0.1", "algo.local_steps=2",
            "algo.outer_optimizer=sgd", "algo.outer_lr=1e30", "cluster.compute=profile", "cluster.step_time_s=0.01",
            "max_steps=40", "log_every=1"]
    run_dir = run(tmp_path, over, world=3, name="nan")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["steps"] < 40
    assert all((run_dir / f"rank{r}.pt").exists() for r in range(3))
