"""optim.clip_grad_norm clips to the global norm (Pascanu et al. 2013) as torch's clip_grad_norm_ does;
optim=lamb follows the LAMB paper's update; optim.lr_scaling gives the documented rates;
schedule=inverse_sqrt is Vaswani et al.'s rate; schedule=step warms up as Goyal et al. 2017."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from lsgd.core.errors import ConfigError
from lsgd.training.optim import (
    build_optimizer,
    build_scheduler,
    clip_grad_norm,
    lr_decay_steps,
    lr_factor_fn,
    scaled_lr,
)


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


def test_step_schedule_warmup_is_goyals_linear_ramp_then_the_milestones():
    """schedule=step with warmup_epochs=E, warmup_start_factor=s: after n completed steps the factor
    is (s + (1 - s) n / W) * gamma^k for n < W = E x steps per epoch, then gamma^k (k: milestones
    reached), as the optimizer sees it; warmup_epochs=0 is the schedule without warm-up, and the
    milestones (lr_decay_steps) do not move."""
    spe, lr, s, gamma = 10, 1.6, 0.0625, 0.1
    cfg = {"name": "step", "milestones": [3, 6], "gamma": gamma, "warmup_epochs": 2, "warmup_start_factor": s}
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(1))], {"name": "sgd", "lr": lr})
    sched = build_scheduler(opt, cfg, steps_per_epoch=spe, total_steps=80)
    seen = []
    for _ in range(80):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    w = 20  # 2 epochs x 10 steps
    for n, expected in {0: s, 1: s + (1 - s) / w, 10: (1 + s) / 2, 19: s + (1 - s) * 19 / w, 20: 1.0, 29: 1.0,
                        30: gamma, 59: gamma, 60: gamma**2, 79: gamma**2}.items():
        assert seen[n] == pytest.approx(lr * expected, rel=1e-12), n
    assert all(b > a for a, b in itertools.pairwise(seen[: w + 1]))  # strictly rising to lr over the warm-up
    assert seen[0] == pytest.approx(0.1, rel=1e-12)  # Goyal et al.: from the batch-256 rate 0.1 to 1.6
    assert lr_decay_steps(cfg, spe) == lr_decay_steps({**cfg, "warmup_epochs": 0}, spe) == (30, 60)

    # a milestone inside the warm-up multiplies the ramp
    inside = lr_factor_fn({**cfg, "milestones": [1]}, spe, 80)
    assert inside(15) == pytest.approx((s + (1 - s) * 15 / w) * gamma, rel=1e-12)
    # no warm-up (the default): gamma^k from step 0, whatever warmup_start_factor
    plain = lr_factor_fn({"name": "step", "milestones": [3, 6], "gamma": gamma}, spe, 80)
    zero = lr_factor_fn({**cfg, "warmup_epochs": 0}, spe, 80)
    assert [plain(n) for n in range(80)] == [zero(n) for n in range(80)] == [gamma ** ((n >= 30) + (n >= 60)) for n in range(80)]


def test_step_warmup_keys_are_the_cosine_schedules():
    """The same ramp as schedule=cosine over the warm-up (same keys, same semantics)."""
    keys = {"warmup_epochs": 1.5, "warmup_start_factor": 0.2}
    step = lr_factor_fn({"name": "step", "milestones": [], **keys}, 8, 100)
    cos = lr_factor_fn({"name": "cosine", "min_factor": 0.0, **keys}, 8, 100)
    assert [step(n) for n in range(13)] == [cos(n) for n in range(13)]  # W = round(1.5 x 8) = 12
    assert step(12) == 1.0 and cos(12) == 1.0


def _params_with_grads(seed: int = 0):
    """Three parameters with gradients (a matrix, a vector, a scalar) and one without."""
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in ((5, 3), (4,), ())]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g, dtype=torch.float32)
    return params + [torch.nn.Parameter(torch.zeros(2))]


@pytest.mark.parametrize("ratio", [0.1, 0.5, 2.0])
def test_clip_grad_norm_scales_every_gradient_by_one_global_factor(ratio):
    params = _params_with_grads()
    grads = [p.grad.double().clone() for p in params[:3]]
    total = math.sqrt(sum(float((g * g).sum()) for g in grads))  # the global L2 norm, by hand
    c = ratio * total
    reference = [torch.nn.Parameter(p.detach().clone()) for p in params]  # torch's own, on copies
    for r, p in zip(reference, params):
        r.grad = None if p.grad is None else p.grad.clone()
    torch_norm = torch.nn.utils.clip_grad_norm_(reference, c)

    norm = clip_grad_norm(params, c)

    assert norm == pytest.approx(total, rel=1e-6) and norm == pytest.approx(float(torch_norm), rel=1e-7)
    factor = min(1.0, c / (total + 1e-6))  # Pascanu et al.'s rule; torch adds 1e-6 to the norm
    for p, g, r in zip(params, grads, reference):
        torch.testing.assert_close(p.grad.double(), g * factor, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(p.grad, r.grad, rtol=0, atol=0)
    assert params[3].grad is None  # a parameter without a gradient is left alone
    clipped = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params[:3]))
    assert clipped == pytest.approx(min(c, total), rel=1e-5)


def test_clip_grad_norm_off_leaves_the_gradients():
    params = _params_with_grads()
    before = [p.grad.clone() for p in params[:3]]
    assert clip_grad_norm(params, None) is None
    for p, g in zip(params, before):
        assert torch.equal(p.grad, g)
