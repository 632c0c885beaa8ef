"""The step path reads nothing back from the device per step (issue: NCCL-safe bookkeeping): the
training-loss accumulators, QSGD's zero-norm case, and on a GPU the CUDA-event step times and a
Trainer step without torch.cuda.synchronize."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lsgd.compression.compressors import QSGD
from lsgd.training.recorder import Recorder


def _recorder(tmp_path: Path) -> Recorder:
    return Recorder({"batch_size": 4}, tmp_path, 1, 10)  # rank 1: writes nothing


def test_add_loss_reads_nothing_back_and_sums_as_the_host_did(tmp_path, monkeypatch):
    """The sum, count and non-finite count equal a host-side float64 sum of the losses (in step
    order, non-finite ones apart), and add_loss never calls Tensor.item / tolist / __float__."""
    losses = [torch.tensor(v, dtype=torch.float32) for v in (2.3, 1.7, math.inf, 0.9, math.nan, 1e-3)]
    losses.append(torch.tensor(0.3, dtype=torch.bfloat16))
    rec = _recorder(tmp_path)
    rec.HOST_LOSSES_MAX = 0  # the tensor path, which a GPU's losses take (CPU losses are read at once)

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


@pytest.mark.parametrize("fold_every", [1024, 3, 1])
def test_cpu_losses_kept_as_floats_sum_as_the_tensor_path(tmp_path, fold_every):
    """CPU losses go to a list of floats folded in at reads (or every ``fold_every`` losses): the
    sum, counts and checkpoint state equal, bit for bit, the tensor path's (float64 adds in step
    order, 0.0 for a non-finite loss), interleaved with shipped losses and a record's reset."""
    gen = torch.Generator().manual_seed(0)
    values = (torch.rand(200, generator=gen, dtype=torch.float64) * 10).tolist()
    values[17], values[90] = math.inf, math.nan
    losses = [torch.tensor(v, dtype=torch.float32) for v in values] + [torch.tensor(0.3, dtype=torch.bfloat16)]
    fast, slow = _recorder(tmp_path), _recorder(tmp_path)
    fast.HOST_LOSSES_MAX, slow.HOST_LOSSES_MAX = fold_every, 0
    for i, loss in enumerate(losses):
        for rec in (fast, slow):
            rec.add_loss(loss)
            if i == 120:
                rec.add_losses(0.125, 3, 1)
        if i == 150:
            a, b = fast.state_dict(), slow.state_dict()
            assert torch.equal(a.pop("loss_sum"), b.pop("loss_sum")) and a == b
    assert len(fast._host_losses) < fold_every
    assert torch.equal(fast.loss_sum, slow.loss_sum) and torch.equal(fast._counts, slow._counts)
    expect = 0.0
    for loss in losses[:121]:
        v = float(loss)
        expect += v if math.isfinite(v) else 0.0
    expect += 0.125
    for loss in losses[121:]:
        v = float(loss)
        expect += v if math.isfinite(v) else 0.0
    assert fast.take_losses() == slow.take_losses() == (expect, len(losses) - 2 + 3, 2 + 1)
    assert fast.take_losses() == (0.0, 0, 0)


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

    from lsgd.training.accel import CudaStepTimes

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
    from lsgd.training.trainer import Trainer

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
        assert trainer.compute_time_s > 0 and not trainer.timer.gpu_steps.pending
    finally:
        dist.destroy_process_group()
