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

**Eager outer steps** (``algo.eager``; Kale, Douillard, Donchev 2025, "Eager Updates For
Overlapped Communication and Computation in DiLoCo", arXiv 2502.12996; docs/papers.md#eager-updates).
A fragment's all-reduce overlaps the whole next H inner steps, and the outer step does not wait
for it: when fragment f syncs (after step s, h divides s; tau must be 0), worker i

* waits for the all-reduce it started at f's previous sync (H steps ago), whose sum is
  S_f^{t-1} = sum_j Delta_{f,j}^{t-1};
* computes Delta_{f,i}^t = theta_{f,i}^global - theta_{f,i} and starts the all-reduce (SUM) of it;
* steps its own copy of the fragment's outer optimizer on the eager outer gradient

      Delta_hat_{f,i}^t = (1/n) Delta_{f,i}^t + (1/n) (S_f^{t-1} - Delta_{f,i}^{t-1})
                        = (1/n) Delta_{f,i}^t + (1/n) sum_{j != i} Delta_{f,j}^{t-1}

  (its own fresh outer gradient in place of its own term of the one-round-stale average; 0 for
  the others' terms at f's first sync), then merges as above (alpha).

The paper's method section (its Algorithm 3) could not be read for lsgd: these mixing weights are
the ones lsgd's issue states, consistent with the paper's abstract and captions ("the local outer
gradient as a proxy" for the others' delayed ones); check them before quoting. The other reading
that its text would have to rule out: (1/n) Delta_{f,i}^t + ((n - 1)/n) times the stale mean
(S_f^{t-1} / n, the worker's own stale term included).

Every worker keeps its own theta_f^global and outer momentum: the replicas differ by the workers'
own terms of the latest round (each applies its own outer gradient one round before the others'),
and each Delta_{f,j} enters every worker's outer steps exactly once. The paper's main results run
eager updates on Streaming DiLoCo (its Table 1), and on DiLoCo (P = 1) as well (its Table 3):
with P fragments up to P all-reduces are in flight, each for H steps. With quantization a
worker's own terms are the ones it sent (quantized) and the sum is re-quantized as above. A
fragment's BatchNorm statistics mix alike, b_i <- (1/n) (b_i + S_b^{t-1} - b_i^{t-1}) (at f's
first sync: b_i), then the alpha merge. The all-reduce of a fragment's last sync before the run
ends is not started (no step would use it); the worker's own term is still applied. The cluster
clock waits only where an all-reduce has not ended after its H steps of compute.

One round (``comm_rounds``) per fragment landed (eager: per fragment synced). A checkpoint saves
the all-reduces in flight without waiting for them on the clock (their results and their ends,
as Overlap-Local-SGD does).
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
    fragment_sync_delay: int | None = option(None, at_least=0, doc="tau: inner steps a fragment's all-reduce "
                                             "overlaps before it lands (< H / P); null: 1, the paper's (its Table "
                                             "1; torchft's default is 0), or 0 with eager", symbol="tau")
    fragment_update_alpha: float = option(0.5, at_least=0, at_most=1, doc="alpha: theta_local <- alpha "
                                          "theta_local + (1 - alpha) theta_global (0: take the global; the paper's "
                                          "0.5, its Figure 10; torchft's default 0)", symbol="alpha")
    outer_optimizer: str = option("nesterov", choices=OUTER_OPTIMIZERS, doc="each fragment's outer step")
    outer_lr: float = option(0.7, above=0, doc="the outer learning rate")
    outer_momentum: float = option(0.9, doc="mu: the outer Nesterov momentum")
    quantization: str = option("none", choices=QUANTIZATIONS, doc="the outer gradients' format on the wire, "
                               "one float32 scale per row")
    average_buffers: bool = option(True, doc="average a fragment's BatchNorm statistics with it")
    eager: bool = option(False, doc="eager outer steps (Kale et al. 2025): each fragment's all-reduce overlaps "
                         "the next H inner steps; the outer step uses the worker's own fresh outer gradient "
                         "with the others' one-round-stale ones (needs fragment_sync_delay 0)",
                         symbol=("eager", "not eager"))


def sync_delay(c: StreamingDiLoCoConfig) -> int:
    """tau: ``algo.fragment_sync_delay``, or where it is null 1 (the paper's one-step overlap) and 0
    with eager outer steps (whose all-reduce overlaps the next H steps instead)."""
    if c.fragment_sync_delay is None:
        return 0 if c.eager else 1
    return int(c.fragment_sync_delay)


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
        """Raises ConfigError: H not a multiple of P, or tau not below H / P (torchft's checks); tau > 0
        with eager outer steps."""
        super().validate_config(algo, world_size)
        c = cls.parse_config(algo)
        H, P, tau = int(c.local_steps), int(c.fragments), sync_delay(c)
        if H % P:
            raise ConfigError(f"algo.local_steps (H = {H}) must be a multiple of algo.fragments (P = {P}): the "
                              f"fragments sync H / P steps apart, each once per H steps")
        if tau >= H // P:
            raise ConfigError(f"algo.fragment_sync_delay (tau = {tau}) must be below algo.local_steps / "
                              f"algo.fragments (H / P = {H // P}): a fragment must land before the next one starts")
        if c.eager and tau:
            raise ConfigError(f"algo.eager=true overlaps each fragment's all-reduce with the next H inner steps: "
                              f"algo.fragment_sync_delay (tau = {tau}) must be 0 or null")

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        c = self.config
        self.P = int(c.fragments)
        self.H = int(c.local_steps)
        self.h = self.H // self.P
        self.tau = sync_delay(c)
        self.alpha = float(c.fragment_update_alpha)
        self.fmt = c.quantization
        self.eager = bool(c.eager)
        self.rounds = 0
        self._in_sync = True
        # the all-reduces in flight, by fragment, in issue order: (handle, its buffer: this worker's
        # outer gradients then buffers; the sum once landed). Without eager steps at most one.
        self.flights: dict[int, tuple] = {}
        # eager: per fragment, what this worker sent at its latest sync (its own term of that sum)
        self.sent: list[torch.Tensor | None] = []

    def setup(self, model, optimizer, ctx=None):
        out = super().setup(model, optimizer, ctx)
        params = list(model.parameters())
        split = split_fragments(model, self.P)
        self.frag_params = [[params[i] for i in idx] for idx, _ in split]
        self.frag_buffers = [bufs if self.config.average_buffers else [] for _, bufs in split]
        # theta^global of every fragment: where every worker started the fragment's current round
        # (eager: where this worker did)
        self.globals = [[p.detach().clone() for p in ps] for ps in self.frag_params]
        self.outer = [self._outer_optimizer(g) for g in self.globals]
        self.sent = [None] * self.P
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
        """The fragment that lands after completed step ``step``, or None (eager: the fragment
        that syncs, whose previous all-reduce lands)."""
        if step % self.h:
            return None
        return (step // self.h - 1) % self.P

    def after_step(self, step: int) -> None:
        self._in_sync = False
        total = self.ctx.total_steps
        if self.eager:
            f = self.lands(step)
            if f is not None:
                self._eager_step(f, start=total is None or step + self.H <= total)
            return
        f = self.starts(step)
        if f is not None and (total is None or step + self.tau <= total):
            self._start(f)
        f = self.lands(step)
        if f is not None:
            self._land(f)

    @torch.no_grad()
    def _outgoing(self, f: int) -> tuple[torch.Tensor, int | None]:
        """Fragment ``f``'s outer gradients (in the wire format) then its buffers, flat, and the
        bytes the encoded payload takes (None: the tensor's own size)."""
        deltas = [g - p.detach() for g, p in zip(self.globals[f], self.frag_params[f])]
        buffers = self.frag_buffers[f]
        nbytes = None
        if self.fmt != "none":
            deltas = [quantize_dequantize(d, self.fmt) for d in deltas]
            nbytes = sum(encoded_nbytes(d, self.fmt) for d in deltas) + tensor_bytes(buffers)
        dtype = deltas[0].dtype if deltas else buffers[0].dtype
        return torch.cat([t.reshape(-1).to(dtype) for t in [*deltas, *buffers]]), nbytes

    def _start(self, f: int, flat: torch.Tensor | None = None, nbytes: int | None = None) -> None:
        if flat is None:
            flat, nbytes = self._outgoing(f)
        self.flights[f] = (self.comm.all_reduce(flat, async_op=True, nbytes=nbytes), flat)

    def _landed(self, f: int) -> torch.Tensor | None:
        """Wait for fragment ``f``'s all-reduce in flight; its sum (None: none in flight)."""
        if f not in self.flights:
            return None
        if next(iter(self.flights)) != f:
            raise RuntimeError(f"fragment {f} lands before fragment {next(iter(self.flights))}, issued earlier")
        handle, flat = self.flights.pop(f)
        handle.wait()
        return flat

    def _summed_gradients(self, f: int, flat: torch.Tensor) -> list[torch.Tensor]:
        """The fragment's parameters' part of a landed sum, per parameter (re-quantized as torchft's
        quantized all-reduce does before its all-gather)."""
        out, offset = [], 0
        for g in self.globals[f]:
            total = flat[offset:offset + g.numel()].view_as(g)
            offset += g.numel()
            out.append(quantize_dequantize(total, self.fmt) if self.fmt != "none" else total)
        return out

    @torch.no_grad()
    def _land(self, f: int) -> None:
        flat = self._landed(f)
        if flat is None:
            raise RuntimeError(f"fragment {f} lands but {sorted(self.flights) or 'none'} is in flight")
        n = self.comm.world_size
        grads = [(total / n).to(g.dtype) for g, total in zip(self.globals[f], self._summed_gradients(f, flat))]
        offset = sum(g.numel() for g in self.globals[f])
        buffers = []
        for b in self.frag_buffers[f]:
            buffers.append((flat[offset:offset + b.numel()].view_as(b) / n).to(b.dtype))
            offset += b.numel()
        self._outer_step(f, grads, buffers)
        # every worker holds the same model when the only fragment took the global one
        self._in_sync = self.P == 1 and self.alpha == 0

    @torch.no_grad()
    def _eager_step(self, f: int, start: bool) -> None:
        """Fragment ``f`` syncs with an eager outer step (module docstring)."""
        stale = self._landed(f)
        own, nbytes = self._outgoing(f)
        previous, self.sent[f] = self.sent[f], (own if start else None)  # own: never written in place
        if start:
            self._start(f, own.clone(), nbytes)
        n = self.comm.world_size
        others = None
        if stale is not None:
            parts = self._summed_gradients(f, stale)
            stale = torch.cat([*(t.reshape(-1) for t in parts), stale[sum(t.numel() for t in parts):]])
            others = stale - previous
        mixed = own if others is None else own + others
        grads, offset = [], 0
        for g in self.globals[f]:
            grads.append((mixed[offset:offset + g.numel()].view_as(g) / n).to(g.dtype))
            offset += g.numel()
        buffers = []
        for b in self.frag_buffers[f]:
            buffers.append(b.clone() if others is None else (mixed[offset:offset + b.numel()].view_as(b) / n).to(b.dtype))
            offset += b.numel()
        self._outer_step(f, grads, buffers)
        self._in_sync = False

    @torch.no_grad()
    def _outer_step(self, f: int, grads: list[torch.Tensor], buffers: list[torch.Tensor]) -> None:
        """The fragment's outer optimizer on ``grads``; its parameters and ``buffers`` (new values of
        the fragment's buffers) merged by alpha."""
        for g, grad in zip(self.globals[f], grads):
            g.grad = grad
        if self.outer[f] is not None:
            self.outer[f].step()
        for g, p in zip(self.globals[f], self.frag_params[f]):
            g.grad = None
            local = p.detach().clone()
            p.data.copy_(g)
            p.data.lerp_(local, self.alpha)
        for b, new in zip(self.frag_buffers[f], buffers):
            b.copy_(new.lerp_(b, self.alpha))
        self.comm.round()
        self.rounds += 1

    @property
    def models_in_sync(self) -> bool:
        return self._in_sync and (bool(self.config.average_buffers) or not float_buffers(self.model))

    def state_dict(self) -> dict:
        in_flight = []
        for f, (handle, flat) in self.flights.items():  # in issue order: their results and their ends
            handle.complete_data()  # flat holds the sum; the clock waits where the run lands it
            in_flight.append({"fragment": f, "flat": flat.clone(), "handle": handle.state_dict()})
        return {"globals": [[g.clone() for g in gs] for gs in self.globals],
                "outer": [None if o is None else o.state_dict() for o in self.outer],
                "rounds": self.rounds, "in_sync": self._in_sync, "in_flight": in_flight,
                "sent": [None if s is None else s.clone() for s in self.sent]}

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
        if isinstance(in_flight, dict):  # checkpoints written before eager steps: one at most
            in_flight = [in_flight]
        self.flights = {}
        for saved in in_flight or []:
            self.flights[saved["fragment"]] = (self.comm.resumed(saved["handle"]), saved["flat"])
        self.sent = list(state.get("sent") or [None] * self.P)
