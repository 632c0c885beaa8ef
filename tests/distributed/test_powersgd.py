"""algo=compressed with compressor=powersgd is torch's PowerSGD hook: same gradients as the hook used
directly, and the counted bytes equal the bytes torch's hook actually all-reduced."""

from __future__ import annotations

import torch
import torch.distributed as dist
from gloo import run_gloo
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd
from torch.nn.parallel import DistributedDataParallel

from lsgd.algorithms.gradient_compression.compressed import Compressed
from lsgd.comm.communicator import Communicator

STEPS = 6
START = 3


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(40, 32), nn.ReLU(), nn.Linear(32, 24), nn.ReLU(), nn.Linear(24, 5))


def batches(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(16, 40, generator=g), torch.randint(0, 5, (16,), generator=g)) for _ in range(STEPS)]


def train(net: nn.Module, opt, rank: int) -> list[list[torch.Tensor]]:
    grads = []
    for x, y in batches(rank):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        grads.append([p.grad.detach().clone() for p in net.parameters()])
        opt.step()
    return grads


def _worker(rank, world):
    # reference: torch's hook registered by hand
    model = make_model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.002)
    state = torch_powersgd.PowerSGDState(
        process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=START,
        min_compression_rate=2.0, use_error_feedback=True, warm_start=True, random_seed=0,
    )
    def hook(state, bucket):  # torch's hook, each bucket completed in turn (gloo needs one collective order)
        fut = torch_powersgd.powerSGD_hook(state, bucket)
        fut.wait()
        return fut

    ddp.register_comm_hook(state, hook)
    ref = train(ddp, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rank)

    # lsgd: algo=compressed, compressor=powersgd; count the bytes torch's all_reduce really receives
    model = make_model()
    comm = Communicator()
    algo = Compressed(
        {"name": "compressed", "compressor": "powersgd", "rank": 2, "start_iter": START, "error_feedback": True,
         "warm_start": True, "min_compression_rate": 2.0, "seed": 0, "bucket_cap_mb": 0.002},
        comm,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    net = algo.setup(model, opt)
    sent = []
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        sent.append(tensor.numel() * tensor.element_size())
        return real_all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting_all_reduce
    try:
        got = train(net, opt, rank)
    finally:
        dist.all_reduce = real_all_reduce

    for step, (a, b) in enumerate(zip(ref, got)):
        for ga, gb in zip(a, b):
            assert torch.equal(ga, gb), f"rank {rank} step {step}: gradients differ"
    assert comm.stats.comm_bytes == sum(sent), (comm.stats.comm_bytes, sum(sent))
    # compression started: later steps send fewer bytes than the dense model
    dense = sum(p.numel() * 4 for p in model.parameters())
    assert algo.powersgd.sent_bytes < algo.powersgd.dense_bytes
    assert algo.powersgd.dense_bytes == dense * STEPS


def test_powersgd_path_equals_torch_hook_and_counts_exact_bytes():
    run_gloo(_worker, 2)


def test_compression_flops_closed_form():
    """Vogels et al. 2019, Algorithm 1: per compressed n x m matrix at rank r, three products of
    2 n m r FLOPs (P = M Q, Q = M^T P, M = P Q^T) and Gram-Schmidt on P (2 n r^2); vectors and
    matrices that fail torch's compression-rate rule are sent as they are and cost nothing."""
    from lsgd.compression.powersgd import compression_flops

    state = torch_powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=2, min_compression_rate=2.0)
    big, vec, tiny = torch.zeros(64, 32), torch.zeros(64), torch.zeros(3, 3)  # tiny: (3+3)*2*2 >= 9
    assert compression_flops(state, [big, vec, tiny]) == 6 * 64 * 32 * 2 + 2 * 64 * 2 * 2
    conv = torch.zeros(16, 8, 3, 3)  # viewed as 16 x 72
    assert compression_flops(state, [conv]) == 6 * 16 * 72 * 2 + 2 * 16 * 2 * 2
