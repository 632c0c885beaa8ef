"""The in-process cluster (lsgd.comm.inprocess): its backend's collectives and messages against
closed-form values, its scheduler's errors, per-worker random state, torch's DDP with its PowerSGD
comm hook against real gloo processes, and every golden case run in-process against its stored
golden, twice beside CPU hogs for identical bits.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lsgd.comm.inprocess.cluster import WorkerFailed, run
from lsgd.comm.inprocess.scheduler import Deadlock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cases  # noqa: E402


# --------------------------------------------------------------------------------------------
# the backend, against closed-form values
# --------------------------------------------------------------------------------------------
def _collectives(rank: int, n: int) -> dict:
    out = {}
    t = torch.arange(3, dtype=torch.float64) + rank
    dist.all_reduce(t)
    out["sum"] = t.tolist()
    for name, op in (("avg", dist.ReduceOp.AVG), ("min", dist.ReduceOp.MIN), ("max", dist.ReduceOp.MAX),
                     ("prod", dist.ReduceOp.PRODUCT)):
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t, op=op)
        out[name] = t.item()
    gathered = [torch.zeros(2) for _ in range(n)]
    dist.all_gather(gathered, torch.tensor([rank, 10.0 * rank]))
    out["all_gather"] = [g.tolist() for g in gathered]
    flat = torch.zeros(2 * n)
    dist.all_gather_single(flat, torch.tensor([rank, -1.0 * rank]))
    out["all_gather_into"] = flat.tolist()
    b = torch.tensor([float(rank)])
    dist.broadcast(b, src=n - 1)
    out["broadcast"] = b.item()
    rs = torch.zeros(1)
    dist.reduce_scatter_single(rs, torch.arange(n, dtype=torch.float32) * (rank + 1))
    out["reduce_scatter"] = rs.item()
    red = torch.tensor([float(rank)])
    dist.reduce(red, dst=1)
    out["reduce"] = red.item() if rank == 1 else None
    g_out = [torch.zeros(1) for _ in range(n)] if rank == 0 else None
    dist.gather(torch.tensor([rank * 2.0]), g_out, dst=0)
    out["gather"] = [x.item() for x in g_out] if rank == 0 else None
    sc = torch.zeros(1)
    dist.scatter(sc, [torch.tensor([100.0 + q]) for q in range(n)] if rank == 0 else None, src=0)
    out["scatter"] = sc.item()
    a2a = torch.zeros(n)
    dist.all_to_all_single(a2a, torch.arange(n, dtype=torch.float32) + 10 * rank)
    out["all_to_all"] = a2a.tolist()
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank})
    out["objects"] = objs
    dist.barrier()
    # a subgroup of the even ranks: created by all, used by its members
    evens = dist.new_group(list(range(0, n, 2)))
    s = torch.tensor([1.0])
    if rank % 2 == 0:
        dist.all_reduce(s, group=evens)
    out["evens"] = s.item()
    # an async all-reduce left in flight across a point-to-point ring, then waited
    pending = torch.tensor([float(rank)])
    work = dist.all_reduce(pending, async_op=True)
    send, recv = torch.tensor([float(rank)]), torch.zeros(1)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % n), dist.P2POp(dist.irecv, recv, (rank - 1) % n)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    work.wait()
    out["in_flight"] = pending.item()
    out["ring"] = recv.item()
    return out


def test_collectives_and_messages_match_closed_form():
    n = 5
    results = run(n, _collectives)
    total = n * (n - 1) / 2
    for rank, out in enumerate(results):
        assert out["sum"] == [total + i * n for i in range(3)]
        assert out["avg"] == pytest.approx((n + 1) / 2)
        assert (out["min"], out["max"], out["prod"]) == (1.0, float(n), 120.0)
        assert out["all_gather"] == [[q, 10.0 * q] for q in range(n)]
        assert out["all_gather_into"] == [v for q in range(n) for v in (q, -1.0 * q)]
        assert out["broadcast"] == n - 1
        # reduce-scatter: chunk r of sum_q (q + 1) * arange(n) is r * n(n+1)/2
        assert out["reduce_scatter"] == rank * n * (n + 1) / 2
        assert out["reduce"] == (total if rank == 1 else None)
        assert out["gather"] == ([2.0 * q for q in range(n)] if rank == 0 else None)
        assert out["scatter"] == 100.0 + rank
        assert out["all_to_all"] == [rank + 10.0 * q for q in range(n)]
        assert out["objects"] == [{"rank": q} for q in range(n)]
        assert out["evens"] == (len(range(0, n, 2)) if rank % 2 == 0 else 1.0)
        assert out["in_flight"] == total
        assert out["ring"] == (rank - 1) % n


def _messages(rank: int, n: int) -> list:
    if rank == 0:  # three messages on one tag, one on another, to rank 1; rank 1 posts first
        for v in (1.0, 2.0, 3.0):
            dist.isend(torch.tensor([v]), 1)
        dist.send(torch.tensor([9.0]), 1, tag=7)
        return []
    if rank == 1:
        tagged = torch.zeros(1)
        w7 = dist.irecv(tagged, 0, tag=7)
        got = []
        for _ in range(3):
            buf = torch.zeros(1)
            dist.recv(buf, 0)
            got.append(buf.item())
        w7.wait()
        anyone = torch.zeros(1)
        src = dist.recv(anyone)  # from any source: rank 2's message
        return got + [tagged.item(), anyone.item(), src]
    dist.send(torch.tensor([20.0 + rank]), 1)
    return []


def test_point_to_point_keeps_order_per_pair_and_tag():
    results = run(3, _messages)
    assert results[1] == [1.0, 2.0, 3.0, 9.0, 22.0, 2]


def _deadlock(rank: int, n: int) -> None:
    dist.recv(torch.zeros(1), (rank + 1) % n)  # everyone receives, nobody sends


def _fails(rank: int, n: int) -> None:
    t = torch.zeros(1)
    dist.all_reduce(t)
    if rank == 2:
        raise ValueError("worker 2 broke")
    dist.all_reduce(t)  # the others wait here for rank 2, then stop


def test_deadlock_and_failure_stop_every_worker_and_name_the_rank():
    with pytest.raises(WorkerFailed) as info:
        run(3, _deadlock)
    assert isinstance(info.value.__cause__, Deadlock)
    with pytest.raises(WorkerFailed, match="worker 2 failed: ValueError: worker 2 broke") as info:
        run(4, _fails)
    assert info.value.rank == 2


def _draws(rank: int, n: int) -> list[float]:
    torch.manual_seed(100 + rank)
    draws = []
    for _ in range(3):
        draws += torch.rand(2).tolist()
        dist.barrier()  # the baton goes round: the other workers draw from their own state
    return draws


def _sets_globals(rank: int, n: int) -> str:
    torch.set_default_dtype(torch.float64)  # as a float64 run's trainer does in every worker
    torch.set_num_threads(1)
    return str(torch.get_default_dtype())


def test_the_callers_torch_settings_come_back_after_the_run():
    threads = torch.get_num_threads()
    assert run(2, _sets_globals) == ["torch.float64"] * 2
    assert torch.get_default_dtype() == torch.float32 and torch.get_num_threads() == threads


def test_every_worker_draws_from_its_own_random_state():
    expected = []
    for rank in range(4):  # what each worker draws alone in its own process
        torch.manual_seed(100 + rank)
        expected.append(torch.rand(6).tolist())
    assert run(4, _draws) == expected


# --------------------------------------------------------------------------------------------
# torch's DDP and its comm hooks, against real gloo processes
# --------------------------------------------------------------------------------------------
def _ddp_steps(rank: int, n: int, hook: str) -> list[float]:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    ddp = DDP(model, bucket_cap_mb=0.0005)  # several buckets
    if hook == "powersgd":
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                       min_compression_rate=0.5)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(5):
        x = torch.randn(8, 12, generator=g)
        y = torch.randint(0, 3, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return [p.detach().sum().item() for p in model.parameters()]


def _ddp_gloo(rank: int, n: int, hook: str, out: str) -> None:
    Path(out, f"{rank}.txt").write_text(repr(_ddp_steps(rank, n, hook)))


@pytest.mark.parametrize("hook", ["allreduce", "powersgd"])
def test_ddp_and_its_powersgd_hook_equal_gloo_processes(hook, tmp_path):
    import gloo

    gloo.run_gloo(_ddp_gloo, 3, hook, str(tmp_path))
    expected = [eval(Path(tmp_path, f"{r}.txt").read_text()) for r in range(3)]
    got = run(3, _ddp_steps, hook)
    for g_rank, e_rank in zip(got, expected):
        assert g_rank == pytest.approx(e_rank, rel=1e-5, abs=1e-6)  # float32 sums in another order


# --------------------------------------------------------------------------------------------
# every golden case in-process
# --------------------------------------------------------------------------------------------
#: one case of each family, run a second time for identical bits
FAMILIES = ["local_sgd_w4", "compressed_powersgd", "adasum_hierarchical_w4", "swarm_sgd_nonblocking_w4",
            "ad_psgd_async_w4", "param_server_w3"]


def _hogs():
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]


@pytest.fixture(scope="module")
def inprocess_runs(tmp_path_factory):
    """Every golden case in-process, then the :data:`FAMILIES` cases once more beside two processes
    that burn the CPU (the machine's load differs between the two runs; the bits must not)."""
    first = cases.run_cases(None, tmp_path_factory.mktemp("inprocess"), inprocess=True)
    hogs = _hogs()
    try:
        again = cases.run_cases(FAMILIES, tmp_path_factory.mktemp("inprocess-again"), inprocess=True)
        assert all(h.poll() is None for h in hogs)  # they burnt CPU all along
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    return first, again


@pytest.mark.parametrize("name", [c.name for c in cases.CASES])
def test_golden_case_in_process_matches_its_stored_golden(name, inprocess_runs):
    diffs = cases.differences(cases.load_golden(name), inprocess_runs[0][name])
    assert not diffs, "in-process run differs from the stored (gloo) golden:\n" + "\n".join(diffs)


@pytest.mark.parametrize("name", FAMILIES)
def test_two_in_process_runs_beside_cpu_hogs_are_bit_identical(name, inprocess_runs):
    first, again = inprocess_runs
    diffs = cases.differences(first[name], again[name], rtol=0)
    assert not diffs, "two in-process runs differ:\n" + "\n".join(diffs)
    assert [r["sha256"] for r in first[name]["ranks"]] == [r["sha256"] for r in again[name]["ranks"]]
