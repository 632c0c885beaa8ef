"""What the DiLoCo-family tests (test_streaming_diloco.py, test_eager_updates.py, test_sparseloco.py)
share: an algorithm driven on gloo ranks in the trainer's hook order under warm-up + cosine, the N
workers' plain inner steps of their single-process references, and their common settings.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.nn.functional as F
from gloo import run_gloo
from test_algorithms import SPE, WARMUP_COSINE, setup_algorithm, step_to_schedule

from lsgd.training.optim import build_optimizer, build_scheduler

#: the inner AdamW of the DiLoCo-family runs
ADAMW = {"name": "adamw", "lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
#: a small cnn for the runs through the real Trainer (tests/distributed/trainer_runs.py)
SMALL = ["model.channels=[4,8]", "model.hidden=16", "max_steps=12", "optim=adamw"]


# -- on gloo ranks, the trainer's hook order --------------------------------------------------------
def run_hook_order(rank, world, model, algo_cfg, optim_cfg, steps, batch, batch_size) -> dict:
    """``steps`` steps of ``model`` under the algorithm of ``algo_cfg``, warm-up + cosine running,
    hooks in the trainer's order (lsgd/training/trainer.py: optimizer step, schedule step,
    after_step, end of step); ``batch(step)``: this rank's (x, y). Returns the final parameters and
    buffers and the communicator's stats."""
    opt = build_optimizer(model.parameters(), optim_cfg)
    sched = build_scheduler(opt, WARMUP_COSINE, SPE, steps)
    comm, algo, net = setup_algorithm(algo_cfg, model, opt, rank, world, steps, batch_size=batch_size)
    for step in range(steps):
        step_to_schedule(algo, net, opt, sched, *batch(step), step)
        algo.after_step(step + 1)
        comm.end_step()
    return {"params": [p.detach().clone() for p in model.parameters()],
            "buffers": [b.clone() for b in model.buffers()], "stats": comm.stats.as_dict()}


def _run_jobs(rank, world, out, job, jobs):
    for name, *args in jobs:
        torch.save(job(rank, world, *args), out / f"{name}.rank{rank}.pt")


def run_jobs(tmp_path: Path, job, jobs) -> dict[str, list[dict]]:
    """``jobs``: ``(world, name, *args)``. The jobs of each world size in turn on one gloo group of
    that many ranks (in ``tmp_path / w{world}``), each rank's result ``job(rank, world, *args)``
    (``job``: a module-level function); returns per name the ranks' results."""
    got = {}
    for world in dict.fromkeys(w for w, *_ in jobs):
        mine = [j[1:] for j in jobs if j[0] == world]
        out = tmp_path / f"w{world}"
        out.mkdir()
        run_gloo(_run_jobs, world, out, job, mine)
        got.update({name: [torch.load(out / f"{name}.rank{r}.pt") for r in range(world)] for name, *_ in mine})
    return got


# -- the single-process references --------------------------------------------------------------
@contextlib.contextmanager
def one_thread():
    """torch on one thread for the block, as on every gloo rank (tests/distributed/gloo.py): the
    same reduction orders."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def assert_matches_reference(runs: list[dict], models: list, atol: float, what: str) -> None:
    """Each rank's final parameters and buffers (``runs``: run_hook_order's results) equal those of
    the reference's worker of that rank (``models``) to ``atol`` (rtol 0)."""
    assert len(runs) == len(models), what
    for r, (run, model) in enumerate(zip(runs, models)):
        for g, w in zip(run["params"], model.parameters()):
            torch.testing.assert_close(g, w.detach(), rtol=0, atol=atol, msg=f"{what} rank {r}")
        for g, w in zip(run["buffers"], model.buffers()):
            torch.testing.assert_close(g, w, rtol=0, atol=atol, msg=f"{what} rank {r} buffers")


def inner_optimizers(models, optim_cfg, steps) -> tuple[list, list]:
    """Each worker's inner optimizer and warm-up + cosine schedule over ``steps`` steps."""
    opts = [build_optimizer(m.parameters(), optim_cfg) for m in models]
    return opts, [build_scheduler(o, WARMUP_COSINE, SPE, steps) for o in opts]


def local_step(models, opts, scheds, batch, step: int) -> None:
    """Every worker's plain inner step ``step`` on its ``batch(rank, step)``: optimizer, then schedule."""
    for r, (m, o, s) in enumerate(zip(models, opts, scheds)):
        x, y = batch(r, step)
        loss = F.cross_entropy(m(x), y)
        o.zero_grad()
        loss.backward()
        o.step()
        s.step()
