"""``accordion``: Accordion (Agarwal, Wang, Lee, Venkataraman, Papailiopoulos, MLSys 2021), the
adaptive baseline of the GraVAC study (papers.md section 2).

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

import torch
from torch import nn

from lsgd.algorithms.gradient_compression.compressed import Compressed, validate_compressor_keys
from lsgd.compression.adaptive import AccordionController
from lsgd.compression.powersgd import PowerSGD
from lsgd.core.checks import choice, int_at_least, number_at_least, positive

ACCORDION_COMPRESSORS = ("topk", "powersgd")


class Accordion(Compressed):
    """Accordion's critical-regime switching between two compression levels.

    Config keys: ``compressor`` (topk | powersgd), ``cf_low``, ``cf_high``, ``rank_low``,
    ``rank_high``, ``switch_period`` (epochs), ``eta``, ``error_feedback``, ``bucket_cap_mb``,
    powersgd's ``start_iter``, ``warm_start``, ``min_compression_rate``.
    """

    name = "accordion"

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        w = "algo."
        choice(algo, "compressor", ACCORDION_COMPRESSORS, w)
        number_at_least(algo, "cf_low", 1, w)
        number_at_least(algo, "cf_high", 1, w)
        int_at_least(algo, "rank_low", 1, w)
        int_at_least(algo, "rank_high", 1, w)
        positive(algo, "switch_period", w)
        positive(algo, "eta", w)
        validate_compressor_keys(algo)

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        self.cf_low = float(cfg.get("cf_low", 1 / 0.99))
        self.cf_high = float(cfg.get("cf_high", 10.0))
        self.eta = float(cfg.get("eta", 0.5))
        self.switch_period = float(cfg.get("switch_period", 10))
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
        if self.compressor_name == "powersgd":
            self.cfg["rank"] = int(self.cfg.get("rank_low", 2))
        else:
            self.cfg["cf"] = self.cf_high
        wrapped = super().setup(model, optimizer, ctx)
        if self.powersgd is not None:
            self.powersgd_low = self.powersgd
            self.powersgd_high = PowerSGD(
                self.comm,
                rank=int(self.cfg.get("rank_high", 1)),
                start_iter=int(self.cfg.get("start_iter", 10)),
                error_feedback=self.error_feedback,
                warm_start=bool(self.cfg.get("warm_start", True)),
                min_compression_rate=float(self.cfg.get("min_compression_rate", 2.0)),
                seed=int(self.cfg.get("seed", 0)),
            )
            self.bucket_state: dict[int, PowerSGD] = {}
        return wrapped

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
