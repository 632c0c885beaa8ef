"""Error feedback keeps its residual in gradient units, across a learning-rate decay.

The real Trainer runs ``compressed`` (top-k, CF 10, error feedback) on 2 gloo ranks with a step
schedule whose x0.1 decay falls inside the run, and plain SGD (no momentum, no weight decay). Two
single-process references, per worker k and tensor (exact top-k ``C``; averaged over workers):

* gradient units (Seide et al. 2014 1-bit SGD; GRACE's residual memory; DGC's accumulation; what
  lsgd implements): ``a = g + r``; send ``C(a)``; ``r <- a - C(a)``; ``w <- w - lr_t mean_k C(a_k)``.
* learning-rate units (EF-SGD, Karimireddy et al., ICML 2019, Algorithm 2): ``p = lr_t g + e``;
  send ``C(p)``; ``e <- p - C(p)``; ``w <- w - mean_k C(p_k)``.

With a constant rate they coincide; across the decay the residual carried over is applied at the
new rate by the first and at the old one by the second. The run must equal the first and differ
from the second.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from test_dgc import WORLD, batches, max_diff
from trainer_runs import TINY, compose_cfg, train

from lsgd.data import dataset_info
from lsgd.models import build_model

STEPS = 10
OVERRIDES = ["dataset.num_train=128", "batch_size=16", f"max_steps={STEPS}", "epochs=3", "model.channels=[4,8]",
             "model.hidden=16", "schedule=step", "schedule.milestones=[1.5]", "schedule.gamma=0.1",
             "algo=compressed", "algo.compressor=topk", "algo.cf=10", "algo.error_feedback=true",
             "optim.lr=0.1", "optim.momentum=0.0", "optim.weight_decay=0.0"]


def reference(cfg: dict, lr_units: bool) -> list[torch.Tensor]:
    """Final parameters under gradient-unit (``lr_units=False``) or EF-SGD error feedback."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(int(cfg["seed"]))
        model = build_model(cfg["model"], dataset_info(cfg["dataset"]))
        params = list(model.parameters())
        data, spe = zip(*(batches(cfg, r, STEPS) for r in range(WORLD)))
        milestone = round(1.5 * spe[0])
        lr0, cf = float(cfg["optim"]["lr"]), float(cfg["algo"]["cf"])
        residual = [[torch.zeros_like(p) for p in params] for _ in range(WORLD)]
        for t in range(STEPS):
            lr = lr0 * (0.1 if t >= milestone else 1.0)
            total = [torch.zeros_like(p) for p in params]
            for k in range(WORLD):
                x, y = data[k][t]
                model.zero_grad()
                F.cross_entropy(model(x), y).backward()
                for i, p in enumerate(params):
                    a = (lr * p.grad if lr_units else p.grad) + residual[k][i]
                    flat = a.reshape(-1)
                    kept = min(flat.numel(), max(1, math.ceil(flat.numel() / cf)))
                    idx = torch.topk(flat.abs(), kept).indices
                    sent = torch.zeros_like(flat)
                    sent[idx] = flat[idx]
                    sent = sent.reshape(a.shape)
                    residual[k][i] = a - sent
                    total[i] += sent
            with torch.no_grad():
                for i, p in enumerate(params):
                    p -= (1.0 if lr_units else lr) * total[i] / WORLD
        return [p.detach() for p in params]
    finally:
        torch.set_num_threads(threads)


def test_error_feedback_residual_in_gradient_units_across_lr_decay(tmp_path):
    _, models = train(tmp_path, OVERRIDES, world=WORLD)
    cfg = compose_cfg([*TINY, f"launcher.nproc_per_node={WORLD}", *OVERRIDES])
    grad_units, lr_units = reference(cfg, lr_units=False), reference(cfg, lr_units=True)
    gap = max_diff(grad_units, lr_units)
    assert gap > 1e-3  # the two conventions really differ on this run (the decay is inside it)
    for rank in range(WORLD):
        got = models[rank]["params"]
        assert max_diff(got, grad_units) < 1e-5, f"rank {rank}: {max_diff(got, grad_units):.3g} from gradient units"
        assert max_diff(got, lr_units) > gap / 2
