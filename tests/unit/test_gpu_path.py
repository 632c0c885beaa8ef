"""The step path reads nothing back from the device per step (issue: NCCL-safe bookkeeping): the
training-loss accumulators, QSGD's zero-norm case, and on a GPU the CUDA-event step times and a
Trainer step without torch.cuda.synchronize."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lsgd.compression.compressors import QSGD
from lsgd.services import Recorder


def _recorder(tmp_path: Path) -> Recorder:
    return Recorder({"batch_size": 4}, tmp_path, 1, 10)  # rank 1: writes nothing


def test_add_loss_reads_nothing_back_and_sums_as_the_host_did(tmp_path, monkeypatch):
    """The sum, count and non-finite count equal a host-side float64 sum of the losses (in step
    order, non-finite ones apart), and add_loss never calls Tensor.item / tolist / __float__."""
    losses = [torch.tensor(v, dtype=torch.float32) for v in (2.3, 1.7, math.inf, 0.9, math.nan, 1e-3)]
    losses.append(torch.tensor(0.3, dtype=torch.bfloat16))
    rec = _recorder(tmp_path)

    def no_read(*_args, **_kw):
        raise AssertionError("add_loss read a tensor back to the host")

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__float__", "__bool__"):
            m.setattr(torch.Tensor, name, no_read)
        for loss in losses:
            rec.add_loss(loss)
    expect = 0.0
    for loss in losses:
        v = float(loss)
        if math.isfinite(v):
            expect += v
    assert rec.take_losses() == (expect, 5, 2)
    assert rec.take_losses() == (0.0, 0, 0)
    rec.add_losses(1.5, 2, 1)
    rec.add_loss(torch.tensor(0.5))
    assert (rec.loss_count, rec.nonfinite) == (3, 1)
    state = rec.state_dict()
    again = _recorder(tmp_path)
    again.load_state_dict(state)
    assert again.take_losses() == (2.0, 3, 1)


def test_qsgd_torch_path_zero_norm_gives_zero_levels():
    """float64 (the torch-generator path, which GPUs take): a zero tensor quantizes to zero levels
    without a host branch on its norm; a non-zero one keeps the levels' formula
    floor(s |x| / norm + u) with the signs of x."""
    q = QSGD(levels=4, seed=1, rank=0)
    zero = q.compress(torch.zeros(10, dtype=torch.float64))
    assert zero.values.dtype == torch.int8 and not zero.values.any()
    assert torch.equal(q.decompress(zero), torch.zeros(10, dtype=torch.float64))
    x = torch.linspace(-1, 1, 64, dtype=torch.float64)
    c = q.compress(x)
    level = 4 * x.abs() / x.norm()
    assert bool(((c.values == 0) | (c.values.sign() == x.sign().to(torch.int8))).all())
    assert bool(((c.values.abs().double() - level.floor()) >= 0).all() and ((c.values.abs().double() - level) < 1).all())


@pytest.mark.cuda
def test_cuda_step_times_match_a_synchronized_clock():
    import time

    from lsgd.accel import CudaStepTimes

    timer = CudaStepTimes()
    a = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        start = timer.start()
        for _ in range(10):
            a = (a @ a).tanh_()
        timer.stop(start)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    seconds = timer.settle()
    assert 0.5 * wall < seconds <= wall * 1.01 and not timer.pending


@pytest.mark.cuda
def test_trainer_steps_on_cuda_without_a_host_sync(tmp_path, monkeypatch):
    """Profile mode on one GPU (world of one, NCCL): train steps call no torch.cuda.synchronize,
    no Tensor.item; compute_time_s comes from the events at the record."""
    import torch.distributed as dist
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from lsgd.cli import _register_resolvers
    from lsgd.trainer import Trainer

    _register_resolvers()
    with initialize_config_module(config_module="lsgd.conf", version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=[
            "debug=default", "device=cuda", "launcher.nproc_per_node=1", "algo=ddp", "precision=bf16",
            "log_every=1000", "eval_every=100000", "checkpoint_every=0", f"results_dir={tmp_path}"]), resolve=True)
    cfg["run_id"] = "run"
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        trainer = Trainer(cfg, tmp_path, "cuda")
        trainer.start_time = 0.0
        trainer.recorder.start(0)
        it = trainer.loader.batches(0)
        batches = [next(it) for _ in range(6)]
        trainer.train_step(*batches[0])  # warm-up (DDP's first steps)
        calls = []
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append("synchronize"))
        monkeypatch.setattr(torch.Tensor, "item", lambda *a: calls.append("item"))
        for x, y in batches[1:]:
            trainer.train_step(x, y)
        monkeypatch.undo()
        assert calls == []
        assert trainer.compute_time_s > 0 and not trainer._gpu_steps.pending
    finally:
        dist.destroy_process_group()
