"""SwarmSGD on real 4-rank gloo groups, in the trainer's hook order with a schedule running,
against a single-process simulation of the n nodes (the paper's rules, docs/papers.md#swarmsgd).

The reference draws the same matchings (``round_partners``, which tests/unit/test_swarm_schedule.py
checks on their own) and uses the lattice quantizer as a component
(tests/unit/test_lattice.py); the pairing, averaging, re-add, resend and byte counts are its own."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from gloo import run_gloo
from test_algorithms import (
    SGD_M,
    SPE,
    WARMUP_COSINE,
    B,
    batch,
    lr_at,
    make_model,
    run_not_lockstep,
    train,
)
from trainer_runs import records, run

from lsgd.algorithms import build_algorithm
from lsgd.algorithms.base import RunContext
from lsgd.algorithms.gossip.swarm_sgd import round_length, round_partners
from lsgd.algorithms.gossip.virtual_pairing import LEFT_OUT, plan
from lsgd.compute.workers import resolve_speeds
from lsgd.clock.network import NetworkModel
from lsgd.comm.communicator import Communicator
from lsgd.training.failures import PEER_LOSS
from lsgd.compression.lattice import LatticeQuantizer
from lsgd.training.optim import build_optimizer, build_scheduler, lr_factor_fn
from lsgd.core.seeding import derive_seed
from lsgd.comm.topology import Topology

SEED = 7


def swarm_cfg(**kw):
    cfg = {"name": "swarm_sgd", "topology": "complete", "weights": "uniform", "local_steps": 2,
           "local_steps_dist": "fixed", "blocking": True, "quantizer": "none", "bits": 8, "side": 1e-4,
           "average_buffers": True, "seed": SEED}
    cfg.update(kw)
    return cfg


class Reference:
    """n nodes in one process: local SGD steps, then the round's pairs average (module docstring)."""

    def __init__(self, n, cfg, steps, schedule):
        self.n, self.cfg, self.steps = n, cfg, steps
        self.models = [make_model() for _ in range(n)]
        self.opts = [torch.optim.SGD(m.parameters(), lr=SGD_M["lr"], momentum=SGD_M["momentum"]) for m in self.models]
        self.lr = lr_at(SGD_M, schedule, steps)
        self.topo = Topology(cfg["topology"], n, cfg["weights"], SEED)
        self.quant = LatticeQuantizer(cfg["bits"], cfg["side"]) if cfg["quantizer"] == "lattice" else None
        self.bytes = [0] * n
        self.resent = [0] * n
        self.pending = {}  # node -> (round, snapshot)

    def params(self, i):
        return [p.data for p in self.models[i].parameters()]

    def run(self):
        H = self.cfg["local_steps"]
        for step in range(self.steps):
            for i in range(self.n):
                x, y = batch(i, step)
                self.opts[i].param_groups[0]["lr"] = self.lr(step)
                loss = F.cross_entropy(self.models[i](x), y)
                self.opts[i].zero_grad()
                loss.backward()
                self.opts[i].step()
            if (step + 1) % H == 0:
                self.end_round((step + 1) // H - 1)
            if step + 1 == self.steps:
                self.finish()
        return self

    def end_round(self, r):
        self.finish()
        partners = round_partners(self.topo, SEED, r)
        for i, j in partners.items():
            if i < j:
                snaps = {k: [t.clone() for t in self.params(k)] for k in (i, j)}
                if self.cfg["blocking"]:
                    self.average(i, j, snaps, r)
                else:
                    self.pending[(i, j)] = (r, snaps)

    def finish(self):
        for (i, j), (r, snaps) in sorted(self.pending.items()):
            self.average(i, j, snaps, r)
        self.pending = {}

    def average(self, i, j, snaps, r):
        """(Q(s_i) + Q(s_j)) / 2 (+ x_now - s_i when non-blocking) on both ends; ``r``: the round
        (or ``{node: its round}``) that seeds each end's lattice rounding."""
        q = self.quant
        avg = {}
        if q is None:
            for k in (i, j):
                self.bytes[k] += sum(t.numel() * 4 for t in snaps[k])
            pair = [(a.double() + b.double()) / 2 for a, b in zip(snaps[i], snaps[j])]
            avg = {i: pair, j: pair}
        else:
            points, ok = {}, {}
            for k, other in ((i, j), (j, i)):
                g = torch.Generator().manual_seed(derive_seed("swarm_lattice", SEED, k, r[k] if isinstance(r, dict) else r))
                enc = [q.encode(t, g) for t in snaps[k]]
                points[k] = [pt for _, pt in enc]
                ok[other] = [q.decode(code, ref)[1] for (code, _), ref in zip(enc, snaps[other])]
                self.bytes[k] += sum(math.ceil(q.bits * t.numel() / 8) + 24 for t in snaps[k]) + len(snaps[k])
            for k in (i, j):
                avg[k] = []
                for t in range(len(snaps[i])):
                    if ok[i][t] and ok[j][t]:
                        avg[k].append((points[i][t] + points[j][t]) / 2)
                    else:  # resent at full precision by both
                        avg[k].append((snaps[i][t].reshape(-1).double() + snaps[j][t].reshape(-1).double()) / 2)
                        self.bytes[k] += snaps[k][t].numel() * 4
                        self.resent[k] += 1
        for k in (i, j):
            with torch.no_grad():
                for t, a, s in zip(self.params(k), avg[k], snaps[k]):
                    if self.cfg["blocking"]:
                        t.copy_(a.view_as(t))
                    else:
                        t.copy_((a.view_as(t) + (t.double() - s.double())).float())


def check_against_reference(tmp_path, cfg, steps, world=4):
    got = train(tmp_path, "swarm", world, cfg, SGD_M, steps, schedule=WARMUP_COSINE)
    ref = Reference(world, cfg, steps, WARMUP_COSINE).run()
    for r in range(world):
        for a, b in zip(got[r]["params"], ref.params(r)):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        assert got[r]["stats"]["comm_bytes"] == ref.bytes[r]
    return got, ref


def test_blocking_pairs_average_exactly_and_keep_the_network_mean(tmp_path):
    steps = 6  # three rounds of H = 2, the last one ending the run
    got, _ = check_against_reference(tmp_path, swarm_cfg(), steps)
    partners = round_partners(Topology("complete", 4, "uniform", SEED), SEED, 2)
    assert len(partners) == 4  # complete graph on 4 nodes: a perfect matching every round
    for i, j in partners.items():  # partners hold the same model after a blocking average
        for a, b in zip(got[i]["params"], got[j]["params"]):
            assert torch.equal(a, b)
    # the network mean before the last averaging (after the last local step) equals the mean after it
    n_params = len(got[0]["params"])
    for t in range(n_params):
        before = sum(g["pre_sync"][-1][t].double() for g in got) / 4
        after = sum(g["params"][t].double() for g in got) / 4
        torch.testing.assert_close(after, before, atol=1e-7, rtol=0)
    assert [g["stats"]["comm_rounds"] for g in got] == [3] * 4


def test_nonblocking_readds_the_local_progress(tmp_path):
    """7 steps of H = 2: the exchange of round r is applied at the end of round r + 1 with the
    re-add, and the last one (started at step 6) when the run ends at step 7."""
    got, _ = check_against_reference(tmp_path, swarm_cfg(blocking=False), 7)
    # not the blocking result: the re-add and the one-round delay change the trajectory
    blocking = Reference(4, swarm_cfg(), 7, WARMUP_COSINE).run()
    assert not torch.allclose(got[0]["params"][0], blocking.params(0)[0], atol=1e-4)


@pytest.mark.parametrize("bits,side,blocking", [(8, 1e-3, True), (2, 1e-4, True), (4, 1e-4, False)])
def test_lattice_averaging_decodes_against_the_reference_and_resends_outside_the_radius(tmp_path, bits, side, blocking):
    cfg = swarm_cfg(quantizer="lattice", bits=bits, side=side, blocking=blocking)
    got, ref = check_against_reference(tmp_path, cfg, 6)
    resent = [g["algo_state"]["resent"] for g in got]
    assert resent == ref.resent
    if bits == 8:
        assert sum(resent) == 0  # models stay within 128 steps of 1e-3 of each other
    else:
        assert sum(resent) > 0   # a 2- or 4-step radius of 1e-4 is left at once: caught and resent


def test_geometric_rounds_run_in_the_trainer_and_resume_exactly(tmp_path):
    """Geometric local steps, non-blocking, lattice: nodes take different numbers of local steps,
    records fall at round boundaries (progress = H x rounds), and a run resumed from a checkpoint
    ends with the same metrics as an uninterrupted one."""
    over = ["algo=swarm_sgd", "algo.local_steps=2", "algo.local_steps_dist=geometric", "algo.blocking=false",
            "algo.quantizer=lattice", "algo.side=1e-3", "algo.topology=ring", "epochs=2", "eval_unit=step",
            "eval_every=8", "log_every=4", "checkpoint_every=8", "eval_workers=true"]
    full = records(run(tmp_path, over, world=4, name="full"))
    steps = [r["step"] for r in full if "kind" not in r]
    assert steps == [4, 8, 12, 16]  # H x rounds: every node is at a round boundary
    evals = [r for r in full if "test_acc" in r]
    assert [r["step"] for r in evals] == [8, 16]
    assert all("consensus_distance" in r and "test_acc_workers_min" in r for r in evals)
    # rank 1 crashes after the checkpoint at progress 8; the resumed run ends where the full one did
    with pytest.raises(Exception, match=f"inject_failure|{PEER_LOSS.pattern}"):  # (or a peer that lost it)
        run(tmp_path, [*over, "inject_failure.step=11", "inject_failure.rank=1"], world=4, name="crash")
    resumed = records(run(tmp_path, over, world=4, name="crash", resume=True))

    measured = {"wall_time_s", "comm_time_s", "compute_time_s", "compute_time_s_max", "samples_per_s"}

    def strip(recs):  # modeled time and bytes must match; measured time cannot
        return [{k: v for k, v in r.items() if k not in measured} for r in recs]

    assert strip(resumed) == strip(full)


@pytest.mark.parametrize("pairing", ["rounds", "virtual_time"])
@pytest.mark.parametrize("blocking", [True, False])
def test_the_clock_prices_the_wait_and_the_overlap(tmp_path, blocking, pairing):
    """4 equal-speed nodes, complete graph (a perfect matching each round), H = 2, 8 steps of
    t = 10 ms, one exchange costing c = alpha + bytes x 8 / bandwidth: blocking waits c every round
    (8 t + 4 c); non-blocking hides each exchange behind the next round (c < 2 t) and waits only for
    the last one, applied when the run ends (8 t + c). Asynchronous pairing with equal speeds pairs
    like the rounds (its schedule's times are these), but the exchange planned after the last step
    never starts: blocking 8 t + 3 c; non-blocking 8 t (the last exchange, posted at 6 t, has landed
    by 8 t)."""
    over = ["algo=swarm_sgd", f"algo.pairing={pairing}", "algo.local_steps=2", f"algo.blocking={str(blocking).lower()}", "max_steps=8",
            "cluster.compute=profile", "cluster.step_time_s=0.01", "network.bandwidth_gbps=1", "network.latency_us=10",
            "launcher.nproc_per_node=4"]
    last = [r for r in records(run(tmp_path, over, world=4)) if "kind" not in r][-1]
    exchanges = 3 if pairing == "virtual_time" else 4
    assert last["step"] == 8 and last["comm_rounds"] == exchanges
    c = 10e-6 + (last["comm_bytes"] / exchanges) * 8 / 1e9
    assert c < 0.02
    expected = 8 * 0.01 + (exchanges * c if blocking else (c if pairing == "rounds" else 0.0))
    assert last["modeled_time_s"] == pytest.approx(expected, rel=1e-9)


# -- asynchronous pairing in virtual time (algo.pairing=virtual_time) --------------------------------
VIRTUAL_STEP_S = (0.01, 0.02, 0.01, 0.04)  # modeled seconds per local step of each node (speeds 1, 1/2, 1, 1/4)


def _virtual_worker(rank, world, out, algo_cfg, total, schedule):
    """The trainer's hook order for a method not in lockstep (lsgd/training/trainer.py, Trainer.work and
    train_step): before_step, step, the schedule at the algorithm's position, after_step, until the
    algorithm's progress reaches the total."""
    model = make_model()
    opt = build_optimizer(model.parameters(), SGD_M)
    sched = build_scheduler(opt, schedule, SPE, total)
    comm = Communicator(NetworkModel(bandwidth_gbps=10, latency_us=10))
    algo = build_algorithm(algo_cfg, comm)
    ctx = RunContext(rank=rank, world_size=world, num_workers=world, worker_index=rank, steps_per_epoch=SPE,
                     total_steps=total, batch_size=B, lr=lambda: opt.param_groups[0]["lr"], worker_step_s=VIRTUAL_STEP_S)
    net = algo.setup(model, opt, ctx)
    step = run_not_lockstep(algo, net, opt, sched, rank, total)
    torch.save({"params": [p.detach().clone() for p in model.parameters()], "steps": step,
                "stats": comm.stats.as_dict(), "algo_state": algo.state_dict()}, out / f"rank{rank}.pt")


class VirtualReference(Reference):
    """The n nodes in one process following the plan (lsgd.algorithms.gossip.virtual_pairing, tested on its
    own in tests/unit/test_virtual_pairing.py): each node's local steps with the learning rate at
    its progress, its exchanges in virtual-time order; a non-blocking exchange applied by each end at
    its own next action, or when it stops."""

    def __init__(self, n, cfg, total, schedule, plans):
        super().__init__(n, cfg, total, schedule)
        self.plans = plans
        self.factor = lr_factor_fn(schedule, SPE, total)
        self.done = [0] * n      # local steps taken
        self.rounds = [0] * n    # actions taken (each node's round count)
        self.acted = set()       # (node, boundary) whose action ran
        self.inflight = {}       # node -> (its average, its snapshot): non-blocking, not yet applied

    def advance(self, i, k):
        """Run node i's local steps up to k (its actions before k must have run)."""
        plan = self.plans[i]
        while self.done[i] < k:
            s = self.done[i]
            assert s == 0 or s not in plan.action or (i, s) in self.acted
            x, y = batch(i, s)
            self.opts[i].param_groups[0]["lr"] = SGD_M["lr"] * self.factor(plan.progress[s - 1] if s else 0)
            loss = F.cross_entropy(self.models[i](x), y)
            self.opts[i].zero_grad()
            loss.backward()
            self.opts[i].step()
            self.done[i] += 1
            if self.done[i] == plan.steps:
                self.apply_inflight(i)

    def apply_inflight(self, i):
        if i in self.inflight:
            avg, snap = self.inflight.pop(i)
            with torch.no_grad():
                for t, a, s in zip(self.params(i), avg, snap):
                    t.copy_((a.view_as(t) + (t.double() - s.double())).float())

    def exchange(self, i, j):
        rounds = {i: self.rounds[i], j: self.rounds[j]}
        snaps = {m: [t.clone() for t in self.params(m)] for m in (i, j)}
        if self.cfg["blocking"]:
            self.average(i, j, snaps, rounds)
            return
        saved = {m: [t.clone() for t in self.params(m)] for m in (i, j)}
        self.average(i, j, snaps, rounds)  # computes (and counts) the averages; undone below
        for m in (i, j):
            avg = [t.double().clone() for t in self.params(m)]  # = average + (x - s) with x = s
            with torch.no_grad():
                for t, old in zip(self.params(m), saved[m]):
                    t.copy_(old)
            self.inflight[m] = (avg, snaps[m])

    def run(self):
        events = sorted((p.times[k - 1], i, k, j) for i, p in enumerate(self.plans) for k, j in p.action.items())
        for x, i, k, j in events:
            if k >= self.plans[i].steps or (i, k) in self.acted:
                continue  # at or after the node's last step: never run; or run by the partner's event
            self.advance(i, k)
            self.acted.add((i, k))
            self.apply_inflight(i)  # the exchange in flight is applied first
            if j != LEFT_OUT:
                kj = next(kk for kk, jj in self.plans[j].action.items() if jj == i and self.plans[j].times[kk - 1] == x)
                self.advance(j, kj)
                self.acted.add((j, kj))
                self.apply_inflight(j)
                self.exchange(i, j)
                self.rounds[j] += 1
            self.rounds[i] += 1
        for i in range(self.n):
            self.advance(i, self.plans[i].steps)
        return self


def exchange_cost(cfg, n_params, numels):
    """Modeled seconds of one exchange on the tests' 10 Gbps, 10 us network: alpha + bytes x 8 / 1e10
    for the message (+ the same for the decode flags with the lattice)."""
    if cfg["quantizer"] == "none":
        return 10e-6 + sum(numels) * 4 * 8 / 10e9
    codes = sum(math.ceil(cfg["bits"] * m / 8) for m in numels) + 24 * n_params
    return 10e-6 + codes * 8 / 10e9 + 10e-6 + n_params * 8 / 10e9


def virtual_plans(cfg, total):
    numels = [p.numel() for p in make_model().parameters()]
    c = exchange_cost(cfg, len(numels), numels)
    return plan(Topology(cfg["topology"], 4, cfg["weights"], SEED), SEED,
                lambda i, r: round_length(cfg["local_steps"], cfg["local_steps_dist"], SEED, i, r),
                VIRTUAL_STEP_S, lambda i, j: c, cfg["blocking"], total)


@pytest.mark.parametrize("blocking,quantizer", [(True, "none"), (False, "none"), (True, "lattice")])
def test_virtual_time_pairing_follows_its_schedule_against_a_single_process_reference(tmp_path, blocking, quantizer):
    """Nodes of speeds 1, 1/2, 1, 1/4 on a complete graph, H = 2, 16 average steps: every rank
    follows the common schedule (fast nodes take more local steps), its learning rate follows the
    progress, and the models, local step counts and bytes equal the reference's."""
    cfg = swarm_cfg(pairing="virtual_time", blocking=blocking, quantizer=quantizer, side=1e-3)
    total = 16
    out = tmp_path / "virtual"
    out.mkdir()
    run_gloo(_virtual_worker, 4, out, cfg, total, WARMUP_COSINE)
    got = [torch.load(out / f"rank{r}.pt") for r in range(4)]
    plans = virtual_plans(cfg, total)
    assert [g["steps"] for g in got] == [p.steps for p in plans]
    assert got[0]["steps"] > got[3]["steps"]  # the fastest node takes more steps than the slowest
    ref = VirtualReference(4, cfg, total, WARMUP_COSINE, plans).run()
    for r in range(4):
        for a, b in zip(got[r]["params"], ref.params(r)):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        assert got[r]["stats"]["comm_bytes"] == ref.bytes[r]


def test_virtual_time_runs_in_the_trainer_records_every_multiple_and_resumes_exactly(tmp_path):
    """Very heterogeneous speeds (spread 6), non-blocking, a record at every progress count: ranks
    cross the counts at different local steps and slow ranks jump over several, yet every record
    (a collective on every rank) is made once, in order; evaluations carry the nodes' own-model
    metrics; a rank crashing after the checkpoint at 8 and the resumed run end with the same
    metrics as an uninterrupted run."""
    over = ["algo=swarm_sgd", "algo.pairing=virtual_time", "algo.local_steps=2", "algo.blocking=false",
            "algo.topology=ring", "cluster.compute=profile", "cluster.speeds=very", "cluster.step_time_s=0.01",
            "epochs=2", "eval_unit=step", "eval_every=4", "log_every=1", "checkpoint_every=8", "eval_workers=true"]
    full = records(run(tmp_path, over, world=4, name="full"))
    recs = [r for r in full if "kind" not in r]
    assert [r["step"] for r in recs] == list(range(1, 17))
    assert [r["step"] for r in recs if "test_acc" in r] == [4, 8, 12, 16]
    assert all("test_acc_workers_min" in r for r in recs if "test_acc" in r)
    speeds = resolve_speeds("very", 4, 0)
    fastest = speeds.index(1.0)  # it takes 24 of the 64 local steps (waiting on slow neighbours); the 18th is past 8
    with pytest.raises(Exception, match=f"inject_failure|{PEER_LOSS.pattern}"):  # (or a peer that lost it)
        run(tmp_path, [*over, "inject_failure.step=18", f"inject_failure.rank={fastest}"], world=4, name="crash")
    crashed = [r["step"] for r in records(tmp_path / "crash") if "kind" not in r]
    assert 8 <= crashed[-1] < 16  # the fastest rank fails after the checkpoint, before the end
    resumed = records(run(tmp_path, over, world=4, name="crash", resume=True))
    measured = {"wall_time_s", "comm_time_s", "compute_time_s", "compute_time_s_max", "samples_per_s"}

    def strip(recs):
        return [{k: v for k, v in r.items() if k not in measured} for r in recs]

    assert strip(resumed) == strip(full)


def test_virtual_time_pairing_needs_the_profile_clock(tmp_path):
    from lsgd.core.errors import ConfigError

    with pytest.raises(ConfigError, match="cluster.compute=profile"):
        run(tmp_path, ["algo=swarm_sgd", "algo.pairing=virtual_time", "cluster.compute=measured"], world=2)
    with pytest.raises(ConfigError, match="algo.quantizer=none"):
        run(tmp_path, ["algo=swarm_sgd", "algo.pairing=virtual_time", "algo.blocking=false", "algo.quantizer=lattice"],
            world=2)
