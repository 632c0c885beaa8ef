"""``adsaga``'s pieces in one process: the SAGA estimator (unbiased; exact when the table is current;
the residual table equals per-sample gradients from autograd), the stochastic delay model (the same
draws on every rank, the distribution's mean, uniform arrivals and mean staleness m - 1), f* by
L-BFGS against gradient descent, and the config errors."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from lsgd.algorithms.asynchronous import plan as async_plan
from lsgd.algorithms.asynchronous.adsaga import DelayModel, objective, partitions, saga_difference, solve_f_star
from lsgd.cli import _register_resolvers
from lsgd.config.validation import compose_config, validate
from lsgd.core.errors import ConfigError

C, D, N = 3, 4, 6


def tiny(seed: int = 0):
    """A tiny multinomial logistic regression: n = 6 samples of dimension 4, 3 classes, float64."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(N, D, generator=g, dtype=torch.float64)
    y = torch.randint(0, C, (N,), generator=g)
    w = torch.randn(C, D, generator=g, dtype=torch.float64)
    c = torch.randn(C, generator=g, dtype=torch.float64)
    return a, y, w, c


def per_sample_gradient(w, c, a, y, i) -> torch.Tensor:
    """grad f_i at (w, c) by autograd, flattened as (weight, bias)."""
    w, c = w.clone().requires_grad_(True), c.clone().requires_grad_(True)
    F.cross_entropy((a[i : i + 1] @ w.T + c), y[i : i + 1]).backward()
    return torch.cat([w.grad.reshape(-1), c.grad])


def full_gradient(w, c, a, y) -> torch.Tensor:
    w, c = w.clone().requires_grad_(True), c.clone().requires_grad_(True)
    F.cross_entropy(a @ w.T + c, y).backward()
    return torch.cat([w.grad.reshape(-1), c.grad])


def table_gradients(table, a) -> torch.Tensor:
    """alpha_i = rho_i (x) (a_i, 1), flattened as (weight, bias): (n, C D + C)."""
    return torch.cat([(table[:, :, None] * a[:, None, :]).reshape(len(a), -1), table], dim=1)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_saga_estimator_is_unbiased_for_any_table(batch):
    """E_J[d_J + alpha_bar] over every J of `batch` distinct samples (uniform, exact enumeration)
    equals the full gradient of the data term at x, whatever the (stale, random) table holds."""
    a, y, w, c = tiny()
    table = torch.randn(N, C, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    alpha_bar = table_gradients(table, a).mean(0)
    subsets = list(itertools.combinations(range(N), batch))
    mean = sum(saga_difference(w, c, a[list(j)], y[list(j)], table[list(j)])[0] + alpha_bar for j in subsets) / len(subsets)
    torch.testing.assert_close(mean, full_gradient(w, c, a, y), rtol=1e-12, atol=1e-12)


def test_saga_estimator_equals_full_gradient_when_table_is_current():
    """With every rho_i = r_i(x) (the table evaluated at x itself), d_J = 0 for every J and the
    estimate is alpha_bar = the full gradient, exactly what SAGA converges to."""
    a, y, w, c = tiny()
    _, current = saga_difference(w, c, a, y, None)
    alpha_bar = table_gradients(current, a).mean(0)
    for j in ([0], [2, 5], [1, 3, 4]):
        d, _ = saga_difference(w, c, a[j], y[j], current[j])
        assert torch.count_nonzero(d) == 0
        torch.testing.assert_close(d + alpha_bar, full_gradient(w, c, a, y), rtol=1e-12, atol=1e-12)


def test_residual_table_stores_the_per_sample_gradients():
    """The GLM table trick: r_i (x) (a_i, 1) is autograd's gradient of sample i's cross-entropy, and
    without a table d is the minibatch gradient."""
    a, y, w, c = tiny()
    _, r = saga_difference(w, c, a, y, None)
    grads = table_gradients(r, a)
    for i in range(N):
        torch.testing.assert_close(grads[i], per_sample_gradient(w, c, a, y, i), rtol=1e-12, atol=1e-12)
    d, _ = saga_difference(w, c, a[[1, 4]], y[[1, 4]], None)
    torch.testing.assert_close(d, full_gradient(w, c, a[[1, 4]], y[[1, 4]]), rtol=1e-12, atol=1e-12)


def test_delay_draws_are_the_same_on_every_rank_and_follow_the_mean():
    """Two models built independently (two ranks) and queried in different orders (a server walks
    all workers, a worker only itself) draw the same numbers; 20,000 exponential draws have the
    configured mean within 5 standard errors (sd = mean for Exp) and its standard deviation within
    5 % ; constant delays are the mean."""
    means = [0.002, 0.004]
    server, worker = DelayModel("exponential", means, seed=7), DelayModel("exponential", means, seed=7)
    k = 20_000
    for i in range(k):
        server(0, i), server(1, i)
    ours = [worker(1, i) for i in reversed(range(k))][::-1]
    assert ours == [server(1, i) for i in range(k)]
    assert DelayModel("exponential", means, seed=8)(1, 0) != server(1, 0)
    for w, mu in enumerate(means):
        x = torch.tensor([server(w, i) for i in range(k)], dtype=torch.float64)
        assert abs(x.mean().item() - mu) < 5 * mu / math.sqrt(k)
        assert x.std().item() == pytest.approx(mu, rel=0.05)
        assert x.min().item() > 0
    assert DelayModel("constant", means, seed=0)(1, 5) == 0.004


def test_exponential_delays_give_uniform_arrivals_and_mean_staleness_m_minus_one():
    """m = 4 equal workers, free messages: by memorylessness every arrival comes from a uniform
    worker and a worker's staleness is geometric with mean m - 1 = 3 (the paper's "mean delay m"
    counting its own arrival). Checked on 20,000 planned arrivals within 5 standard errors."""
    m, total = 4, 5000
    p = async_plan.plan([0.001] * m, [1] * m, [0.0] * m, [0.0] * m, total, task_s=DelayModel("exponential", [0.001] * m, 3))
    k = len(p.arrivals)
    assert k == m * total
    counts = [sum(a.worker == w for a in p.arrivals) for w in range(m)]
    sd = math.sqrt(k * (1 / m) * (1 - 1 / m))
    assert all(abs(n - k / m) < 5 * sd for n in counts)
    stale = torch.tensor([a.staleness for a in p.arrivals], dtype=torch.float64)
    var_geometric = (1 - 1 / m) / (1 / m) ** 2
    assert abs(stale.mean().item() - (m - 1)) < 5 * math.sqrt(var_geometric / k)
    # constant equal delays: round robin, staleness m - 1 after the first round
    q = async_plan.plan([0.001] * m, [1] * m, [0.0] * m, [0.0] * m, 10, task_s=DelayModel("constant", [0.001] * m, 3))
    assert [a.worker for a in q.arrivals[:8]] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert {a.staleness for a in q.arrivals[m:]} == {m - 1}


def test_f_star_matches_newton_and_the_strong_convexity_bound():
    """f* from L-BFGS against an independent solver on a tiny problem: Newton's method (exact
    Hessian, 15 steps) reaches x_N with f(x_N) - ||grad f(x_N)||^2 / (2 lambda) <= f* <= f(x_N)
    (lambda-strong convexity), and both agree to 1e-10."""
    a, y, _, _ = tiny(2)
    l2 = 0.1
    f_star = solve_f_star(a, y, C, l2)

    def f(x):
        return objective(x[: C * D].view(C, D), x[C * D :], a, y, l2)

    x = torch.zeros(C * D + C, dtype=torch.float64)
    for _ in range(15):
        g = torch.autograd.functional.jacobian(f, x)
        x = x - torch.linalg.solve(torch.autograd.functional.hessian(f, x), g)
    g = torch.autograd.functional.jacobian(f, x)
    fx = f(x).item()
    assert fx - g.norm().item() ** 2 / (2 * l2) - 1e-12 <= f_star <= fx + 1e-12
    assert f_star == pytest.approx(fx, abs=1e-10)


def test_partitions_are_disjoint_equal_and_seeded():
    parts = partitions(100, 50, 3, seed=0)
    assert parts.shape == (3, 16)
    assert len(set(parts.reshape(-1).tolist())) == 48
    assert torch.equal(parts, partitions(100, 50, 3, seed=0)) and not torch.equal(parts, partitions(100, 50, 3, seed=1))
    with pytest.raises(ValueError, match="num_samples"):
        partitions(100, 101, 3, seed=0)


def load(overrides: list[str]) -> dict:
    _register_resolvers()
    with initialize_config_module(config_module="lsgd.conf", version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)


BASE = ["debug=default", "algo=adsaga", "model=logreg", "launcher.nproc_per_node=3", "algo.num_samples=64",
        "batch_size=4", "cluster.step_time_s=0.001"]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["algo.mode=lockstep"], "algo.mode"),
        (["algo.variance_reduction=maybe"], "algo.variance_reduction"),
        (["algo.delay=pareto"], "algo.delay"),
        (["algo.l2=0"], "algo.l2"),
        (["algo.num_samples=1"], "algo.num_samples"),
        (["launcher.nproc_per_node=1"], "nproc_per_node"),
        (["model=cnn"], "model=logreg"),
        (["optim.weight_decay=0.1"], "optim.weight_decay"),
        (["batch_size=40"], "batch_size"),
        (["cluster.compute=measured"], "cluster.compute"),
    ],
)
def test_config_errors_name_the_key(overrides, key):
    """From validation, or (a value of the wrong type for ADSAGAConfig's field) already while the
    config is composed."""
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose_config([*BASE, *overrides])


def test_valid_configs_pass():
    validate(load(BASE))
    validate(load([*BASE, "algo.mode=sync", "cluster.compute=measured", "algo.variance_reduction=false"]))
    validate(load(["experiment=adsaga_logreg", "variant=adsaga_sync_saga"]))
