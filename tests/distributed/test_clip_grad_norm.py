"""optim.clip_grad_norm in the real trainer: the gradient is clipped after the algorithm has
synchronized it and before the optimizer's step (lsgd.training.optim.clip_grad_norm).

Three one-step DDP runs on 2 gloo ranks from the same initial model x0 and the same batches,
SGD without momentum at learning rate lr, float64: clipped at c (a), at 2c (b) and unclipped (d).
With the averaged gradient g and ||g|| > 2c, the closed forms (Pascanu et al. 2013, Algorithm 2)
are a = x0 - lr c g/||g||, b = x0 - 2 lr c g/||g||, d = x0 - lr g; so x0 = 2a - b, ||a - b|| =
lr c (exactly lr c ||g|| / (||g|| + 1e-6): torch adds 1e-6 to the norm), and a - b is parallel to
x0 - d. Clipping each worker's local gradient before the
average would give ||a - b|| < lr c (the mean of two vectors of norm c that are not parallel is
shorter than c), and clipping after the step would not move the step at all."""

from __future__ import annotations

from pathlib import Path

import torch
from gloo import run_gloo
from trainer_runs import compose_cfg

LR, C = 0.1, 1e-3


def _train_each(rank, world, cfgs, root):
    from lsgd.training.trainer import Trainer

    for name, cfg in cfgs.items():
        run_dir = Path(root) / name
        trainer = Trainer(cfg, run_dir, "cpu")
        trainer.fit()
        torch.save(torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()]), run_dir / f"rank{rank}.pt")


def test_the_synchronized_gradient_is_clipped_to_the_global_norm_before_the_step(tmp_path):
    cfgs = {}
    for name, clip in (("a", C), ("b", 2 * C), ("d", None)):
        cfg = compose_cfg([
            "debug=default", "algo=ddp", "dataset.num_train=256", "dataset.num_test=32", "dtype=float64",
            "max_steps=1", "log_every=1", "eval_every=1000", "checkpoint_every=0", "schedule=constant",
            f"optim.lr={LR}", "optim.momentum=0", f"optim.clip_grad_norm={'null' if clip is None else clip}",
            "launcher.nproc_per_node=2", f"results_dir={tmp_path}",
        ])
        cfg["run_id"], cfg["resume"] = name, False
        (tmp_path / name).mkdir()
        cfgs[name] = cfg
    run_gloo(_train_each, 2, cfgs, str(tmp_path))
    x = {}
    for name in cfgs:
        r0, r1 = (torch.load(tmp_path / name / f"rank{r}.pt") for r in (0, 1))
        torch.testing.assert_close(r0, r1, rtol=0, atol=0)  # the replicas stay identical
        x[name] = r0
    x0 = 2 * x["a"] - x["b"]
    step = x["a"] - x["b"]                      # lr c g / ||g||
    g = (x0 - x["d"]) / LR                      # the averaged, unclipped gradient
    gn = g.norm().item()
    assert gn > 2 * C                           # both clipped runs really clipped
    # torch's factor is c / (||g|| + 1e-6): the step's norm is lr c ||g|| / (||g|| + 1e-6)
    assert abs(step.norm().item() - LR * C * gn / (gn + 1e-6)) <= 1e-9 * LR * C
    torch.testing.assert_close(step / (LR * C), g / (gn + 1e-6), rtol=0, atol=1e-9)
