"""``accordion``: Accordion (Agarwal, Wang, Lee, Venkataraman, Papailiopoulos, MLSys 2021), the
adaptive baseline of the GraVAC study (docs/papers.md#accordion).

Per layer (each parameter tensor, as in Accordion's code), every ``algo.switch_period`` epochs
the norm of the gradient accumulated over the period (the averaged gradient every worker holds
after the exchange, so all workers decide alike without extra communication) is compared with the
previous period's: a relative change ``|prev - cur| / prev >= eta`` (``algo.eta``, 0.5) marks a
critical regime and the layer uses the low compression level for the next period, else the high
level (:class:`lsgd.compression.adaptive.AccordionController`). The first period and every
learning-rate decay force low compression.

Learning-rate decays are the milestones of a ``step`` schedule (the paper's decays, e.g. x0.1 at
epochs 150 and 250; :func:`lsgd.training.optim.lr_decay_steps`), not every step on which the rate falls.
A forced low period lasts from the first step run at the decayed rate to the end of the switch
period the decay falls in: a decay on a period boundary (milestones and periods both in epochs, the
usual case) makes the whole next period low; a decay inside a period switches every layer to low
at once for the rest of that period, and the next boundary decides by the norm rule again. Under a
continuous schedule (``cosine``, warm-up) there are no milestones, so nothing forces low
compression beyond the first period: only the norm rule switches levels. (Reading every falling
step as a decay would keep Accordion at low compression for the whole of a cosine run.)

Levels (``algo.compressor``):

* ``topk``: keep 99% (``algo.cf_low`` = 1/0.99) or 10% (``algo.cf_high`` = 10) of each tensor,
  with error feedback, through the :class:`~lsgd.algorithms.gradient_compression.compressed.Compressed` DDP hook;
* ``powersgd``: torch's PowerSGD hook with rank ``algo.rank_low`` (2) or ``algo.rank_high`` (1).
  torch's PowerSGD state has one rank, so two states are kept and each DDP bucket uses the low
  one when any of its layers is critical (use a small ``algo.bucket_cap_mb`` for per-layer
  decisions); a bucket's error-feedback residual moves with it when it switches state, and both
  states share the iteration counter.

Every step writes a compression row (``cf`` of the step, ``low_fraction``, ``sent``: low / high
/ mixed) to metrics.jsonl.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lsgd.algorithms.gradient_compression.compressed import Compressed, CompressionHookConfig
from lsgd.compression.adaptive import AccordionController
from lsgd.compression.options import PowerSGDHookOptions
from lsgd.compression.powersgd import PowerSGD
from lsgd.core.typed_config import option

ACCORDION_COMPRESSORS = ("topk", "powersgd")


@dataclass
class AccordionConfig(PowerSGDHookOptions, CompressionHookConfig):
    """``algo=accordion``'s keys: the two compression levels, the switch rule,
    :class:`~lsgd.algorithms.gradient_compression.compressed.CompressionHookConfig`'s and the
    settings its two PowerSGD states share (:class:`lsgd.compression.options.PowerSGDHookOptions`)."""

    name: str = "accordion"
    compressor: str = option("topk", choices=ACCORDION_COMPRESSORS, doc="the compressor whose level switches")
    cf_low: float = option(1 / 0.99, at_least=1, doc="topk: the compression factor in critical regimes (keep 99%)",
                           symbol="CF low")
    cf_high: float = option(10, at_least=1, doc="topk: the compression factor otherwise (keep 10%)", symbol="CF high")
    rank_low: int = option(2, at_least=1, doc="powersgd: the rank in critical regimes")
    rank_high: int = option(1, at_least=1, doc="powersgd: the rank otherwise")
    switch_period: float = option(10, above=0, doc="epochs between decisions (the paper: 10 on CIFAR/ImageNet)")
    eta: float = option(0.5, above=0, doc="eta: relative change of the accumulated gradient norm that marks a "
                        "critical regime")


class Accordion(Compressed):
    """Accordion: per-layer switching between two compression levels on critical regimes.

    Config keys (:class:`AccordionConfig`): ``compressor`` (topk | powersgd), ``cf_low``,
    ``cf_high``, ``rank_low``, ``rank_high``, ``switch_period`` (epochs), ``eta``,
    ``error_feedback``, ``bucket_cap_mb``, powersgd's ``start_iter``, ``warm_start``,
    ``min_compression_rate``, ``seed``.
    """

    name = "accordion"
    Config = AccordionConfig
    label = "Accordion"
    paper = "docs/papers.md#accordion"
    defining_keys = ("algo.compressor",)

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        """Each key against :class:`AccordionConfig` (:meth:`parse_config`); Compressed's check
        across keys (DGC's clipping) does not apply."""
        cls.parse_config(algo)

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.cf_low = float(self.config.cf_low)
        self.cf_high = float(self.config.cf_high)
        self.eta = float(self.config.eta)
        self.switch_period = float(self.config.switch_period)
        self.decay_steps: frozenset[int] = frozenset()
        self._step_counters = (0, 0)

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, ctx=None) -> nn.Module:
        if ctx is not None:
            self.steps_per_epoch = ctx.steps_per_epoch
            self.decay_steps = frozenset(ctx.lr_decay_steps)
        params = list(model.parameters())
        self.controller = AccordionController(num_layers=len(params), eta=self.eta)
        self.accum = [torch.zeros_like(p) for p in params]
        self.period_steps = max(1, round(self.switch_period * (self.steps_per_epoch or 1)))
        wrapped = super().setup(model, optimizer, ctx)
        if self.powersgd is not None:
            self.powersgd_low = self.powersgd
            self.powersgd_high = self.make_powersgd(int(self.config.rank_high))
            self.bucket_state: dict[int, PowerSGD] = {}
        return wrapped

    def compressor_cf(self) -> float:
        """topk's default compression factor: the high one (each tensor's own is :meth:`_cf`)."""
        return self.cf_high

    def powersgd_rank(self) -> int:
        """The first PowerSGD state's rank: the low one (the second state, :attr:`powersgd_high`, has
        the high one)."""
        return int(self.config.rank_low)

    # -- compression at the level of each layer ---------------------------------------------------
    def compress_one(self, key, g):
        g_ef = self.memory.compensate(key, g)
        c = self.compressor.compress(g_ef, step=self.local_step, key=key, cf=self._cf(key))
        self.memory.update(key, g_ef, self.compressor.decompress(c))
        return c

    def _cf(self, key: int) -> float:
        return self.cf_low if self.controller.low[key] else self.cf_high

    def cost_key(self, key):
        """The compute of a tensor's compression is priced per (tensor, compression factor)."""
        return key, self._cf(key)

    def register_hook(self, ddp) -> None:
        if self.powersgd is not None:
            ddp.register_comm_hook(None, self._powersgd_hook)
        else:
            super().register_hook(ddp)

    def _powersgd_hook(self, state, bucket):
        keys = [self.param_index[id(p)] for p in bucket.parameters()]
        low = any(self.controller.low[k] for k in keys)
        chosen = self.powersgd_low if low else self.powersgd_high
        idx = bucket.index()
        previous = self.bucket_state.get(idx)
        if previous is not None and previous is not chosen and idx in previous.state.error_dict:
            chosen.state.error_dict[idx] = previous.state.error_dict.pop(idx)
        self.bucket_state[idx] = chosen
        with self.comm.overlap(self.bucket_ready_at(bucket)):
            return chosen.hook(state, bucket)

    def powersgd_hooks(self) -> list:
        return [self.powersgd_low, self.powersgd_high] if self.powersgd is not None else []

    def byte_counters(self) -> tuple[int, int]:
        if self.powersgd is not None:
            lo, hi = self.powersgd_low, self.powersgd_high
            return lo.dense_bytes + hi.dense_bytes, lo.sent_bytes + hi.sent_bytes
        return super().byte_counters()

    # -- the critical-regime rule -----------------------------------------------------------------
    @torch.no_grad()
    def after_backward(self, step: int) -> None:
        super().after_backward(step)
        for acc, p in zip(self.accum, self.model.parameters()):
            if p.grad is not None:
                acc.add_(p.grad)

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        super().after_step(step)
        if self.powersgd is not None:  # both states count iterations together
            it = max(self.powersgd_low.state.iter, self.powersgd_high.state.iter)
            self.powersgd_low.state.iter = self.powersgd_high.state.iter = it
        dense, sent = self.byte_counters()
        d0, s0 = self._step_counters
        self._step_counters = (dense, sent)
        low = self.controller.low
        n_low = sum(low)
        self.step_rows.append({
            "kind": "compression",
            "step": step,
            "cf": (dense - d0) / (sent - s0) if sent > s0 else 1.0,
            "sent": "low" if n_low == len(low) else ("high" if n_low == 0 else "mixed"),
            "low_fraction": n_low / len(low),
        })
        decayed = step in self.decay_steps  # the next step runs at a milestone's decayed rate
        if decayed:
            self.controller.force_low()
        if step % self.period_steps == 0:
            norms = torch.stack([a.norm() for a in self.accum]).tolist()  # one host read per period
            self.controller.end_period(norms, lr_decayed=decayed)
            for a in self.accum:
                a.zero_()

    def metrics(self) -> dict:
        out = super().metrics()
        out["low_fraction"] = sum(self.controller.low) / len(self.controller.low)
        return out

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update(
            controller=self.controller.state_dict(),
            accum=[a.clone() for a in self.accum],
            step_counters=self._step_counters,
        )
        if self.powersgd is not None:
            state["powersgd_high"] = self.powersgd_high.state_dict()
            state["powersgd_high_bytes"] = (self.powersgd_high.dense_bytes, self.powersgd_high.sent_bytes)
            state["bucket_low"] = {i: s is self.powersgd_low for i, s in self.bucket_state.items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.controller.load_state_dict(state["controller"])
        for a, saved in zip(self.accum, state["accum"]):
            a.copy_(saved)
        self._step_counters = tuple(state.get("step_counters", (0, 0)))
        if self.powersgd is not None and "powersgd_high" in state:
            self.powersgd_high.load_state_dict(state["powersgd_high"])
            self.powersgd_high.dense_bytes, self.powersgd_high.sent_bytes = state.get("powersgd_high_bytes", (0, 0))
            self.bucket_state = {
                int(i): (self.powersgd_low if low else self.powersgd_high) for i, low in state["bucket_low"].items()
            }
