"""Eager outer steps (``algo=streaming_diloco algo.eager=true``; Kale, Douillard, Donchev 2025,
arXiv 2502.12996) on real gloo groups:

* against an independent single-process simulation of the N workers: each worker's own copy of
  every fragment's global parameters and Nesterov momentum, stepped on
  (1/n) Delta_i^t + (1/n) (sum_j Delta_j^{t-1} - Delta_i^{t-1}), under the trainer's hook order
  with warm-up + cosine running, with fragments, the alpha merge, BatchNorm statistics and
  quantized outer gradients; the bytes of every all-reduce started and the rounds;
* through the real Trainer: the cluster clock overlaps each all-reduce with the whole next H inner
  steps: at a bandwidth where it lasts 2.5 inner steps the run takes its compute time alone, where
  the same run without eager steps waits for every landing, and where it lasts longer than H
  steps the run waits the rest (closed forms).
"""

from __future__ import annotations

import pytest
import torch
from hook_runs import ADAMW, SMALL, assert_matches_reference, inner_optimizers, local_step, one_thread
from test_algorithms import SGD_M
from test_streaming_diloco import (D, MU, OUTER_LR, _units_bytes, algo_cfg, batch, bn_fragment, fragments_of,
                                   make_model, ref_nbytes, ref_quantize, run_lsgd)
from trainer_runs import compose_cfg, train as train_cli


def eager_reference(world, kind, H, P, alpha, fmt, optim_cfg, steps):
    """The N workers in one process. After step s with h = H / P dividing s, fragment
    f = (s / h - 1) mod P syncs: each worker's q_i = Q(global_i - local_i) (its own global copy);
    the sum of the q_i goes in flight when s + H <= steps (until f's next sync); each worker steps
    its own Nesterov momentum on ((q_i + Q(S_prev) - q_i,prev) / n) (q_i / n at f's first sync),
    global_i <- global_i - lr (Delta + mu b_i), local_i <- global_i + alpha (local_i - global_i);
    the fragment's BatchNorm statistics b_i <- (b_i + S_b,prev - b_i,prev) / n, then merged by
    alpha. Returns the models and the bytes of the all-reduces started."""
    h = H // P
    models = [make_model(kind) for _ in range(world)]
    opts, scheds = inner_optimizers(models, optim_cfg, steps)
    frags = fragments_of(kind, P)
    glob = [[p.detach().clone() for p in m.parameters()] for m in models]
    mom: list[list] = [[None] * len(glob[0]) for _ in range(world)]
    bn_frag = bn_fragment(kind, P)
    sent_prev: list[list] = [[None] * P for _ in range(world)]  # per worker and fragment: (params, stats)
    flight: dict[int, tuple] = {}
    sent_bytes = rounds = 0
    for step in range(steps):
        local_step(models, opts, scheds, batch, step)
        done = step + 1
        if done % h:
            continue
        f = (done // h - 1) % P
        start = done + H <= steps
        stale = flight.pop(f, None)
        with torch.no_grad():
            own = []
            for r, m in enumerate(models):
                params = list(m.parameters())
                q = {i: ref_quantize(glob[r][i] - params[i].detach(), fmt) for i in frags[f]}
                stats = [m[1].running_mean.clone(), m[1].running_var.clone()] if bn_frag == f else None
                own.append((q, stats))
            if start:
                sums = {i: _ordered_sum([own[r][0][i] for r in range(world)]) for i in frags[f]}
                stat_sums = None
                if bn_frag == f:
                    stat_sums = [_ordered_sum([own[r][1][j] for r in range(world)]) for j in range(2)]
                flight[f] = (sums, stat_sums)
                sent_bytes += sum(ref_nbytes(glob[0][i], fmt) for i in frags[f]) + (2 * D * 4 if bn_frag == f else 0)
            for r, m in enumerate(models):
                params = list(m.parameters())
                q, stats = own[r]
                prev = sent_prev[r][f]
                for i in frags[f]:
                    mixed = q[i] if stale is None else q[i] + (ref_quantize(stale[0][i], fmt) - prev[0][i])
                    delta = mixed / world
                    mom[r][i] = delta.clone() if mom[r][i] is None else mom[r][i].mul(MU).add(delta)
                    glob[r][i] = glob[r][i].add(delta.add(mom[r][i], alpha=MU), alpha=-OUTER_LR)
                    params[i].copy_(glob[r][i].lerp(params[i], alpha))
                if stats is not None:
                    for j, buf in enumerate((m[1].running_mean, m[1].running_var)):
                        new = buf.clone() if stale is None else (stats[j] + (stale[1][j] - prev[1][j])) / world
                        buf.copy_(new.lerp(buf, alpha))
                sent_prev[r][f] = (q, stats) if start else None
            rounds += 1
    return models, sent_bytes, rounds


def _ordered_sum(ts: list[torch.Tensor]) -> torch.Tensor:
    total = ts[0].clone()
    for t in ts[1:]:
        total += t
    return total


#: (world, model, H, P, alpha, quantization, inner optimizer)
SETTINGS = [
    (2, "bn", 4, 2, 0.5, "fp4", ADAMW),
    (2, "mlp4", 3, 1, 0.0, "none", SGD_M),
    (2, "bn", 6, 3, 0.0, "int8", SGD_M),
    (4, "mlp4", 4, 2, 0.3, "none", ADAMW),
]


def test_eager_steps_equal_the_update_rule_on_n_workers(tmp_path):
    """The trainer's hook order with warm-up + cosine running, on 2 and 4 gloo ranks, against the
    single-process simulation: parameters and BatchNorm statistics (bit for bit on 2 workers), the
    bytes of the all-reduces started (none after a fragment's last sync) and one round per sync."""
    steps = 12
    got = run_lsgd(tmp_path, [(world, f"e{n}", kind, algo_cfg(H, P, 0, alpha, fmt, eager=True), opt, steps, "float32")
                              for n, (world, kind, H, P, alpha, fmt, opt) in enumerate(SETTINGS)])
    with one_thread():
        wanted = [eager_reference(world, kind, H, P, alpha, fmt, opt, steps)
                  for world, kind, H, P, alpha, fmt, opt in SETTINGS]
    for n, ((world, kind, H, P, *_), (want, sent, rounds)) in enumerate(zip(SETTINGS, wanted)):
        atol = 0 if world == 2 else 1e-6  # 2 workers: bit for bit; 4: gloo's ring sums in another order
        assert_matches_reference(got[f"e{n}"], want, atol, f"setting {n}")
        stats = got[f"e{n}"][0]["stats"]
        assert stats["comm_bytes"] == sent
        assert stats["comm_rounds"] == rounds == steps // (H // P)
        # eager workers differ by their own terms of the latest round: the comparison is not vacuous
        assert not all(torch.equal(a, b) for a, b in zip(got[f"e{n}"][0]["params"], got[f"e{n}"][1]["params"]))


def test_eager_without_its_stale_terms_is_not_the_delayed_landing(tmp_path):
    """One fragment, H = 3, 2 workers: the eager run differs from Streaming DiLoCo's own landing
    (tau = 0, the average applied at once), and its first outer step is each worker's own
    (1/n) Delta_i: with alpha = 1 nothing is merged and the models stay those of local training,
    eager or not (only the stored globals move)."""
    steps = 6
    jobs = [(2, "eager", "mlp4", algo_cfg(3, 1, 0, 0.0, eager=True), SGD_M, steps, "float32"),
            (2, "landed", "mlp4", algo_cfg(3, 1, 0, 0.0), SGD_M, steps, "float32"),
            (2, "eager_keep", "mlp4", algo_cfg(3, 1, 0, 1.0, eager=True), SGD_M, steps, "float32"),
            (2, "landed_keep", "mlp4", algo_cfg(3, 1, 0, 1.0), SGD_M, steps, "float32")]
    got = run_lsgd(tmp_path, jobs)
    assert any(not torch.equal(a, b) for a, b in zip(got["eager"][0]["params"], got["landed"][0]["params"]))
    for r in range(2):
        for a, b in zip(got["eager_keep"][r]["params"], got["landed_keep"][r]["params"]):
            assert torch.equal(a, b)
    # eager: the all-reduce of the last sync (step 6) is not started; the landed run sends both
    assert got["eager"][0]["stats"]["comm_bytes"] * 2 == got["landed"][0]["stats"]["comm_bytes"]


# -- the clock, through the real Trainer -----------------------------------------------------------
def _eager_clock(t: float, steps: int, H: int, P: int, costs: list[float]) -> float:
    """A worker's modeled time under eager steps: compute t per step; after step s with h = H / P
    dividing s, fragment f waits for its previous all-reduce (if any), then starts its next (cost
    ``costs[f]``, if s + H <= steps) on the one stream (after the one before it)."""
    h, now, free, ends = H // P, 0.0, 0.0, {}
    for s in range(1, steps + 1):
        now += t
        if s % h == 0:
            f = (s // h - 1) % P
            if f in ends:
                now = max(now, ends.pop(f))
            if s + H <= steps:
                free = max(now, free) + costs[f]
                ends[f] = free
    return now


@pytest.mark.parametrize("steps_per_all_reduce", [2.5, 6.0])
def test_the_clock_overlaps_each_all_reduce_with_the_next_inner_phase(tmp_path, steps_per_all_reduce):
    """P = 1, H = 4, 12 steps of t = 10 ms on 2 workers, at the bandwidth where the model's
    all-reduce lasts 2.5 (or 6) inner steps: with eager steps it starts after steps 4 and 8 and is
    waited for 4 steps later, so at 2.5 steps the modeled time is the compute alone, 12 t, where
    the same run without eager steps waits 3 times (12 t + 3 c); at 6 steps the run waits c - 4 t
    at steps 8 and 12 (the closed form of :func:`_eager_clock`)."""
    t, steps, H = 0.01, 12, 4
    base = [*SMALL, f"max_steps={steps}", "algo=streaming_diloco", f"algo.local_steps={H}", "algo.fragments=1",
            "algo.fragment_sync_delay=0",
            "cluster.compute=profile", f"cluster.step_time_s={t}", "network.latency_us=10"]
    nbytes = sum(_units_bytes(compose_cfg(["debug=default", *base]), 1))
    gbps = nbytes * 8 / ((steps_per_all_reduce * t - 2 * 10e-6) * 1e9)
    c = 2 * 10e-6 + nbytes * 8 / (gbps * 1e9)
    assert c == pytest.approx(steps_per_all_reduce * t)
    over = [*base, f"network.bandwidth_gbps={gbps!r}"]
    eager, _ = train_cli(tmp_path, [*over, "algo.eager=true"], name="eager")
    landed, _ = train_cli(tmp_path, over, name="landed")
    assert eager[-1]["modeled_time_s"] == pytest.approx(_eager_clock(t, steps, H, 1, [c]), rel=1e-9)
    assert landed[-1]["modeled_time_s"] == pytest.approx(steps * t + 3 * c, rel=1e-9)
    if steps_per_all_reduce < H:
        assert eager[-1]["modeled_time_s"] == pytest.approx(steps * t, rel=1e-9)  # compute only: fully hidden
    else:
        assert eager[-1]["modeled_time_s"] == pytest.approx(steps * t + 2 * (c - H * t), rel=1e-9)
    # two all-reduces of the model (after steps 4 and 8), three landings without eager steps
    assert eager[-1]["comm_bytes"] == 2 * nbytes and landed[-1]["comm_bytes"] == 3 * nbytes
    assert eager[-1]["peak_step_bytes"] == landed[-1]["peak_step_bytes"] == nbytes  # 2 workers: 2 (n-1)/n = 1
