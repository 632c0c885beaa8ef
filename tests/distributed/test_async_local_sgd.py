"""``async_local_sgd`` (server + workers, virtual timing) through the trainer on gloo: one worker
equals sync DiLoCo, a heterogeneous 4-process run records every multiple, is reproducible and
resumes exactly, and a failing worker stops the job."""

from __future__ import annotations

import pytest
import torch
from torch.multiprocessing.spawn import ProcessException
from trainer_runs import records, run, train

from lsgd.algorithms.asynchronous.plan import dylu_steps, plan
from lsgd.compute.workers import resolve_speeds

MEASURED = {"wall_time_s", "comm_time_s", "compute_time_s", "compute_time_s_max", "samples_per_s"}


def strip(recs):
    return [{k: v for k, v in r.items() if k not in MEASURED} for r in recs]


@pytest.mark.parametrize("outer", ["sgd", "nesterov"])
def test_one_worker_equals_sync_diloco(tmp_path, outer):
    """Server + 1 worker, H = 4, 12 steps: the server's model after each arrival is DiLoCo's after
    each round (same shard, model, AdamW, schedule), so the final models and evaluations agree."""
    common = ["max_steps=12", "eval_every=4", "algo.local_steps=4", f"algo.outer_optimizer={outer}",
              "algo.outer_lr=0.7", "algo.outer_momentum=0.9", "cluster.compute=profile", "cluster.step_time_s=0.01"]
    sync_recs, sync_models = train(tmp_path, ["algo=diloco", *common], world=1, name="diloco")
    async_recs, async_models = train(tmp_path, ["algo=async_local_sgd", *common], world=2, name="async")
    server = async_models[0]
    for p, q in zip(server["params"], sync_models[0]["params"]):
        assert torch.equal(p, q)
    for p, q in zip(server["buffers"], sync_models[0]["buffers"]):
        if p.is_floating_point():
            assert torch.equal(p, q)
    assert [r["step"] for r in async_recs] == [r["step"] for r in sync_recs] == list(range(1, 13))
    evals = [(r["step"], r["test_acc"], r["test_loss"]) for r in async_recs if "test_acc" in r]
    sync_evals = [(r["step"], r["test_acc"], r["test_loss"]) for r in sync_recs if "test_acc" in r]
    assert [e[:2] for e in evals] == [e[:2] for e in sync_evals] and len(evals) == 3
    for e, s in zip(evals, sync_evals):  # the test set is split over 2 ranks instead of 1: the sum's order
        assert e[2] == pytest.approx(s[2], rel=1e-6)
    # records 1-3 are made by the server once arrival 0 is in (virtual time): the lr it shows then
    # is the schedule's at the arrival's progress, as DiLoCo's at the round's end
    assert [r["lr"] for r in async_recs][3::4] == [r["lr"] for r in sync_recs][3::4]
    assert async_recs[-1]["updates_worker0"] == 3 and async_recs[-1]["staleness_max"] == 0


CNN_PARAMS = 215_418
CNN_FLOAT_BUFFERS = 2 * (16 + 32)
TOTAL = 16


def four_process_plan():
    """The plan of the 4-process runs below, from the config alone: speeds 'very' over 4 ranks
    (seed 0; the server's is unused), 0.01 s per step at speed 1, DyLU of H = 4, one message of
    the CNN's parameters and BatchNorm statistics on the default 10 Gbps, 10 us link."""
    speeds = resolve_speeds("very", 4, 0)
    step_s = [0.01 / speeds[r] for r in (1, 2, 3)]
    cost = 10e-6 + 4 * (CNN_PARAMS + CNN_FLOAT_BUFFERS) * 8 / 10e9
    return plan(step_s, dylu_steps(4, step_s, True), [cost] * 3, [cost] * 3, TOTAL), cost


def follows_plan_repeats_and_resumes(tmp_path, over: list[str], p, server_end_s: float) -> None:
    """Run ``over`` on 4 processes (server + 3 workers) and check it against plan ``p``: a record
    at every progress count 1..TOTAL (evaluations at 4, 8, 12, 16); the server's update counts,
    staleness and rounds as planned; the cluster clock ends at the latest of the workers' last
    boundaries and ``server_end_s`` (the server's last send, seconds); a second run is identical;
    the worker taking the most local steps, crashing after the checkpoint at 8, stops the job, and
    resuming ends with the uninterrupted run's records."""
    full = records(run(tmp_path, over, world=4, name="full"))
    recs = [r for r in full if "kind" not in r]
    assert [r["step"] for r in recs] == list(range(1, TOTAL + 1))
    assert [r["step"] for r in recs if "test_acc" in r] == [4, 8, 12, 16]
    last = recs[-1]
    assert [last[f"updates_worker{w}"] for w in range(3)] == [sum(a.worker == w for a in p.arrivals) for w in range(3)]
    assert last["staleness_max"] == max(a.staleness for a in p.arrivals)
    assert last["staleness"] == pytest.approx(sum(a.staleness for a in p.arrivals) / len(p.arrivals))
    assert last["comm_rounds"] == len(p.arrivals)
    ends = [wp.times[-1] for wp in p.workers] + [server_end_s]
    assert last["modeled_time_s"] == pytest.approx(max(ends), rel=1e-9)

    again = records(run(tmp_path, over, world=4, name="again"))
    assert strip(again) == strip(full)

    w = max(range(3), key=lambda w: p.workers[w].steps)
    k = next(k for k, prog in enumerate(p.workers[w].progress, start=1) if prog > 8)
    assert p.workers[w].progress[k - 1] < TOTAL
    # which rank's error surfaces here races (peers fail as the dead rank's sockets close); the
    # launcher names the first one: tests/cli/test_async_local_sgd_cli.py
    with pytest.raises(ProcessException):
        run(tmp_path, [*over, f"inject_failure.step={k}", f"inject_failure.rank={w + 1}"], world=4, name="crash")
    crashed = [r["step"] for r in records(tmp_path / "crash") if "kind" not in r]
    assert 8 <= crashed[-1] < TOTAL
    resumed = records(run(tmp_path, over, world=4, name="crash", resume=True))
    assert strip(resumed) == strip(full)


def test_heterogeneous_workers_record_every_multiple_reproducibly_and_resume_exactly(tmp_path):
    """Server + 3 workers of speeds spread 6 (cluster.speeds=very), DyLU, delayed Nesterov, a record
    at every progress count: the server applies the planned arrivals (update counts, staleness, the
    cluster clock's end time), every record is made once, in order, two runs are identical, and a
    worker crashing after the checkpoint at 8 stops the job; resuming ends with the
    same records as an uninterrupted run."""
    over = ["algo=async_local_sgd", "algo.local_steps=4", "algo.dylu=true", "algo.outer_optimizer=delayed_nesterov",
            "algo.dn_buffer=3", "algo.outer_lr=0.5", "cluster.compute=profile", "cluster.speeds=very",
            "cluster.step_time_s=0.01", "epochs=3", f"max_steps={TOTAL}", "eval_unit=step", "eval_every=4",
            "log_every=1", "checkpoint_every=8"]
    p, cost = four_process_plan()
    assert len({wp.steps for wp in p.workers}) > 1  # the workers take different numbers of local steps
    assert max(a.staleness for a in p.arrivals) > 0
    # the processes' cluster clocks follow the plan: the server sends its last model at end_s,
    # workers stop at their last boundary
    follows_plan_repeats_and_resumes(tmp_path, over, p, server_end_s=p.end_s + cost)


def test_config_errors_through_the_run_validation():
    from trainer_runs import compose_cfg

    from lsgd.core.errors import ConfigError

    with pytest.raises(ConfigError, match="needs cluster.compute=profile"):
        compose_cfg(["algo=async_local_sgd", "cluster.compute=measured"])
    with pytest.raises(ConfigError, match="at least 2 processes"):
        compose_cfg(["algo=async_local_sgd", "launcher.nproc_per_node=1"])
    assert compose_cfg(["algo=async_local_sgd"])["optim"]["name"] == "adamw"  # the paper's inner optimizer


def test_dropped_stale_updates_and_the_workers_own_models_through_the_trainer(tmp_path):
    """Server + 2 workers of speeds 1 and 1/3, H = 2, max_staleness = 0: the server drops exactly
    the planned arrivals that are stale; eval records carry the workers' own-model metrics beside
    the server model's."""
    over = ["algo=async_local_sgd", "algo.local_steps=2", "algo.outer_optimizer=sgd", "algo.outer_lr=1.0",
            "algo.max_staleness=0", "cluster.compute=profile", "cluster.speeds=[1.0,1.0,0.3333333333333333]",
            "cluster.step_time_s=0.01", "max_steps=8", "eval_every=4", "eval_workers=true"]
    recs = [r for r in records(run(tmp_path, over, world=3)) if "kind" not in r]
    cost = 10e-6 + 4 * (CNN_PARAMS + CNN_FLOAT_BUFFERS) * 8 / 10e9
    p = plan([0.01, 0.03], [2, 2], [cost] * 2, [cost] * 2, 8, max_staleness=0)
    stale = sum(a.staleness > 0 for a in p.arrivals)
    assert 0 < stale < len(p.arrivals) and [a.dropped for a in p.arrivals] == [a.staleness > 0 for a in p.arrivals]
    assert recs[-1]["dropped"] == stale and recs[-1]["comm_rounds"] == len(p.arrivals)
    assert recs[-1]["server_updates"] == len(p.arrivals) - stale
    assert recs[-1]["staleness_max"] == max(a.staleness for a in p.arrivals)
    evals = [r for r in recs if "test_acc" in r]
    assert [r["step"] for r in evals] == [4, 8]
    assert all("test_acc_workers_min" in r and "test_acc_workers_mean" in r for r in evals)


def test_fedbuff_resumes_with_its_buffer_exactly(tmp_path):
    """FedBuff through the trainer (server + 3 workers, speeds spread 6): the checkpoint at 8 falls
    while the buffer holds arrivals (K chosen so), and a run crashed after it resumes to the same
    records as an uninterrupted one."""
    p, _ = four_process_plan()
    applied = next(i + 1 for i, a in enumerate(p.arrivals) if a.progress >= 8)
    k = next(k for k in (2, 3, 4, 5) if applied % k)  # arrivals left in the buffer at the checkpoint
    over = ["algo=async_local_sgd", "algo.local_steps=4", "algo.dylu=true", "algo.outer_optimizer=sgd",
            "algo.outer_lr=1.0", f"algo.fedbuff={k}", "algo.staleness_exponent=0.5", "cluster.compute=profile",
            "cluster.speeds=very", "cluster.step_time_s=0.01", "epochs=3", f"max_steps={TOTAL}", "eval_unit=step",
            "eval_every=4", "log_every=1", "checkpoint_every=8"]
    full = records(run(tmp_path, over, world=4, name="full"))
    w = max(range(3), key=lambda w: p.workers[w].steps)
    step = next(s for s, prog in enumerate(p.workers[w].progress, start=1) if prog > 8)
    with pytest.raises(ProcessException):
        run(tmp_path, [*over, f"inject_failure.step={step}", f"inject_failure.rank={w + 1}"], world=4, name="crash")
    resumed = records(run(tmp_path, over, world=4, name="crash", resume=True))
    assert strip(resumed) == strip(full)
    # not the unbuffered run: the server stepped on means of K arrivals
    plain = records(run(tmp_path, [o for o in over if not o.startswith("algo.fedbuff")], world=4, name="plain"))
    assert [r.get("test_loss") for r in strip(plain)] != [r.get("test_loss") for r in strip(full)]


GRACE_SPEEDS = [1.0, 1.0, 0.95, 0.7]  # the server's first (unused)


def grace_plan(grace):
    """The plan of the grace-period runs below: workers of speeds 1, 0.95 and 0.7 at 0.01 s per
    step, H = 4, one CNN message each way on the default link."""
    step_s = [0.01 / s for s in GRACE_SPEEDS[1:]]
    cost = 10e-6 + 4 * (CNN_PARAMS + CNN_FLOAT_BUFFERS) * 8 / 10e9
    return plan(step_s, [4] * 3, [cost] * 3, [cost] * 3, TOTAL, grace)


def test_grace_period_groups_arrivals_reproducibly_and_resumes_exactly(tmp_path):
    """Server + 3 workers whose arrivals cluster, algo.grace_period_s=0.01: the server applies the
    planned groups (update counts, staleness with the members after the first stale by the others,
    the cluster clock's end time: the server's last send or the workers' last boundary), every
    record is made once, in order, two runs are identical, and a worker crashing after the
    checkpoint at 8 resumes to the same records as an uninterrupted run."""
    p = grace_plan(0.01)
    sizes = [a.group_end - a.group_start + 1 for i, a in enumerate(p.arrivals) if a.group_end == i]
    assert max(sizes) == 3 and 1 in sizes  # groups of three, and arrivals outside every window
    no_grace = grace_plan(0.0)
    assert [a.staleness for a in p.arrivals] != [a.staleness for a in no_grace.arrivals]
    over = ["algo=async_local_sgd", "algo.local_steps=4", "algo.grace_period_s=0.01",
            "algo.outer_optimizer=delayed_nesterov", "algo.dn_buffer=3", "algo.outer_lr=0.5",
            "cluster.compute=profile", f"cluster.speeds=[{','.join(map(str, GRACE_SPEEDS))}]",
            "cluster.step_time_s=0.01", "epochs=3", f"max_steps={TOTAL}", "eval_unit=step", "eval_every=4",
            "log_every=1", "checkpoint_every=8"]
    follows_plan_repeats_and_resumes(tmp_path, over, p, server_end_s=p.server_end_s)


def test_least_visited_shards_resume_exactly_and_change_the_run(tmp_path):
    """algo.shard_policy=least_visited through the trainer (server + 3 workers, speeds spread 6,
    DyLU): the plan moves workers between shards (each task the least-visited one, read on from
    where it stopped); a worker crashing after the checkpoint at 8 resumes to the records of an
    uninterrupted run (the batches and the per-shard schedule follow from the step alone), and
    the run is not the shard_policy=worker one."""
    speeds = resolve_speeds("very", 4, 0)
    step_s = [0.01 / speeds[r] for r in (1, 2, 3)]
    _, cost = four_process_plan()
    p = plan(step_s, dylu_steps(4, step_s, True), [cost] * 3, [cost] * 3, TOTAL, 0.0, "least_visited")
    assert any(shard != w for w, wp in enumerate(p.workers) for shard, _ in wp.data)
    over = ["algo=async_local_sgd", "algo.local_steps=4", "algo.dylu=true", "algo.shard_policy=least_visited",
            "algo.outer_optimizer=delayed_nesterov", "algo.dn_buffer=3", "algo.outer_lr=0.5",
            "cluster.compute=profile", "cluster.speeds=very", "cluster.step_time_s=0.01", "epochs=3",
            f"max_steps={TOTAL}", "eval_unit=step", "eval_every=4", "log_every=1", "checkpoint_every=8"]
    full = records(run(tmp_path, over, world=4, name="full"))
    recs = [r for r in full if "kind" not in r]
    assert [r["step"] for r in recs] == list(range(1, TOTAL + 1))
    assert recs[-1]["comm_rounds"] == len(p.arrivals)
    w = max(range(3), key=lambda w: p.workers[w].steps)
    k = next(k for k, prog in enumerate(p.workers[w].progress, start=1) if prog > 8)
    with pytest.raises(ProcessException):
        run(tmp_path, [*over, f"inject_failure.step={k}", f"inject_failure.rank={w + 1}"], world=4, name="crash")
    resumed = records(run(tmp_path, over, world=4, name="crash", resume=True))
    assert strip(resumed) == strip(full)
    plain = records(run(tmp_path, [o for o in over if "shard_policy" not in o], world=4, name="plain"))
    assert [r.get("test_loss") for r in strip(plain)] != [r.get("test_loss") for r in strip(full)]
