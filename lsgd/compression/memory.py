"""Error-feedback memories: what a worker keeps of the compression error, per tensor.

A memory holds state per tensor ``key`` (an int, e.g. the parameter's index in
``model.parameters()``). Each step, for each tensor::

    g_ef = memory.compensate(key, g)        # g plus what was not sent before
    c    = compressor.compress(g_ef)
    memory.update(key, g_ef, compressor.decompress(c))   # remember what was not sent

* :class:`NoMemory`: no feedback (lossless compressors, or ``error_feedback=false``).
* :class:`ErrorFeedback`: the residual ``r`` in gradient units (Seide, Fu, Droppo, Li and Yu,
  "1-Bit Stochastic Gradient Descent and its Application to Data-Parallel Distributed Training of
  Speech DNNs", Interspeech 2014: the quantization error is added to the next minibatch's
  gradient, "error feedback"): ``g_ef = g + r``,
  ``r <- g_ef - sent``. Over T steps, ``sum_t sent_t + r_T == sum_t g_t``: nothing is lost,
  only delayed.
* :class:`DGCMemory`: DGC's momentum correction with factor masking (Lin et al., ICLR 2018,
  Sec. 3.2 and Algorithm 1), plain or Nesterov as in the authors' ``DGCSGDMemory``.

Units: every memory here keeps what was not sent in *gradient* units, before the learning rate is
applied (the optimizer multiplies the averaged result by the learning rate of the step that
finally sends it). This is the residual of 1-bit SGD, of GRACE's ``ResidualMemory`` (Xu et al.,
"GRACE: A Compressed Communication Framework for Distributed Machine Learning", ICDCS 2021), of
DGC's accumulation ``v`` (Algorithm 1), and the residual the GraVAC paper's compression gain is
defined on (``g_ef = g + residual``, docs/papers.md#gravac). It is *not* EF-SGD (Karimireddy,
Rebjock, Stich and Jaggi, "Error Feedback Fixes SignSGD and other Gradient Compression Schemes",
ICML 2019, Algorithm 2), which compresses ``p_t = lr_t g_t + e_t`` and keeps ``e`` in
learning-rate-scaled (parameter) units: with a constant learning rate the two give the same
updates, but at a learning-rate decay from lr to lr' a residual carried across it is applied at
lr' here and at the old lr in EF-SGD.

All state is kept as tensors on the gradient's device and saved by :meth:`Memory.state_dict`
(checkpoints); tensors passed in are never modified.
"""

from __future__ import annotations

import abc

import torch


class Memory(abc.ABC):
    """Base error-feedback memory (interface); per-key state, checkpointable."""

    @abc.abstractmethod
    def compensate(self, key: int, grad: torch.Tensor) -> torch.Tensor:
        """The tensor to compress for ``grad`` of tensor ``key`` (same shape; ``grad`` untouched)."""
        raise NotImplementedError

    @abc.abstractmethod
    def update(self, key: int, g_ef: torch.Tensor, sent: torch.Tensor) -> None:
        """Record what was sent: ``sent`` = decompress of this worker's own payload of ``g_ef``
        (dense, same shape as ``g_ef``)."""
        raise NotImplementedError

    @abc.abstractmethod
    def reset(self, key: int | None = None) -> None:
        """Zero the state of tensor ``key`` (of every tensor if None)."""
        raise NotImplementedError

    @abc.abstractmethod
    def residual(self, key: int) -> torch.Tensor | None:
        """The error carried to the next step for tensor ``key`` (None if nothing is kept)."""
        raise NotImplementedError

    @abc.abstractmethod
    def state_dict(self) -> dict:
        raise NotImplementedError

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError


def _check_shape(key: int, have: torch.Tensor, want: torch.Tensor) -> None:
    if have.shape != want.shape:
        raise ValueError(f"memory key {key}: stored state has shape {tuple(have.shape)}, "
                         f"the tensor has shape {tuple(want.shape)}")


class NoMemory(Memory):
    """No error feedback: ``compensate`` returns ``grad`` itself, ``update`` does nothing."""

    def compensate(self, key, grad):
        return grad

    def update(self, key, g_ef, sent):
        return None

    def reset(self, key=None):
        return None

    def residual(self, key):
        return None

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        return None


class ErrorFeedback(Memory):
    """Residual error feedback in gradient units (Seide et al. 2014, 1-bit SGD; GRACE's residual
    memory; see the module docstring for why this is not EF-SGD's learning-rate-scaled error).

    ``compensate``: ``g_ef = g + r`` (a new tensor; ``r = 0`` at first);
    ``update``: ``r <- g_ef - sent``. ``r`` has the units and shape of the gradient.

    Raises:
        ValueError: the stored residual of ``key`` has another shape than the tensor.
    """

    def __init__(self):
        self.residuals: dict[int, torch.Tensor] = {}

    def compensate(self, key, grad):
        r = self.residuals.get(key)
        if r is None:
            return grad.detach().clone()
        _check_shape(key, r, grad)
        return grad.detach() + r.to(device=grad.device, dtype=grad.dtype)

    def update(self, key, g_ef, sent):
        _check_shape(key, sent, g_ef)
        self.residuals[key] = (g_ef.detach() - sent.detach().to(g_ef.dtype))

    def reset(self, key=None):
        if key is None:
            for r in self.residuals.values():
                r.zero_()
        elif key in self.residuals:
            self.residuals[key].zero_()

    def residual(self, key):
        return self.residuals.get(key)

    def state_dict(self):
        return {"residuals": {k: v.clone() for k, v in self.residuals.items()}}

    def load_state_dict(self, state):
        self.residuals = {int(k): v.clone() for k, v in state.get("residuals", {}).items()}


class DGCMemory(Memory):
    """DGC's momentum correction and factor masking (Lin et al., ICLR 2018, Sec. 3.2, Algorithm 1).

    With momentum ``m``, per tensor: momentum ``u`` and accumulation ``v`` (both 0 at first), both
    in gradient units and of the gradient's shape. As the authors' ``DGCSGDMemory.compensate``
    (github.com/synxlin/deep-gradient-compression, dgc/memory.py):

    * ``compensate(g)``, plain momentum: ``u <- m u + g``; ``v <- v + u``.
      Nesterov (``nesterov=True``): ``u <- m (u + g)``; ``v <- v + u + g``. (With ``b`` torch
      SGD's Nesterov buffer, ``b <- m b + g`` and update ``g + m b``, this ``u`` is ``m b``.)
      Returns ``g_ef = v`` (a copy).
    * ``update(g_ef, sent)``: factor masking on the sent coordinates ``mask = sent != 0``:
      ``v <- g_ef`` with ``v[mask] = 0``, ``u[mask] = 0``. (The mask is taken from the dense
      ``sent``: a coordinate that was selected with value exactly 0 keeps its momentum; its
      accumulation is 0 either way.)
    * ``reset``: zeroes ``u`` and ``v``.

    ``residual(key)`` is ``v``. The optimizer must then run without momentum (the memory applies it).

    Raises:
        ValueError: ``momentum`` outside [0, 1); stored state of another shape than the tensor.
    """

    def __init__(self, momentum: float, nesterov: bool = False):
        if not 0 <= momentum < 1:
            raise ValueError(f"DGCMemory momentum must be in [0, 1), got {momentum!r}")
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.u: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def compensate(self, key, grad):
        g = grad.detach()
        u, v = self.u.get(key), self.v.get(key)
        if u is None:
            u, v = torch.zeros_like(g), torch.zeros_like(g)
        else:
            _check_shape(key, u, g)
            u, v = u.to(device=g.device, dtype=g.dtype), v.to(device=g.device, dtype=g.dtype)
        if self.nesterov:
            u = u.add_(g).mul_(self.momentum)
            v = v.add_(u).add_(g)
        else:
            u = u.mul_(self.momentum).add_(g)
            v = v.add_(u)
        self.u[key], self.v[key] = u, v
        return v.clone()

    def update(self, key, g_ef, sent):
        _check_shape(key, sent, g_ef)
        mask = sent != 0
        self.v[key] = g_ef.detach().masked_fill(mask, 0)
        if key in self.u:
            self.u[key].masked_fill_(mask, 0)
        else:
            self.u[key] = torch.zeros_like(g_ef)

    def reset(self, key=None):
        keys = list(self.u) if key is None else [key]
        for k in keys:
            if k in self.u:
                self.u[k].zero_()
            if k in self.v:
                self.v[k].zero_()

    def residual(self, key):
        return self.v.get(key)

    def state_dict(self):
        return {
            "momentum": self.momentum,
            "nesterov": self.nesterov,
            "u": {k: t.clone() for k, t in self.u.items()},
            "v": {k: t.clone() for k, t in self.v.items()},
        }

    def load_state_dict(self, state):
        self.momentum = float(state.get("momentum", self.momentum))
        self.nesterov = bool(state.get("nesterov", self.nesterov))
        self.u = {int(k): t.clone() for k, t in state.get("u", {}).items()}
        self.v = {int(k): t.clone() for k, t in state.get("v", {}).items()}
