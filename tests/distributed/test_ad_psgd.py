"""Asynchronous AD-PSGD (algo.pairing=virtual_time, algo=ad_psgd's default) on real 4-rank gloo groups:
the trainer's hook order against a single-process replay of the schedule, and the trainer itself
under heterogeneous speeds (step counts, modeled time, reproducibility, exact resume); on an
in-process cluster, the default against the lock-step variant (algo.pairing=lockstep) in modeled time.

The schedule (lsgd.algorithms.gossip.ad_psgd.virtual_plan) is tested on its own in
tests/unit/test_ad_psgd_schedule.py; here the replay applies its averagings and gradient steps to
n models in one process, with its own code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from gloo import run_gloo
from test_algorithms import SGD_M, SPE, WARMUP_COSINE, B, batch, make_model, run_not_lockstep
from trainer_runs import compose_cfg, records

from lsgd.algorithms import build_algorithm
from lsgd.algorithms.gossip.ad_psgd import virtual_plan
from lsgd.algorithms.base import RunContext
from lsgd.clock.network import NetworkModel
from lsgd.clock.worker_clock import Clock
from lsgd.comm.communicator import Communicator
from lsgd.training.failures import PEER_LOSS
from lsgd.training.optim import build_optimizer, build_scheduler, lr_factor_fn
from lsgd.comm.topology import Topology

SEED = 7
STEP_S = (0.01, 0.02, 0.01, 0.04)  # modeled seconds per local step (speeds 1, 1/2, 1, 1/4); 0, 2 active
TOTAL = 16
CFG = {"name": "ad_psgd", "topology": "ring", "weights": "uniform", "average_buffers": True,
       "pairing": "virtual_time", "seed": SEED}


def _worker(rank, world, out):
    """The trainer's hook order for a method not in lockstep (lsgd/training/trainer.py, Trainer.train_step),
    with the cluster clock charged each step's modeled compute."""
    model = make_model()
    opt = build_optimizer(model.parameters(), SGD_M)
    sched = build_scheduler(opt, WARMUP_COSINE, SPE, TOTAL)
    clock = Clock()
    comm = Communicator(NetworkModel(bandwidth_gbps=10, latency_us=10), clock=clock)
    algo = build_algorithm(CFG, comm)
    ctx = RunContext(rank=rank, world_size=world, num_workers=world, worker_index=rank, steps_per_epoch=SPE,
                     total_steps=TOTAL, batch_size=B, lr=lambda: opt.param_groups[0]["lr"], worker_step_s=STEP_S,
                     clock=clock)
    net = algo.setup(model, opt, ctx)
    times = []
    step = run_not_lockstep(algo, net, opt, sched, rank, TOTAL, clock, STEP_S[rank], after=lambda _: times.append(clock.time_s))
    torch.save({"params": [p.detach().clone() for p in model.parameters()], "steps": step, "times": times,
                "stats": comm.stats.as_dict()}, out / f"rank{rank}.pt")


class Replay:
    """n models in one process following the plan: worker i's local step k takes its gradient at its
    model when the step begins (learning rate at its progress so far), takes part in the step's
    averagings in virtual-time order (both ends get the float64 mean), then adds its optimizer step.
    Checks that every averaging keeps the network's sum of models."""

    def __init__(self, plans):
        self.plans, self.n = plans, len(plans)
        self.models = [make_model() for _ in range(self.n)]
        self.opts = [torch.optim.SGD(m.parameters(), lr=SGD_M["lr"], momentum=SGD_M["momentum"]) for m in self.models]
        self.factor = lr_factor_fn(WARMUP_COSINE, SPE, TOTAL)
        self.opened = [0] * self.n   # local steps begun
        self.current = [None] * self.n  # the open step's (model being averaged, optimizer step)
        self.initial_sum = sum(self.flat(i).double() for i in range(self.n))
        self.delta_sum = torch.zeros_like(self.initial_sum)
        self.bytes = [0] * self.n

    def flat(self, i):
        return torch.cat([p.data.reshape(-1) for p in self.models[i].parameters()])

    def write(self, i, flat):
        offset = 0
        with torch.no_grad():
            for p in self.models[i].parameters():
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    def close(self, i):
        if self.current[i] is not None:
            x, delta = self.current[i]
            self.write(i, x + delta)
            self.current[i] = None

    def open_through(self, i, k):
        """Begin worker i's local step k (closing the steps before it)."""
        while self.opened[i] < k:
            self.close(i)
            s = self.opened[i]  # 0-based step about to run
            progress = self.plans[i].progress[s - 1] if s else 0
            self.opts[i].param_groups[0]["lr"] = SGD_M["lr"] * self.factor(progress)
            x, y = batch(i, s)
            loss = F.cross_entropy(self.models[i](x), y)
            self.opts[i].zero_grad()
            loss.backward()
            before = self.flat(i).clone()
            self.opts[i].step()
            delta = self.flat(i) - before
            self.delta_sum += delta.double()
            self.write(i, before)
            self.current[i] = (before, delta)
            self.opened[i] += 1

    def run(self):
        step_of = {}  # (worker, x, peer) -> the worker's local step that holds this averaging
        for i, p in enumerate(self.plans):
            for k, exs in p.exchanges.items():
                for j, x in exs:
                    step_of[(i, x, j)] = k
        numel = self.flat(0).numel()
        for x, i, j in sorted({(x, min(i, j), max(i, j)) for i, x, j in step_of}):  # virtual-time order
            self.open_through(i, step_of[(i, x, j)])
            self.open_through(j, step_of[(j, x, i)])
            (xi, di), (xj, dj) = self.current[i], self.current[j]
            avg = ((xi.double() + xj.double()) / 2).float()
            torch.testing.assert_close(2 * avg.double(), xi.double() + xj.double(), atol=1e-6, rtol=0)  # sum kept
            self.current[i], self.current[j] = (avg, di), (avg, dj)
            self.bytes[i] += numel * 4
            self.bytes[j] += numel * 4
        for i in range(self.n):
            self.open_through(i, self.plans[i].steps)
            self.close(i)
        return self


def test_virtual_time_follows_its_schedule_against_a_single_process_replay(tmp_path):
    """Ring of 4 with speeds 1, 1/2, 1, 1/4, 16 average steps: every rank takes the plan's steps
    (the fast ones more), its clock is the plan's at every step (the active workers never wait for a
    passive one's compute), and the models and bytes equal a one-process replay of the plan; the
    network's sum of models moves only by the gradient steps (the averagings keep the mean)."""
    out = tmp_path / "run"
    out.mkdir()
    run_gloo(_worker, 4, out)
    got = [torch.load(out / f"rank{r}.pt") for r in range(4)]
    numel = sum(p.numel() for p in make_model().parameters())
    cost = 10e-6 + numel * 4 * 8 / 10e9
    plans = virtual_plan(Topology("ring", 4, "uniform", SEED), SEED, STEP_S, lambda a, p: cost, TOTAL)
    assert [g["steps"] for g in got] == [p.steps for p in plans]
    assert got[0]["steps"] >= 3 * got[3]["steps"]
    for g, p in zip(got, plans):
        assert g["times"] == pytest.approx(p.times, rel=1e-12, abs=1e-12)
    replay = Replay(plans).run()
    for r in range(4):
        for a, b in zip(got[r]["params"], replay.models[r].parameters()):
            torch.testing.assert_close(a, b.data, atol=1e-6, rtol=0)
        assert got[r]["stats"]["comm_bytes"] == replay.bytes[r]
    total = sum(torch.cat([p.reshape(-1) for p in g["params"]]).double() for g in got)
    torch.testing.assert_close(total, replay.initial_sum + replay.delta_sum, atol=1e-5, rtol=0)


# -- through the trainer ---------------------------------------------------------------------------
SPEEDS = [1.0, 1.0, 1.0, 0.25]
T, STEP_TIME = 16, 0.01
OVER = ["algo=ad_psgd", "algo.pairing=virtual_time", "cluster.compute=profile", "cluster.speeds=[1.0,1.0,1.0,0.25]",
        f"cluster.step_time_s={STEP_TIME}", f"max_steps={T}", "epochs=10", "log_every=1", "eval_unit=step", "eval_every=8",
        "checkpoint_every=8", "launcher.nproc_per_node=4"]
MEASURED = {"wall_time_s", "comm_time_s", "compute_time_s", "compute_time_s_max", "samples_per_s"}


def _train(rank, world, cfg, run_dir):
    from lsgd.training.trainer import Trainer

    trainer = Trainer(cfg, Path(run_dir), "cpu")
    trainer.fit()
    torch.save({"params": [p.detach().clone() for p in trainer.model.parameters()], "steps": trainer.step,
                "clock": trainer.clock.time_s}, Path(run_dir) / f"rank{rank}.pt")


def trainer_run(tmp_path, name, extra=(), resume=False):
    from trainer_runs import TINY

    cfg = compose_cfg([*TINY, f"results_dir={tmp_path}", *OVER, *extra])
    cfg["run_id"], cfg["resume"] = name, resume
    run_dir = tmp_path / name
    run_dir.mkdir(exist_ok=resume)
    run_gloo(_train, 4, cfg, str(run_dir))
    return run_dir


def test_the_trainer_runs_fast_workers_ahead_reproducibly_and_resumes_exactly(tmp_path):
    """Speeds 1, 1, 1, 1/4, 10 ms steps, 16 average steps, a record at every step, an evaluation
    and a checkpoint at 8, an evaluation at 16: the fast workers take about 4x the slow one's steps;
    the run's modeled time is about 4 x 16 x 10 ms / 3.25 (the total speed), within one slow step
    (and the exchanges), not the lock-step pace 16 x 40 ms; every record is made once, in order; a
    run whose fast worker fails after the checkpoint, resumed, ends with the same records and
    bit-identical models (and step counts) as the uninterrupted run (its records up to the
    checkpoint come from its first, from-scratch execution: two runs agree bit for bit)."""
    full = trainer_run(tmp_path, "full")
    got = [torch.load(full / f"rank{r}.pt") for r in range(4)]
    steps = [g["steps"] for g in got]
    assert all(3.0 <= s / steps[3] <= 5.0 for s in steps[:3]), steps
    rates = [g["steps"] / g["clock"] for g in got]  # steps per modeled second: 4x, less the exchanges' share
    assert all(3.6 <= r / rates[3] <= 4.0 for r in rates[:3]), rates
    recs = [r for r in records(full) if "kind" not in r]
    assert [r["step"] for r in recs] == list(range(1, T + 1))
    assert [r["step"] for r in recs if "test_acc" in r] == [8, 16]
    ideal = 4 * T * STEP_TIME / sum(SPEEDS)
    modeled = recs[-1]["modeled_time_s"]
    assert modeled == max(g["clock"] for g in got)
    assert ideal <= modeled <= ideal + STEP_TIME / 0.25 + 0.1 * ideal
    assert modeled < 0.5 * T * STEP_TIME / 0.25
    # the spawner reports whichever rank exits first: rank 0's own error or a peer's lost connection
    with pytest.raises(Exception, match=f"inject_failure|{PEER_LOSS.pattern}"):
        trainer_run(tmp_path, "crash", ["inject_failure.step=15", "inject_failure.rank=0"])
    crashed = [r["step"] for r in records(tmp_path / "crash") if "kind" not in r]
    assert 8 <= crashed[-1] < T
    resumed = trainer_run(tmp_path, "crash", resume=True)

    def strip(rs):
        return [{k: v for k, v in r.items() if k not in MEASURED} for r in rs]

    assert strip(records(resumed)) == strip(records(full))
    for r in range(4):
        again = torch.load(resumed / f"rank{r}.pt")
        assert again["steps"] == steps[r]
        for a, b in zip(again["params"], got[r]["params"]):
            assert torch.equal(a, b)


# -- algo=ad_psgd is the asynchronous algorithm; the lock-step variant by name (issue 41) ------------
T_AB = 8
AB = ["debug=default", "dataset.num_train=512", "dataset.num_test=64", "schedule=cosine", "algo=ad_psgd",
      "cluster.speeds=[1.0,1.0,1.0,0.25]", f"cluster.step_time_s={STEP_TIME}", f"max_steps={T_AB}", "epochs=10",
      "log_every=1", "eval_every=1000", "checkpoint_every=0", "launcher.nproc_per_node=4"]


def _fit(rank, world, cfg, run_dir):
    """One worker of an in-process cluster: its step count, cluster clock, bytes sent and the
    modeled cost of one averaging with the slow worker (rank 3)."""
    import copy

    from lsgd.training.trainer import Trainer

    trainer = Trainer(copy.deepcopy(cfg), Path(run_dir), "cpu")
    trainer.fit()
    nbytes = sum(t.numel() * t.element_size() for t in trainer.algorithm.mixed_tensors())
    return {"steps": trainer.step, "clock": trainer.clock.time_s, "bytes": trainer.comm.stats.as_dict()["comm_bytes"],
            "model_bytes": nbytes, "cost_s": float(trainer.comm.pair_cost(rank, 3, nbytes)[0]) if rank != 3 else None}


def in_process_run(tmp_path, name, extra=()):
    """``algo=ad_psgd`` (+ ``extra``) on the 4 workers of an in-process cluster (one torch thread):
    (the run's records, each worker's :func:`_fit`, the composed config)."""
    from lsgd.comm.inprocess.cluster import run

    cfg = compose_cfg([*AB, f"results_dir={tmp_path}", *extra])
    cfg["run_id"] = name
    run_dir = tmp_path / name
    run_dir.mkdir()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = run(4, _fit, cfg, str(run_dir))
    finally:
        torch.set_num_threads(threads)
    return [r for r in records(run_dir) if "kind" not in r], got, cfg


def test_algo_ad_psgd_is_asynchronous_and_the_lockstep_variant_waits_for_the_straggler(tmp_path):
    """A ring of 4 at speeds 1, 1, 1, 1/4, 10 ms a step at speed 1, 8 average steps. ``algo=ad_psgd``
    runs the paper's asynchronous algorithm: the fast workers never wait, so the run takes the
    network's step budget at the network's total speed, 4 x 8 x 10 ms / 3.25 = 98.5 ms, plus at most
    the slow worker's last step (40 ms) and an averaging; ``algo.pairing=lockstep`` (the user's
    explicit choice, still honoured) runs every step of every worker with the others', so the slow
    worker (passive, never waiting: its partners are always ready first) sets the pace: exactly its
    8 steps of 40 ms plus the averagings it took part in, 320 ms + m x c."""
    recs_a, got_a, cfg_a = in_process_run(tmp_path, "async")
    recs_l, got_l, cfg_l = in_process_run(tmp_path, "lockstep", ["algo.pairing=lockstep"])
    assert cfg_a["algo"]["pairing"] == "virtual_time" and cfg_l["algo"]["pairing"] == "lockstep"
    slow_s = STEP_TIME / 0.25
    c = got_a[0]["cost_s"]
    assert c == got_l[0]["cost_s"] == got_l[2]["cost_s"] and 0 < c < 0.1 * STEP_TIME
    # asynchronous: the fast workers take about 4x the slow one's steps; the time follows the budget
    async_s = recs_a[-1]["modeled_time_s"]
    ideal = 4 * T_AB * STEP_TIME / sum(SPEEDS)
    assert async_s == max(g["clock"] for g in got_a)
    assert ideal <= async_s <= ideal + slow_s + c
    plans = virtual_plan(Topology("ring", 4, "uniform", 0), 0, [STEP_TIME / s for s in SPEEDS], lambda a, p: c, T_AB)
    assert async_s == pytest.approx(max(p.times[-1] for p in plans), rel=1e-12)  # its schedule's last step
    assert [g["steps"] for g in got_a] == [p.steps for p in plans]
    assert all(g["steps"] >= 3 * got_a[3]["steps"] for g in got_a[:3]), [g["steps"] for g in got_a]
    # lock-step: every worker T steps; the slow worker's clock = its compute + its averagings, exactly
    lock_s = recs_l[-1]["modeled_time_s"]
    assert [g["steps"] for g in got_l] == [T_AB] * 4
    averagings = got_l[3]["bytes"] // got_l[3]["model_bytes"]
    assert 1 <= averagings <= 2 * T_AB
    assert lock_s == max(g["clock"] for g in got_l) == got_l[3]["clock"]
    assert lock_s == pytest.approx(T_AB * slow_s + averagings * c, rel=1e-12)
    # so the asynchronous default saves at least the lock-step time less the budget and one slow
    # step: here 0.120 s against 0.325 s (7 averagings of 0.70 ms)
    assert lock_s - async_s >= T_AB * slow_s - ideal - slow_s - c
