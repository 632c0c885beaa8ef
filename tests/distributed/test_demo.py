"""DeMo (``algo=demo``, lsgd/algorithms/gradient_compression/demo.py) against the authors' ``demo.py``
(github.com/bloc97/DeMo), as written for the tests in tests/distributed/demo_reference.py:

* one process: lsgd's step, driven by hand with a learning-rate schedule, equals ``demo.py``'s step
  with one worker, parameter by parameter and momentum by momentum (a convolution through its
  matrix view, lsgd's rule for tensors ``demo.py`` does not handle);
* several processes: the real Trainer on 3 gloo ranks (the trainer's hook order, a cosine schedule
  with warm-up) ends where 3 reference workers end, run in one process with their all-gather done
  by threads, each on the batches the trainer feeds that rank; replicas identical;
* the bytes of a step against the closed form ``sum chunks * min(k, chunk size) * (8 + value size)``
  (+ BatchNorm buffers' broadcast);
* config errors name the key before any worker starts;
* the chunk sizes and the DCT basis equal ``demo.py``'s.

Every comparison is also made against a wrong variant (another decay, an average over all workers
instead of over the workers that sent a coefficient), which must differ: the tests can fail.
"""

from __future__ import annotations

import contextlib
import math
import threading

import pytest
import torch
import torch.nn.functional as F
from demo_reference import Compress, ReferenceDeMo, ThreadGather, _dct_ortho, smaller_split
from torch import nn
from trainer_runs import TINY, compose_cfg, train

from lsgd.compression.dct import ChunkedDCT, chunk_size, dct_matrix


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def max_diff(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


# -- the pieces: chunk sizes and the DCT ---------------------------------------------------------
def test_chunk_sizes_are_demo_pys():
    for target in (1, 7, 32, 64):
        for n in range(1, 300):
            assert chunk_size(n, target) == smaller_split(n, target), (n, target)
    assert [chunk_size(n, 64) for n in (10, 64, 67, 96, 128, 144, 784, 4096)] == [10, 64, 1, 48, 64, 48, 56, 64]


def test_dct_basis_is_demo_pys_and_orthonormal():
    with default_dtype(torch.float64):
        for n in (1, 2, 5, 48, 64):
            c = dct_matrix(n)
            assert torch.allclose(c @ c.T, torch.eye(n), atol=1e-13)
            # demo.py's f = dct(I): row j is the DCT of e_j, i.e. C^T
            assert torch.allclose(_dct_ortho(torch.eye(n)), c.T, atol=1e-13)
        t = ChunkedDCT((96, 3, 4, 4), 64, torch.float64)  # matrix view [96, 48]: chunks 48 x 48
        assert (t.chunks, t.num_chunks, t.chunk_numel) == ((48, 48), 2, 2304)
        x = torch.randn(96, 3, 4, 4)
        assert torch.allclose(t.decode(t.encode(x)), x, atol=1e-12)


# -- one process: lsgd's step equals demo.py's ----------------------------------------------------
def _model(kind: str) -> nn.Module:
    """The chunk sizes avoid a trap of the method rather than of either implementation: where every
    selected basis function of a chunk vanishes at an element (a DCT basis of odd length has exact
    zeros, cos(pi / 2): the middle element of a length-3 chunk at frequency 1), u there is a
    rounding residue (~1e-17) whose sign depends on how the basis was computed, and ``sign(u)``
    moves the weight by +-lr either way. demo.py's basis (an FFT of the identity) and lsgd's (the
    cosine formula) leave different residues, so such a step cannot be compared; with k = 3 of a
    few coefficients per chunk it happens within a few steps for a 3-wide chunk, so the small
    chunks here have power-of-two lengths (no zeros) or keep an even frequency."""
    if kind == "mlp":  # 1-D and 2-D tensors only: demo.py as written. Chunks (target 64): [128, 96] ->
        # 64 x 48 (k < chunk), [67, 128] -> 1 x 64 (67 is prime), [10, 67] -> 10 x 1, biases 64, 1, 10
        return nn.Sequential(nn.Linear(96, 128), nn.Tanh(), nn.Linear(128, 67), nn.Tanh(), nn.Linear(67, 10))
    # a convolution (4-D weight, its matrix view [8, 16]) before the same kind of layers
    return nn.Sequential(nn.Conv2d(4, 8, 2), nn.Tanh(), nn.Flatten(), nn.Linear(8 * 5 * 5, 67), nn.Tanh(),
                         nn.Linear(67, 10))


def _factor(step: int) -> float:
    """A warm-up over 3 steps, then a decay: the learning rate moves every step."""
    return min(1.0, (step + 1) / 3) * 0.8 ** step


def _hand_driven(kind: str, steps: int, algo: dict, lr: float, reference_algo: dict | None = None):
    """lsgd's DeMo driven by hand on one worker and demo.py's on a copy of the model (each parameter
    as its matrix view), the same batches; returns (lsgd params, reference params, lsgd momenta,
    reference momenta), each as matrix views."""
    from lsgd.algorithms import build_algorithm
    from lsgd.comm.communicator import Communicator

    reference_algo = reference_algo or algo
    torch.manual_seed(0)
    model = _model(kind)
    ref_model = _model(kind)
    ref_model.load_state_dict(model.state_dict())
    shape_in = (5, 96) if kind == "mlp" else (5, 4, 6, 6)
    data = [(torch.randn(*shape_in), torch.randint(0, 10, (5,))) for _ in range(steps)]

    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _factor)
    demo = build_algorithm({"name": "demo", **algo}, Communicator())
    demo.setup(model, optimizer)

    # the reference steps leaf tensors of each parameter's matrix view (the identity for 1-D and 2-D)
    def view(p):
        return p.detach().reshape(p.shape[0], -1).clone() if p.dim() > 2 else p.detach().clone()

    views = [view(p).requires_grad_() for p in ref_model.parameters()]
    ref = ReferenceDeMo(views, lr=lr, **{k: v for k, v in reference_algo.items()})
    ref_scheduler = torch.optim.lr_scheduler.LambdaLR(ref, _factor)
    for x, y in data:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        demo.optimizer_step()
        scheduler.step()

        ref_model.zero_grad()
        F.cross_entropy(ref_model(x), y).backward()
        for v, p in zip(views, ref_model.parameters()):
            v.grad = p.grad.reshape(v.shape).clone()
        ref.step()
        ref_scheduler.step()
        with torch.no_grad():
            for v, p in zip(views, ref_model.parameters()):
                p.copy_(v.reshape(p.shape))
    got = [view(p) for p in model.parameters()]
    momenta = [d.reshape(v.shape) for d, v in zip(demo.delta, views)]
    return got, [v.detach() for v in views], momenta, [ref.demo_state[v]["delta"] for v in views]


@pytest.mark.parametrize("kind", ["mlp", "conv"])
@pytest.mark.parametrize("chunk, topk", [(64, 32), (8, 3)])
def test_one_worker_step_equals_demo_py(kind, chunk, topk):
    """Six steps under a moving learning rate with decoupled weight decay: the parameters and the
    momenta equal demo.py's (float64); another decay gives other parameters."""
    algo = {"compression_decay": 0.999, "compression_topk": topk, "compression_chunk": chunk, "weight_decay": 0.05}
    with default_dtype(torch.float64):
        got, expect, delta, ref_delta = _hand_driven(kind, 6, algo, lr=0.01)
        assert max_diff(got, expect) < 1e-12, max_diff(got, expect)
        assert max_diff(delta, ref_delta) < 1e-12, max_diff(delta, ref_delta)
        wrong, expect, _, _ = _hand_driven(kind, 6, {**algo, "compression_decay": 0.99}, lr=0.01, reference_algo=algo)
        assert max_diff(wrong, expect) > 1e-4


# -- several processes: the trainer on gloo ranks against reference workers ---------------------
WORLD = 3
STEPS = 10
#: logistic regression (1-D and 2-D tensors: demo.py as written) on 12x12 inputs: W [10, 144] in
#: 3 chunks of 10 x 48, c [10] in one chunk of 10; 512 samples / (3 x 16) = 10 steps per epoch, a
#: cosine schedule warming up over the first epoch; float64
LOGREG = ["model=logreg", "model.init=torch", "dataset.input_shape=[1,12,12]", "batch_size=16", f"max_steps={STEPS}",
          "epochs=2", "schedule.warmup_epochs=0.5", "algo=demo", "optim.lr=0.01", "algo.weight_decay=0.02",
          "dtype=float64"]


def _batches(cfg: dict, rank: int, world: int, steps: int):
    from lsgd.data import ShardedLoader, build_datasets

    train_set, _ = build_datasets(cfg["dataset"], int(cfg["seed"]))
    loader = ShardedLoader(train_set, cfg["dataset"], rank, world, int(cfg["batch_size"]), int(cfg["seed"]))
    out, epoch = [], 0
    while len(out) < steps:
        out += list(loader.batches(epoch))
        epoch += 1
    return out[:steps], loader.steps_per_epoch


class MeanOverAll(Compress):
    """A wrong exchange: each coefficient summed over the workers that sent it and divided by all
    workers (what an all-reduce of the sparse selections would give)."""

    def __init__(self, world: int):
        self.world = world

    def batch_decompress(self, p, idx, val, xshape, totalk):
        idx, val = torch.cat(idx, dim=-1), torch.cat(val, dim=-1)
        x = torch.zeros(*idx.shape[:-1], totalk, dtype=p.dtype).scatter_add_(-1, idx, val)
        return (x / self.world).reshape(xshape)


def reference_workers(cfg: dict, world: int, steps: int, compress=None) -> list[list[torch.Tensor]]:
    """Each reference worker's final parameters: ``world`` demo.py optimizers on copies of lsgd's
    initial model, each stepping on the batches the trainer gives its rank, their all-gathers joined
    by threads; the learning rate of lsgd's schedule (not what is tested here)."""
    from lsgd.data import dataset_info
    from lsgd.models import build_model
    from lsgd.training.optim import build_scheduler

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with default_dtype(torch.float64 if cfg["dtype"] == "float64" else torch.float32):
            data = [_batches(cfg, r, world, steps) for r in range(world)]
            spe = data[0][1]
            torch.manual_seed(int(cfg["seed"]))
            model = build_model(cfg["model"], dataset_info(cfg["dataset"]))
            models = [model] + [build_model(cfg["model"], dataset_info(cfg["dataset"])) for _ in range(world - 1)]
            for m in models[1:]:
                m.load_state_dict(model.state_dict())
            gather = ThreadGather(world)
            algo = cfg["algo"]
            errors: list[BaseException] = []

            def run(rank: int) -> None:
                try:
                    opt = ReferenceDeMo(models[rank].parameters(), lr=float(cfg["optim"]["lr"]),
                                        compression_decay=algo["compression_decay"],
                                        compression_topk=algo["compression_topk"],
                                        compression_chunk=algo["compression_chunk"],
                                        weight_decay=algo["weight_decay"], gather=gather.for_rank(rank))
                    if compress is not None:
                        opt.compress = compress
                    sched = build_scheduler(opt, cfg["schedule"], spe, steps)
                    for x, y in data[rank][0]:
                        opt.zero_grad()
                        F.cross_entropy(models[rank](x), y).backward()
                        opt.step()
                        sched.step()
                except BaseException as exc:  # noqa: BLE001 (re-raised below)
                    errors.append(exc)
                    gather.barrier.abort()

            workers = [threading.Thread(target=run, args=(r,)) for r in range(world)]
            for t in workers:
                t.start()
            for t in workers:
                t.join()
            if errors:
                raise errors[0]
            return [[p.detach().clone() for p in m.parameters()] for m in models]
    finally:
        torch.set_num_threads(threads)


def _per_step_bytes(params: list[tuple[tuple[int, ...], int]], topk: int, chunk: int) -> int:
    """The closed form: sum over tensors of chunks x min(k, chunk size) x (8 + value size), a
    tensor of more than 2 dimensions as its matrix view (chunk sizes by demo_reference's own rule)."""
    total = 0
    for shape, itemsize in params:
        view = (shape[0], math.prod(shape[1:])) if len(shape) > 1 else (math.prod(shape),)
        sizes = [smaller_split(n, chunk) for n in view]
        chunks = math.prod(n // s for n, s in zip(view, sizes))
        total += chunks * min(topk, math.prod(sizes)) * (8 + itemsize)
    return total


@pytest.fixture(scope="module")
def logreg_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo_logreg")
    records, models = train(tmp, LOGREG, world=WORLD)
    cfg = compose_cfg([*TINY, f"launcher.nproc_per_node={WORLD}", *LOGREG])
    return records, models, cfg


def test_trainer_on_gloo_ranks_equals_demo_py_workers(logreg_run):
    """3 gloo ranks through the trainer (cosine schedule with warm-up, decoupled weight decay) end
    with identical replicas equal to 3 reference workers; averaging each coefficient over all
    workers instead of over its senders, or one worker alone, ends elsewhere."""
    records, models, cfg = logreg_run
    expect = reference_workers(cfg, WORLD, STEPS)
    assert max_diff(expect[0], expect[1]) == 0 and max_diff(expect[0], expect[2]) == 0  # demo.py's replicas agree
    for rank in range(WORLD):
        got = models[rank]["params"]
        assert max_diff(got, expect[0]) < 1e-10, f"rank {rank}: {max_diff(got, expect[0]):.3g}"
    assert max_diff(models[0]["params"], reference_workers(cfg, WORLD, STEPS, MeanOverAll(WORLD))[0]) > 1e-3
    assert max_diff(models[0]["params"], reference_workers(cfg, 1, STEPS)[0]) > 1e-3


def test_bytes_per_step_are_the_closed_form(logreg_run):
    """W [10, 144]: 3 chunks of 10 x 48, 32 coefficients each; c [10]: one chunk, all 10; each
    coefficient an int64 index and a float64 value: 106 x 16 = 1696 bytes per step and worker."""
    records, _, cfg = logreg_run
    per_step = _per_step_bytes([((10, 144), 8), ((10,), 8)], 32, 64)
    assert per_step == (3 * 32 + 10) * 16 == 1696
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert [r["comm_bytes"] for r in records] == [per_step * r["step"] for r in records]
    assert [r["comm_rounds"] for r in records] == [r["step"] for r in records]


#: the debug cnn at a small width: conv [4, 1, 5, 5] -> [4, 25], conv [8, 4, 5, 5] -> [8, 100]
#: (chunks 8 x 50), BatchNorm weights and biases, fc [16, 392] (chunks 16 x 56), [10, 16]; float32
CNN = ["model.channels=[4,8]", "model.hidden=16", "batch_size=16", "max_steps=4", "algo=demo",
       "algo.compression_topk=16", "optim.lr=0.001"]


def test_cnn_replicas_stay_identical_and_count_the_buffer_broadcast(tmp_path):
    """Convolutions (matrix views) and BatchNorm on 2 ranks: identical parameters and buffers on
    both, and per step the closed form plus the broadcast of the BatchNorm statistics."""
    records, models = train(tmp_path, CNN, world=2)
    for a, b in zip(models[0]["params"] + models[0]["buffers"], models[1]["params"] + models[1]["buffers"]):
        assert torch.equal(a, b)
    shapes = [(4, 1, 5, 5), (4,), (4,), (8, 4, 5, 5), (8,), (8,), (16, 392), (16,), (10, 16), (10,)]
    per_step = _per_step_bytes([(s, 4) for s in shapes], 16, 64) + 2 * (4 + 8) * 4  # BN running mean + var
    assert [r["comm_bytes"] for r in records] == [per_step * r["step"] for r in records]


# -- config errors, before any worker starts ---------------------------------------------------
@pytest.mark.parametrize("bad, key", [(["optim=adamw"], "optim.name"),
                                      (["optim.momentum=0.9"], "optim.momentum"),
                                      (["optim.nesterov=true"], "optim.nesterov"),
                                      (["optim.weight_decay=0.1"], "optim.weight_decay"),
                                      (["algo.compression_decay=1.0"], "algo.compression_decay"),
                                      (["algo.compression_topk=0"], "algo.compression_topk"),
                                      (["algo.compression_chunk=2.5"], "algo.compression_chunk"),
                                      (["algo.weight_decay=-0.1"], "algo.weight_decay")])
def test_config_errors_name_the_key(bad, key):
    from lsgd.core.errors import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose_cfg(["debug=default", "algo=demo", *bad])


def test_algo_demo_sets_demo_pys_optimizer_settings():
    """algo=demo alone composes a valid run: optim=sgd without momentum or weight decay at the
    authors' learning rate, and the paper's compression defaults."""
    cfg = compose_cfg(["debug=default", "algo=demo"])
    assert {k: cfg["optim"][k] for k in ("name", "lr", "momentum", "nesterov", "weight_decay")} == \
        {"name": "sgd", "lr": 4e-4, "momentum": 0.0, "nesterov": False, "weight_decay": 0.0}
    assert cfg["algo"] == {"name": "demo", "compression_decay": 0.999, "compression_topk": 32,
                           "compression_chunk": 64, "weight_decay": 0.0}
