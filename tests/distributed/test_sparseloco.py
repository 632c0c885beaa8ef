"""SparseLoCo (lsgd/algorithms/averaging/sparseloco.py) on real gloo groups:

* against an independent single-process simulation of the N workers (the update rule written out:
  error feedback, the top-k of each chunk chosen by sorting each chunk's elements in Python, the
  authors' statistical quantizer element by element), in the trainer's hook order with warm-up +
  cosine running, with BatchNorm statistics, both aggregations, 2, 3 and 4 workers: the models,
  the bytes of every round against the closed form, ``peak_step_bytes`` and the rounds;
* through the real Trainer: every element kept at full precision without error feedback is DiLoCo
  with the SGD outer optimizer at the same rate, and a run's bytes are the closed form of the model.

The authors' reference (github.com/tplr-ai/SparseLoCo) is a GPU training script over NCCL, not a
library: it is not run here; its compressor is written out in the reference below and in
tests/unit/test_sparseloco_pieces.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from hook_runs import (ADAMW, SMALL, assert_matches_reference, inner_optimizers, local_step, one_thread,
                       run_hook_order, run_jobs)
from test_algorithms import SGD_M
from torch import nn
from trainer_runs import compose_cfg, train as train_cli

D, B = 16, 8


def make_model(kind: str) -> nn.Module:
    """``mlp``: Linear(16, 16), Tanh, Linear(16, 16), Tanh, Linear(16, 4); ``bn``: Linear (no bias),
    BatchNorm, Tanh, Linear(16, 4). float64."""
    torch.manual_seed(0)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, D), nn.Tanh(), nn.Linear(D, 4))
    else:
        model = nn.Sequential(nn.Linear(D, D, bias=False), nn.BatchNorm1d(D), nn.Tanh(), nn.Linear(D, 4))
    return model.double()


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(B, D, generator=g, dtype=torch.float64), torch.randint(0, 4, (B,), generator=g)


def algo_cfg(H, chunk, topk, bits, beta, alpha, aggregate):
    return {"name": "sparseloco", "local_steps": H, "chunk": chunk, "topk": topk, "bits": bits, "error_decay": beta,
            "outer_lr": alpha, "aggregate": aggregate, "quantization_range": 6.0, "average_buffers": True}


def _lsgd_job(rank, world, kind, acfg, optim_cfg, steps):
    return run_hook_order(rank, world, make_model(kind), acfg, optim_cfg, steps, lambda step: batch(rank, step), B)


def run_lsgd(tmp_path, jobs):
    """Every job ``(world, name, kind, algo_cfg, optim_cfg, steps)`` on gloo ranks in the trainer's
    hook order (hook_runs.run_hook_order); per name the ranks' parameters, buffers, stats."""
    return run_jobs(tmp_path, _lsgd_job, jobs)


# -- the independent simulation ----------------------------------------------------------------------
def chunks_of(shape, chunk):
    """Each chunk's elements as flat indices into the tensor (row-major): a matrix (a tensor of more
    dimensions read as [shape[0], rest]) in tiles of the largest divisors not above chunk, read row
    by row; a vector in pieces."""
    numel = math.prod(shape)
    if len(shape) >= 2:
        rows, cols = shape[0], numel // shape[0]
        h = max(d for d in range(1, chunk + 1) if rows % d == 0)
        w = max(d for d in range(1, chunk + 1) if cols % d == 0)
        return [[(y * h + i) * cols + x * w + j for i in range(h) for j in range(w)]
                for y in range(rows // h) for x in range(cols // w)]
    s = max(d for d in range(1, chunk + 1) if numel % d == 0)
    return [list(range(c * s, (c + 1) * s)) for c in range(numel // s)]


def ref_quantize(values: torch.Tensor, bits: int, span: float) -> torch.Tensor:
    """The authors' quantizer: shift the mean, 2^bits bins of span sigma / 2^bits (sigma: unbiased
    std), each value read as its bin's mean (float32, as it travels) plus the shift (float32)."""
    bins = 2**bits
    m = values.numel()
    shift = values.sum() / m
    c = values - shift
    sigma = torch.sqrt((c * c).sum() / (m - 1)) if m > 1 else torch.zeros((), dtype=values.dtype)
    s = span * sigma / bins
    if not (float(s) > 0 and math.isfinite(float(s))):
        s = torch.ones((), dtype=values.dtype)
    out = torch.empty(m, dtype=torch.float32)
    codes = [min(max(round(float(x / s) + bins // 2), 0), bins - 1) for x in c]
    for b in range(bins):
        mine = [j for j, code in enumerate(codes) if code == b]
        mean = (sum(float(c[j]) for j in mine) / len(mine)) if mine else 0.0
        for j in mine:
            out[j] = torch.tensor(mean, dtype=torch.float32) + shift.to(torch.float32)
    return out.to(values.dtype)


def ref_compress(e: torch.Tensor, chunk: int, topk: int, bits: int, span: float):
    """(the dense sparse-quantized tensor, its kept flat positions, the payload bytes)."""
    flat = e.reshape(-1)
    positions = []
    chunks = chunks_of(tuple(e.shape), chunk)
    L = len(chunks[0])
    k = min(L, max(1, round(L * topk / chunk**2)))
    for members in chunks:
        order = sorted(range(L), key=lambda j: (-abs(float(flat[members[j]])), j))[:k]
        positions += [members[j] for j in order]
    pos = torch.tensor(positions)
    vals = flat[pos].clone()
    if bits:
        vals = ref_quantize(vals, bits, span)
    dense = torch.zeros_like(flat)
    dense[pos] = vals
    K, width = len(positions), max(1, math.ceil(math.log2(L)))
    nbytes = -(-K * width // 8) + (K * e.element_size() if bits == 0 else -(-K * bits // 8) + 4 * (1 + 2**bits))
    return dense.reshape(e.shape), pos, nbytes


def reference(world, kind, H, chunk, topk, bits, beta, alpha, aggregate, optim_cfg, steps):
    """The N workers in one process: inner steps under the schedule; after every H-th step each
    worker's e <- beta e + (theta - theta_i), its Delta_hat = Q(top-k of each chunk of e), e <- e -
    Delta_hat; theta <- theta - alpha x (the sum of the Delta_hat over the workers, divided by the
    workers or, for ``selected``, by the workers that kept the element); BatchNorm statistics
    averaged. Returns the models and one round's bytes (payload, buffers)."""
    models = [make_model(kind) for _ in range(world)]
    opts, scheds = inner_optimizers(models, optim_cfg, steps)
    theta = [p.detach().clone() for p in models[0].parameters()]
    errors = [[torch.zeros_like(t) for t in theta] for _ in range(world)]
    payload = buffer_bytes = 0
    for step in range(steps):
        local_step(models, opts, scheds, batch, step)
        if (step + 1) % H:
            continue
        with torch.no_grad():
            payload = 0
            for i, t in enumerate(theta):
                total, count = torch.zeros_like(t), torch.zeros_like(t)
                for r, m in enumerate(models):
                    p = list(m.parameters())[i]
                    errors[r][i] = beta * errors[r][i] + (t - p)
                    dense, pos, nbytes = ref_compress(errors[r][i], chunk, topk, bits, 6.0)
                    errors[r][i] = errors[r][i] - dense
                    total = total + dense
                    count.view(-1)[pos] += 1
                payload += nbytes
                if aggregate == "mean":
                    mean = total / world
                else:
                    mean = torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))
                theta[i] = t - alpha * mean
                for m in models:
                    list(m.parameters())[i].copy_(theta[i])
            bufs = [[b for b in m.buffers() if b.is_floating_point()] for m in models]
            buffer_bytes = sum(b.numel() * b.element_size() for b in bufs[0])
            for j in range(len(bufs[0])):
                avg = sum(bb[j] for bb in bufs) / world
                for bb in bufs:
                    bb[j].copy_(avg)
    return models, payload, buffer_bytes


#: (world, model, H, chunk, topk, bits, beta, alpha, aggregate, inner optimizer): tiles of 4 x 4
#: keeping 6 (a vector's pieces of 4 keep round(1.5) = 2), of 8 x 8 keeping 20 (pieces of 8:
#: round(2.5) = 2), 1- and 2-bit codes and full precision
SETTINGS = [
    (2, "bn", 3, 4, 6, 2, 0.9, 0.8, "mean", ADAMW),
    (2, "mlp", 4, 8, 20, 0, 0.95, 1.0, "selected", SGD_M),
    (3, "bn", 2, 8, 16, 1, 0.5, 1.0, "mean", ADAMW),
    (4, "mlp", 3, 4, 5, 2, 0.95, 1.0, "selected", ADAMW),
]


def test_equals_the_update_rule_on_n_workers(tmp_path):
    """The trainer's hook order with warm-up + cosine running, on 2, 3 and 4 gloo ranks, against
    the single-process simulation (float64): parameters and BatchNorm statistics to 1e-12; per
    round one all-gather of the payload (indices, codes and scales: the closed form) and a float
    all-reduce of the statistics, so comm_bytes, wire bytes and peak_step_bytes exactly."""
    steps = 12
    got = run_lsgd(tmp_path, [(world, f"s{n}", kind, algo_cfg(H, chunk, topk, bits, beta, alpha, agg), opt, steps)
                              for n, (world, kind, H, chunk, topk, bits, beta, alpha, agg, opt) in enumerate(SETTINGS)])
    with one_thread():
        wanted = [reference(*setting, steps) for setting in SETTINGS]
    for n, ((world, kind, H, *_), (want, payload, buffers)) in enumerate(zip(SETTINGS, wanted)):
        assert_matches_reference(got[f"s{n}"], want, 1e-12, f"setting {n}")
        rounds = steps // H
        stats = got[f"s{n}"][0]["stats"]
        assert stats["comm_rounds"] == rounds
        assert stats["comm_bytes"] == rounds * (payload + buffers)
        wire = (world - 1) * payload + 2 * (world - 1) / world * buffers
        assert stats["wire_bytes"] == pytest.approx(rounds * wire, rel=1e-12)
        assert stats["peak_step_bytes"] == pytest.approx(wire, rel=1e-12)
        # the comparison can fail: the workers' models moved together, off their own local training
        assert not torch.equal(got[f"s{n}"][0]["params"][0], make_model(kind).state_dict()["0.weight"])


# -- through the real Trainer -------------------------------------------------------------------
def test_every_element_at_full_precision_without_error_feedback_is_diloco_with_sgd(tmp_path):
    """topk = chunk^2 (every element kept), bits = 0, error_decay = 0: e = Delta, Delta_hat = Delta,
    e = 0, theta <- theta - alpha mean(Delta): DiLoCo with outer SGD at lr alpha. Through the Trainer
    (float64, the cnn with BatchNorm, warm-up + cosine): DiLoCo's losses and final models to 1e-12
    (DiLoCo subtracts the average model, SparseLoCo averages the differences: not bit for bit), the
    same rounds."""
    common = [*SMALL, "dtype=float64", "algo.local_steps=4", "algo.outer_lr=0.7"]
    d_recs, d_models = train_cli(tmp_path, ["algo=diloco", "algo.outer_optimizer=sgd", *common], name="diloco")
    s_recs, s_models = train_cli(tmp_path, ["algo=sparseloco", "algo.topk=4096", "algo.bits=0", "algo.error_decay=0",
                                            *common], name="sparseloco")
    for d, s in zip(d_recs, s_recs):
        assert s["train_loss"] == pytest.approx(d["train_loss"], rel=1e-12, abs=0)
        assert (s["step"], s["comm_rounds"]) == (d["step"], d["comm_rounds"])
    assert d_recs[-1]["comm_rounds"] == 3
    for r in range(2):
        for ds, ss in zip(d_models[r]["params"] + d_models[r]["buffers"], s_models[r]["params"] + s_models[r]["buffers"]):
            torch.testing.assert_close(ss, ds, rtol=1e-12, atol=1e-14)


def _payload_by_hand(cfg: dict, chunk: int, topk: int, bits: int) -> tuple[int, int]:
    """(the payload's bytes, the float buffers' bytes) of the run's model, from its parameter
    shapes: per tensor K = chunks x k values, ceil(log2 L)-bit indices, b-bit codes and 4 (1 + 2^b)
    bytes of scales (float32)."""
    from lsgd.data import dataset_info
    from lsgd.models import build_model

    model = build_model(cfg["model"], dataset_info(cfg["dataset"]))
    total = 0
    for p in model.parameters():
        chunks = chunks_of(tuple(p.shape), chunk)
        L = len(chunks[0])
        K = len(chunks) * min(L, max(1, round(L * topk / chunk**2)))
        total += -(-K * max(1, math.ceil(math.log2(L))) // 8) + -(-K * bits // 8) + 4 * (1 + 2**bits)
    buffers = sum(b.numel() * 4 for b in model.buffers() if b.is_floating_point())
    return total, buffers


def test_a_runs_bytes_are_the_closed_form_of_its_model(tmp_path):
    """The cnn with the defaults (chunk 64, topk 128, 2 bits) and H = 4 on 3 workers: 3 rounds, each
    an all-gather of the payload (wire: 2 x payload) and the BatchNorm statistics' all-reduce; the
    peak step is a round."""
    over = [*SMALL, "epochs=2", "algo=sparseloco", "algo.local_steps=4"]
    recs, _ = train_cli(tmp_path, over, world=3, name="cnn")
    payload, buffers = _payload_by_hand(compose_cfg(["debug=default", *over]), 64, 128, 2)
    last = recs[-1]
    assert last["comm_rounds"] == 3
    assert last["comm_bytes"] == 3 * (payload + buffers)
    assert last["peak_step_bytes"] == pytest.approx(2 * payload + 2 * 2 / 3 * buffers, rel=1e-12)
    assert last["wire_bytes"] == pytest.approx(3 * (2 * payload + 4 / 3 * buffers), rel=1e-12)
