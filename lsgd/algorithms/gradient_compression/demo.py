"""``demo``: DeMo, Decoupled Momentum Optimization (Peng, Quesnelle and Kingma 2024, arXiv 2411.19870,
Algorithm 1; the authors' code github.com/bloc97/DeMo ``demo.py``, class ``DeMo``;
docs/papers.md#demo).

Each step, for every parameter tensor x with local gradient g (no all-reduce of gradients happens:
the workers' momenta stay their own, "decoupled"), with eta the learning rate in use (its
parameter group's, schedule applied), beta = ``algo.compression_decay``, k =
``algo.compression_topk``, lambda = ``algo.weight_decay``::

    x     <- x (1 - eta lambda)                       decoupled weight decay
    delta <- beta delta + eta g                       the worker's own momentum
    q     =  top-k per chunk of DCT(delta)            its fast components
    delta <- delta - IDCT(q)                          what is sent leaves the momentum
    Q     =  all-gather of (indices, values) of q     every worker's q
    u     =  IDCT(mean of Q)
    x     <- x - eta sign(u)                          sign descent (demo.py: torch's SGD on sign(u))

the paper's Algorithm 1 (extract the fast components, remove them from the momentum, synchronize,
step) as ``demo.py`` implements it, which is followed wherever it is more specific than the paper
(the learning rate inside the momentum, the sign step, the mean below); the paper's 2026 revision
generalizes DeMo to other base optimizers, which is not implemented here.

DCT is the orthonormal DCT-II of each chunk of ``algo.compression_chunk`` (:mod:`lsgd.compression.dct`:
chunk sizes, layout, tensors of more than two dimensions). "Mean of Q" is ``demo.py``'s: at each
coefficient the mean of the values sent for it, over the workers that selected it (not a sum, and
not divided by the number of workers: ``scatter_reduce(reduce="mean", include_self=False)``); a
coefficient nobody selected is 0. Every worker decodes the same gathered lists in rank order, so
every replica takes the same step and the models stay identical; floating-point buffers (BatchNorm
statistics) are broadcast from rank 0 after each step (counted), as DDP's ``broadcast_buffers``.

DeMo is the optimizer. ``demo.py``'s ``DeMo`` is a ``torch.optim.SGD`` with momentum, dampening and
weight decay 0 whose step applies ``sign(u)``; here :meth:`DeMo.optimizer_step` applies the whole
update and the run's optimizer is only where the learning rate lives (``optim.lr``, its
``lr_scaling`` and the ``schedule``, per parameter group, as for every method). The rest of
``optim`` would be a second momentum or weight decay that ``demo.py`` does not have, so the run must
use ``optim=sgd`` with ``optim.momentum=0``, ``optim.nesterov=false`` and ``optim.weight_decay=0``
(a ConfigError naming the key otherwise, before any worker starts: DeMo's momentum is
``algo.compression_decay``, its weight decay ``algo.weight_decay``). ``conf/algo/demo.yaml`` sets
them, with the authors' learning rate 4e-4 (their OLMo configs ``OLMo-*-demo.yaml``: lr 4e-4, weight
decay 0, cosine schedule with warm-up).

What travels, per step and worker: one all-gather of the indices of every tensor's selection
(int64, as ``torch.topk`` returns them and ``demo.py`` sends them) and one of the values (the
parameters' dtype), each the concatenation over all tensors. Counted payload (``comm_bytes``)::

    sum over tensors of chunks * min(k, chunk elements) * (8 + value element size)
    + floating buffer bytes (the broadcast, when the model has BatchNorm)

(``demo.py``'s ``data_transmit``; counted with more than one worker, nothing with one). One round per step.

Where lsgd departs from ``demo.py``, and why:

* the two all-gathers carry every tensor at once; ``demo.py`` issues two per tensor. The bytes and
  the result are the same; the clock charges the latency of two messages per step, not two per
  tensor (a real implementation buckets them, as DDP buckets its all-reduce);
* tensors of more than two dimensions (convolutions) are transformed as their matrix view, 0-d
  tensors as one element (``demo.py`` handles 1-D and 2-D only; :mod:`lsgd.compression.dct`);
* a parameter without a gradient this step (not in the loss) counts as a zero gradient: its
  momentum decays and it still takes part in the exchange (``demo.py`` would fail on ``None``);
* the DCT basis is computed from the cosine formula in float64 (``demo.py``: an FFT of the identity
  in torch's default dtype), the same to rounding. A consequence both share: where every selected
  basis function of a chunk vanishes at an element (a basis of odd length has exact zeros), u there
  is a rounding residue whose sign moves the weight by +-eta; the two bases can disagree there;
* the buffer broadcast: the OLMo models ``demo.py`` was written for have no floating buffers; without
  it the BatchNorm statistics of the workers would drift apart.

Compute on the cluster clock (``cluster.compute=profile``): the transform, selection and decoding
are counted once on the device's roofline (:attr:`lsgd.algorithms.base.RunContext.counted_seconds`)
and charged every step, the local part before the all-gathers, the decoding after them.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from lsgd.algorithms.base import AlgoConfig, Algorithm
from lsgd.compression.dct import ChunkedDCT, scatter_mean, topk_per_chunk
from lsgd.core.errors import ConfigError
from lsgd.core.typed_config import option

@dataclass
class DeMoConfig(AlgoConfig):
    """``algo=demo``'s keys, with ``demo.py``'s defaults (those of the authors' OLMo configs)."""

    name: str = "demo"
    compression_decay: float = option(0.999, at_least=0, below=1, symbol="beta",
                                      doc="beta: decay of each worker's momentum delta (demo.py's "
                                          "compression_decay, 0.999 there and in the authors' OLMo configs)")
    compression_topk: int = option(32, at_least=1, symbol="k",
                                   doc="k: DCT coefficients each worker sends per chunk, at most the chunk's size "
                                       "(demo.py's compression_topk, 32 there and in the authors' configs)")
    compression_chunk: int = option(64, at_least=1, symbol="chunk",
                                    doc="target chunk length s: each dimension is cut into chunks of its largest "
                                        "divisor <= s, a dimension <= s is one chunk (demo.py's compression_chunk, 64 "
                                        "there and in the authors' configs)")
    weight_decay: float = option(0.0, at_least=0,
                                 doc="lambda: decoupled weight decay, x <- x (1 - lr lambda) before the update "
                                     "(demo.py's weight_decay; 0 in the authors' configs)")


#: the ``optim`` keys that DeMo takes over, the value each must have, and what replaces it
_TAKEN_OVER = (("momentum", 0, "0", "DeMo's momentum is algo.compression_decay"),
               ("nesterov", False, "false", "DeMo's momentum is algo.compression_decay"),
               ("weight_decay", 0, "0", "DeMo's decoupled weight decay is algo.weight_decay"))


class DeMo(Algorithm):
    """DeMo: decoupled local momentum, its largest DCT components all-gathered, sign descent."""

    name = "demo"
    Config = DeMoConfig
    label = "DeMo"
    paper = "docs/papers.md#demo"
    defining_keys = ("algo.compression_topk",)
    grad_scaler = "flag"  # workers' gradients stay local: the found-inf flag is agreed (lsgd.training.accel)

    @classmethod
    def validate_run(cls, cfg: dict, world_size: int) -> None:
        """DeMo is the optimizer: it needs ``optim=sgd`` without momentum, Nesterov or weight decay
        (module docstring).

        Raises:
            ConfigError: naming ``optim.name``, ``optim.momentum``, ``optim.nesterov`` or
                ``optim.weight_decay``.
        """
        optim = cfg.get("optim") or {}
        if optim.get("name") != "sgd":
            raise ConfigError(
                f"algo=demo is its own optimizer (sign descent on the all-gathered DCT components of a local "
                f"momentum) and takes only the learning rate from optim; got optim.name={optim.get('name')!r}, "
                "allowed: sgd (with optim.momentum=0, optim.nesterov=false, optim.weight_decay=0, as "
                "conf/algo/demo.yaml sets them)")
        for key, allowed, written, why in _TAKEN_OVER:
            value = optim.get(key, allowed)
            if value is None or value != allowed:
                raise ConfigError(f"optim.{key}={value!r} conflicts with algo=demo ({why}); "
                                  f"allowed: optim.{key}={written}")

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.beta = float(self.config.compression_decay)
        self.topk = int(self.config.compression_topk)
        self.chunk = int(self.config.compression_chunk)
        self.weight_decay = float(self.config.weight_decay)
        self.params: list[nn.Parameter] = []
        self.delta: list[torch.Tensor] = []          # each tensor's local momentum
        self.transforms: list[ChunkedDCT] = []
        self.price: dict[str, float] = {}            # modeled seconds of the local part / the decoding

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, ctx=None) -> nn.Module:
        module = super().setup(model, optimizer, ctx)
        # demo.py's order: the optimizer's parameter groups, parameters that require a gradient
        self.params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        self.delta = [torch.zeros_like(p) for p in self.params]
        self.transforms = []
        by_shape: dict[tuple, ChunkedDCT] = {}
        for p in self.params:
            key = (tuple(p.shape), p.dtype, p.device)
            if key not in by_shape:
                by_shape[key] = ChunkedDCT(p.shape, self.chunk, p.dtype, p.device)
            self.transforms.append(by_shape[key])
        # the schedule steps the optimizer's learning rate, whose own step() DeMo never calls:
        # torch's ordering warning is moot
        warnings.filterwarnings("ignore",
                                message=re.escape("Detected call of `lr_scheduler.step()` before `optimizer.step()`"))
        return module

    def _lrs(self) -> list[float]:
        """The learning rate of each of :attr:`params` (its group's, now)."""
        return [float(group["lr"]) for group in self.optimizer.param_groups
                for p in group["params"] if p.requires_grad]

    def _priced(self, key: str, fn):
        """``fn()``, and its modeled seconds on the clock: counted the first time (a checkpoint keeps
        the price, so a resumed run charges what the uninterrupted one does)."""
        counted = self.ctx.counted_seconds
        if key in self.price or counted is None:
            out = fn()
        else:
            out, self.price[key] = counted(fn)
        clock = self.comm.clock
        if clock is not None and self.price.get(key):
            clock.compute(self.price[key])
        return out

    @torch.no_grad()
    def _compress(self, lrs: list[float]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Weight decay, the momentum update, each tensor's selection and its removal from the
        momentum; returns the flat (indices, values) of every tensor, in :attr:`params` order."""
        idxs, vals = [], []
        for p, delta, transform, lr in zip(self.params, self.delta, self.transforms, lrs):
            if self.weight_decay:
                p.mul_(1.0 - lr * self.weight_decay)
            delta.mul_(self.beta)
            if p.grad is not None:
                delta.add_(p.grad, alpha=lr)
            idx, val = topk_per_chunk(transform.encode(delta), self.topk)
            delta.sub_(transform.decode(scatter_mean(idx, val, transform.chunk_numel)))
            idxs.append(idx.reshape(-1))
            vals.append(val.reshape(-1))
        return idxs, vals

    @torch.no_grad()
    def _apply(self, idx_all: torch.Tensor, val_all: torch.Tensor, lrs: list[float]) -> None:
        """Decode every worker's selections (``[workers, payload]``, rank order) and take the sign step."""
        workers = idx_all.shape[0]
        offset = 0
        for p, transform, lr in zip(self.params, self.transforms, lrs):
            k = min(self.topk, transform.chunk_numel)
            n = transform.num_chunks * k
            # demo.py's batch_decompress: the workers' [chunks, k] selections side by side, rank order
            idx = idx_all[:, offset:offset + n].reshape(workers, transform.num_chunks, k)
            val = val_all[:, offset:offset + n].reshape(workers, transform.num_chunks, k)
            idx = idx.permute(1, 0, 2).reshape(transform.num_chunks, workers * k)
            val = val.permute(1, 0, 2).reshape(transform.num_chunks, workers * k)
            u = transform.decode(scatter_mean(idx, val, transform.chunk_numel))
            p.add_(u.sign(), alpha=-lr)
            offset += n

    def optimizer_step(self) -> None:
        """DeMo's step (module docstring): compress, all-gather, decode, sign descent; then the
        buffers' broadcast."""
        lrs = self._lrs()
        idxs, vals = self._priced("compress", lambda: self._compress(lrs))
        idx, val = torch.cat(idxs), torch.cat(vals)
        p = self.comm.world_size
        idx_all = torch.empty(p * idx.numel(), dtype=idx.dtype, device=idx.device)
        val_all = torch.empty(p * val.numel(), dtype=val.dtype, device=val.device)
        # demo.py's _demo_all_gather: indices and values in flight together, then both waited for
        handles = [self.comm.all_gather_into(idx_all, idx, async_op=True),
                   self.comm.all_gather_into(val_all, val, async_op=True)]
        for handle in handles:
            handle.wait()
        self.comm.round()
        self._priced("decode", lambda: self._apply(idx_all.view(p, -1), val_all.view(p, -1), lrs))
        self.broadcast_buffers()

    @property
    def models_in_sync(self) -> bool:
        return True

    def state_dict(self) -> dict:
        return {"delta": [d.clone() for d in self.delta], "price": dict(self.price)}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for d, s in zip(self.delta, state["delta"]):
                d.copy_(s)
        self.price = dict(state.get("price", {}))
