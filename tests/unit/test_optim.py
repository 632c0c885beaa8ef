"""optim=lamb follows the LAMB paper's update; optim.lr_scaling gives the documented rates;
schedule=inverse_sqrt is Vaswani et al.'s rate."""

from __future__ import annotations

import math

import pytest
import torch

from lsgd.errors import ConfigError
from lsgd.optim import build_optimizer, build_scheduler, lr_decay_steps, scaled_lr


def lamb_reference(params, grads_per_step, lr, betas, eps, wd):
    """You et al. (ICLR 2020) Algorithm 2 written out, per layer, in float64 with phi = identity."""
    b1, b2 = betas
    xs = [p.detach().double().clone() for p in params]
    m = [torch.zeros_like(x) for x in xs]
    v = [torch.zeros_like(x) for x in xs]
    for t, grads in enumerate(grads_per_step, start=1):
        for i, g in enumerate(grads):
            g = g.double()
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat = m[i] / (1 - b1**t)
            v_hat = v[i] / (1 - b2**t)
            r = m_hat / (v_hat.sqrt() + eps)
            update = r + wd * xs[i]
            x_norm, u_norm = xs[i].norm(), update.norm()
            trust = x_norm / u_norm if x_norm > 0 and u_norm > 0 else torch.tensor(1.0, dtype=torch.float64)
            xs[i] = xs[i] - lr * trust * update
    return xs


def test_lamb_matches_the_paper_update():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.zeros(4))]
    cfg = {"name": "lamb", "lr": 0.02, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01, "max_grad_norm": None}
    opt = build_optimizer(params, cfg)
    grads_per_step = [[torch.randn_like(p) for p in params] for _ in range(5)]
    expected = lamb_reference(params, grads_per_step, 0.02, (0.9, 0.999), 1e-6, 0.01)
    for grads in grads_per_step:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
    for p, ref in zip(params, expected):
        torch.testing.assert_close(p.detach().double(), ref, rtol=1e-5, atol=1e-6)
    # the zero-initialized layer moved (trust ratio 1 when ||x|| = 0), i.e. the adaptation is not skipped
    assert params[2].detach().abs().sum() > 0


@pytest.mark.parametrize(
    "rule, world, expected",
    [
        ("none", 8, 0.1),
        ("linear", 8, 0.1 * 8),
        ("sqrt", 8, 0.1 * math.sqrt(8)),
        ("adasum", 8, 0.1 * 2.0),      # capped at adasum_lr_factor
        ("adasum", 1, 0.1),
        ("linear", 1, 0.1),
    ],
)
def test_lr_scaling_rules(rule, world, expected):
    cfg = {"optim": {"lr": 0.1, "lr_scaling": rule, "base_batch_size": None, "adasum_lr_factor": 2.0},
           "batch_size": 32, "algo": {"name": "adasum"}}
    assert scaled_lr(cfg, world) == pytest.approx(expected)


def test_lr_scaling_base_batch_and_hierarchical():
    cfg = {"optim": {"lr": 0.1, "lr_scaling": "linear", "base_batch_size": 256}, "batch_size": 128, "algo": {}}
    assert scaled_lr(cfg, 4) == pytest.approx(0.1 * 512 / 256)
    cfg = {"optim": {"lr": 0.1, "lr_scaling": "adasum", "base_batch_size": 32, "adasum_lr_factor": 2.5},
           "batch_size": 32, "algo": {"hierarchical": True, "local_size": 4}}
    assert scaled_lr(cfg, 8) == pytest.approx(0.1 * 2.5 * 4)


def test_unknown_lr_scaling_names_the_key():
    with pytest.raises(ConfigError, match=r"optim\.lr_scaling"):
        scaled_lr({"optim": {"lr": 0.1, "lr_scaling": "cubic"}, "batch_size": 8}, 2)


def test_inverse_sqrt_is_vaswanis_rate():
    """lrate = d^-0.5 * min(n^-0.5, n * w^-1.5) for the n-th step (n from 1), d = 512, w = 4000,
    with optim.lr = d^-0.5 * w^-0.5 (Vaswani et al. 2017, Sec. 5.3), as the optimizer sees it."""
    d, w = 512, 4000
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(1))], {"name": "adamw", "lr": d**-0.5 * w**-0.5})
    sched = build_scheduler(opt, {"name": "inverse_sqrt", "warmup_steps": w}, steps_per_epoch=100, total_steps=10**6)
    seen = {}
    for n in range(1, 20001):  # the rate of step n, then the step
        seen[n] = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
    for n in (1, 2, 1000, 3999, 4000, 4001, 10000, 20000):
        assert seen[n] == pytest.approx(d**-0.5 * min(n**-0.5, n * w**-1.5), rel=1e-12), n
    assert max(seen, key=seen.get) == w and seen[w] == pytest.approx(6.99e-4, rel=1e-3)
    assert lr_decay_steps({"name": "inverse_sqrt", "warmup_steps": w}, 100) == ()
    with pytest.raises(ConfigError, match=r"schedule\.warmup_steps"):
        build_scheduler(opt, {"name": "inverse_sqrt", "warmup_steps": 0}, 100, 1000)
