"""``sparseloco``: SparseLoCo (Sarfi, Thérien, Lidin, Belilovsky 2025, "Communication Efficient LLM
Pre-training with SparseLoCo", arXiv 2508.15706; docs/papers.md#sparseloco).

DiLoCo (:mod:`lsgd.algorithms.averaging.diloco`) whose outer gradient travels as the top-k of
each chunk, quantized to 2 bits, with error feedback in place of the outer momentum. Every H =
``algo.local_steps`` inner steps (the run's ``optim``, AdamW as DiLoCo's), worker i, with
theta the global model every worker started the round from:

    Delta_i = theta - theta_i                        (DiLoCo's sign: global minus local)
    e_i <- beta e_i + Delta_i                        (beta = ``error_decay``)
    Delta_hat_i = Q(TopK_chunk(e_i))                 (:mod:`lsgd.compression.chunked_topk`)
    e_i <- e_i - Delta_hat_i
    all-gather the Delta_hat_j (indices, 2-bit codes, scales)
    Delta = (1/R) sum_j Delta_hat_j                  (``aggregate: mean``; R workers)
    theta <- theta - alpha Delta ;  theta_i <- theta  (alpha = ``outer_lr``)

``aggregate: selected`` divides each element's sum by the number of workers that kept it (0
where none did): what the authors' code does (``scatter_reduce(reduce="mean",
include_self=False)``), where the paper's equation, as read from secondary sources, averages over
all R. TopK_chunk keeps ``k = max(1, round(L topk / chunk^2))`` of the largest magnitudes of each
chunk of L elements (DeMo's 2-D chunking: a matrix in tiles of at most ``chunk x chunk``); Q is the
authors' statistical quantizer (``bits`` = 2: 4 bins over ``quantization_range`` = 6 standard
deviations of the kept values, each bin read as the mean of its values; per tensor a float32
shift and 4 float32 bin values travel); ``bits: 0`` sends the values at full precision.

Defaults: the authors' 512M configuration (``hparams/512M/sweeps/sparseloco.yaml`` of
github.com/tplr-ai/SparseLoCo; the paper's v2 points to github.com/one-covenant/SparseLoCo): H = 15,
alpha = 1, beta = 0.95, topk = 128 of 4096 (3.1%), chunk 64, 4 bins (2 bits), range 6; the paper reports 1-3% density and 2-bit quantization. The paper's
own text could not be read for lsgd: the chunking, quantizer and aggregation follow the authors'
code (read as copied in a public fork), the update equations secondary sources' rendering of the
paper.

Bytes: one all-gather per round of each worker's payload,
``sum_t [ceil(K_t w_t / 8) + ceil(K_t b / 8) + 4 (1 + 2^b)]`` (K_t values kept of tensor t, w_t
= ceil(log2 L_t) bits per index within its chunk, b = ``bits``; ``K_t x element size`` in place of
the codes and scales at bits = 0), and, with ``average_buffers``, a float all-reduce of the
BatchNorm statistics (averaged, not compressed; the paper trains transformers without them). One
round (``comm_rounds``) per synchronization; the inner optimizer's state is kept (DiLoCo's
``maintain``). With ``topk = chunk^2`` (every element kept), ``bits = 0`` and ``error_decay = 0``
this is DiLoCo with ``outer_optimizer: sgd`` at ``outer_lr`` = alpha.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lsgd.algorithms.base import DRIFT_AGREEMENT_LAG, AlgoConfig, Algorithm, float_buffers
from lsgd.compression.chunked_topk import Tiling, compress, decode, encode, payload_nbytes, tiling
from lsgd.core.errors import ConfigError
from lsgd.core.typed_config import option

AGGREGATES = ("mean", "selected")


@dataclass
class SparseLoCoConfig(AlgoConfig):
    """``algo=sparseloco``'s keys (module docstring)."""

    name: str = "sparseloco"
    local_steps: int = option(15, at_least=1, doc="H: inner steps per round (the authors' 512M runs: 15)",
                              symbol="H")
    outer_lr: float = option(1.0, above=0, doc="alpha: theta <- theta - alpha mean(Delta_hat) (the authors' "
                             "configuration: 1)", symbol="alpha")
    error_decay: float = option(0.95, at_least=0, at_most=1, doc="beta: e <- beta e + Delta (the authors' "
                                "configuration: 0.95)", symbol="beta")
    chunk: int = option(64, at_least=1, at_most=256, doc="DeMo's chunking: a matrix in tiles of at most chunk x "
                        "chunk elements, a vector in pieces of at most chunk")
    topk: int = option(128, at_least=1, doc="k: values kept per full chunk x chunk tile (density topk / "
                       "chunk^2: 128 / 4096 = 3.1%); a chunk of L elements keeps max(1, round(L topk / chunk^2))",
                       symbol="k")
    bits: int = option(2, at_least=0, at_most=8, doc="bits per kept value: 2^bits bins of the statistical "
                       "quantizer (0: the values at full precision)")
    quantization_range: float = option(6.0, above=0, doc="the quantizer's bins span this many standard "
                                       "deviations of a tensor's kept values")
    aggregate: str = option("mean", choices=AGGREGATES, doc="mean: (1/R) sum of the workers' sparse outer "
                            "gradients (the paper's equation); selected: each element's sum over the workers "
                            "that kept it (the authors' code)")
    average_buffers: bool = option(True, doc="average BatchNorm statistics at full precision in each round")


class SparseLoCo(Algorithm):
    """SparseLoCo: DiLoCo with top-k, 2-bit outer gradients and error feedback for momentum."""

    name = "sparseloco"
    Config = SparseLoCoConfig
    label = "SparseLoCo"
    paper = "docs/papers.md#sparseloco"
    defining_keys = ("algo.local_steps", "algo.topk")
    agreement_lag = DRIFT_AGREEMENT_LAG  # workers drift apart between syncs (Algorithm.agreement_lag)
    grad_scaler = "flag"  # workers step on their own gradients (lsgd.training.accel)

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        """Raises ConfigError: more values kept per tile than a chunk x chunk tile holds."""
        super().validate_config(algo, world_size)
        c = cls.parse_config(algo)
        if int(c.topk) > int(c.chunk) ** 2:
            raise ConfigError(f"algo.topk ({c.topk}) must be at most algo.chunk^2 ({int(c.chunk) ** 2}): the values "
                              f"kept per chunk x chunk tile (algo.topk = algo.chunk^2 keeps every element)")

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        c = self.config
        self.H = int(c.local_steps)
        self.alpha = float(c.outer_lr)
        self.beta = float(c.error_decay)
        self.bits = int(c.bits)
        self.span = float(c.quantization_range)
        self.rounds = 0
        self._in_sync = True

    def setup(self, model, optimizer, ctx=None):
        out = super().setup(model, optimizer, ctx)
        params = list(model.parameters())
        # theta: the model every worker started the round from; e: this worker's error feedback
        self.globals = [p.detach().clone() for p in params]
        self.errors = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in params]
        self.tilings: list[Tiling] = [tiling(p.shape, int(self.config.chunk), int(self.config.topk)) for p in params]
        self.buffers = float_buffers(model) if self.config.average_buffers else []
        return out

    def payload_nbytes(self) -> int:
        """Bytes of one worker's payload (the module docstring's sum over the tensors)."""
        return payload_nbytes(self.tilings, self.bits, [p.element_size() for p in self.globals])

    def after_step(self, step: int) -> None:
        self._in_sync = False
        if step % self.H == 0:
            self.sync()

    @torch.no_grad()
    def sync(self) -> None:
        params = [p.detach() for p in self.model.parameters()]
        items = []
        for g, p, e, til in zip(self.globals, params, self.errors, self.tilings):
            e.mul_(self.beta).add_(g - p)
            s = compress(e, til, self.bits, self.span)
            e.sub_(s.dense())
            items.append(s)
        payload = encode(items, self.bits).to(self.comm.device)
        gathered = self.comm.all_gather(payload)
        dtypes = [g.dtype for g in self.globals]
        totals = [torch.zeros(t.chunks, t.chunk_len, dtype=g.dtype, device=g.device)
                  for t, g in zip(self.tilings, self.globals)]
        counts = [torch.zeros_like(t) for t in totals] if self.config.aggregate == "selected" else None
        for r, theirs in enumerate(gathered):
            decoded = decode(theirs, self.tilings, self.bits, dtypes, self.globals[0].device if self.globals else None)
            for i, (idx, vals) in enumerate(decoded):
                totals[i].scatter_add_(1, idx, vals)
                if counts is not None:
                    counts[i].scatter_add_(1, idx, torch.ones_like(vals))
        n = self.comm.world_size
        for i, (g, p, til) in enumerate(zip(self.globals, params, self.tilings)):
            if counts is None:
                mean = totals[i] / n
            else:
                mean = torch.where(counts[i] > 0, totals[i] / counts[i].clamp(min=1), torch.zeros_like(totals[i]))
            g.sub_(til.join(mean), alpha=self.alpha)
            p.copy_(g)
        if self.buffers:
            self.comm.average_(self.buffers)
        self.comm.round()
        self.rounds += 1
        self._in_sync = True

    @property
    def models_in_sync(self) -> bool:
        return self._in_sync and (bool(self.config.average_buffers) or not float_buffers(self.model))

    def state_dict(self) -> dict:
        return {"globals": [g.clone() for g in self.globals], "errors": [e.clone() for e in self.errors],
                "rounds": self.rounds, "in_sync": self._in_sync}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for mine, saved in ((self.globals, state["globals"]), (self.errors, state["errors"])):
                for t, s in zip(mine, saved):
                    t.copy_(s)
        self.rounds, self._in_sync = state["rounds"], state["in_sync"]
