"""``adsaga`` (server + workers) through the real trainer on gloo ranks, against a single-process
reference written independently (per-sample gradients by autograd, a table of full gradients, the
server's arrival order and staleness replayed from the delay plan): ADSAGA with 3 workers and
exponential delays, asynchronous SGD, synchronous SAGA with 2 workers; a run is reproducible and its
cluster clocks follow the planned delays; suboptimality falls; a run resumes exactly after a worker
fails; with one worker the asynchronous protocol is plain (synchronous) SAGA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.multiprocessing.spawn import ProcessException
from trainer_runs import TINY, compose_cfg, records, run, train

from lsgd.algorithms.asynchronous import plan as async_plan
from lsgd.algorithms.asynchronous.adsaga import DelayModel, features, partitions
from lsgd.data import build_datasets
from lsgd.data.partition import generator

MEASURED = {"wall_time_s", "comm_time_s", "compute_time_s", "compute_time_s_max", "samples_per_s"}
STEP_S, LR, L2, N_SAMPLES, BATCH, TOTAL = 0.01, 3e-4, 0.05, 96, 4, 8
PARAMS = 7850  # logreg on 1x28x28 inputs, 10 classes
COST = 10e-6 + 4 * PARAMS * 8 / 10e9  # one message of the parameters on the default 10 Gbps, 10 us link
COMMON = ["model=logreg", "algo=adsaga", f"algo.num_samples={N_SAMPLES}", f"batch_size={BATCH}", f"max_steps={TOTAL}",
          "schedule=constant", f"optim.lr={LR}", "optim.momentum=0", f"algo.l2={L2}", "cluster.compute=profile",
          f"cluster.step_time_s={STEP_S}", "log_every=1", "eval_every=1000", "eval_unit=step"]


def strip(recs):
    return [{k: v for k, v in r.items() if k not in MEASURED} for r in recs]


def grad_i(x: torch.Tensor, a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """grad of sample (a, y)'s cross-entropy at the flat x = (W (10, 784), c (10,)), by autograd."""
    x = x.clone().requires_grad_(True)
    F.cross_entropy(a[None] @ x[:7840].view(10, 784).T + x[7840:], y[None]).backward()
    return x.grad


def reference(m: int, mode: str, vr: bool = True, delay: str = "exponential") -> torch.Tensor:
    """The final x of ADSAGA / async SGD / sync SAGA in one process (module docstring of adsaga),
    on the same data and samples the run draws (seeded by (seed, worker, task))."""
    cfg = compose_cfg([*TINY, *COMMON])
    train_set, _ = build_datasets(cfg["dataset"], cfg["seed"])
    parts = partitions(len(train_set), N_SAMPLES, m, cfg["seed"])
    n = parts.numel()
    data = [features(train_set, parts[w]) for w in range(m)]
    tables = [torch.zeros(parts.shape[1], PARAMS) for _ in range(m)]
    mean = torch.zeros(PARAMS)  # (1/n) sum_i alpha_i

    def saga(w: int, task: int, x_at: torch.Tensor) -> torch.Tensor:
        nonlocal mean
        j = torch.randperm(parts.shape[1], generator=generator("adsaga-sample", cfg["seed"], w, task))[:BATCH]
        grads = torch.stack([grad_i(x_at, data[w][0][i], data[w][1][i]) for i in j])
        if not vr:
            return grads.mean(0)
        d = (grads - tables[w][j]).mean(0)
        change = (grads - tables[w][j]).sum(0) / n
        tables[w][j] = grads
        return d, change

    x = torch.zeros(PARAMS)
    if mode == "sync":
        for t in range(TOTAL):
            outs = [saga(w, t, x) for w in range(m)]
            g = sum(o[0] for o in outs) / m + mean + L2 * x
            x = x - LR * g
            mean = mean + sum(o[1] for o in outs)
        return x
    plan = async_plan.plan([STEP_S] * m, [1] * m, [COST] * m, [COST] * m, TOTAL,
                           task_s=DelayModel(delay, [STEP_S] * m, cfg["seed"]))
    history = [x]
    for i, arrival in enumerate(plan.arrivals):
        stale = history[i - arrival.staleness]  # the model the worker pulled
        x = history[-1]
        if vr:
            d, change = saga(arrival.worker, arrival.task, stale)
            x = x - LR * (d + mean + L2 * x)
            mean = mean + change
        else:
            x = x - LR * (saga(arrival.worker, arrival.task, stale) + L2 * x)
        history.append(x)
    return x


def server_x(models) -> torch.Tensor:
    return torch.cat([p.reshape(-1) for p in models[0]["params"]])


def test_adsaga_three_workers_equals_the_replayed_reference_and_is_reproducible(tmp_path):
    """Server + 3 workers, exponential delays: the server's final model equals the single-process
    replay of the same arrival order and staleness within 1e-6; the run's records (suboptimality,
    iterations, staleness, bytes, modeled time) are identical in a second run; suboptimality falls at
    every record; the recorded staleness is the plan's."""
    recs, models = train(tmp_path, COMMON, world=4, name="a")
    recs2, models2 = train(tmp_path, COMMON, world=4, name="b")
    assert strip(recs) == strip(recs2)
    assert torch.equal(server_x(models), server_x(models2))
    torch.testing.assert_close(server_x(models), reference(3, "async"), rtol=0, atol=1e-6)
    assert [r["step"] for r in recs] == list(range(1, TOTAL + 1))
    assert recs[-1]["iterations"] == 3 * TOTAL and recs[-1]["gradients"] == 3 * TOTAL * BATCH
    gaps = [r["suboptimality"] for r in recs]
    assert all(g > 0 for g in gaps) and all(b < a for a, b in zip(gaps, gaps[1:])) and gaps[-1] < 0.85 * gaps[0]
    plan = async_plan.plan([STEP_S] * 3, [1] * 3, [COST] * 3, [COST] * 3, TOTAL,
                           task_s=DelayModel("exponential", [STEP_S] * 3, 0))
    assert recs[-1]["staleness"] == pytest.approx(sum(a.staleness for a in plan.arrivals) / len(plan.arrivals))
    assert recs[-1]["staleness_max"] > 0
    # the processes' cluster clocks follow the plan (the drawn delays, not the profile's step time):
    # the server sends its last model at end_s + COST, workers stop at their last boundary
    ends = [wp.times[-1] for wp in plan.workers] + [plan.end_s + COST]
    assert recs[-1]["modeled_time_s"] == pytest.approx(max(ends), rel=1e-9)
    # per gradient the worker sends and receives one copy of the parameters (comm_bytes is the
    # mean over ranks; the server's share is the same bytes in the other direction)
    assert recs[-1]["comm_bytes"] * 4 == pytest.approx(2 * 3 * TOTAL * PARAMS * 4)


@pytest.mark.parametrize(("m", "overrides", "mode", "vr"), [
    (2, ["algo.mode=sync"], "sync", True),
    (2, ["algo.variance_reduction=false", "algo.delay=constant"], "async", False),
])
def test_sync_saga_and_async_sgd_equal_the_reference(tmp_path, m, overrides, mode, vr):
    """Synchronous SAGA (2 workers, one server iteration on both) and asynchronous SGD (2 workers,
    constant delays) equal their single-process references within 1e-6; a synchronous run's
    modeled time is the sum over iterations of the slowest worker's delay, plus messages."""
    recs, models = train(tmp_path, [*COMMON, *overrides], world=m + 1)
    delay = "constant" if "algo.delay=constant" in overrides else "exponential"
    torch.testing.assert_close(server_x(models), reference(m, mode, vr, delay), rtol=0, atol=1e-6)
    assert recs[-1]["iterations"] == (TOTAL if mode == "sync" else m * TOTAL)
    assert recs[-1]["suboptimality"] < recs[0]["suboptimality"]
    if mode == "sync":  # an iteration lasts the slowest worker's Exp draw, plus the two messages
        draws = DelayModel("exponential", [STEP_S] * m, 0)
        slowest = sum(max(draws(w, t) for w in range(m)) for t in range(TOTAL))
        assert slowest < recs[-1]["modeled_time_s"] <= slowest + TOTAL * 2 * m * COST + 1e-9


def test_one_worker_adsaga_is_plain_saga(tmp_path):
    """Server + 1 worker: whatever the delays, nothing is stale, so ADSAGA (exponential delays) is
    the same computation as synchronous SAGA with one worker, bit for bit, and both equal plain
    single-process SAGA (the reference with m = 1)."""
    _, async_models = train(tmp_path, COMMON, world=2, name="async")
    _, sync_models = train(tmp_path, [*COMMON, "algo.mode=sync"], world=2, name="sync")
    assert torch.equal(server_x(async_models), server_x(sync_models))
    torch.testing.assert_close(server_x(async_models), reference(1, "sync"), rtol=0, atol=1e-6)


def test_adsaga_resumes_exactly_after_a_worker_fails(tmp_path):
    """Server + 3 workers, a checkpoint at progress 4: a worker failing after it stops the job, and
    resuming from the checkpoint (server: alpha_bar; workers: SAGA table and the computed, not yet
    pushed difference) ends with the records and server model of an uninterrupted run."""
    over = [*COMMON, "checkpoint_every=4"]
    full, full_models = train(tmp_path, over, world=4, name="full")
    plan = async_plan.plan([STEP_S] * 3, [1] * 3, [COST] * 3, [COST] * 3, TOTAL,
                           task_s=DelayModel("exponential", [STEP_S] * 3, 0))
    w = max(range(3), key=lambda w: plan.workers[w].steps)
    k = next(k for k, prog in enumerate(plan.workers[w].progress, start=1) if prog > 4)
    assert plan.workers[w].progress[k - 1] < TOTAL
    with pytest.raises(ProcessException):
        run(tmp_path, [*over, f"inject_failure.step={k}", f"inject_failure.rank={w + 1}"], world=4, name="crash")
    before = [r for r in records(tmp_path / "crash") if "kind" not in r]
    assert 4 <= before[-1]["step"] < TOTAL
    run_dir = run(tmp_path, over, world=4, name="crash", resume=True)
    # a resume, not a fresh (deterministic) restart: the records up to the checkpoint are the
    # crashed run's own (their measured wall times), the later ones were made again
    kept = [r for r in records(run_dir) if "kind" not in r and r["step"] <= 4]
    assert [r["wall_time_s"] for r in kept] == [r["wall_time_s"] for r in before if r["step"] <= 4]
    resumed = [r for r in records(run_dir) if "kind" not in r]
    assert strip(resumed) == strip(full)
    assert torch.equal(server_x([torch.load(run_dir / "rank0.pt")]), server_x(full_models))
