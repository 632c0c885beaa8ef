"""``compressed``: data-parallel SGD with a static gradient compressor and error feedback, inside
DDP comm hooks (docs/papers.md#compressed; the static baselines of the GraVAC study).

``algo.compressor`` picks the compressor (``none``, ``fp16``, ``topk``, ``randomk``, ``dgc``,
``redsync``, ``qsgd``, ``powersgd``) and ``algo.cf`` its compression factor theta (dense size /
compressed size; sparsifiers keep ceil(n / cf) elements of each tensor).

Per DDP bucket, in the comm hook (so bucket i is compressed and sent while backward still runs
for the layers in front of it), for every gradient tensor g of the bucket (error feedback is per
tensor, keyed by the parameter's index in ``model.parameters()``):

    g_ef = g + r          (error feedback; DGC: momentum correction, lsgd.compression.memory)
    c    = C(g_ef)        (compress at theta)
    r    = g_ef - D(c)    (residual of what this worker sent)

and the bucket's payloads go out in one exchange (:func:`lsgd.compression.exchange.exchange`):
all-reduce for payloads that can be summed (fp16, randomk with indices from the seed shared by all
workers and the step), all-gather of (values, int32 indices) for the others. The averaged, dense
result becomes the bucket's gradient. ``powersgd`` runs torch's own PowerSGD hook instead
(:mod:`lsgd.compression.powersgd`: rank, start iteration, error feedback, warm start).

DGC (Lin, Han, Mao, Wang and Dally, "Deep Gradient Compression", ICLR 2018; the authors' code
github.com/synxlin/deep-gradient-compression): with ``algo.compressor=dgc``,
``algo.momentum_correction=true`` and ``algo.error_feedback=true`` the SGD optimizer's
``momentum`` m, ``nesterov`` flag and ``weight_decay`` wd move into the comm hook (the optimizer's
param groups get momentum 0, nesterov false, weight decay 0, so its step is ``w <- w - lr * G``
with G the averaged, decompressed result). Per tensor of worker k, in this order::

    g <- g * min(1, c / (||g|| + 1e-6))   local gradient clipping (Sec. 3.3), c = clip_norm * sqrt(N)
    g <- g + wd * w                  weight decay, part of the gradient that is corrected
    u <- m u + g;  v <- v + u        momentum correction (Sec. 3.2; Nesterov: u <- m (u + g);
                                     v <- v + u + g, as the authors' DGCSGDMemory)
    c = C(v)                         sampled-threshold top-k at the (warmed-up) cf
    v[sent] = 0;  u[sent] = 0        factor masking

(:class:`lsgd.compression.memory.DGCMemory`). ``algo.error_feedback=false`` turns all of it off
but the clipping: no memory, nothing accumulated, and the optimizer keeps its own momentum and
weight decay (it then applies them to the averaged sparse gradient). ``momentum_correction=true``
needs ``optim.name=sgd`` (a ConfigError before any worker starts; TypeError at setup when the
hooks are driven by hand).

Weight decay: the paper does not mention it; its Algorithm 1 corrects the gradient of the loss, and
here ``wd * w`` is part of that gradient (the regularized loss), so momentum applies to it as in
momentum SGD. (Leaving it to a momentum-free optimizer, as lsgd did before, scales the effective
weight decay by about 1 - m.) The authors' code reaches the same effective decay differently: its
``DGCSGD`` optimizer (dgc/optim/sgd.py) applies ``wd * w`` locally with a momentum buffer of its
own, dense and never compressed.

Local gradient clipping (``algo.clip_norm``, null: off; dgc only): the threshold ``clip_norm`` is
the one of single-worker clipping, on the gradient averaged over all N workers. The paper clips
each worker's share ``G_k = g_k / N`` (Algorithm 1 accumulates ``1/(N b)`` of each sample's
gradient) at ``clip_norm * N**-1/2``; here ``g_k`` is the worker's mean gradient, so it is clipped
at ``clip_norm * N**(1/2)`` (the same rule). The norm is per tensor, as in the authors' code (the
memory applies its ``gradient_clipping`` to each parameter's gradient; dgc/clip_grad.py
``clip_grad_norm_``, scale ``max_norm / (norm + 1e-6)`` when below 1); the comm hook compresses a
bucket before later gradients exist, so a whole-model norm is not available. It precedes the
weight decay, as torch's ``clip_grad_norm_`` on ``.grad`` precedes the optimizer's weight decay.

Density warm-up (Sec. 3.4): ``algo.warmup_epochs`` W (0: off) epochs with compression factor
``cf ** ((e + 1) / (W + 1))`` in epoch e (:class:`lsgd.compression.compressors.DGC`), converted to
steps with the run's ``steps_per_epoch``; the study's variants ``dgc_10x`` / ``dgc_1000x`` use
the paper's W = 4.

Accounting: the exact payload bytes each worker hands to the collectives (``Compressed.nbytes``
summed, plus the size exchange and padding of unequal all-gathers; an item whose sparse payload
would outgrow the dense tensor travels dense, :mod:`lsgd.compression.exchange`), counted by the
communicator; one step = one round. The record key ``cf`` is the effective compression factor
since the previous record: dense gradient bytes / gradient bytes handed to the collectives, both
summed over the steps since the previous record on this worker (rank 0's value is recorded;
1.0 when nothing was sent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from lsgd.algorithms.averaging.ddp import DDP
from lsgd.algorithms.base import AlgoConfig
from lsgd.compression import compressors as C
from lsgd.compression.exchange import exchange
from lsgd.compression.memory import DGCMemory, ErrorFeedback, NoMemory
from lsgd.compression.options import (
    DGCOptions,
    LatticeOptions,
    PowerSGDOptions,
    QSGDOptions,
    RandomKOptions,
)
from lsgd.compression.powersgd import PowerSGD
from lsgd.core.errors import ConfigError
from lsgd.core.typed_config import option


def build_compressor(config, *, cf: float | None = None, seed: int | None = None,
                     steps_per_epoch: int | None = None) -> C.Compressor:
    """The compressor named by ``config.compressor`` (an algo config) with its keys from ``config``:
    those of its options dataclass that its constructor takes (:func:`lsgd.compression.compressors.config_params`)
    and ``config`` declares (GraVAC's declares neither ``cf`` nor ``warmup_epochs``, Accordion's no
    ``cf``); ``cf`` and ``seed`` replace ``algo.cf`` and ``algo.seed`` where given; ``steps_per_epoch``:
    DGC's density warm-up, ``algo.warmup_epochs``."""
    name = config.compressor
    keys = C.config_params(name)
    values = {k: getattr(config, k, None) for k in keys}
    if seed is not None and "seed" in keys:
        values["seed"] = seed
    params = {k: v for k, v in values.items() if v is not None}
    if name in C.SPARSIFIERS:
        params["cf"] = float(cf if cf is not None else config.cf)
    if name == "dgc" and params.get("warmup_epochs"):
        params["steps_per_epoch"] = steps_per_epoch
    return C.build(name, **params)


@dataclass
class CompressionHookConfig(AlgoConfig):
    """The keys of the methods that compress in DDP comm hooks (``compressed``, ``accordion``): the
    compressor, error feedback and DDP's bucket size."""

    compressor: str = option("topk", choices=tuple(C.COMPRESSORS), doc="the compressor (lsgd.compression.compressors)")
    error_feedback: bool = option(True, doc="residual memory per tensor, in gradient units (saved in checkpoints)",
                                  symbol=("error feedback", "no error feedback"))
    bucket_cap_mb: float = option(25, above=0, doc="DDP's gradient bucket size, MiB")


@dataclass
class CompressedConfig(PowerSGDOptions, LatticeOptions, QSGDOptions, DGCOptions, RandomKOptions, CompressionHookConfig):
    """``algo=compressed``'s keys: :class:`CompressionHookConfig`'s and every compressor's options
    (:mod:`lsgd.compression.options`)."""

    name: str = "compressed"


class Compressed(DDP):
    """Static gradient compression with error feedback, in DDP comm hooks.

    Config keys (:class:`CompressedConfig`): ``compressor``, ``cf``, ``error_feedback`` (bool),
    ``bucket_cap_mb``; powersgd: ``rank``, ``start_iter``, ``warm_start``, ``min_compression_rate``;
    qsgd: ``levels``; lattice: ``bits``, ``side``; dgc: ``momentum_correction``, ``clip_norm``,
    ``sample_ratio``, ``warmup_epochs``; randomk/dgc/qsgd/lattice (and powersgd's initial Q): ``seed``
    (the run's ``seed`` unless set).
    """

    name = "compressed"
    Config = CompressedConfig
    label = "compressed"
    paper = "docs/papers.md#compressed"
    defining_keys = ("algo.compressor",)
    grad_scaler = None  # error feedback would keep a skipped step's residual (lsgd.training.accel)

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        super().validate_config(algo, world_size)
        config = cls.parse_config(algo)
        if config.clip_norm is not None and config.compressor != "dgc":
            raise ConfigError(f"algo.clip_norm (DGC's local gradient clipping) applies to algo.compressor=dgc "
                              f"only, got algo.compressor={config.compressor!r}; allowed: null")

    @classmethod
    def validate_run(cls, cfg: dict, world_size: int) -> None:
        """DGC's momentum correction takes over SGD's momentum: it needs ``optim.name=sgd``."""
        config = cls.parse_config(cfg["algo"])
        if (config.compressor == "dgc" and config.momentum_correction
                and config.error_feedback and cfg.get("optim", {}).get("name") != "sgd"):
            raise ConfigError(
                f"algo.momentum_correction=true (DGC) takes over SGD's momentum and weight decay and needs "
                f"optim.name=sgd, got optim.name={cfg.get('optim', {}).get('name')!r}; allowed: optim=sgd, or "
                "algo.momentum_correction=false")

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.compressor_name = self.config.compressor
        self.error_feedback = bool(self.config.error_feedback)
        self.local_step = 0          # completed local steps (the step seed of randomk / dgc)
        self.dense_bytes = 0         # gradient bytes a dense all-reduce would have sent (cumulative)
        self.sent_bytes = 0          # gradient payload bytes actually sent (cumulative)
        self.powersgd: PowerSGD | None = None
        self.compressor = None
        self.memory = None
        self.weight_decay: dict[int, float] = {}  # DGC: key -> wd taken over from the optimizer
        self.clip_norm: float | None = None        # DGC: per-tensor threshold on the local gradient
        self.compress_s: dict = {}                 # modeled seconds of one tensor's compression, by cost_key
        self.compress_counts: dict = {}            # times each cost_key was counted (up to 2)
        self.step_compress_s = 0.0                 # modeled compression seconds of this step so far

    def compressor_seed(self) -> int:
        """``algo.seed``, or the run's seed (``RunContext.seed``) when it is null."""
        seed = self.config.seed
        return int(seed) if seed is not None else int(self.ctx.seed)

    def compressor_cf(self) -> float:
        """The sparsifier's compression factor: ``algo.cf`` (Accordion: its high one)."""
        return float(self.config.cf)

    def powersgd_rank(self) -> int:
        """The PowerSGD state's rank: ``algo.rank`` (Accordion: its low one)."""
        return int(self.config.rank)

    def make_powersgd(self, rank: int) -> PowerSGD:
        """torch's PowerSGD hook and state of ``rank`` with the config's start, warm start, minimum
        compression rate and seed (:meth:`compressor_seed`)."""
        return PowerSGD(
            self.comm,
            rank=rank,
            start_iter=int(self.config.start_iter),
            error_feedback=self.error_feedback,
            warm_start=bool(self.config.warm_start),
            min_compression_rate=float(self.config.min_compression_rate),
            seed=self.compressor_seed(),
        )

    # -- setup ------------------------------------------------------------------------------
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, ctx=None) -> nn.Module:
        self.model, self.optimizer = model, optimizer
        if ctx is not None:
            self.ctx = ctx
            self.steps_per_epoch = ctx.steps_per_epoch
        self.param_index = {id(p): i for i, p in enumerate(model.parameters())}
        if self.compressor_name == "powersgd":
            self.powersgd = self.make_powersgd(self.powersgd_rank())
        else:
            self.compressor = build_compressor(self.config, cf=self.compressor_cf(), seed=self.compressor_seed(),
                                               steps_per_epoch=self.steps_per_epoch)
            self.memory = self._make_memory(model, optimizer)
            if self.compressor_name == "dgc" and self.config.clip_norm is not None:
                self.clip_norm = float(self.config.clip_norm) * math.sqrt(self.comm.world_size)
        return super().setup(model, optimizer, ctx)

    def _make_memory(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        """The error-feedback memory: none when disabled or lossless; DGC with momentum
        correction: :class:`DGCMemory`, taking over the SGD optimizer's momentum, Nesterov flag and
        weight decay (module docstring); else the residual :class:`ErrorFeedback`.

        Raises:
            TypeError: momentum correction with an optimizer other than SGD (optim.name != sgd).
            ValueError: param groups with different momentum or Nesterov settings.
        """
        if not self.error_feedback or not self.compressor.lossy:
            return NoMemory()
        if self.compressor_name != "dgc" or not self.config.momentum_correction:
            return ErrorFeedback()
        if not isinstance(optimizer, torch.optim.SGD):
            raise TypeError(f"algo.momentum_correction=true (DGC) takes over SGD's momentum and needs optim.name=sgd, "
                              f"got {type(optimizer).__name__}; allowed: optim.name=sgd or algo.momentum_correction=false")
        settings = {(float(g["momentum"]), bool(g.get("nesterov", False))) for g in optimizer.param_groups}
        if len(settings) != 1:
            raise ValueError(f"DGC momentum correction needs one momentum and Nesterov setting for all param groups, "
                             f"got {sorted(settings)}")
        (momentum, nesterov), = settings
        index = {id(p): i for i, p in enumerate(model.parameters())}
        for group in optimizer.param_groups:
            wd = float(group.get("weight_decay", 0.0))
            for p in group["params"]:
                if wd and id(p) in index:
                    self.weight_decay[index[id(p)]] = wd
            # the hook applies them (DGC Sec. 3.2); torch's SGD rejects Nesterov without momentum
            group["momentum"], group["nesterov"], group["weight_decay"] = 0.0, False, 0.0
        return DGCMemory(momentum, nesterov=nesterov)

    def register_hook(self, ddp) -> None:
        """Compression hook (or torch's PowerSGD hook) instead of DDP's plain all-reduce."""
        ddp.register_comm_hook(None, self._powersgd_hook if self.powersgd is not None else self.compression_hook)

    def _powersgd_hook(self, state, bucket):
        """torch's PowerSGD hook, its all-reduces clocked from the bucket's ready time."""
        with self.comm.overlap(self.bucket_ready_at(bucket)):
            return self.powersgd.hook(state, bucket)

    # -- the comm hook ----------------------------------------------------------------------
    def local_gradient(self, key: int, grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        """DGC's corrections of one local gradient before the memory (module docstring): clipping
        to ``clip_norm * sqrt(N)`` (per tensor), then ``+ wd * w``. Other compressors: ``grad``."""
        if self.clip_norm is not None:
            # on the device (no host read per tensor): the factor min(1, clip / (norm + 1e-6)) in
            # float64, as the host-side arithmetic it replaces; a factor of exactly 1 changes nothing
            factor = (self.clip_norm / (grad.norm().double() + 1e-6)).clamp(max=1.0)
            grad = grad * factor.to(grad.dtype)
        wd = self.weight_decay.get(key)
        if wd:
            grad = grad + wd * param.detach()
        return grad

    def compress_one(self, key: int, g: torch.Tensor):
        """Error feedback and compression of one gradient tensor; returns its Compressed payload."""
        g_ef = self.memory.compensate(key, g)
        c = self.compressor.compress(g_ef, step=self.local_step, key=key)
        self.memory.update(key, g_ef, self.compressor.decompress(c))
        return c

    def cost_key(self, key: int):
        """What the modeled compression seconds are cached by (:meth:`compress_bucket`)."""
        return key

    def compress_bucket(self, grads: list[torch.Tensor], keys: list[int]) -> list:
        """:meth:`compress_one` of each tensor; returns the Compressed payloads. Their compute goes
        on the clock in :meth:`after_backward`: a tensor's ops (compensate, compress, decompress,
        update) are counted and priced on the device's roofline the first time its
        :meth:`cost_key` is seen and again the second time (then the error-feedback memory holds
        a residual, as on every later step), :attr:`RunContext.counted_seconds`, and charged at the
        second count's price on every later step (a DGC warm-up's changing density does not
        reprice it)."""
        items = []
        counted = self.ctx.counted_seconds
        for key, g in zip(keys, grads):
            cost = self.cost_key(key)
            if self.compress_counts.get(cost, 0) >= 2 or counted is None:
                items.append(self.compress_one(key, g))
            else:  # counted twice: the second count (memory filled, steady state) is kept
                c, self.compress_s[cost] = counted(lambda key=key, g=g: self.compress_one(key, g))
                self.compress_counts[cost] = self.compress_counts.get(cost, 0) + 1
                items.append(c)
            self.step_compress_s += self.compress_s.get(cost, 0.0)
        return items

    def compression_hook(self, _state, bucket):  # no return annotation: DDP inspects it
        """Compress, exchange and average one DDP bucket (returns a completed future)."""
        grads = bucket.gradients()
        params = bucket.parameters()
        keys = [self.param_index[id(p)] for p in params]
        if self.clip_norm is not None or self.weight_decay:
            grads = [self.local_gradient(k, g, p) for k, g, p in zip(keys, grads, params)]
        items = self.compress_bucket(grads, keys)
        before = self.comm.stats.comm_bytes
        with self.comm.overlap(self.bucket_ready_at(bucket)):
            outs = exchange(self.comm, self.compressor, items)
        self.dense_bytes += sum(g.numel() * g.element_size() for g in grads)
        # what the exchange handed to collectives (sizes, padding, dense fallback); one worker sends nothing
        self.sent_bytes += (self.comm.stats.comm_bytes - before) if self.comm.world_size > 1 else sum(c.nbytes for c in items)
        buf = bucket.buffer()
        offset = 0
        for out in outs:
            n = out.numel()
            buf[offset : offset + n].copy_(out.reshape(-1))
            offset += n
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(buf)
        return fut

    def after_step(self, step: int) -> None:
        self.local_step = step
        super().after_step(step)

    # -- metrics and state ----------------------------------------------------------------------
    def powersgd_hooks(self) -> list:
        """The PowerSGD hooks in use (none for the sparsifiers)."""
        return [self.powersgd] if self.powersgd is not None else []

    def after_backward(self, step: int) -> None:
        """Settle the buckets' clock, then charge the compression compute (after the step's
        communication: an upper bound, as early buckets really compress during backward):
        PowerSGD's FLOPs at the device's compute rate (:meth:`ComputeModel.seconds`), the other
        compressors' counted ops on its roofline (:meth:`compress_bucket`)."""
        super().after_backward(step)
        flops = sum(h.pop_flops() for h in self.powersgd_hooks())
        seconds, self.step_compress_s = self.step_compress_s, 0.0
        clock = self.comm.clock
        if flops and clock is not None and self.ctx.compute_seconds is not None:
            clock.compute(self.ctx.compute_seconds(flops))
        if seconds and clock is not None:
            clock.compute(seconds)

    def byte_counters(self) -> tuple[int, int]:
        """(dense gradient bytes, sent gradient bytes) since the start of training."""
        if self.powersgd is not None:
            return self.powersgd.dense_bytes, self.powersgd.sent_bytes
        return self.dense_bytes, self.sent_bytes

    def metrics(self) -> dict:
        dense, sent = self.byte_counters()
        last_dense, last_sent = getattr(self, "_last_counters", (0, 0))
        self._last_counters = (dense, sent)
        out = {"cf": (dense - last_dense) / (sent - last_sent) if sent > last_sent else 1.0}
        if self.compressor_name == "lattice":
            out["lattice_resent"] = self.compressor.resent
        return out

    def state_dict(self) -> dict:
        state = {"local_step": self.local_step, "bytes": (self.dense_bytes, self.sent_bytes),
                 "last_counters": getattr(self, "_last_counters", (0, 0)),
                 # the priced compression compute (compress_bucket): a resumed run charges what the
                 # uninterrupted one does, not a fresh count
                 "compress_price": (dict(self.compress_s), dict(self.compress_counts))}
        if self.powersgd is not None:
            state["powersgd"] = self.powersgd.state_dict()
            state["powersgd_bytes"] = (self.powersgd.dense_bytes, self.powersgd.sent_bytes)
        if self.memory is not None:
            state["memory"] = self.memory.state_dict()
        if self.compressor_name == "lattice":
            state["lattice_resent"] = self.compressor.resent
        return state

    def load_state_dict(self, state: dict) -> None:
        self.local_step = int(state.get("local_step", 0))
        self.dense_bytes, self.sent_bytes = state.get("bytes", (0, 0))
        self._last_counters = tuple(state.get("last_counters", (0, 0)))
        if "compress_price" in state:
            self.compress_s, self.compress_counts = (dict(d) for d in state["compress_price"])
        if self.powersgd is not None and "powersgd" in state:
            self.powersgd.load_state_dict(state["powersgd"])
            self.powersgd.dense_bytes, self.powersgd.sent_bytes = state.get("powersgd_bytes", (0, 0))
        if self.memory is not None and "memory" in state:
            self.memory.load_state_dict(state["memory"])
        if self.compressor_name == "lattice":
            self.compressor.resent = int(state.get("lattice_resent", 0))

