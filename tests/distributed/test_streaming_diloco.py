"""Streaming DiLoCo (lsgd/algorithms/averaging/streaming_diloco.py) on real gloo groups:

* against torchft 0.2.0's ``DiLoCo`` (the reference implementation: ``torchft/local_sgd.py``) on the
  same model, data, inner optimizer and schedule, 2 fragments x delay {0, 1} x alpha {0, 0.5, 1}:
  lsgd on 2 gloo ranks in the trainer's hook order, torchft as 2 replicas on threads of this process
  whose Manager is a stub (an all-reduce that sums the replicas' tensors in rank order and divides by
  their number, as torchft's Manager does; a commit counter as ``current_step``);
* against an independent single-process simulation of the N workers (the update rule written out,
  a brute-force low-precision reference), with a schedule running, BatchNorm buffers, quantization;
* through the real Trainer: one fragment without delay or mixing is DiLoCo, ``peak_step_bytes``
  is the largest fragment's all-reduce, and the cluster clock overlaps a fragment's all-reduce
  with the tau inner steps after it starts.

torchft's quantized all-reduce (``should_quantize=True``) needs Triton kernels on a GPU: on a CPU it
fails inside the Manager. The low-precision formats are checked against the brute-force reference
here and in tests/unit/test_streaming_diloco_pieces.py, not against torchft.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from hook_runs import (ADAMW, SMALL, assert_matches_reference, inner_optimizers, local_step, one_thread,
                       run_hook_order, run_jobs)
from test_algorithms import SGD_M, SPE, WARMUP_COSINE
from torch import nn
from trainer_runs import compose_cfg, train as train_cli

from lsgd.training.optim import build_optimizer, build_scheduler

D, B = 16, 8
OUTER_LR, MU = 0.7, 0.9


def make_model(kind: str, dtype=torch.float32) -> nn.Module:
    """``mlp4``: four equal Linear(16, 16) units; ``bn``: Linear, BatchNorm, Linear (three units,
    the BatchNorm's statistics travel with its fragment)."""
    torch.manual_seed(0)
    if kind == "mlp4":
        model = nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, D), nn.Tanh(), nn.Linear(D, D), nn.Tanh(),
                              nn.Linear(D, D))
    else:
        # no bias before the BatchNorm: its gradient would be rounding noise, which AdamW scales up
        model = nn.Sequential(nn.Linear(D, D, bias=False), nn.BatchNorm1d(D), nn.Tanh(), nn.Linear(D, 4))
    return model.to(dtype)


#: per model, its units' parameter indices and buffer owners, written out by hand (the split rule:
#: fragment p holds units p, p + P, ...)
UNITS = {"mlp4": [[0, 1], [2, 3], [4, 5], [6, 7]], "bn": [[0], [1, 2], [3, 4]]}


def fragments_of(kind: str, P: int) -> list[list[int]]:
    units = UNITS[kind]
    return [sorted(i for u in units[p::P] for i in u) for p in range(P)]


def bn_fragment(kind: str, P: int) -> int | None:
    """The fragment holding the BatchNorm (unit 1) and so its statistics."""
    return 1 % P if kind == "bn" else None


def batch(rank: int, step: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(B, D, generator=g).to(dtype), torch.randint(0, 4, (B,), generator=g)


# -- lsgd on gloo ranks, the trainer's hook order ------------------------------------------------
def _lsgd_job(rank, world, kind, algo_cfg, optim_cfg, steps, dtype):
    dtype = getattr(torch, dtype)
    return run_hook_order(rank, world, make_model(kind, dtype), algo_cfg, optim_cfg, steps,
                          lambda step: batch(rank, step, dtype), B)


def run_lsgd(tmp_path, jobs) -> dict[str, list[dict]]:
    """Every job ``(world, name, kind, algo_cfg, optim_cfg, steps, dtype)`` on gloo ranks in the
    trainer's hook order (hook_runs.run_hook_order); per name the ranks' parameters, buffers, stats."""
    return run_jobs(tmp_path, _lsgd_job, jobs)


def algo_cfg(H, P, tau=0, alpha=0.0, quantization="none", **kw):
    return {"name": "streaming_diloco", "local_steps": H, "fragments": P, "fragment_sync_delay": tau,
            "fragment_update_alpha": alpha, "outer_optimizer": "nesterov", "outer_lr": OUTER_LR,
            "outer_momentum": MU, "quantization": quantization, "average_buffers": True, **kw}


# -- torchft's DiLoCo on threads, a stub Manager ---------------------------------------------------
class _World:
    """The replicas' all-reduces, matched by call order: SUM in rank order, then / n (torchft's
    Manager.allreduce: a SUM all-reduce and ``tensor /= num_participants``)."""

    def __init__(self, n: int):
        self.n, self.cond = n, threading.Condition()
        self.inputs: dict[int, dict[int, torch.Tensor]] = {}
        self.sums: dict[int, torch.Tensor] = {}


class _Work:
    def __init__(self, world: _World, k: int, tensor: torch.Tensor):
        self.world, self.k, self.tensor = world, k, tensor

    def wait(self, timeout=None) -> bool:
        w = self.world
        with w.cond:
            if not w.cond.wait_for(lambda: len(w.inputs[self.k]) == w.n, timeout=60):
                raise TimeoutError(f"all-reduce {self.k}: a replica never joined")
            if self.k not in w.sums:
                ins = w.inputs[self.k]
                total = ins[0].clone()
                for r in range(1, w.n):
                    total += ins[r]
                w.sums[self.k] = total
            total = w.sums[self.k]
        with torch.no_grad():
            self.tensor.copy_(total)
            self.tensor /= w.n
        return True


class StubManager:
    """What torchft's DiLoCo calls of its Manager, for one replica that always commits."""

    _use_async_quorum = False

    def __init__(self, world: _World, rank: int):
        self.world, self.rank, self.step, self.calls = world, rank, 0, 0

    def allreduce(self, tensor, should_quantize=False, reduce_op=None):
        assert not should_quantize, "the stub does not quantize"
        k, self.calls = self.calls, self.calls + 1
        with self.world.cond:
            self.world.inputs.setdefault(k, {})[self.rank] = tensor.detach().clone()
            self.world.cond.notify_all()
        return _Work(self.world, k, tensor)

    def current_step(self) -> int:
        return self.step

    def should_commit(self, timeout=None) -> bool:
        self.step += 1
        return True

    def num_participants(self) -> int:
        return self.world.n

    def start_quorum(self, *a, **k): ...
    def wait_quorum(self, *a, **k): ...
    def register_state_dict_fn(self, *a, **k): ...
    def allow_state_dict_read(self, *a, **k): ...
    def disallow_state_dict_read(self, *a, **k): ...


def run_torchft(world: int, kind: str, H: int, P: int, tau: int, alpha: float, optim_cfg: dict, steps: int,
                dtype=torch.float64) -> list[list[torch.Tensor]]:
    """torchft's DiLoCo on ``world`` replicas (threads): per replica its final parameters."""
    from torchft.local_sgd import DiLoCo

    shared = _World(world)
    models = [make_model(kind, dtype) for _ in range(world)]
    errors: list[BaseException] = []

    def replica(rank: int) -> None:
        try:
            model = models[rank]
            opt = build_optimizer(model.parameters(), optim_cfg)
            sched = build_scheduler(opt, WARMUP_COSINE, SPE, steps)
            units = [m for m in model if any(True for _ in m.parameters(recurse=False))]
            frags = [nn.ModuleList(units[p::P]) for p in range(P)]
            outer = [torch.optim.SGD(f.parameters(), lr=OUTER_LR, momentum=MU, nesterov=True) for f in frags]
            with DiLoCo(StubManager(shared, rank), frags, opt, outer, sync_every=H, fragment_sync_delay=tau,
                        fragment_update_alpha=alpha):
                for step in range(steps):
                    x, y = batch(rank, step, dtype)
                    loss = F.cross_entropy(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()  # torchft's post-hook counts the step, starts and lands fragments
                    sched.step()
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test)
            errors.append(exc)

    threads = [threading.Thread(target=replica, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return [[p.detach().clone() for p in m.parameters()] for m in models]


TORCHFT_GRID = [(tau, alpha) for tau in (0, 1) for alpha in (0.0, 0.5, 1.0)]


def test_matches_torchft_diloco(tmp_path):
    """2 replicas, 4 equal Linear units in 2 strided fragments, sync_every 4 (each fragment lands
    every 4 steps, one every 2), 12 steps of AdamW under warm-up + cosine, float64: lsgd's parameters
    are torchft's to 1e-12 for every delay and alpha (the sums' order differs: gloo's ring, the stub's
    rank order)."""
    pytest.importorskip("torchft", reason="torchft (the reference implementation) is not installed: "
                                          "pip install torchft==0.2.0 (the dev extra)")
    world, H, P, steps = 2, 4, 2, 12
    jobs = [(world, f"tau{tau}_alpha{alpha}", "mlp4", algo_cfg(H, P, tau, alpha), ADAMW, steps, "float64")
            for tau, alpha in TORCHFT_GRID]
    got = run_lsgd(tmp_path, jobs)
    local = run_lsgd_free(world, "mlp4", ADAMW, steps)
    for (_, name, *_), (tau, alpha) in zip(jobs, TORCHFT_GRID):
        want = run_torchft(world, "mlp4", H, P, tau, alpha, ADAMW, steps)
        for r in range(world):
            for g, w in zip(got[name][r]["params"], want[r]):
                torch.testing.assert_close(g, w, rtol=0, atol=1e-12, msg=f"{name} rank {r}")
        # the comparison can fail: every run's model moved off pure local training (alpha = 1 moves
        # only the stored globals, so its parameters stay the local ones, as in torchft)
        moved = any(not torch.allclose(g, lo, rtol=0, atol=1e-9) for g, lo in zip(got[name][0]["params"], local[0]))
        assert moved == (alpha < 1.0), name
        # one all-reduce of a fragment (half of the model, float64) per landing
        assert got[name][0]["stats"]["comm_bytes"] == steps // (H // P) * 2 * (D * D + D) * 8


def run_lsgd_free(world, kind, optim_cfg, steps, dtype=torch.float64):
    """Each worker's model after ``steps`` local steps with no synchronization (what alpha = 1 keeps)."""
    models = [make_model(kind, dtype) for _ in range(world)]
    opts, scheds = inner_optimizers(models, optim_cfg, steps)
    for step in range(steps):
        local_step(models, opts, scheds, lambda rank, step: batch(rank, step, dtype), step)
    return [[p.detach().clone() for p in model.parameters()] for model in models]


# -- an independent single-process simulation -----------------------------------------------------
FMAX = {"int8": 127.0, "fp8": 448.0, "fp4": 6.0}
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _grid(fmt):
    """(representable values, whether each value's encoding is even)."""
    if fmt == "fp8":
        codes = torch.arange(256, dtype=torch.uint8)
        values = codes.view(torch.float8_e4m3fn).float()
        keep = torch.isfinite(values)
        return values[keep], (codes[keep] % 2 == 0)
    idx = torch.arange(8)
    return torch.cat([_E2M1, -_E2M1]), torch.cat([idx % 2 == 0, idx % 2 == 0])


def ref_quantize(t: torch.Tensor, fmt: str) -> torch.Tensor:
    """Row-wise float32 scale FMAX / max|row|; the nearest value (ties to the even encoding),
    int8 truncated toward zero; divided by the scale."""
    if fmt == "none":
        return t
    rows = (t.reshape(t.shape[0], -1) if t.dim() >= 2 else t.reshape(1, -1)).float()
    m = rows.abs().amax(1, keepdim=True)
    scale = torch.where(m > 0, torch.tensor(FMAX[fmt]) / m, torch.ones_like(m))
    y = rows * scale
    if fmt == "int8":
        q = torch.trunc(y)
    else:
        values, even = _grid(fmt)
        d = (y[..., None] - values).abs()
        best = d == d.min(-1, keepdim=True).values
        pref = best & even
        idx = torch.where(pref.any(-1), pref.float().argmax(-1), best.float().argmax(-1))
        q = values[idx]
    return (q / scale).reshape(t.shape).to(t.dtype)


def reference(world, kind, H, P, tau, alpha, fmt, optim_cfg, steps):
    """The N workers in one process: inner steps under the schedule; after step s, fragment
    ((s + tau) / h - 1) mod P starts when h divides s + tau (each worker's Q(global - local) summed,
    its BatchNorm statistics summed), fragment (s / h - 1) mod P lands when h divides s: Delta =
    Q(sum) / N, Nesterov b <- mu b + Delta, global <- global - lr (Delta + mu b), local <- global +
    alpha (local - global), statistics <- avg + alpha (local - avg).

    Written with the torch operations torch's SGD and torchft's merge use (``add`` with ``alpha``,
    ``lerp``), so that the values the quantizer reads are the implementation's to the bit on 2
    workers (whose sum has one order): int8 truncates, so a last-bit difference before it moves a
    value by a whole level."""
    h = H // P
    models = [make_model(kind) for _ in range(world)]
    opts, scheds = inner_optimizers(models, optim_cfg, steps)
    frags = fragments_of(kind, P)
    glob = [p.detach().clone() for p in models[0].parameters()]
    mom: list = [None] * len(glob)
    bn_frag = bn_fragment(kind, P)
    sent = 0
    flight = None
    for step in range(steps):
        local_step(models, opts, scheds, batch, step)
        done = step + 1
        if (done + tau) % h == 0 and done + tau <= steps:
            f = ((done + tau) // h - 1) % P
            params = [list(m.parameters()) for m in models]
            sums = {}
            for i in frags[f]:
                deltas = [ref_quantize((glob[i] - params[r][i]).detach(), fmt) for r in range(world)]
                total = deltas[0].clone()
                for dlt in deltas[1:]:
                    total += dlt
                sums[i] = total
                sent += ref_nbytes(glob[i], fmt)
            stats = None
            if bn_frag == f:
                bufs = [[m[1].running_mean.clone(), m[1].running_var.clone()] for m in models]
                stats = [sum(b[j] for b in bufs) for j in range(2)]
                sent += 2 * D * 4
            flight = (f, sums, stats)
        if done % h == 0:
            f, sums, stats = flight
            assert f == (done // h - 1) % P
            with torch.no_grad():
                for i, total in sums.items():
                    delta = ref_quantize(total, fmt) / world
                    mom[i] = delta.clone() if mom[i] is None else mom[i].mul(MU).add(delta)
                    glob[i] = glob[i].add(delta.add(mom[i], alpha=MU), alpha=-OUTER_LR)
                    for m in models:
                        p = list(m.parameters())[i]
                        p.copy_(glob[i].lerp(p, alpha))
                if stats is not None:
                    for m in models:
                        for buf, total in zip((m[1].running_mean, m[1].running_var), stats):
                            buf.copy_((total / world).lerp(buf, alpha))
            flight = None
    return models, sent


def ref_nbytes(t, fmt):
    if fmt == "none":
        return t.numel() * 4
    rows = t.shape[0] if t.dim() >= 2 else 1
    bits = 4 if fmt == "fp4" else 8
    return rows * (4 + -(-(t.numel() // rows) * bits // 8))


#: (world, model, H, P, tau, alpha, quantization, inner optimizer)
SETTINGS = [
    (2, "bn", 4, 2, 1, 0.5, "fp4", ADAMW),
    (2, "bn", 6, 1, 2, 0.0, "int8", SGD_M),
    (2, "mlp4", 8, 4, 1, 0.3, "fp8", ADAMW),
    (4, "mlp4", 4, 2, 1, 0.0, "fp4", SGD_M),
]


def test_equals_the_update_rule_on_n_workers(tmp_path):
    """The trainer's hook order with warm-up + cosine running, on 2 and 4 gloo ranks, against the
    single-process simulation: parameters and BatchNorm statistics (bit for bit on 2 workers), the
    bytes sent (bits and scales of each quantized outer gradient, float32 statistics) and rounds."""
    steps = 12
    got = run_lsgd(tmp_path, [(world, f"s{n}", kind, algo_cfg(H, P, tau, alpha, fmt), opt, steps, "float32")
                              for n, (world, kind, H, P, tau, alpha, fmt, opt) in enumerate(SETTINGS)])
    with one_thread():
        wanted = [reference(world, kind, H, P, tau, alpha, fmt, opt, steps)
                  for world, kind, H, P, tau, alpha, fmt, opt in SETTINGS]
    for n, ((world, kind, H, P, *_), (want, sent)) in enumerate(zip(SETTINGS, wanted)):
        atol = 0 if world == 2 else 1e-6  # 2 workers: bit for bit; 4: gloo's ring sums in another order
        assert_matches_reference(got[f"s{n}"], want, atol, f"setting {n}")
        assert got[f"s{n}"][0]["stats"]["comm_bytes"] == sent
        assert got[f"s{n}"][0]["stats"]["comm_rounds"] == steps // (H // P)


def test_peak_step_bytes_of_p_equal_fragments_is_one_pth_of_diloco(tmp_path):
    """Four equal units: each step's largest all-reduce is one fragment's, peak_step_bytes =
    2 (n - 1) / n x (the model's bytes / P) for P = 1, 2, 4 (P = 1: DiLoCo's)."""
    world, steps = 2, 8
    jobs = [(world, f"P{P}", "mlp4", algo_cfg(4, P, 0, 0.0), ADAMW, steps, "float32") for P in (1, 2, 4)]
    jobs.append((world, "diloco", "mlp4", {"name": "diloco", "local_steps": 4}, ADAMW, steps, "float32"))
    got = run_lsgd(tmp_path, jobs)
    model_bytes = 4 * (D * D + D) * 4
    ring = 2 * (world - 1) / world
    assert got["diloco"][0]["stats"]["peak_step_bytes"] == ring * model_bytes
    for P in (1, 2, 4):
        stats = got[f"P{P}"][0]["stats"]
        assert stats["peak_step_bytes"] == ring * model_bytes / P
        assert stats["wire_bytes"] == ring * model_bytes * steps / 4  # P landings of 1 / P of the model per 4 steps


# -- through the real Trainer -------------------------------------------------------------------
def _units_bytes(cfg: dict, P: int) -> list[int]:
    """Each fragment's bytes (parameters and floating buffers) of the run's model, by the split
    rule written out here: units are modules with parameters of their own, strided by P."""
    from lsgd.data import dataset_info
    from lsgd.models import build_model

    model = build_model(cfg["model"], dataset_info(cfg["dataset"]))
    units = []
    for m in model.modules():
        own = list(m.parameters(recurse=False)) + [b for b in m.buffers(recurse=False) if b.is_floating_point()]
        if own:
            units.append(sum(t.numel() * t.element_size() for t in own))
    return [sum(units[p::P]) for p in range(P)]


def test_one_fragment_without_delay_or_mixing_is_diloco(tmp_path):
    """P = 1, tau = 0, alpha = 0 through the Trainer (float64, the cnn with BatchNorm, warm-up +
    cosine): DiLoCo's losses and final models to 1e-12 (the outer gradient is averaged after the
    subtraction, DiLoCo subtracts the average: not bit for bit), and exactly its bytes, rounds,
    modeled time and peak_step_bytes."""
    common = [*SMALL, "dtype=float64", "algo.local_steps=4"]
    d_recs, d_models = train_cli(tmp_path, ["algo=diloco", *common], name="diloco")
    s_recs, s_models = train_cli(tmp_path, ["algo=streaming_diloco", "algo.fragments=1", "algo.fragment_sync_delay=0",
                                            "algo.fragment_update_alpha=0", *common], name="streaming")
    for d, s in zip(d_recs, s_recs):
        assert s["train_loss"] == pytest.approx(d["train_loss"], rel=1e-12, abs=0)
        for key in ("step", "comm_bytes", "wire_bytes", "comm_rounds", "model_alpha_terms", "model_beta_bytes",
                    "peak_step_bytes", "modeled_time_s", "modeled_time_1gbps_s"):
            assert s[key] == d[key], (key, d["step"])
    for r in range(2):
        want, got = d_models[r], s_models[r]
        for ds, ss in zip(want["params"] + want["buffers"], got["params"] + got["buffers"]):
            torch.testing.assert_close(ss, ds, rtol=1e-12, atol=1e-14)
    cfg = compose_cfg(["debug=default", *common, "algo=diloco"])
    assert d_recs[-1]["peak_step_bytes"] == 2 * (2 - 1) / 2 * sum(_units_bytes(cfg, 1)) * 2  # float64: 8 bytes
    assert d_recs[-1]["comm_rounds"] == 3


def test_peak_step_bytes_is_the_largest_fragment(tmp_path):
    """The cnn's six units (conv, BatchNorm, conv, BatchNorm, linear, linear) in 2 or 3 strided
    fragments: peak_step_bytes is the largest fragment's all-reduce (2 workers: its bytes)."""
    for P in (2, 3):
        over = [*SMALL, "algo=streaming_diloco", "algo.local_steps=6", f"algo.fragments={P}"]
        recs, _ = train_cli(tmp_path, over, name=f"P{P}")
        cfg = compose_cfg(["debug=default", *over])
        sizes = _units_bytes(cfg, P)
        assert recs[-1]["peak_step_bytes"] == max(sizes)
        assert recs[-1]["comm_bytes"] == sum(sizes[f % P] for f in range(12 // (6 // P)))


def _clock(t: float, steps: int, h: int, tau: int, costs: list[float]) -> float:
    """A worker's modeled time: compute t per step; fragment f's all-reduce (cost ``costs[f]``)
    issued after step s - tau, waited for after step s (both workers alike)."""
    now, end = 0.0, None
    P = len(costs)
    for s in range(1, steps + 1):
        now += t
        if (s + tau) % h == 0 and s + tau <= steps:
            end = now + costs[((s + tau) // h - 1) % P]
        if s % h == 0:
            now = max(now, end)
    return now


@pytest.mark.parametrize("gbps", [0.0005, 10.0])
def test_the_fragment_all_reduce_overlaps_tau_inner_steps(tmp_path, gbps):
    """H = 4, P = 2 (a fragment lands every 2 steps), 8 steps of t = 10 ms on 2 workers: with
    tau = 0 each landing waits for its all-reduce, c_f = 2 alpha + n_f beta; with tau = 1 the
    all-reduce started a step earlier hides behind that step (all of it at 10 Gbps, c_f - t of it
    at 0.5 Mbit/s), so the modeled time is shorter than tau = 0's."""
    t, steps = 0.01, 8
    over = [*SMALL, f"max_steps={steps}", "algo=streaming_diloco", "algo.local_steps=4", "algo.fragments=2",
            "cluster.compute=profile", f"cluster.step_time_s={t}", f"network.bandwidth_gbps={gbps}",
            "network.latency_us=10"]
    cfg = compose_cfg(["debug=default", *over])
    costs = [2 * 10e-6 + n * 8 / (gbps * 1e9) for n in _units_bytes(cfg, 2)]
    times = {}
    for tau in (0, 1):
        recs, _ = train_cli(tmp_path, [*over, f"algo.fragment_sync_delay={tau}"], name=f"tau{tau}")
        times[tau] = recs[-1]["modeled_time_s"]
        assert times[tau] == pytest.approx(_clock(t, steps, 2, tau, costs), rel=1e-9)
    assert times[1] < times[0]
    if gbps == 10.0:
        assert times[1] == pytest.approx(steps * t, rel=1e-9)  # every all-reduce hidden
    else:
        assert min(costs) > t  # none hidden entirely: each landing waits c_f - t
