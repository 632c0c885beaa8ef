"""Adaptive compression controllers: GraVAC's compression factor and Accordion's regime switch.

Both are pure state machines over Python floats (no tensors, no ``torch.distributed``): the
algorithms in :mod:`lsgd.algorithms.gradient_compression.gravac` and :mod:`lsgd.algorithms.gradient_compression.accordion` measure gains or
norms, make them identical on every worker (all-reduce, or values every worker already holds) and
feed them here, so every worker takes the same decision. ``state_dict`` / ``load_state_dict``
give JSON-able state for an exact resume.

* :class:`GraVACController`: Tyagi and Swany, "GraVAC: Adaptive Compression for
  Communication-Efficient Distributed DL Training", IEEE CLOUD 2023, Algorithm 1 (the paper's
  version, not the authors' public code; docs/papers.md#gravac).
* :class:`AccordionController`: Agarwal, Wang, Lee, Venkataraman and Papailiopoulos, "Adaptive
  Gradient Communication via Critical Learning Regime Identification", MLSys 2021.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["AccordionController", "GraVACController", "GraVACDecision"]

POLICIES = ("exponential", "geometric")
STATE_VERSION = 1


def _check_gain(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{name} must be a finite gain >= 0, got {value!r}")
    return value


def _rel_diff(a: float, b: float, base: float) -> float:
    """``|a - b| / base``, with 0/0 read as 0 (equal) and x/0 as +inf (different)."""
    diff = abs(a - b)
    if diff == 0.0:
        return 0.0
    return diff / base if base > 0.0 else math.inf


@dataclass
class GraVACDecision:
    """What :meth:`GraVACController.observe` decided for one iteration.

    Attributes:
        sent: ``"candidate"`` (theta_min * theta_s), ``"min"`` (theta_min; also the settled
            theta_ideal) or ``"dense"`` (uncompressed fallback).
        cf: compression factor actually sent (dense size / compressed size); 1.0 for dense.
        cf_min: theta_min used this step.
        cf_candidate: theta_min * theta_s used this step (theta_ideal once settled).
        gain_min: EWMA-smoothed gain of theta_min after this step's update, dimensionless.
        gain_candidate: EWMA-smoothed gain of the candidate after this step's update.
        gain: smoothed gain of what was sent (1.0 for dense).
        reset_residual: True when dense was sent: Algorithm 1 zeroes the error-feedback residuals.
    """

    sent: str
    cf: float
    cf_min: float
    cf_candidate: float
    gain_min: float
    gain_candidate: float
    gain: float
    reset_residual: bool


class GraVACController:
    """GraVAC's adaptive compression factor (Tyagi and Swany, IEEE CLOUD 2023, Algorithm 1).

    Symbols: theta_min = ``cf_min`` (the current minimum CF), theta_s = the scale factor applied on
    top of it, candidate CF theta_c = theta_min * theta_s, theta_max = ``cf_max``, eps =
    ``epsilon``, omega = ``omega``. CF = dense size / compressed size (dimensionless, >= 1).
    A gain is ``||g_c||^2 / ||g_ef||^2`` with error feedback in numerator and denominator
    (``g_ef = g + residual``), dimensionless, in [0, 1] for sparsifiers; dense has gain 1.

    Each iteration the caller takes ``(theta_min, theta_c) = plan()``, compresses ``g_ef`` at
    theta_min and that output again by theta_s ("multi-level" compression), measures both raw
    gains (all-reduced so every worker agrees) and calls :meth:`observe`. The rules (the
    definition of this class):

    1. EWMA smoothing (paper: gains "smoothed with an exponential moving average"; the factor is
       our reading, config ``ewma``): ``s <- ewma * s + (1 - ewma) * x``; the first observation
       initializes ``s = x``. theta_min and the candidate have separate EWMAs; the candidate's is
       reset (next observation re-initializes it) whenever the candidate CF changes, theta_min's
       whenever theta_min changes (our reading: a smoothed gain belongs to one CF).
    2. Epsilon rule (Algorithm 1), each step on the smoothed gains: send the candidate if
       ``gain_c >= eps``; else theta_min's output if ``gain_min >= eps``; else dense, with
       ``reset_residual=True``.
    3. Compression throughput (paper: ``T = T_system * gain``, ``T_system = N b / t_iter`` with
       t_iter including compression): a sample ``T_system * gain`` with ``T_system = samples /
       t_iter_s`` (samples/s) joins its CF's running mean over the current window. The throughput
       table maps each CF to the mean of the latest window in which it got samples (kept across
       windows). Samples come in two ways:

       * :meth:`observe` with a time: one sample for theta_min (``t_iter_s``, its smoothed gain)
         and one for the candidate (``t_iter_candidate_s``, its smoothed gain) every iteration:
         the times an iteration sending each CF takes (lsgd's ``throughput_time=modeled``);
         if theta_min and the candidate are the same CF both samples join its mean;
       * :meth:`record_throughput`: one sample for the CF an iteration actually sent, with that
         iteration's measured time (the paper's measured throughput, ``throughput_time=measured``:
         a CF's shorter iterations count for it alone). A sample of an iteration whose window
         has already ended is dropped (a measured time is known only after the exchange).

       A NaN time records nothing; dense iterations (CF 1) are never in the table.
    4. Window end (Algorithm 1, every ``window`` iterations: when ``observations % window == 0``),
       in this order:

       a. if ``|gain_min - gain_c| / gain_min <= omega`` (smoothed gains after this step; 0/0 is
          equal, x/0 differs): theta_min <- the candidate CF just evaluated and theta_s <-
          ``scale_start``, and the exponential counter k restarts at 0; else k <- k + 1 and
          theta_s grows by the scaling policy: ``exponential``: ``theta_s <- theta_s * ratio**k``
          (multipliers x2, x4, x8, ... for ratio 2; our reading of "exponential" with k counting
          the window ends since theta_min was last raised); ``geometric``: ``theta_s <- theta_s *
          ratio``. Then the cap (paper: "capped at theta_max"): theta_s <= cf_max / theta_min,
          so the candidate never exceeds cf_max (theta_min <= cf_max follows, as it only ever
          takes candidate values).
       b. Settling (paper: "when the two best throughputs are within omega, settle on the lower
          of their CFs"): take the two CFs of the throughput table with the highest mean
          throughput (ties to the lower CF); if both exist and ``|T1 - T2| / max(T1, T2) <=
          omega``, settle on theta_ideal = the lower of the two CFs. Also settle on cf_max when
          theta_min == cf_max (the candidate is then capped at cf_max too: nothing is left to
          explore; also at construction when ``cf_min == cf_max``; our reading).

    Once settled, :meth:`plan` returns ``(theta_ideal, theta_ideal)`` forever; the decision's
    ``sent`` is ``"min"`` (meaning theta_ideal; the decision uses the theta_min EWMA, both EWMAs
    are still updated) and the epsilon rule still falls back to ``"dense"`` when that smoothed gain
    is below eps. Window ends no longer change anything and the throughput table is frozen.
    Settling resets each EWMA whose CF differs from theta_ideal (rule 1).

    Args:
        cf_min: initial theta_min, >= 1 (paper: 10 for Top-k/DGC/Redsync, 1.5 for Random-k).
        cf_max: theta_max, >= cf_min (paper: 1000 or 2000).
        epsilon: eps, gain threshold in (0, 1] (paper: 0.7 or 0.9).
        window: iterations per window, >= 1 (paper: 500 or 2000).
        omega: relative tolerance for gains and throughputs, >= 0 (paper: 0.01).
        policy: theta_s scaling, ``"exponential"`` or ``"geometric"``.
        ratio: growth ratio of the policy, > 1 (paper: 2 for geometric).
        scale_start: theta_s at start and after each raise of theta_min, > 1.
        ewma: smoothing factor in [0, 1) (0 = no smoothing).

    Raises:
        ValueError: a constructor value out of range; the message names the key and its allowed
            range, e.g. ``window must be an integer >= 1, got 0``.
    """

    def __init__(
        self,
        cf_min: float = 10.0,
        cf_max: float = 1000.0,
        epsilon: float = 0.9,
        window: int = 500,
        omega: float = 0.01,
        policy: str = "exponential",
        ratio: float = 2.0,
        scale_start: float = 2.0,
        ewma: float = 0.9,
    ) -> None:
        def real(key: str, value) -> float:
            try:
                out = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{key} must be a number, got {value!r}") from None
            if not math.isfinite(out):
                raise ValueError(f"{key} must be finite, got {value!r}")
            return out

        cf_min, cf_max = real("cf_min", cf_min), real("cf_max", cf_max)
        epsilon, omega = real("epsilon", epsilon), real("omega", omega)
        ratio, scale_start, ewma = real("ratio", ratio), real("scale_start", scale_start), real("ewma", ewma)
        if cf_min < 1.0:
            raise ValueError(f"cf_min must be >= 1, got {cf_min!r}")
        if cf_max < cf_min:
            raise ValueError(f"cf_max must be >= cf_min ({cf_min!r}), got {cf_max!r}")
        if not 0.0 < epsilon <= 1.0:
            raise ValueError(f"epsilon must be in (0, 1], got {epsilon!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an integer >= 1, got {window!r}")
        if omega < 0.0:
            raise ValueError(f"omega must be >= 0, got {omega!r}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if ratio <= 1.0:
            raise ValueError(f"ratio must be > 1, got {ratio!r}")
        if scale_start <= 1.0:
            raise ValueError(f"scale_start must be > 1, got {scale_start!r}")
        if not 0.0 <= ewma < 1.0:
            raise ValueError(f"ewma must be in [0, 1), got {ewma!r}")
        self.config = {
            "cf_min": cf_min, "cf_max": cf_max, "epsilon": epsilon, "window": window, "omega": omega,
            "policy": policy, "ratio": ratio, "scale_start": scale_start, "ewma": ewma,
        }
        self.cf_max, self.epsilon, self.window, self.omega = cf_max, epsilon, window, omega
        self.policy, self.ratio, self.scale_start, self.ewma = policy, ratio, scale_start, ewma

        self._cf_min = cf_min
        self._theta_s = self._capped_scale(cf_min, scale_start)
        self._stale = 0  # window ends since theta_min was last raised (exponential policy's k)
        self._ewma_min: float | None = None
        self._ewma_cand: float | None = None
        self._observations = 0
        self._window_sum: dict[float, float] = {}
        self._window_count: dict[float, int] = {}
        self._throughput: dict[float, float] = {}
        self._cf_ideal: float | None = cf_max if cf_min >= cf_max else None

    # ---------------------------------------------------------------- properties
    @property
    def cf_min(self) -> float:
        """theta_min (theta_ideal once settled)."""
        return self._cf_ideal if self._cf_ideal is not None else self._cf_min

    @property
    def cf_candidate(self) -> float:
        """theta_min * theta_s, never above cf_max (theta_ideal once settled)."""
        if self._cf_ideal is not None:
            return self._cf_ideal
        if self._theta_s >= self.cf_max / self._cf_min:  # capped: exactly cf_max, no rounding
            return self.cf_max
        return self._cf_min * self._theta_s

    @property
    def theta_s(self) -> float:
        """The current scale factor theta_s (candidate / theta_min before the cf_max cap)."""
        return self._theta_s

    @property
    def settled(self) -> bool:
        """Whether theta_ideal has been found (exploration is over)."""
        return self._cf_ideal is not None

    @property
    def cf_ideal(self) -> float | None:
        """theta_ideal once settled, else None."""
        return self._cf_ideal

    @property
    def observations(self) -> int:
        """Number of :meth:`observe` calls so far."""
        return self._observations

    @property
    def throughput(self) -> dict[float, float]:
        """A copy of the throughput table: CF -> mean ``T_system * gain`` (samples/s) of the
        latest window in which that CF was tried (the current window's running mean included)."""
        return dict(self._throughput)

    # ---------------------------------------------------------------- step
    def plan(self) -> tuple[float, float]:
        """``(theta_min, candidate CF)`` to compress at this iteration; both theta_ideal once settled."""
        return self.cf_min, self.cf_candidate

    def observe(
        self, gain_min: float, gain_candidate: float, t_iter_s: float, samples: int,
        t_iter_candidate_s: float | None = None,
    ) -> GraVACDecision:
        """Record one iteration's raw gains and time; return the decision of rules 1-4.

        Args:
            gain_min: raw gain ``||C(g_ef, theta_min)||^2 / ||g_ef||^2`` of this iteration (the
                same on every worker), >= 0 (``gravac``'s ``algo.gain=authors_code``: the authors'
                code's ratio of unsquared norms, which can exceed 1; docs/papers.md#gravac).
            gain_candidate: raw gain of the candidate CF, >= 0.
            t_iter_s: seconds an iteration sending theta_min takes, compression included, > 0;
                NaN records no throughput at this call (measured mode: the sent CF's sample
                comes through :meth:`record_throughput` instead).
            samples: samples processed by all workers this iteration (N * b), >= 0.
            t_iter_candidate_s: seconds an iteration sending the candidate CF takes (None:
                ``t_iter_s``). lsgd's ``gravac`` passes modeled times for both.

        Raises:
            ValueError: a gain negative or not finite, ``t_iter_s`` <= 0 or infinite, or
                ``samples`` < 0.
        """
        gain_min = _check_gain("gain_min", gain_min)
        gain_candidate = _check_gain("gain_candidate", gain_candidate)
        t_iter_s = float(t_iter_s)
        if not math.isnan(t_iter_s) and not (math.isfinite(t_iter_s) and t_iter_s > 0.0):
            raise ValueError(f"t_iter_s must be > 0 seconds (or NaN when not measured), got {t_iter_s!r}")
        if samples < 0:
            raise ValueError(f"samples must be >= 0, got {samples!r}")
        t_cand_s = t_iter_s if t_iter_candidate_s is None else float(t_iter_candidate_s)
        if not math.isnan(t_cand_s) and not (math.isfinite(t_cand_s) and t_cand_s > 0.0):
            raise ValueError(f"t_iter_candidate_s must be > 0 seconds (or NaN), got {t_iter_candidate_s!r}")

        cf_min, cf_cand = self.plan()
        a = self.ewma
        self._ewma_min = gain_min if self._ewma_min is None else a * self._ewma_min + (1.0 - a) * gain_min
        self._ewma_cand = (
            gain_candidate if self._ewma_cand is None else a * self._ewma_cand + (1.0 - a) * gain_candidate
        )
        s_min, s_cand = self._ewma_min, self._ewma_cand
        self._observations += 1

        if self.settled:
            if s_min >= self.epsilon:
                decision = GraVACDecision("min", cf_min, cf_min, cf_cand, s_min, s_cand, s_min, False)
            else:
                decision = GraVACDecision("dense", 1.0, cf_min, cf_cand, s_min, s_cand, 1.0, True)
            return decision

        if s_cand >= self.epsilon:
            decision = GraVACDecision("candidate", cf_cand, cf_min, cf_cand, s_min, s_cand, s_cand, False)
        elif s_min >= self.epsilon:
            decision = GraVACDecision("min", cf_min, cf_min, cf_cand, s_min, s_cand, s_min, False)
        else:
            decision = GraVACDecision("dense", 1.0, cf_min, cf_cand, s_min, s_cand, 1.0, True)

        for cf, gain, t in ((cf_min, s_min, t_iter_s), (cf_cand, s_cand, t_cand_s)):
            if not math.isnan(t):
                self._add_sample(cf, samples / t * gain)

        if self._observations % self.window == 0:
            self._window_end(s_min, s_cand, cf_cand)
        return decision

    def record_throughput(self, cf: float, t_iter_s: float, gain: float, samples: int, observation: int) -> bool:
        """Add the throughput sample ``samples / t_iter_s * gain`` of an iteration that sent ``cf``
        (rule 3, measured mode); returns whether it was recorded.

        Args:
            cf: the CF that iteration sent (1.0, dense, is ignored), >= 1.
            t_iter_s: that iteration's seconds including compression and communication, > 0
                (NaN: nothing is recorded).
            gain: the smoothed gain of what it sent (``GraVACDecision.gain``), >= 0.
            samples: samples processed by all workers in it (N * b), >= 0.
            observation: :attr:`observations` right after that iteration's :meth:`observe`
                (1-based); a sample from a window that has already ended is dropped.

        Raises:
            ValueError: ``t_iter_s`` <= 0 or infinite, a gain negative or not finite, ``samples`` < 0.
        """
        t_iter_s = float(t_iter_s)
        if math.isnan(t_iter_s):
            return False
        if not (math.isfinite(t_iter_s) and t_iter_s > 0.0):
            raise ValueError(f"t_iter_s must be > 0 seconds (or NaN when not measured), got {t_iter_s!r}")
        gain = _check_gain("gain", gain)
        if samples < 0:
            raise ValueError(f"samples must be >= 0, got {samples!r}")
        ended = (self._observations // self.window) * self.window  # observations at the last window end
        if float(cf) <= 1.0 or self.settled or observation <= ended:
            return False
        self._add_sample(float(cf), samples / t_iter_s * gain)
        return True

    def _add_sample(self, cf: float, value: float) -> None:
        self._window_sum[cf] = self._window_sum.get(cf, 0.0) + value
        self._window_count[cf] = self._window_count.get(cf, 0) + 1
        self._throughput[cf] = self._window_sum[cf] / self._window_count[cf]

    # ---------------------------------------------------------------- window end
    def _capped_scale(self, cf_min: float, theta_s: float) -> float:
        return min(theta_s, self.cf_max / cf_min)

    def _set(self, cf_min: float, theta_s: float) -> None:
        """Move to (theta_min, theta_s), resetting the EWMA of each CF that changes (rule 1)."""
        old_min, old_cand = self._cf_min, self.cf_candidate
        self._cf_min, self._theta_s = cf_min, self._capped_scale(cf_min, theta_s)
        if self._cf_min != old_min:
            self._ewma_min = None
        if self.cf_candidate != old_cand:
            self._ewma_cand = None

    def _grow(self) -> float:
        """theta_s after one more window end without a raise (policy, rule 4a), before the cap."""
        cap = self.cf_max / self._cf_min
        if self._theta_s >= cap:
            return self._theta_s
        if self.policy == "geometric":
            return self._theta_s * self.ratio
        # exponential: theta_s * ratio**k, computed in logs to avoid overflow for large k
        if self._stale * math.log(self.ratio) >= math.log(cap / self._theta_s):
            return cap
        return self._theta_s * self.ratio**self._stale

    def _window_end(self, s_min: float, s_cand: float, cf_cand: float) -> None:
        # (a) raise theta_min, or scale theta_s by the policy
        if _rel_diff(s_min, s_cand, s_min) <= self.omega:
            self._stale = 0
            self._set(cf_cand, self.scale_start)
        else:
            self._stale += 1
            self._set(self._cf_min, self._grow())
        # (b) settle
        ideal: float | None = None
        if self._cf_min >= self.cf_max:
            ideal = self.cf_max
        elif len(self._throughput) >= 2:
            (cf1, t1), (cf2, t2) = sorted(self._throughput.items(), key=lambda kv: (-kv[1], kv[0]))[:2]
            if _rel_diff(t1, t2, max(t1, t2)) <= self.omega:
                ideal = min(cf1, cf2)
        if ideal is not None:
            if ideal != self._cf_min:
                self._ewma_min = None
            if ideal != self.cf_candidate:
                self._ewma_cand = None
            self._cf_ideal = ideal
        self._window_sum.clear()
        self._window_count.clear()

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict:
        """JSON-able state (floats, ints, strings, lists, None) for an exact resume."""
        return {
            "version": STATE_VERSION,
            "config": dict(self.config),
            "cf_min": self._cf_min,
            "theta_s": self._theta_s,
            "stale_windows": self._stale,
            "ewma_min": self._ewma_min,
            "ewma_candidate": self._ewma_cand,
            "observations": self._observations,
            "window_sum": [[cf, v] for cf, v in self._window_sum.items()],
            "window_count": [[cf, n] for cf, n in self._window_count.items()],
            "throughput": [[cf, v] for cf, v in self._throughput.items()],
            "cf_ideal": self._cf_ideal,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output.

        Raises:
            ValueError: the state's version is unknown or its ``config`` differs from this
                controller's (the message names the first differing key).
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"GraVACController state version must be {STATE_VERSION}, got {state.get('version')!r}")
        for key, value in self.config.items():
            saved = state["config"].get(key)
            if saved != value:
                raise ValueError(f"GraVACController state has {key}={saved!r}, this controller {key}={value!r}")
        self._cf_min = float(state["cf_min"])
        self._theta_s = float(state["theta_s"])
        self._stale = int(state["stale_windows"])
        self._ewma_min = None if state["ewma_min"] is None else float(state["ewma_min"])
        self._ewma_cand = None if state["ewma_candidate"] is None else float(state["ewma_candidate"])
        self._observations = int(state["observations"])
        self._window_sum = {float(cf): float(v) for cf, v in state["window_sum"]}
        self._window_count = {float(cf): int(n) for cf, n in state["window_count"]}
        self._throughput = {float(cf): float(v) for cf, v in state["throughput"]}
        self._cf_ideal = None if state["cf_ideal"] is None else float(state["cf_ideal"])


class AccordionController:
    """Accordion's per-layer critical-regime detection (Agarwal et al., MLSys 2021).

    Every switch period the caller passes, per layer, the norm of the gradient accumulated over
    the period that just ended (Accordion's Algorithm 1: ``||Delta_old|| - ||Delta_curr||`` relative
    to ``||Delta_old||``). Rules:

    * the first period is critical: ``low`` starts all True, and the first :meth:`end_period`
      (no previous norms) returns all True;
    * ``lr_decayed=True`` (a learning-rate decay at this boundary) returns all True;
    * otherwise layer i is critical (low compression) iff ``|prev_i - cur_i| / prev_i >= eta``;
      ``prev_i == 0`` is critical iff ``cur_i != 0`` (our reading: the paper does not define it);
    * in every case the norms become the previous norms for the next period;
    * :meth:`force_low` (a learning-rate decay inside a period) sets every layer low until the
      next :meth:`end_period`, which decides by the rules above.

    Attributes:
        low: per layer, True = low compression (critical regime; PowerSGD rank 2 or Top-k 99%),
            False = high compression (rank 1 or Top-k 10%).

    Args:
        num_layers: number of layers (tensors) decided on, >= 1.
        eta: relative-change threshold, > 0 (paper: 0.5).

    Raises:
        ValueError: ``num_layers < 1`` or ``eta <= 0`` (the message names the key).
    """

    def __init__(self, num_layers: int, eta: float = 0.5) -> None:
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be an integer >= 1, got {num_layers!r}")
        eta_f = float(eta)
        if not (math.isfinite(eta_f) and eta_f > 0.0):
            raise ValueError(f"eta must be > 0, got {eta!r}")
        self.num_layers = num_layers
        self.eta = eta_f
        self.low: list[bool] = [True] * num_layers
        self.prev: list[float] | None = None

    def end_period(self, norms: Sequence[float], lr_decayed: bool = False) -> list[bool]:
        """Decide each layer's level for the next period; returns (a copy of) and stores ``low``.

        Args:
            norms: per layer, the norm of the gradient accumulated over the period that just
                ended (finite, >= 0).
            lr_decayed: the learning rate decayed at this boundary (forces all layers low).

        Raises:
            ValueError: ``len(norms) != num_layers``, or a norm negative or not finite.
        """
        if len(norms) != self.num_layers:
            raise ValueError(f"norms must have num_layers={self.num_layers} entries, got {len(norms)}")
        cur = [float(x) for x in norms]
        for i, x in enumerate(cur):
            if not (math.isfinite(x) and x >= 0.0):
                raise ValueError(f"norms[{i}] must be a finite norm >= 0, got {x!r}")
        if self.prev is None or lr_decayed:
            low = [True] * self.num_layers
        else:
            low = [
                (c != 0.0) if p == 0.0 else abs(p - c) / p >= self.eta
                for p, c in zip(self.prev, cur)
            ]
        self.prev = cur
        self.low = low
        return list(low)

    def force_low(self) -> None:
        """A learning-rate decay inside a period: all layers low until the next :meth:`end_period`."""
        self.low = [True] * self.num_layers

    def state_dict(self) -> dict:
        """JSON-able state: ``num_layers``, ``eta``, ``low`` and ``prev`` (None before the first period end)."""
        return {
            "num_layers": self.num_layers,
            "eta": self.eta,
            "low": list(self.low),
            "prev": None if self.prev is None else list(self.prev),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output.

        Raises:
            ValueError: the state's ``num_layers`` differs from this controller's.
        """
        if int(state["num_layers"]) != self.num_layers:
            raise ValueError(f"num_layers: state has {state['num_layers']}, this controller {self.num_layers}")
        self.eta = float(state.get("eta", self.eta))
        self.low = [bool(x) for x in state["low"]]
        self.prev = None if state["prev"] is None else [float(x) for x in state["prev"]]

