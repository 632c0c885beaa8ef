"""``streaming_diloco``: Streaming DiLoCo (Douillard et al. 2025, "Streaming DiLoCo with overlapping
communication: Towards a Distributed Free Lunch", arXiv 2501.18512; docs/papers.md#streaming-diloco),
as torchft runs it (torchft 0.2.0, ``torchft/local_sgd.py``, class ``DiLoCo`` and
``_StreamingDiLoCoFragment``).

DiLoCo (:mod:`lsgd.algorithms.averaging.diloco`) with three changes from the paper's Section 2
(streaming partial updates, overlapping communication with computation, quantized outer gradients):

**Fragments** (``algo.fragments`` = P). The model's *units* are its modules that hold parameters or
floating buffers of their own (``module.named_parameters(recurse=False)``, in
``model.named_modules()`` order; a parameter shared by several modules belongs to the first): a
Linear, a convolution, a BatchNorm, an Embedding, a LayerNorm. Fragment p holds units
p, p + P, p + 2P, ... (the paper's strided pattern, over units rather than transformer blocks), so
every fragment spans the model's depth. A model with fewer units than P is refused.

**Schedule** (H = ``algo.local_steps``, h = H / P, tau = ``algo.fragment_sync_delay`` < h). After
completed inner step s (the trainer's ``after_step(s)``; every worker counts alike, so all agree on
the fragment):

* if (s + tau) is a multiple of h, fragment f = ((s + tau) / h - 1) mod P *starts*: each worker
  computes its outer gradient Delta_{f,i} = theta_f^global - theta_{f,i} (torchft's sign) and
  starts the all-reduce (SUM) of it;
* if s is a multiple of h, fragment f = (s / h - 1) mod P *lands*: the worker waits for its
  all-reduce, Delta_f = (sum_i Delta_{f,i}) / n, and (one Nesterov outer optimizer per fragment,
  mu = ``outer_momentum``, lr = ``outer_lr``, torch's SGD as DiLoCo's)

      b_f <- mu b_f + Delta_f
      theta_f^global <- theta_f^global - lr (Delta_f + mu b_f)
      theta_{f,i} <- theta_f^global + alpha (theta_{f,i} - theta_f^global)    alpha = ``fragment_update_alpha``

  (torch's ``lerp_``: alpha = 0 takes the new global fragment, alpha = 1 keeps the local one; the
  local theta_{f,i} is the one after step s, tau steps after its outer gradient was taken).

So fragment 0 lands at steps h, h + H, h + 2H, ..., fragment 1 at 2h, 2h + H, ..., each once per H
steps, and at most one fragment is in flight; its all-reduce overlaps tau inner steps (the cluster
clock: issued at step s - tau, waited at step s, as Overlap-Local-SGD's anchor). The inner
optimizer's state is never touched, other fragments never change. With P = 1, tau = 0 and alpha = 0
this is DiLoCo (``algo=diloco``, ``buffer_policy: maintain``). A fragment that would land after the
run's last step does not start.

**Low-precision outer gradients** (``algo.quantization``: ``none`` | ``int8`` | ``fp8`` | ``fp4``).
Each worker's Delta_{f,i} is sent in the format, one float32 scale per row
(:mod:`lsgd.compression.rowwise`); the workers sum what they receive in the model's precision
(float32: the paper accumulates in float32), and, as torchft's quantized all-reduce re-quantizes
the reduced chunk before its all-gather, the sum travels in the format again before the division
by n. Simulated: the all-reduce moves the dequantized values as floats, and is counted and clocked
as the encoded payload (:func:`lsgd.compression.rowwise.encoded_nbytes`: the elements' bits and
the scales; a ring all-reduce of it, the wire bytes of torchft's all-to-all + all-gather).

**Buffers** (``algo.average_buffers``, default true). A fragment's floating buffers (BatchNorm
statistics) travel in the same all-reduce at full precision and land as its parameters do:
b_i <- b_avg + alpha (b_i - b_avg), b_avg their mean when the fragment started. torchft syncs
parameters only.

One round (``comm_rounds``) per fragment landed. A checkpoint saves the all-reduce in flight without
waiting for it on the clock (its result and its end, as Overlap-Local-SGD does).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lsgd.algorithms.averaging.diloco import OUTER_OPTIMIZERS
from lsgd.algorithms.base import DRIFT_AGREEMENT_LAG, AlgoConfig, Algorithm, float_buffers
from lsgd.comm.accounting import tensor_bytes
from lsgd.compression.rowwise import FORMATS, encoded_nbytes, quantize_dequantize
from lsgd.core.errors import ConfigError
from lsgd.core.typed_config import option

QUANTIZATIONS = ("none", *FORMATS)


@dataclass
class StreamingDiLoCoConfig(AlgoConfig):
    """``algo=streaming_diloco``'s keys (module docstring)."""

    name: str = "streaming_diloco"
    local_steps: int = option(100, at_least=1, doc="H: inner steps between two syncs of one fragment (a multiple "
                              "of fragments)", symbol="H")
    fragments: int = option(2, at_least=1, doc="P: fragments of the model's units, synced in turn H / P steps "
                            "apart", symbol="P")
    fragment_sync_delay: int = option(0, at_least=0, doc="tau: inner steps a fragment's all-reduce overlaps "
                                      "before it lands (< H / P)", symbol="tau")
    fragment_update_alpha: float = option(0.0, at_least=0, at_most=1, doc="alpha: theta_local <- alpha "
                                          "theta_local + (1 - alpha) theta_global (0: take the global)",
                                          symbol="alpha")
    outer_optimizer: str = option("nesterov", choices=OUTER_OPTIMIZERS, doc="each fragment's outer step")
    outer_lr: float = option(0.7, above=0, doc="the outer learning rate")
    outer_momentum: float = option(0.9, doc="mu: the outer Nesterov momentum")
    quantization: str = option("none", choices=QUANTIZATIONS, doc="the outer gradients' format on the wire, "
                               "one float32 scale per row")
    average_buffers: bool = option(True, doc="average a fragment's BatchNorm statistics with it")


def model_units(model: nn.Module) -> list[tuple[list[int], list[torch.Tensor]]]:
    """The model's units in ``named_modules()`` order: per module that holds parameters or
    floating buffers of its own, ``(indices of its parameters in model.parameters(), its floating
    buffers)``; a parameter or buffer shared by several modules belongs to the first."""
    index = {id(p): i for i, p in enumerate(model.parameters())}
    seen: set[int] = set()
    units = []
    for module in model.modules():
        params = []
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                params.append(index[id(p)])
        buffers = []
        for b in module.buffers(recurse=False):
            if b.is_floating_point() and id(b) not in seen:
                seen.add(id(b))
                buffers.append(b)
        if params or buffers:
            units.append((params, buffers))
    return units


def split_fragments(model: nn.Module, fragments: int) -> list[tuple[list[int], list[torch.Tensor]]]:
    """Fragment p of ``fragments``: units p, p + P, p + 2P, ... of :func:`model_units`, as
    ``(parameter indices in model.parameters() order, floating buffers)``.

    Raises:
        ConfigError: the model has fewer units than ``fragments``.
    """
    units = model_units(model)
    if len(units) < fragments:
        raise ConfigError(f"algo.fragments={fragments} is more than the model's {len(units)} units (modules with "
                          f"parameters or buffers of their own): set algo.fragments <= {len(units)}")
    out = []
    for p in range(fragments):
        mine = units[p::fragments]
        out.append((sorted(i for params, _ in mine for i in params), [b for _, bufs in mine for b in bufs]))
    return out


class StreamingDiLoCo(Algorithm):
    """Streaming DiLoCo: DiLoCo's outer steps fragment by fragment, overlapped, in low precision."""

    name = "streaming_diloco"
    Config = StreamingDiLoCoConfig
    label = "Streaming DiLoCo"
    paper = "docs/papers.md#streaming-diloco"
    defining_keys = ("algo.local_steps", "algo.fragments")
    agreement_lag = DRIFT_AGREEMENT_LAG  # workers drift apart between syncs (Algorithm.agreement_lag)
    grad_scaler = "flag"  # workers step on their own gradients (lsgd.training.accel)

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        """Raises ConfigError: H not a multiple of P, or tau not below H / P (torchft's checks)."""
        super().validate_config(algo, world_size)
        c = cls.parse_config(algo)
        H, P, tau = int(c.local_steps), int(c.fragments), int(c.fragment_sync_delay)
        if H % P:
            raise ConfigError(f"algo.local_steps (H = {H}) must be a multiple of algo.fragments (P = {P}): the "
                              f"fragments sync H / P steps apart, each once per H steps")
        if tau >= H // P:
            raise ConfigError(f"algo.fragment_sync_delay (tau = {tau}) must be below algo.local_steps / "
                              f"algo.fragments (H / P = {H // P}): a fragment must land before the next one starts")

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        c = self.config
        self.P = int(c.fragments)
        self.h = int(c.local_steps) // self.P
        self.tau = int(c.fragment_sync_delay)
        self.alpha = float(c.fragment_update_alpha)
        self.fmt = c.quantization
        self.rounds = 0
        self._in_sync = True
        self.handle = None        # the all-reduce in flight
        self.flat: torch.Tensor | None = None  # its buffer: outer gradients, then buffers (the sum once landed)
        self.in_flight: int | None = None      # its fragment

    def setup(self, model, optimizer, ctx=None):
        out = super().setup(model, optimizer, ctx)
        params = list(model.parameters())
        split = split_fragments(model, self.P)
        self.frag_params = [[params[i] for i in idx] for idx, _ in split]
        self.frag_buffers = [bufs if self.config.average_buffers else [] for _, bufs in split]
        # theta^global of every fragment: where every worker started the fragment's current round
        self.globals = [[p.detach().clone() for p in ps] for ps in self.frag_params]
        self.outer = [self._outer_optimizer(g) for g in self.globals]
        return out

    def _outer_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer | None:
        """The fragment's own outer optimizer (torchft PR #230); None for a fragment of buffers only."""
        if not params:
            return None
        lr = float(self.config.outer_lr)
        if self.config.outer_optimizer == "nesterov":
            return torch.optim.SGD(params, lr=lr, momentum=float(self.config.outer_momentum), nesterov=True)
        return torch.optim.SGD(params, lr=lr)

    # -- the schedule ---------------------------------------------------------------------------
    def starts(self, step: int) -> int | None:
        """The fragment whose all-reduce starts after completed step ``step``, or None."""
        if (step + self.tau) % self.h:
            return None
        return ((step + self.tau) // self.h - 1) % self.P

    def lands(self, step: int) -> int | None:
        """The fragment that lands after completed step ``step``, or None."""
        if step % self.h:
            return None
        return (step // self.h - 1) % self.P

    def after_step(self, step: int) -> None:
        self._in_sync = False
        f = self.starts(step)
        total = self.ctx.total_steps
        if f is not None and (total is None or step + self.tau <= total):
            self._start(f)
        f = self.lands(step)
        if f is not None:
            self._land(f)

    @torch.no_grad()
    def _start(self, f: int) -> None:
        deltas = [g - p.detach() for g, p in zip(self.globals[f], self.frag_params[f])]
        buffers = self.frag_buffers[f]
        nbytes = None
        if self.fmt != "none":
            deltas = [quantize_dequantize(d, self.fmt) for d in deltas]
            nbytes = sum(encoded_nbytes(d, self.fmt) for d in deltas) + tensor_bytes(buffers)
        dtype = deltas[0].dtype if deltas else buffers[0].dtype
        self.flat = torch.cat([t.reshape(-1).to(dtype) for t in [*deltas, *buffers]])
        self.in_flight = f
        self.handle = self.comm.all_reduce(self.flat, async_op=True, nbytes=nbytes)

    @torch.no_grad()
    def _land(self, f: int) -> None:
        if f != self.in_flight:
            raise RuntimeError(f"fragment {f} lands but fragment {self.in_flight} is in flight")
        self.handle.wait()
        self.handle, self.in_flight = None, None
        n = self.comm.world_size
        flat, offset = self.flat, 0
        for g, p in zip(self.globals[f], self.frag_params[f]):
            total = flat[offset:offset + g.numel()].view_as(g)
            offset += g.numel()
            if self.fmt != "none":  # torchft re-quantizes the reduced chunk before its all-gather
                total = quantize_dequantize(total, self.fmt)
            g.grad = (total / n).to(g.dtype)
        if self.outer[f] is not None:
            self.outer[f].step()
        for g, p in zip(self.globals[f], self.frag_params[f]):
            g.grad = None
            local = p.detach().clone()
            p.data.copy_(g)
            p.data.lerp_(local, self.alpha)
        for b in self.frag_buffers[f]:
            avg = (flat[offset:offset + b.numel()].view_as(b) / n).to(b.dtype)
            offset += b.numel()
            b.copy_(avg.lerp_(b, self.alpha))
        self.flat = None
        self.comm.round()
        self.rounds += 1
        # every worker holds the same model when the only fragment took the global one
        self._in_sync = self.P == 1 and self.alpha == 0

    @property
    def models_in_sync(self) -> bool:
        return self._in_sync and (bool(self.config.average_buffers) or not float_buffers(self.model))

    def state_dict(self) -> dict:
        in_flight = None
        if self.handle is not None:  # the all-reduce in flight: its result and its end (module docstring)
            self.handle.complete_data()  # flat holds the sum; the clock waits where the run lands it
            in_flight = {"fragment": self.in_flight, "flat": self.flat.clone(), "handle": self.handle.state_dict()}
        return {"globals": [[g.clone() for g in gs] for gs in self.globals],
                "outer": [None if o is None else o.state_dict() for o in self.outer],
                "rounds": self.rounds, "in_sync": self._in_sync, "in_flight": in_flight}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for gs, saved in zip(self.globals, state["globals"]):
                for g, s in zip(gs, saved):
                    g.copy_(s)
        for o, s in zip(self.outer, state["outer"]):
            if o is not None:
                o.load_state_dict(s)
        self.rounds, self._in_sync = state["rounds"], state["in_sync"]
        in_flight = state.get("in_flight")
        if in_flight is None:
            self.handle = self.flat = self.in_flight = None
        else:
            self.in_flight, self.flat = in_flight["fragment"], in_flight["flat"]
            self.handle = self.comm.resumed(in_flight["handle"])
