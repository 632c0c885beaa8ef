"""``gravac``: GraVAC's adaptive compression factor (Tyagi and Swany, IEEE CLOUD 2023, Algorithm 1,
the paper's version; the authors' code's gain rule with ``algo.gain=authors_code``; docs/papers.md#gravac).

Every step, after backward, on the whole model (the decision needs the gain of all layers, so
this runs after backward rather than per DDP bucket):

1. ``(theta_min, theta_c) = controller.plan()``; per tensor ``g_ef = g + r`` (error feedback),
   ``c_min = C(g_ef, theta_min)`` and the candidate ``c_c = C(c_min, theta_c / theta_min)``
   ("multi-level" compression: the theta_min output is compressed again, cheaper than compressing
   g_ef from scratch at theta_c).
2. Compression gains with error feedback in numerator and denominator,
   ``gain = sum ||c||^2 / sum ||g_ef||^2`` over all tensors and all workers (the sums are all-reduced
   with the payload sizes and the time term below, 48 counted bytes, so every worker takes the
   same decision). ``algo.gain=authors_code`` computes the gain and the candidate as the authors'
   public code does instead (below).
3. :class:`lsgd.compression.adaptive.GraVACController` smooths the gains (EWMA), applies the
   epsilon rule (candidate, else theta_min, else dense with the residuals reset), records the
   compression throughput ``T = T_system * gain`` per CF and every ``window`` steps scales theta_s,
   raises theta_min when the gains agree within omega, and settles on theta_ideal.
4. The chosen payloads are exchanged (all-gather of values and int32 indices for top-k style
   sparsifiers; all-reduce for random-k with shared indices; dense all-reduce for the fallback),
   the residual becomes ``g_ef - D(sent)``, and the averaged gradient replaces ``p.grad``.

``t_iter`` of ``T_system = N b / t_iter`` (``algo.throughput_time``):

* ``modeled`` (default; our reading): every iteration both CFs get a throughput sample, each with
  its own time: this step's modeled compute (forward and backward from the clock's compute
  profile, ``cluster.compute=profile``: counted operators, so the same seed takes the same decisions
  on any machine) plus the modeled time to exchange that CF's payload on the configured network
  (``network.*``). A laptop run then sees the communication savings a cluster would, and the
  throughputs of theta_min and the candidate differ by more than their gains, so the settling
  rule compares real trade-offs. With ``cluster.compute=measured`` the compute term is measured
  and decisions are no longer reproducible.
* ``measured`` (the paper): each iteration's wall time (its measured forward and backward,
  compression and exchange; not the evaluation or checkpoint that may follow) is a throughput
  sample for the CF it actually sent, so a higher CF's shorter iterations count for it (dense
  iterations record nothing). Decisions follow timing noise: not reproducible by design.

``algo.gain`` (the gain rule):

* ``paper`` (default): steps 1 and 2 above (the paper's gain and Algorithm 1).
* ``authors_code``: the rule of the authors' public code, github.com/sahiltyagi4/GraVAC at commit
  cbcd352 (its GraVAC code, unchanged since commit 9efa6bf; paths under ``gravac_py3/``):

  - the candidate is a second, separate compression of the same error-compensated gradient,
    ``c_c = C(g_ef, theta_c)``, not ``C(c_min, theta_c / theta_min)``: the code keeps two
    compressors, one for theta_min and one for the candidate (``run/compression_throughput.py``
    lines 57-62), and hands both the backpropagated gradients ``bp_grads`` (lines 221, 224, 229);
    its README says multi-level compression "still needs implementation";
  - the gain is a ratio of *unsquared* L2 norms, each taken per layer and summed over the layers,
    ``sum_l ||D(c)_l|| / sum_l ||g_l||``: ``ModelHelper.grad_norm`` (``helper/misc.py`` lines
    133-139) adds ``torch.norm(g.flatten())`` of each layer, and ``compression_gain`` (lines
    161-163) divides the compressed sum by the uncompressed one;
  - the denominator is the raw gradient ``g`` (``p.grad`` after backward), without the residual:
    ``bpgrad_norm`` is the norm of ``bp_grads`` (``run/compression_throughput.py`` lines 221-222),
    while the numerator is the decompressed output of ``C(g + r)`` (``layerwise_compressed_grads``,
    ``helper/misc.py`` lines 165-171, returns what ``ResidualGrads.update`` stored,
    ``compressors/residual_gradients.py`` lines 16-21, after ``compensate`` added the residual,
    lines 10-14). So the gain can exceed 1. (lsgd takes the norms in float64, the code in the
    gradient's float32.)

  lsgd takes these three and keeps the rest of the paper's rules: one residual, of what was sent
  (the code keeps one per compressor, each updated as if its own output had been sent,
  ``compressors/variable_compression.py`` lines 40-50, and never reset at a dense step); the sums
  are all-reduced over the workers like the paper rule's (the code decides on each worker's own
  gradient, with no collective for the gain: with one worker the two agree); the controller
  smooths the ratio (the code smooths numerator and denominator separately, a pandas EWMA over
  the last ``--windowsize`` values, ``helper/misc.py`` lines 67-85) and runs Algorithm 1. The
  gains feed the code's decision by the paper's epsilon rule (``run/compression_throughput.py``
  lines 235-283), but the code never raises theta_min: the candidate is set at each epoch's end
  to ``min_cf * cfstepsize`` or ``max_cf`` (lines 310-311), and settling compares the last
  throughput sample of each CF (lines 305, 313-330). The candidate's gain is that of the
  candidate's own output: as written, lines 230-231 take the norm of the theta_min
  compressor's output for the candidate too, which would make the two gains differ only by
  their smoothing. docs/papers.md#gravac lists every difference.

Every value a decision depends on is the same on every worker: the three norm sums, the
payload sizes of both CFs and the time term are summed in one all-reduce (6 float64, 48 counted
bytes) and averaged over workers (compute and payloads can differ across workers: heterogeneous
speeds, DGC's variable selection). A measured time is known only after the exchange, so it rides
on the next iteration's all-reduce; the last iteration of each window therefore counts in no
window. The controller's state, the residuals and the pending measured sample are checkpointed,
so a resumed run takes the decisions of an uninterrupted one (modeled mode).

With ``algo.compressor=dgc`` GraVAC uses DGC's sampled-threshold selection with plain error
feedback (the gain is defined on ``g_ef = g + r``); DGC's momentum correction and density warm-up
belong to the static ``compressed`` algorithm, and the optimizer keeps its own momentum here.

Every step writes a compression row (``cf``, ``cf_min``, ``cf_candidate``, ``gain_min``,
``gain_candidate``, ``gain``, ``sent``) to metrics.jsonl (docs/results.md).

Compression compute: compensating and compressing each tensor at both CFs (with their norms) goes
on the clock, priced on the device roofline (:meth:`lsgd.compute.model.ComputeModel.counted_seconds`,
counted at the second encounter of each (tensor, cf_min, candidate cf) and cached), before the
decision's all-reduce; the final residual update and decompression are not counted.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import nn

from lsgd.algorithms.base import AlgoConfig, Algorithm
from lsgd.algorithms.gradient_compression.compressed import build_compressor
from lsgd.compression import compressors as C
from lsgd.compression.adaptive import POLICIES, GraVACController
from lsgd.compression.exchange import exchange
from lsgd.compression.memory import ErrorFeedback, NoMemory
from lsgd.compression.options import DGCSampling
from lsgd.core.errors import ConfigError
from lsgd.core.typed_config import option

THROUGHPUT_TIMES = ("modeled", "measured")
#: ``algo.gain``: the paper's gain (squared norms, error feedback in numerator and denominator,
#: multi-level candidate) or the authors' public code's (unsquared per-layer norms, no error
#: feedback in the denominator, two separate compressions); module docstring
GAINS = ("paper", "authors_code")


@dataclass
class GraVACConfig(DGCSampling, AlgoConfig):
    """``algo=gravac``'s keys (defaults: the paper's DGC setting), with the sparsifiers' ``seed`` and
    DGC's ``sample_ratio`` (:class:`lsgd.compression.options.DGCSampling`)."""

    name: str = "gravac"
    compressor: str = option("dgc", choices=C.SPARSIFIERS, doc="the sparsifier whose compression factor adapts")
    epsilon: float = option(0.9, above=0, at_most=1,
                            doc="epsilon: minimum (smoothed) compression gain to send a compressed gradient",
                            symbol="eps")
    cf_min: float = option(10, at_least=1, doc="theta_min: the initial (lowest) compression factor", symbol="CF min")
    cf_max: float = option(1000, at_least=1, doc="theta_max: the highest compression factor (>= cf_min)",
                           symbol="CF max")
    window: int = option(500, at_least=1, doc="steps between compression factor changes")
    omega: float = option(0.01, at_least=0, doc="omega: gains / throughputs agree within this relative difference")
    policy: str = option("exponential", choices=POLICIES, doc="the scaling of theta_s")
    ratio: float = option(2.0, above=1, doc="the scaling ratio of the policy")
    scale_start: float = option(2.0, above=1,
                                doc="theta_s after a raise of theta_min (candidate = theta_min * theta_s)")
    ewma: float = option(0.9, at_least=0, at_most=1, doc="smoothing of the gains (exponential moving average)")
    error_feedback: bool = option(True, doc="residual memory per tensor, in gradient units (saved in checkpoints)",
                                  symbol=("error feedback", "no error feedback"))
    gain: str = option("paper", choices=GAINS, doc="the compression gain rule: paper (squared norms of the whole "
                       "gradient, error feedback in numerator and denominator, the candidate compressed from "
                       "theta_min's output) | authors_code (the authors' public code: unsquared norms per layer, "
                       "summed, the raw gradient in the denominator, the candidate a separate compression of "
                       "g + r; docs/papers.md#gravac)",
                       symbol={"paper": "paper's gain", "authors_code": "authors' code gain"})
    throughput_time: str = option("modeled", choices=THROUGHPUT_TIMES, doc="t_iter of T_system: modeled (clock "
                                  "compute profile + network model per CF; reproducible) | measured (paper: wall "
                                  "time of the iterations that sent each CF)")


class GraVAC(Algorithm):
    """GraVAC: an adaptive compression factor from the compression gain with error feedback (Algorithm 1).

    Config keys (:class:`GraVACConfig`): ``compressor`` (topk, dgc, redsync, randomk), ``epsilon``,
    ``cf_min``, ``cf_max``, ``window``, ``omega``, ``policy``, ``ratio``, ``scale_start``, ``ewma``,
    ``error_feedback``, ``gain``, ``throughput_time``, plus the compressor's own keys (``seed``,
    ``sample_ratio``).
    """

    name = "gravac"
    Config = GraVACConfig
    label = "GraVAC"
    paper = "docs/papers.md#gravac"
    defining_keys = ("algo.compressor",)

    @classmethod
    def validate_config(cls, algo: dict, world_size: int) -> None:
        super().validate_config(algo, world_size)
        config = cls.parse_config(algo)
        if not config.cf_max >= config.cf_min:
            raise ConfigError(f"algo.cf_max must be a number >= {float(config.cf_min):g}, got {config.cf_max!r}")

    def __init__(self, cfg, comm):
        super().__init__(cfg, comm)
        config = self.config
        self.controller = GraVACController(
            cf_min=float(config.cf_min),
            cf_max=float(config.cf_max),
            epsilon=float(config.epsilon),
            window=int(config.window),
            omega=float(config.omega),
            policy=config.policy,
            ratio=float(config.ratio),
            scale_start=float(config.scale_start),
            ewma=float(config.ewma),
        )
        # DGC's density warm-up belongs to the static method: GraVACConfig declares no warmup_epochs
        self.compressor = build_compressor(config, cf=float(config.cf_min))
        self.dense = C.build("none")
        self.memory = ErrorFeedback() if config.error_feedback else NoMemory()
        self.modeled = config.throughput_time == "modeled"
        self.authors_gain = config.gain == "authors_code"
        # measured mode: (cf sent, its smoothed gain, observation count, local seconds) of the
        # previous iteration, whose time joins this iteration's all-reduce
        self.pending: tuple[float, float, int, float] | None = None
        self.last: dict = {}
        self.byte_counts = (0, 0)    # (dense gradient bytes, gradient bytes sent) since the start
        self.recorded_counts = (0, 0)  # the same at the previous record
        self.compress_s: dict = {}     # modeled seconds of compressing one tensor at (key, cf_min, cf_cand)
        self.compress_counts: dict = {}

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, ctx=None) -> nn.Module:
        super().setup(model, optimizer, ctx)
        self.params = list(model.parameters())
        return model

    def _counted(self, work, cost):
        """``work()``, its modeled compute counted on the device roofline
        (:attr:`RunContext.counted_seconds`) the first two times ``cost`` (tensor, cf_min,
        candidate cf) is seen and cached at the second count (steady state, residual in memory)."""
        counted = self.ctx.counted_seconds
        if counted is None or self.compress_counts.get(cost, 0) >= 2:
            return work()
        out, self.compress_s[cost] = counted(work)
        self.compress_counts[cost] = self.compress_counts.get(cost, 0) + 1
        return out

    def _transfer_s(self, nbytes: int) -> float:
        """Modeled seconds to exchange a gradient payload of ``nbytes`` per worker."""
        kind = self.compressor.exchange
        return getattr(self.comm.network, kind)(nbytes, self.comm.world_size)

    def _step_compute_s(self) -> tuple[float, float]:
        """(modeled, measured) seconds of this step's forward and backward (NaN: unknown)."""
        if self.ctx.step_compute_s is None:
            return math.nan, math.nan
        return self.ctx.step_compute_s()

    @torch.no_grad()
    def after_backward(self, step: int) -> None:
        t_start = time.perf_counter()
        modeled_s, measured_s = self._step_compute_s()
        cf_min, cf_cand = self.controller.plan()
        keys, g_efs, mins, cands = [], [], [], []
        device = self.params[0].device
        norms = torch.zeros(3, dtype=torch.float64, device=device)
        compress_s = 0.0
        for key, p in enumerate(self.params):
            if p.grad is None:
                continue

            def work(key=key, grad=p.grad):
                g_ef = self.memory.compensate(key, grad)
                c_min = self.compressor.compress(g_ef, step=step, key=key, cf=cf_min)
                if self.authors_gain:  # the authors' code: a second, separate compression of g_ef;
                    # unsquared norms of this tensor (layer); the raw gradient in the denominator
                    c_cand = (self.compressor.compress(g_ef, step=step, key=key, cf=cf_cand)
                              if cf_cand > cf_min else c_min)
                    terms = (grad.detach().double().norm(), self.compressor.decompress(c_min).double().norm(),
                             self.compressor.decompress(c_cand).double().norm())
                    return g_ef, c_min, c_cand, terms
                c_cand = (
                    self.compressor.compress_further(c_min, cf_cand / cf_min, step=step, key=key)
                    if cf_cand > cf_min
                    else c_min
                )
                sq = (g_ef.double().pow(2).sum(), self.compressor.decompress(c_min).double().pow(2).sum(),
                      self.compressor.decompress(c_cand).double().pow(2).sum())
                return g_ef, c_min, c_cand, sq

            g_ef, c_min, c_cand, sq = self._counted(work, (key, cf_min, cf_cand))
            compress_s += self.compress_s.get((key, cf_min, cf_cand), 0.0)
            norms[0] += sq[0]
            norms[1] += sq[1]
            norms[2] += sq[2]
            keys.append(key)
            g_efs.append(g_ef)
            mins.append(c_min)
            cands.append(c_cand)
        if compress_s and self.comm.clock is not None:
            self.comm.clock.compute(compress_s)  # compressing at both CFs (lsgd.compute.model's roofline)
        # one all-reduce of everything the decision reads: the norm sums (algo.gain), payload bytes of both
        # CFs, and the time term (modeled: this step's compute; measured: the previous iteration)
        pending = self.pending
        t_local = (modeled_s if self.modeled else (pending[3] if pending is not None else 0.0))
        shared = torch.cat([norms, torch.tensor(
            [sum(c.nbytes for c in mins), sum(c.nbytes for c in cands), t_local],  # NaN: unknown
            dtype=torch.float64, device=device)])
        self.comm.all_reduce(shared)
        n = self.comm.world_size
        den, num_min, num_cand = shared[:3].tolist()  # paper: ||g_ef||^2, ||c_min||^2, ||c_c||^2 summed
        bytes_min, bytes_cand, t_mean = (v / n for v in shared[3:].tolist())
        gain_min = num_min / den if den > 0 else 1.0
        gain_cand = num_cand / den if den > 0 else 1.0
        samples = n * (self.batch_size or 1)
        t_min = t_cand = math.nan
        if self.modeled and not math.isnan(modeled_s):  # each CF's iteration time on the configured network
            t_min = t_mean + self._transfer_s(bytes_min)
            t_cand = t_mean + self._transfer_s(bytes_cand)
        elif not self.modeled and pending is not None:  # the paper: the sent CF's measured iteration
            self.controller.record_throughput(pending[0], t_mean, pending[1], samples, pending[2])
        decision = self.controller.observe(gain_min, gain_cand, t_min, samples, t_iter_candidate_s=t_cand)

        before = self.comm.stats.comm_bytes
        if decision.sent == "dense":
            items = [self.dense.compress(g) for g in g_efs]
            outs = exchange(self.comm, self.dense, items)
            self.memory.reset()
        else:
            items = cands if decision.sent == "candidate" else mins
            for key, g_ef, c in zip(keys, g_efs, items):
                self.memory.update(key, g_ef, self.compressor.decompress(c))
            outs = exchange(self.comm, self.compressor, items)
        dense_bytes = sum(g.numel() * g.element_size() for g in g_efs)
        # what the exchange handed to collectives; one worker sends nothing
        sent_bytes = (self.comm.stats.comm_bytes - before) if n > 1 else sum(c.nbytes for c in items)
        for key, out in zip(keys, outs):
            self.params[key].grad.copy_(out)
        self.comm.round()
        self.byte_counts = (self.byte_counts[0] + dense_bytes, self.byte_counts[1] + sent_bytes)
        if not self.modeled:
            self.pending = (decision.cf, decision.gain, self.controller.observations,
                            measured_s + time.perf_counter() - t_start)
        self.last = {
            "kind": "compression",
            "step": step + 1,
            "cf": dense_bytes / sent_bytes if sent_bytes else 1.0,
            "sent": decision.sent,
            "cf_min": decision.cf_min,
            "cf_candidate": decision.cf_candidate,
            "gain_min": decision.gain_min,
            "gain_candidate": decision.gain_candidate,
            "gain": decision.gain,
        }
        if not math.isnan(t_min):
            self.last.update(t_iter_min_s=t_min, t_iter_candidate_s=t_cand)
        self.step_rows.append(self.last)

    def after_step(self, step: int) -> None:
        self.broadcast_buffers()

    @property
    def models_in_sync(self) -> bool:
        return True

    def metrics(self) -> dict:
        """``cf`` since the previous record (docs/results.md), and the last step's ``cf_min``,
        ``cf_candidate`` and ``gain``."""
        (dense, sent), (d0, s0) = self.byte_counts, self.recorded_counts
        self.recorded_counts = self.byte_counts
        out = {k: self.last[k] for k in ("cf_min", "cf_candidate", "gain") if k in self.last}
        out["cf"] = (dense - d0) / (sent - s0) if sent > s0 else 1.0
        return out

    def state_dict(self) -> dict:
        return {"controller": self.controller.state_dict(), "memory": self.memory.state_dict(),
                "pending": self.pending, "last": dict(self.last),
                "byte_counts": list(self.byte_counts), "recorded_counts": list(self.recorded_counts),
                "compress_price": (dict(self.compress_s), dict(self.compress_counts))}  # as the uninterrupted run charges

    def load_state_dict(self, state: dict) -> None:
        self.controller.load_state_dict(state["controller"])
        self.memory.load_state_dict(state["memory"])
        self.pending = None if state.get("pending") is None else tuple(state["pending"])
        self.last = dict(state.get("last", {}))
        self.byte_counts = tuple(state.get("byte_counts", (0, 0)))
        self.recorded_counts = tuple(state.get("recorded_counts", (0, 0)))
        if "compress_price" in state:
            self.compress_s, self.compress_counts = (dict(d) for d in state["compress_price"])
