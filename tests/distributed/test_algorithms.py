"""Algorithms on real 2- and 4-rank gloo groups against single-process closed-form references.

Every run drives the hooks in the trainer's order (lsgd/training/trainer.py) with a learning-rate schedule
running: ``after_backward``, ``optimizer_step``, ``scheduler.step()``, ``after_step``. The
references apply the same schedule: local step ``t`` (0-based) uses ``lr * factor(t)``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gloo import run_gloo
from torch import nn

from lsgd.algorithms import build_algorithm
from lsgd.algorithms.base import RunContext
from lsgd.clock.network import NetworkModel, cost_terms
from lsgd.comm.communicator import Communicator
from lsgd.training.optim import build_optimizer, build_scheduler, lr_decay_steps, lr_factor_fn

IN, HID, OUT, B = 10, 16, 3, 8


def make_model(bn: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(IN, HID)] + ([nn.BatchNorm1d(HID)] if bn else []) + [nn.Tanh(), nn.Linear(HID, OUT)]
    return nn.Sequential(*layers)


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(B, IN, generator=g), torch.randint(0, OUT, (B,), generator=g)



def run_not_lockstep(algo, net, opt, sched, rank: int, total: int, clock=None, compute_s: float = 0.0, after=None) -> int:
    """The trainer's hook order for a method not in lockstep (lsgd/training/trainer.py, Trainer.work and
    train_step): before_step, forward, backward, ``clock`` (where given) charged ``compute_s`` modeled
    seconds, after_backward, optimizer step, the schedule at the algorithm's position,
    after_step, until the algorithm's progress reaches ``total``; ``after(step)`` after each step.
    Returns the local steps taken."""
    assert not algo.lockstep
    step = 0
    while algo.progress(step) < total:
        algo.before_step(step)
        x, y = batch(rank, step)
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        if clock is not None:
            clock.compute(compute_s)
        algo.after_backward(step)
        algo.optimizer_step()
        sched.last_epoch = algo.schedule_position(step + 1) - 1
        sched.step()
        step += 1
        algo.after_step(step)
        if after is not None:
            after(step)
    return step

def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


#: steps per "epoch" of the schedules below (milestones and warm-up are in epochs)
SPE = 3
CONSTANT = {"name": "constant"}
#: decay x0.1 after 3 and 6 steps: on the sync steps of H = 3
STEP_AT_SYNC = {"name": "step", "milestones": [1, 2], "gamma": 0.1}
#: linear warm-up over 3 steps from 0.1, then cosine to 0 at the last step
WARMUP_COSINE = {"name": "cosine", "warmup_epochs": 1, "warmup_start_factor": 0.1, "min_factor": 0.0}


def make_optimizer(model, optim_cfg, groups):
    """The run's optimizer; ``groups``: per-group learning-rate multipliers over the model's
    parameter tensors split in two halves (None: one group)."""
    if groups is None:
        return build_optimizer(model.parameters(), optim_cfg)
    params = list(model.parameters())
    half = len(params) // 2
    opt = build_optimizer([{"params": params[:half]}, {"params": params[half:]}], optim_cfg)
    for g, mult in zip(opt.param_groups, groups):
        g["lr"] = optim_cfg["lr"] * mult
    return opt


def setup_algorithm(algo_cfg, model, opt, rank, world, steps, batch_size=B, **ctx_fields):
    """Rank ``rank`` of ``world``'s communicator (10 Gbit/s, 10 us), the algorithm of ``algo_cfg``
    on it and the model it wraps (``algo.setup``) under a RunContext of ``steps`` steps, SPE steps
    per epoch and the learning rate of ``opt``'s first group (``ctx_fields``: its other fields).
    Returns (comm, algo, net)."""
    comm = Communicator(NetworkModel(bandwidth_gbps=10, latency_us=10))
    algo = build_algorithm(algo_cfg, comm)
    ctx = RunContext(rank=rank, world_size=world, num_workers=world, worker_index=rank, steps_per_epoch=SPE,
                     total_steps=steps, batch_size=batch_size, lr=lambda: opt.param_groups[0]["lr"], **ctx_fields)
    return comm, algo, algo.setup(model, opt, ctx)


def step_to_schedule(algo, net, opt, sched, x, y, step: int) -> None:
    """Step ``step`` on (x, y) in the trainer's order (lsgd/training/trainer.py, Trainer.train_step)
    up to the schedule: forward, backward, after_backward, optimizer step, schedule step (after_step
    is the caller's)."""
    loss = F.cross_entropy(net(x), y)
    opt.zero_grad()
    loss.backward()
    algo.after_backward(step)
    algo.optimizer_step()
    sched.step()


def _worker(rank, world, out, algo_cfg, optim_cfg, steps, bn, schedule, groups):
    model = make_model(bn)
    opt = make_optimizer(model, optim_cfg, groups)
    sched = build_scheduler(opt, schedule, SPE, steps)
    comm, algo, net = setup_algorithm(algo_cfg, model, opt, rank, world, steps,
                                      lr_decay_steps=lr_decay_steps(schedule, SPE))
    pre_sync = []
    for step in range(steps):  # the trainer's order (lsgd/training/trainer.py, Trainer.train_step)
        step_to_schedule(algo, net, opt, sched, *batch(rank, step), step)
        pre_sync.append([t.detach().clone() for t in list(model.parameters()) + list(model.buffers())])
        algo.after_step(step + 1)
    torch.save(
        {
            "params": [p.detach().clone() for p in model.parameters()],
            "buffers": [b.clone() for b in model.buffers()],
            "pre_sync": pre_sync,
            "stats": comm.stats.as_dict(),
            "algo_state": algo.state_dict(),
            "rows": algo.pop_step_rows(),
        },
        out / f"rank{rank}.pt",
    )


def train(tmp_path, name, world, algo_cfg, optim_cfg, steps, bn=False, schedule=CONSTANT, groups=None):
    out = tmp_path / name
    out.mkdir()
    run_gloo(_worker, world, out, algo_cfg, optim_cfg, steps, bn, schedule, groups)
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


def lr_at(optim_cfg, schedule, steps):
    """Learning rate of 0-based local step ``t`` under ``schedule`` (what the scheduler sets)."""
    factor = lr_factor_fn(schedule, SPE, steps)
    return lambda t: optim_cfg["lr"] * factor(t)


SGD_M = {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": False, "weight_decay": 0.0}


def assert_close_lists(a, b, atol=1e-6):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=atol, rtol=0)


def reference_minibatch(world, steps, optim_cfg, schedule=CONSTANT):
    """Single process: SGD on the mean loss of all workers' batches (= one global batch)."""
    model = make_model()
    opt = build_optimizer(model.parameters(), optim_cfg)
    lr = lr_at(optim_cfg, schedule, steps)
    for step in range(steps):
        opt.param_groups[0]["lr"] = lr(step)
        loss = sum(F.cross_entropy(model(x), y) for x, y in (batch(r, step) for r in range(world))) / world
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("world", [2, 4])
def test_local_sgd_h1_equals_ddp_and_minibatch_reference(tmp_path, world):
    steps = 5
    ddp = train(tmp_path, "ddp", world, {"name": "ddp"}, SGD_M, steps, schedule=WARMUP_COSINE)
    local = train(tmp_path, "local", world,
                  {"name": "local_sgd", "local_steps": 1, "average_buffers": True, "buffer_policy": "average"}, SGD_M, steps,
                  schedule=WARMUP_COSINE)
    ref = reference_minibatch(world, steps, SGD_M, WARMUP_COSINE)
    for r in range(world):
        assert_close_lists(ddp[r]["params"], ref)
        assert_close_lists(local[r]["params"], ddp[r]["params"])
    # bytes: DDP all-reduces every gradient once per step; local SGD H=1 averages parameters and
    # momentum buffers (same size) once per step
    n = num_params(make_model()) * 4
    assert ddp[0]["stats"]["comm_bytes"] == steps * n
    assert ddp[0]["stats"]["comm_rounds"] == steps
    assert local[0]["stats"]["comm_bytes"] == steps * 2 * n
    assert local[0]["stats"]["wire_bytes"] == pytest.approx(steps * 2 * n * 2 * (world - 1) / world)


@pytest.mark.parametrize("world", [2, 4])
def test_post_local_sgd_warmup_equals_ddp(tmp_path, world):
    steps = 4
    ddp = train(tmp_path, "ddp", world, {"name": "ddp"}, SGD_M, steps)
    post = train(tmp_path, "post", world, {"name": "post_local_sgd", "warmup_steps": steps, "local_steps": 3,
                                            "average_buffers": True, "buffer_policy": "maintain"}, SGD_M, steps)
    for r in range(world):
        assert_close_lists(post[r]["params"], ddp[r]["params"])
    assert post[0]["stats"]["comm_rounds"] == steps


@pytest.mark.parametrize("world", [2, 4])
def test_local_sgd_averages_parameters_and_buffers(tmp_path, world):
    H, steps = 3, 6
    res = train(tmp_path, "local", world, {"name": "local_sgd", "local_steps": H, "average_buffers": True,
                                           "buffer_policy": "maintain"}, SGD_M, steps, bn=True)
    model = make_model(bn=True)
    n_float = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers() if b.is_floating_point())
    for sync_step in (H, 2 * H):
        pre = [res[r]["pre_sync"][sync_step - 1] for r in range(world)]
        mean = [torch.stack([pre[r][i] for r in range(world)]).float().mean(0) for i in range(len(pre[0]))
                if pre[0][i].is_floating_point()]
        # between syncs the replicas differ
        assert not torch.equal(pre[0][0], pre[1][0])
    final = res[0]["params"] + [b for b in res[0]["buffers"] if b.is_floating_point()]
    for got, want in zip(final, mean):
        torch.testing.assert_close(got.float(), want, atol=1e-6, rtol=0)
    for r in range(1, world):
        assert_close_lists(res[r]["params"], res[0]["params"], atol=0)
    rounds = steps // H
    nbytes = n_float * 4  # integer buffers (num_batches_tracked) are equal everywhere: not sent
    assert res[0]["stats"]["comm_rounds"] == rounds
    assert res[0]["stats"]["comm_bytes"] == rounds * nbytes
    assert res[0]["stats"]["wire_bytes"] == pytest.approx(rounds * nbytes * 2 * (world - 1) / world)
    # alpha-beta model: one coalesced all-reduce per round
    a, b = cost_terms("all_reduce", nbytes, world)
    assert res[0]["stats"]["model_alpha_terms"] == pytest.approx(rounds * a)
    assert res[0]["stats"]["model_beta_bytes"] == pytest.approx(rounds * b)


def test_slowmo_alpha1_beta0_equals_local_sgd(tmp_path):
    world, H, steps = 2, 3, 6
    base = {"local_steps": H, "average_buffers": True, "buffer_policy": "reset"}
    local = train(tmp_path, "local", world, {"name": "local_sgd", **base}, SGD_M, steps)
    slow = train(tmp_path, "slow", world, {"name": "slowmo", "slow_lr": 1.0, "slow_momentum": 0.0, **base}, SGD_M, steps)
    for r in range(world):
        assert_close_lists(slow[r]["params"], local[r]["params"])


def reference_outer(world, H, rounds, optim_cfg, outer, schedule=CONSTANT, groups=None, reset=False):
    """Single process simulation of `world` workers: H local steps each, average, outer step.

    Local step t uses ``lr * factor(t) * multiplier of the tensor's group`` (set by hand, not by a
    scheduler). outer(x_prev, x_avg, gammas, state) -> new x (list of tensors), written out by
    hand; ``gammas[i]``: the learning rate tensor i used in the round's steps (its last step).
    """
    steps = H * rounds
    lr = lr_at(optim_cfg, schedule, steps)
    workers = [make_model() for _ in range(world)]
    x_prev = [p.detach().clone() for p in workers[0].parameters()]
    opts = [make_optimizer(w, optim_cfg, groups) for w in workers]
    mults = groups or [1.0]
    tensor_mult = [m for g, m in zip(opts[0].param_groups, mults) for _ in g["params"]]
    state: dict = {}
    step = 0
    for _ in range(rounds):
        for _ in range(H):
            for r, (w, o) in enumerate(zip(workers, opts)):
                for g, m in zip(o.param_groups, mults):
                    g["lr"] = lr(step) * m
                x, y = batch(r, step)
                loss = F.cross_entropy(w(x), y)
                o.zero_grad()
                loss.backward()
                o.step()
            step += 1
        gammas = [lr(step - 1) * m for m in tensor_mult]
        x_avg = [torch.stack(ps).mean(0) for ps in zip(*[[p.detach() for p in w.parameters()] for w in workers])]
        x_new = outer(x_prev, x_avg, gammas, state)
        for w in workers:
            with torch.no_grad():
                for p, v in zip(w.parameters(), x_new):
                    p.copy_(v)
        if reset:
            for o in opts:
                o.state.clear()
        x_prev = [v.clone() for v in x_new]
    return x_prev


@pytest.mark.parametrize(("world", "schedule", "groups"), [
    (2, CONSTANT, None),
    (4, CONSTANT, None),
    (2, STEP_AT_SYNC, None),       # decays on sync steps 3 and 6
    (2, WARMUP_COSINE, None),
    (2, STEP_AT_SYNC, (0.5, 1.0)),  # two param groups with their own learning rates
], ids=["constant-w2", "constant-w4", "step_at_sync", "warmup_cosine", "step_at_sync-2groups"])
def test_slowmo_rounds_equal_hand_computed_update(tmp_path, world, schedule, groups):
    H, rounds, alpha, beta = 3, 3, 0.8, 0.5

    def slowmo(x_prev, x_avg, gammas, state):
        # SlowMo Algorithm 1: gamma is the base learning rate the round's steps used
        u = state.setdefault("u", [torch.zeros_like(t) for t in x_prev])
        for i in range(len(u)):
            u[i] = beta * u[i] + (x_prev[i] - x_avg[i]) / gammas[i]
        return [xp - alpha * g * ui for xp, ui, g in zip(x_prev, u, gammas)]

    want = reference_outer(world, H, rounds, SGD_M, slowmo, schedule, groups, reset=True)
    got = train(tmp_path, "slow", world, {"name": "slowmo", "local_steps": H, "slow_lr": alpha, "slow_momentum": beta,
                                          "average_buffers": True, "buffer_policy": "reset"}, SGD_M, H * rounds,
                schedule=schedule, groups=groups)
    for r in range(world):
        assert_close_lists(got[r]["params"], want, atol=1e-5)
    assert got[0]["stats"]["comm_rounds"] == rounds
    assert got[0]["stats"]["comm_bytes"] == rounds * num_params(make_model()) * 4


def test_diloco_outer_step_is_nesterov_on_averaged_pseudo_gradient(tmp_path):
    world, H, rounds, lr, mu = 2, 4, 2, 0.7, 0.9
    adamw = {"name": "adamw", "lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}

    def nesterov(x_prev, x_avg, gammas, state):
        b = state.setdefault("b", [torch.zeros_like(t) for t in x_prev])
        out = []
        for i in range(len(b)):
            delta = x_prev[i] - x_avg[i]
            b[i] = mu * b[i] + delta
            out.append(x_prev[i] - lr * (delta + mu * b[i]))
        return out

    want = reference_outer(world, H, rounds, adamw, nesterov, WARMUP_COSINE)
    got = train(tmp_path, "diloco", world, {"name": "diloco", "local_steps": H, "outer_optimizer": "nesterov",
                                            "outer_lr": lr, "outer_momentum": mu, "average_buffers": True,
                                            "buffer_policy": "maintain"}, adamw, H * rounds, schedule=WARMUP_COSINE)
    for r in range(world):
        assert_close_lists(got[r]["params"], want, atol=1e-5)


def test_ddp_broadcasts_batchnorm_buffers_and_counts_every_bucket(tmp_path):
    world, steps = 2, 3
    res = train(tmp_path, "ddp_bn", world, {"name": "ddp", "bucket_cap_mb": 25}, SGD_M, steps, bn=True)
    model = make_model(bn=True)
    p_bytes = num_params(model) * 4
    b_bytes = sum(b.numel() * 4 for b in model.buffers() if b.is_floating_point())
    for r in range(1, world):
        assert_close_lists(res[r]["buffers"], res[0]["buffers"], atol=0)
        assert_close_lists(res[r]["params"], res[0]["params"], atol=0)
    s = res[0]["stats"]
    assert s["comm_bytes"] == steps * (p_bytes + b_bytes)
    # rank 0 is the broadcast root: on 2 ranks the binomial tree sends the buffers once (MPICH)
    assert s["wire_bytes"] == pytest.approx(steps * (p_bytes * 2 * (world - 1) / world + b_bytes))
    assert s["comm_rounds"] == steps


ACCORDION = {"name": "accordion", "compressor": "topk", "cf_low": 1 / 0.99, "cf_high": 10.0, "switch_period": 1,
             "eta": 100.0, "error_feedback": True, "bucket_cap_mb": 25}


@pytest.mark.parametrize(("schedule", "low_steps"), [
    # the first two periods (steps 1-6) are low: the first, and the one after it (no previous norm
    # to compare with); cosine has no milestones, so from then on the norm rule alone decides (eta
    # is too large to call anything critical): steps 7-12 are high
    (WARMUP_COSINE, set(range(1, 7))),
    # a milestone on the boundary after step 9: the whole next period (steps 10-12) is low
    ({"name": "step", "milestones": [3], "gamma": 0.1}, set(range(1, 7)) | {10, 11, 12}),
    # a milestone inside the third period (from step 9 on, 8 completed): low from the decay to the
    # period's end (step 9), then the norm rule again (high)
    ({"name": "step", "milestones": [8 / 3], "gamma": 0.1}, set(range(1, 7)) | {9}),
], ids=["warmup_cosine", "step_on_boundary", "step_inside_period"])
def test_accordion_forces_low_compression_at_milestones_only(tmp_path, schedule, low_steps):
    """Accordion (Agarwal et al. 2021): the first switch period and each learning-rate decay of a
    step schedule force low compression; switch period = 1 epoch = 3 steps."""
    steps = 12
    res = train(tmp_path, "acc", 2, ACCORDION, SGD_M, steps, schedule=schedule)
    rows = [r for r in res[0]["rows"] if r["kind"] == "compression"]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    got_low = {r["step"] for r in rows if r["low_fraction"] == 1.0}
    assert got_low == low_steps
    assert all(r["low_fraction"] in (0.0, 1.0) for r in rows)
    for r in range(1, 2):
        assert_close_lists(res[r]["params"], res[0]["params"], atol=0)
