"""The gossip family (D-PSGD, DecentLaM, SGP) on real 4-rank gloo groups, in the trainer's hook
order with a schedule running, against single-process simulations of the n nodes built from the
mixing matrices (docs/papers.md#decentralized-methods) and against each other where the papers say they coincide."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_algorithms import SGD_M, SPE, WARMUP_COSINE, batch, lr_at, make_model, train

from lsgd.training.failures import PEER_LOSS
from lsgd.comm.topology import Topology

N = 4
SGD = {"name": "sgd", "lr": 0.1, "momentum": 0.0, "nesterov": False, "weight_decay": 0.0}


def cfg(name, **kw):
    out = {"name": name, "topology": "ring", "weights": "uniform", "average_buffers": True, "seed": 0}
    out.update(kw)
    return out


class Nodes:
    """n replicas in one process, each with its own optimizer and batches."""

    def __init__(self, optim_cfg, steps, schedule):
        self.models = [make_model() for _ in range(N)]
        momentum = optim_cfg["momentum"]
        self.opts = [torch.optim.SGD(m.parameters(), lr=optim_cfg["lr"], momentum=momentum) for m in self.models]
        self.lr = lr_at(optim_cfg, schedule, steps)

    def flat(self, i):
        return torch.cat([p.data.reshape(-1) for p in self.models[i].parameters()])

    def write(self, i, flat):
        offset = 0
        for p in self.models[i].parameters():
            p.data.copy_(flat[offset : offset + p.numel()].view_as(p).to(p.dtype))
            offset += p.numel()

    def gradients(self, step):
        for i in range(N):
            x, y = batch(i, step)
            self.opts[i].param_groups[0]["lr"] = self.lr(step)
            loss = F.cross_entropy(self.models[i](x), y)
            self.opts[i].zero_grad()
            loss.backward()


def mix(w, flats, i):
    out = flats[i].double() * w[i, i]
    for j in range(N):
        if j != i and w[i, j] > 0:
            out += w[i, j] * flats[j].double()
    return out.float()


def reference_dpsgd(topo, variant, steps, optim_cfg=SGD_M, schedule=WARMUP_COSINE):
    nodes = Nodes(optim_cfg, steps, schedule)
    for step in range(steps):
        nodes.gradients(step)
        w = topo.mixing_matrix(step)
        before = [nodes.flat(i) for i in range(N)]
        for opt in nodes.opts:
            opt.step()
        after = [nodes.flat(i) for i in range(N)]
        for i in range(N):
            if variant == "awc":  # x_i + d_i + (sum_j W_ij x_j - x_i), d_i at the pre-averaging model
                nodes.write(i, after[i] + (mix(w, before, i) - before[i]))
            else:
                nodes.write(i, mix(w, after, i))
    return nodes


def assert_models(got, nodes, atol=1e-6):
    for r in range(N):
        for a, b in zip(got[r]["params"], nodes.models[r].parameters()):
            torch.testing.assert_close(a, b.data, atol=atol, rtol=0)


@pytest.mark.parametrize("topology,weights,variant", [
    ("ring", "uniform", "awc"), ("ring", "metropolis", "atc"), ("exponential", "uniform", "awc"),
    ("one_peer_exponential", "uniform", "atc"), ("complete", "uniform", "awc"),
])
def test_dpsgd_equals_its_recursion(tmp_path, topology, weights, variant):
    steps = 5
    got = train(tmp_path, "dpsgd", N, cfg("dpsgd", topology=topology, weights=weights, variant=variant), SGD_M, steps,
                schedule=WARMUP_COSINE)
    topo = Topology(topology, N, weights, 0)
    assert_models(got, reference_dpsgd(topo, variant, steps))
    # bytes: every step each node sends its model to each out-neighbour (one_peer: one, ring: two, ...)
    model_bytes = sum(p.numel() * 4 for p in got[0]["params"])
    sends = sum(len(topo.out_neighbors(0, t)) for t in range(steps))
    assert got[0]["stats"]["comm_bytes"] == sends * model_bytes
    assert got[0]["stats"]["comm_rounds"] == steps


def test_dpsgd_on_the_complete_graph_averages_then_steps_at_the_pre_averaging_model(tmp_path):
    """W = 11^T / n: x_i(t+1) = mean_j x_j(t) + d_i(x_i(t)), the closed form of adapt-with-combine."""
    steps = 4
    got = train(tmp_path, "awc", N, cfg("dpsgd", topology="complete"), SGD, steps, schedule=WARMUP_COSINE)
    nodes = Nodes(SGD, steps, WARMUP_COSINE)
    lr = lr_at(SGD, WARMUP_COSINE, steps)
    for step in range(steps):
        nodes.gradients(step)
        mean = sum(nodes.flat(i).double() for i in range(N)) / N
        grads = [torch.cat([p.grad.reshape(-1) for p in m.parameters()]) for m in nodes.models]
        for i in range(N):
            nodes.write(i, mean - lr(step) * grads[i].double())
    assert_models(got, nodes, atol=2e-6)


def test_decentlam_with_beta_zero_is_adapt_then_combine_dpsgd(tmp_path):
    steps = 5
    lam = train(tmp_path, "lam", N, cfg("decentlam", momentum=0.0), SGD, steps, schedule=WARMUP_COSINE)
    atc = train(tmp_path, "atc", N, cfg("dpsgd", variant="atc"), SGD, steps, schedule=WARMUP_COSINE)
    for r in range(N):
        for a, b in zip(lam[r]["params"], atc[r]["params"]):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_decentlam_momentum_follows_its_recursion(tmp_path):
    """g_hat = (x - sum_j W_ij (x_j - lr g_j)) / lr; m <- beta m + g_hat; x <- x - lr m."""
    steps, beta = 6, 0.9
    got = train(tmp_path, "lam", N, cfg("decentlam", momentum=beta, topology="complete", weights="uniform"), SGD, steps,
                schedule=WARMUP_COSINE)
    topo = Topology("complete", N, "uniform", 0)
    nodes = Nodes(SGD, steps, WARMUP_COSINE)
    lr = lr_at(SGD, WARMUP_COSINE, steps)
    m = [torch.zeros_like(nodes.flat(0)).double() for _ in range(N)]
    for step in range(steps):
        nodes.gradients(step)
        w, gamma = topo.mixing_matrix(step), lr(step)
        xs = [nodes.flat(i).double() for i in range(N)]
        zs = [(xs[i] - gamma * torch.cat([p.grad.reshape(-1) for p in nodes.models[i].parameters()]).double()).float()
              for i in range(N)]
        for i in range(N):
            z_bar = mix(w, zs, i).double()
            m[i] = beta * m[i] + (xs[i] - z_bar) / gamma
            nodes.write(i, xs[i] - gamma * m[i])
    assert_models(got, nodes, atol=2e-6)


def test_decentlam_needs_plain_sgd():
    from lsgd.algorithms.gossip.decentlam import DecentLaM
    from lsgd.core.errors import ConfigError

    with pytest.raises(ConfigError, match="optim.momentum=0"):
        DecentLaM.validate_run({"algo": cfg("decentlam", momentum=0.9), "optim": SGD_M}, N)


def reference_sgp(topo, steps, optim_cfg, schedule):
    nodes = Nodes(optim_cfg, steps, schedule)
    weights = [1.0] * N
    for step in range(steps):
        nodes.gradients(step)
        z = [nodes.flat(i) for i in range(N)]
        for opt in nodes.opts:
            opt.step()
        x = [z[i].double() * weights[i] + (nodes.flat(i) - z[i]).double() for i in range(N)]
        shares = {}
        for i in range(N):
            outs = topo.out_neighbors(i, step)
            p = 1.0 / (len(outs) + 1)
            shares[i] = (torch.cat([x[i] * p, torch.tensor([weights[i] * p], dtype=torch.float64)]).float().double(),
                         [i, *outs])
        new_w = []
        for i in range(N):
            got = [msg for msg, dests in shares.values() if i in dests]
            total = shares[i][0] + sum(msg for msg in got if msg is not shares[i][0])
            nodes.write(i, total[:-1] / float(total[-1]))
            new_w.append(float(total[-1]))
        weights = new_w
    return nodes, weights


@pytest.mark.parametrize("topology", ["one_peer_exponential", "exponential"])
def test_sgp_equals_push_sum_and_keeps_the_mass(tmp_path, topology):
    steps = 5
    got = train(tmp_path, "sgp", N, cfg("sgp", topology=topology), SGD_M, steps, schedule=WARMUP_COSINE)
    nodes, weights = reference_sgp(Topology(topology, N, "uniform", 0), steps, SGD_M, WARMUP_COSINE)
    assert_models(got, nodes)
    got_w = [g["algo_state"]["weight"] for g in got]
    np.testing.assert_allclose(got_w, weights, rtol=0, atol=1e-7)
    assert sum(got_w) == pytest.approx(N, abs=1e-6)  # sum_i w_i = n


def reference_osgp(topo, steps, optim_cfg, schedule):
    """Overlap SGP with one step of staleness, n nodes in one process: the shares sent at step k
    are added at step k + 1 (the last step's at once). Returns the nodes, the final weights and,
    per step, the nodes' de-biased models and the network sums of the numerators and the weights
    including the shares in flight."""
    nodes = Nodes(optim_cfg, steps, schedule)
    weights = [1.0] * N
    in_flight = {i: [] for i in range(N)}  # the shares sent to i at the previous step
    history, sums = [], []
    for step in range(steps):
        nodes.gradients(step)
        z = [nodes.flat(i) for i in range(N)]
        for opt in nodes.opts:
            opt.step()
        x = [z[i].double() * weights[i] + (nodes.flat(i) - z[i]).double() for i in range(N)]
        kept, sent = {}, {i: [] for i in range(N)}
        for i in range(N):
            outs = topo.out_neighbors(i, step)
            p = 1.0 / (len(outs) + 1)
            kept[i] = torch.cat([x[i] * p, torch.tensor([weights[i] * p], dtype=torch.float64)]).float().double()
            for j in outs:
                sent[j].append(kept[i])
        last = step == steps - 1
        totals = []
        for i in range(N):
            total = kept[i] + sum(in_flight[i], torch.zeros_like(kept[i]))
            if last:
                total = total + sum(sent[i], torch.zeros_like(kept[i]))
            totals.append(total)
            nodes.write(i, total[:-1] / float(total[-1]))
            weights[i] = float(total[-1])
        in_flight = {i: [] for i in range(N)} if last else sent
        network = sum(totals) + sum(m for msgs in in_flight.values() for m in msgs)
        sums.append(network)
        history.append([nodes.flat(i).clone() for i in range(N)])
    return nodes, weights, history, sums


@pytest.mark.parametrize("topology", ["one_peer_exponential", "exponential"])
def test_osgp_adds_the_shares_one_step_late_and_keeps_the_mass(tmp_path, topology):
    """algo.overlap: every step's models equal the one-step-stale push-sum recursion (which differs
    from blocking SGP's), the push-sum weights end summing to n and the numerators to the network
    sum the recursion predicts."""
    steps = 6
    got = train(tmp_path, "osgp", N, cfg("sgp", topology=topology, overlap=True), SGD_M, steps, schedule=WARMUP_COSINE)
    topo = Topology(topology, N, "uniform", 0)
    nodes, weights, history, sums = reference_osgp(topo, steps, SGD_M, WARMUP_COSINE)
    blocking, _ = reference_sgp(topo, steps, SGD_M, WARMUP_COSINE)
    assert max((nodes.flat(i) - blocking.flat(i)).abs().max().item() for i in range(N)) > 1e-4  # a different method
    assert_models(got, nodes)
    for step in range(steps):  # the de-biased models after every step, not only the last
        for r in range(N):
            flat = torch.cat([t.reshape(-1) for t in got[r]["pre_sync"][step][: len(got[r]["params"])]])
            torch.testing.assert_close(flat, history[step][r], atol=1e-6, rtol=0)
    got_w = [g["algo_state"]["weight"] for g in got]
    np.testing.assert_allclose(got_w, weights, rtol=0, atol=1e-7)
    assert sum(got_w) == pytest.approx(N, abs=1e-6)  # sum_i w_i = n once every share has arrived
    numerators = sum(w * torch.cat([p.reshape(-1) for p in g["params"]]).double() for w, g in zip(got_w, got))
    torch.testing.assert_close(numerators, sums[-1][:-1], atol=1e-5, rtol=0)
    for total in sums:  # the recursion itself: the weights, counting those in flight, sum to n every step
        assert float(total[-1]) == pytest.approx(N, abs=1e-6)
    assert got[0]["stats"]["comm_rounds"] == steps


@pytest.mark.parametrize("overlap", [False, True])
def test_sgp_de_biased_models_reach_the_mean_on_a_static_strongly_connected_graph(tmp_path, overlap):
    """Learning rate 0 after the first epoch (3 steps): the models only mix, and on the static
    directed exponential graph every z_i = x_i / w_i converges to sum_i x_i / n (with overlap too,
    the shares arriving one step late)."""
    steps = 40
    stop = {"name": "step", "milestones": [1], "gamma": 0.0}
    got = train(tmp_path, "sgp", N, cfg("sgp", topology="exponential", overlap=overlap), SGD, steps, schedule=stop)
    # after step SPE no more gradient steps: x_i = w_i z_i sum to the mass of step SPE's end
    flats = [torch.cat([p.reshape(-1) for p in g["params"]]).double() for g in got]
    w = [g["algo_state"]["weight"] for g in got]
    mean = sum(wi * f for wi, f in zip(w, flats)) / N
    before = [torch.cat([t.reshape(-1) for t in g["pre_sync"][SPE - 1][:len(g["params"])]]).double() for g in got]
    assert sum(w) == pytest.approx(N, abs=1e-6)
    assert max((f - mean).abs().max().item() for f in flats) < 1e-6
    assert not all(torch.equal(before[0], b) for b in before[1:])  # they did differ after the gradient steps


@pytest.mark.parametrize("variant", ["awc", "atc"])
def test_the_clock_hides_the_awc_exchange_behind_the_next_gradient(tmp_path, variant):
    """Ring of 4, 8 steps of t = 20 ms, an exchange with two neighbours of cost c per message: the
    two messages share the worker's egress and ingress ports (LogGP, lsgd.clock.ports; before issue 22
    they travelled at once and the exchange cost c), so an exchange costs 2c: atc waits 2c every
    step (8 t + 16 c); awc's exchange of x(t) runs during step t's forward and backward pass
    (2c < t), so only step 0's blocking one shows (8 t + 2c)."""
    from trainer_runs import records, run

    over = ["algo=dpsgd", f"algo.variant={variant}", "max_steps=8", "cluster.compute=profile", "cluster.step_time_s=0.02",
            "network.bandwidth_gbps=1", "network.latency_us=10", "launcher.nproc_per_node=4"]
    last = [r for r in records(run(tmp_path, over, world=4)) if "kind" not in r][-1]
    sends = 8 * 2  # two neighbours per step (awc: step 0 blocking, 7 posted after steps 1..7)
    c = 10e-6 + (last["comm_bytes"] / sends) * 8 / 1e9
    assert 2 * c < 0.02 and last["comm_rounds"] == 8
    expected = 8 * 0.02 + (2 * c if variant == "awc" else 16 * c)
    assert last["modeled_time_s"] == pytest.approx(expected, rel=1e-9)


def test_dpsgd_resumes_with_the_exchange_in_flight_to_identical_metrics(tmp_path):
    from trainer_runs import records, run

    over = ["algo=dpsgd", "algo.variant=awc", "epochs=2", "eval_unit=step", "eval_every=8", "log_every=4",
            "checkpoint_every=8", "eval_workers=true"]
    full = records(run(tmp_path, over, world=4, name="full"))
    with pytest.raises(Exception, match=f"inject_failure|{PEER_LOSS.pattern}"):  # (or a peer that lost it)
        run(tmp_path, [*over, "inject_failure.step=11", "inject_failure.rank=2"], world=4, name="crash")
    resumed = records(run(tmp_path, over, world=4, name="crash", resume=True))
    measured = {"wall_time_s", "comm_time_s", "compute_time_s", "compute_time_s_max", "samples_per_s"}
    assert [{k: v for k, v in r.items() if k not in measured} for r in resumed] == \
           [{k: v for k, v in r.items() if k not in measured} for r in full]
    assert "consensus_distance" in full[-1] and full[-1]["test_acc_workers_min"] <= full[-1]["test_acc_workers_mean"]


@pytest.mark.parametrize("overlap", [False, True])
def test_the_clock_hides_the_osgp_exchange_behind_the_next_step(tmp_path, overlap):
    """One-peer exponential graph of 4, 8 steps of t = 10 ms, one share of cost c sent and one
    received per step: SGP waits c every step (8 t + 8 c); Overlap SGP's exchange of step k runs
    during step k + 1's forward and backward pass (c < t), so only the last step's, waited for at
    once, shows (8 t + c)."""
    from trainer_runs import records, run

    over = ["algo=sgp", f"algo.overlap={str(overlap).lower()}", "max_steps=8", "cluster.compute=profile",
            "cluster.step_time_s=0.01", "network.bandwidth_gbps=1", "network.latency_us=10", "launcher.nproc_per_node=4"]
    last = [r for r in records(run(tmp_path, over, world=4)) if "kind" not in r][-1]
    sends = 8  # one out-neighbour per step
    c = 10e-6 + (last["comm_bytes"] / sends) * 8 / 1e9
    assert c < 0.01 and last["comm_rounds"] == 8
    expected = 8 * 0.01 + (c if overlap else 8 * c)
    assert last["modeled_time_s"] == pytest.approx(expected, rel=1e-9)
    assert last["push_sum_weight"] > 0


def test_osgp_resumes_with_the_shares_in_flight_to_identical_metrics(tmp_path):
    """A checkpoint at step 8 saves the shares sent at step 8 as they stand (what was received and
    the exchange's end on the clock) without waiting for them; the resumed run waits for them and
    adds them at step 9 as the uninterrupted run does."""
    from trainer_runs import records, run

    over = ["algo=sgp", "algo.overlap=true", "epochs=2", "eval_unit=step", "eval_every=8", "log_every=4",
            "checkpoint_every=8", "eval_workers=true"]

    full = records(run(tmp_path, over, world=4, name="full"))
    # the spawner reports whichever rank exits first: rank 2's own error or a peer's lost connection
    with pytest.raises(Exception, match=f"inject_failure|{PEER_LOSS.pattern}"):
        run(tmp_path, [*over, "inject_failure.step=11", "inject_failure.rank=2"], world=4, name="crash")
    ckpt = tmp_path / "crash" / "checkpoints"
    assert json.loads((ckpt / "last.json").read_text())["step"] == 8
    for r in range(4):  # every node had shares in flight at the checkpoint: saved with their end
        pending = torch.load(ckpt / "step_00000008" / f"rank{r}.pt", weights_only=False)["algorithm"]["pending"]
        assert pending["round"] == 7 and pending["handle"]["end"] is not None  # the 8th step's (0-based)
        assert all(x[-1] > 0 for x in pending["recvs"].values())  # the weight share received
    resumed = records(run(tmp_path, over, world=4, name="crash", resume=True))
    measured = {"wall_time_s", "comm_time_s", "compute_time_s", "compute_time_s_max", "samples_per_s"}
    assert [{k: v for k, v in r.items() if k not in measured} for r in resumed] == \
           [{k: v for k, v in r.items() if k not in measured} for r in full]
    assert "consensus_distance" in full[-1] and "push_sum_weight" in full[-1]


def reference_ad_psgd(topo, steps, optim_cfg=SGD_M, schedule=WARMUP_COSINE):
    """Gradients at x_i, then each passive worker averages with the active workers that picked it
    (ascending), then every worker adds its optimizer step."""
    from lsgd.algorithms.gossip.ad_psgd import step_partners

    nodes = Nodes(optim_cfg, steps, schedule)
    for step in range(steps):
        nodes.gradients(step)
        before = [nodes.flat(i) for i in range(N)]
        for opt in nodes.opts:
            opt.step()
        delta = [nodes.flat(i) - before[i] for i in range(N)]
        x = list(before)
        for a, p in sorted(step_partners(topo, 0, step).items(), key=lambda ap: (ap[1], ap[0])):
            x[a] = x[p] = ((x[a].double() + x[p].double()) / 2).float()
        for i in range(N):
            nodes.write(i, x[i] + delta[i])
    return nodes


@pytest.mark.parametrize("topology", ["ring", "complete"])
def test_ad_psgd_equals_its_recursion_and_keeps_the_mean(tmp_path, topology):
    from lsgd.algorithms.gossip.ad_psgd import step_partners

    steps = 6
    # the lock-step variant (algo=ad_psgd's default is the asynchronous algorithm: tests/distributed/test_ad_psgd.py)
    got = train(tmp_path, "ad", N, cfg("ad_psgd", topology=topology, pairing="lockstep"), SGD_M, steps,
                schedule=WARMUP_COSINE)
    topo = Topology(topology, N, "uniform", 0)
    assert_models(got, reference_ad_psgd(topo, steps))
    picks = [step_partners(topo, 0, t) for t in range(steps)]
    # the active workers average once per step; a passive one as often as it was picked
    assert [g["stats"]["comm_rounds"] for g in got[::2]] == [steps] * (N // 2)
    for p in (1, 3):
        assert got[p]["stats"]["comm_rounds"] == sum(p in pk.values() for pk in picks)
    assert got[0]["stats"]["comm_bytes"] == steps * sum(t.numel() * 4 for t in got[0]["params"])


def test_ad_psgd_splits_the_graph_in_two_and_rejects_dynamic_graphs():
    from lsgd.algorithms.gossip.ad_psgd import ADPSGD
    from lsgd.core.errors import ConfigError

    with pytest.raises(ConfigError, match="algo.topology=one_peer_exponential"):
        ADPSGD.validate_config(cfg("ad_psgd", topology="one_peer_exponential"), 8)
    # exponential graph on 8 (not bipartite): even/odd split, the +1 edges connect it
    ADPSGD.validate_config(cfg("ad_psgd", topology="exponential"), 8)
    # the hypercube is bipartite by bit parity, not by index parity (0 -> 1, 2, 4 are all passive)
    from lsgd.algorithms.gossip.ad_psgd import bipartite_neighbors, sides

    cube = Topology("hypercube", 8, "uniform", 0)
    assert bipartite_neighbors(cube)[0] == [1, 2, 4] and sides(cube)[3] == 0
    ADPSGD.validate_config(cfg("ad_psgd", topology="hypercube"), 8)


def reference_lead(topo, steps, alpha, gamma, optim_cfg=SGD, schedule=WARMUP_COSINE):
    """LEAD's recursion with an identity compressor (docs/papers.md#lead), float64 state."""
    nodes = Nodes(optim_cfg, steps, schedule)
    lr = lr_at(optim_cfg, schedule, steps)
    w = topo.mixing_matrix(0)
    n = nodes.flat(0).numel()
    h, h_w, dual = ([torch.zeros(n, dtype=torch.float64) for _ in range(N)] for _ in range(3))
    for step in range(steps):
        nodes.gradients(step)
        x = [nodes.flat(i).double() for i in range(N)]
        for opt in nodes.opts:
            opt.step()
        d = [nodes.flat(i).double() - x[i] for i in range(N)]
        if step == 0:
            continue
        eta = lr(step)
        q = [(x[i] + d[i] - eta * dual[i] - h[i]).float().double() for i in range(N)]
        for i in range(N):
            y_hat = h[i] + q[i]
            y_hat_w = h_w[i] + sum(w[i, j] * q[j] for j in range(N) if w[i, j] > 0)
            h[i] = (1 - alpha) * h[i] + alpha * y_hat
            h_w[i] = (1 - alpha) * h_w[i] + alpha * y_hat_w
            dual[i] = dual[i] + gamma / (2 * eta) * (y_hat - y_hat_w)
            nodes.write(i, x[i] + d[i] - eta * dual[i])
    return nodes


@pytest.mark.parametrize("topology", ["ring", "complete"])
def test_lead_with_the_identity_compressor_follows_its_recursion(tmp_path, topology):
    steps, alpha, gamma = 6, 0.5, 1.0
    got = train(tmp_path, "lead", N, cfg("lead", topology=topology, alpha=alpha, gamma=gamma, compressor="none", bits=2),
                SGD, steps, schedule=WARMUP_COSINE)
    assert_models(got, reference_lead(Topology(topology, N, "uniform", 0), steps, alpha, gamma), atol=2e-6)
    assert got[0]["stats"]["comm_rounds"] == steps - 1  # step 0 is a plain local step


@pytest.mark.parametrize("compressor", ["none", "quantize"])
def test_lead_keeps_h_w_equal_to_w_h_and_the_duals_summing_to_zero(tmp_path, compressor):
    """Invariants of the recursion, whatever the compressor: H_w = W H at the start and
    y_hat_w = h_w + W q keep h_w = W h; with a doubly stochastic W and D = 0 at the start, D moves
    along (I - W) y_hat, so sum_i D_i = 0. Both hold only if every node decodes its neighbours'
    messages to the very values they used themselves (the packed 2-bit wire format)."""
    steps = 5
    got = train(tmp_path, "leadinv", N, cfg("lead", alpha=0.5, gamma=1.0, compressor=compressor, bits=2), SGD, steps,
                schedule=WARMUP_COSINE)
    w = Topology("ring", N, "uniform", 0).mixing_matrix(0)
    h, h_w, dual = ([g["algo_state"][k] for g in got] for k in ("h", "h_w", "dual"))
    scale = max(t.abs().max().item() for t in h)
    assert scale > 0 and max(t.abs().max().item() for t in dual) > 0  # the state did move
    for i in range(N):
        torch.testing.assert_close(h_w[i], sum(float(w[i, j]) * h[j] for j in range(N)), atol=1e-12 * scale, rtol=0)
    dual_scale = max(t.abs().max().item() for t in dual)
    assert sum(dual).abs().max().item() <= 1e-12 * dual_scale * N


def test_lead_rejects_directed_and_time_varying_topologies():
    from lsgd.algorithms.gossip.lead import LEAD
    from lsgd.core.errors import ConfigError

    for topology in ("exponential", "one_peer_exponential", "matching"):
        with pytest.raises(ConfigError, match=f"algo.topology={topology}"):
            LEAD.validate_config(cfg("lead", topology=topology, alpha=0.2, gamma=0.5, compressor="none"), N)
    LEAD.validate_config(cfg("lead", topology="hypercube", alpha=0.2, gamma=0.5, compressor="none"), N)


def test_lead_quantizer_is_unbiased_and_its_payload_is_packed(tmp_path):
    from lsgd.algorithms.gossip.lead import dequantize, packed_bits, quantize

    v = torch.linspace(-1.0, 0.7, 41)
    g = torch.Generator().manual_seed(0)
    draws = 3000
    mean = sum(dequantize(*quantize(v, 2, g), 2) for _ in range(draws)) / draws
    levels, norm = quantize(v, 2, g)
    assert levels.abs().max() <= 2 and float(norm) == 1.0
    # one level step is norm / 2: standard error <= 0.5 / (2 sqrt(draws)); 5 sigma
    assert (mean - v.double()).abs().max() < 5 * 0.25 / draws ** 0.5
    assert [packed_bits(b) for b in (1, 2, 3, 4, 7, 8)] == [2, 3, 4, 5, 8, 9]  # 2^b + 1 levels: b + 1 bits
    steps = 3
    got = train(tmp_path, "leadq", N, cfg("lead", alpha=0.5, gamma=1.0, compressor="quantize", bits=2), SGD, steps,
                schedule=WARMUP_COSINE)
    n, tensors = sum(t.numel() for t in got[0]["params"]), len(got[0]["params"])
    # 2 ring neighbours x (steps - 1) rounds x (n levels at b + 1 = 3 bits + a float32 norm per tensor)
    assert got[0]["stats"]["comm_bytes"] == 2 * (steps - 1) * ((n * 3 + 7) // 8 + 4 * tensors)
    assert all(torch.isfinite(t).all() for g_ in got for t in g_["params"])
